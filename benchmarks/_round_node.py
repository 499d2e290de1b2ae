"""One node of bench_round_rendezvous.py: a process that runs just a rendezvous handler's rounds.

``python _round_node.py LOGFILE`` loads torch and npu-job's launcher, then serves commands read
from stdin, one JSON object a line, answering each with one JSON line on stdout (everything else
the process prints goes to stderr; its log, at npu-run's INFO level, to ``LOGFILE``):

* ``{"open": {...}}``: make the handler of one trial as torch's agent would, from
  ``RendezvousParameters``: ``variant`` is ``parallel`` (npu-run's backend, from torch's registry),
  ``c10d`` (torch's stock handler) or ``ranked`` (:class:`RankedC10dHandler` around it); the node's
  report is what npu-run reads, ``$NPU_JOB_OUTPUT_DIR/npu_job_node.json`` of ``dir`` (none there:
  an unknown node at ``node_rank``). Answers ``{"report": BYTES}``;
* ``{"round": N}``: one ``next_rendezvous``; answers ``{"enter", "exit"}`` (monotonic seconds, the
  machine's one clock), ``cpu`` (this process's user+sys over the call: every thread, the root
  store's server among them on its host), ``rank``, and on request (``bytes``: the parallel
  root's host, after the call) what the round left in the root store per join and the plan;
* ``{"close": true}``: ``shutdown()``, then drop the handler;
* ``{"quit": true}``.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
from datetime import timedelta
from typing import Any, Dict, Optional, Tuple

from npu_job.launcher import noderank, torchcompat
from npu_job.launcher.rendezvous import c10d as ranked_c10d
from npu_job.launcher.rendezvous import handler as parallel
from npu_job.launcher.rendezvous.config import RunKeys
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from npu_job.podfacts import OUTPUT_DIR_ENV

NPROC = 1  # devices a node without a report says it has (npu-run's --nproc_per_node)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def open_handler(spec: Dict[str, Any]) -> Tuple[RendezvousHandler, int]:
    """The trial's handler, made from the parameters npu-run would give torch's agent."""
    os.environ[OUTPUT_DIR_ENV] = spec["dir"]
    report = noderank.node_report(os.environ, spec["node_rank"], NPROC)
    nnodes = spec["nnodes"]
    common = dict(
        endpoint=f"127.0.0.1:{spec['port']}",
        run_id=spec["run_id"],
        min_nodes=nnodes,
        max_nodes=nnodes,
        join_timeout="60",
    )
    if spec["variant"] == "parallel":
        options: Dict[str, Any] = dict(
            rank=spec["node_rank"],
            enable_tiered_parallel_tcpstore=False,
            node_report=report.data.decode("utf-8", "replace"),
            close_timeout="10",
        )
        if spec.get("node_order"):
            options[parallel.NODE_ORDER_OPTION] = spec["node_order"]
        if report.pod_index is not None:
            options[parallel.POD_INDEX_OPTION] = str(report.pod_index)
        parallel.register()
        params = RendezvousParameters(backend="parallel", **common, **options)
        return get_rendezvous_handler(params), len(report.data)
    params = RendezvousParameters(
        backend="c10d",
        local_addr="127.0.0.1",
        is_host=spec["is_host"],
        **common,
        **ranked_c10d.report_options(report.data),
    )
    stock = get_rendezvous_handler(params)
    if spec["variant"] == "c10d":
        return stock, len(report.data)
    return ranked_c10d.RankedC10dHandler(stock, params), len(report.data)


def root_bytes(spec: Dict[str, Any], number: int) -> Dict[str, Any]:
    """What round ``number`` of a parallel run left in its root store: each join's report and
    claim, and the plan the root published (read back through a plain client)."""
    keys = RunKeys(spec["run_id"])
    client = TCPStore("127.0.0.1", spec["port"], is_master=False, timeout=timedelta(seconds=30))
    members = [
        int(client.get(keys.slot(number, position))) for position in range(1, spec["nnodes"] + 1)
    ]
    reports = [len(client.get(keys.report(number, member))) for member in members]
    claims = [len(client.get(keys.claim(number, member))) for member in members]
    plan = len(client.get(keys.plan(number)))
    del client
    return {"reports": reports, "claims": claims, "plan": plan}


def serve(replies: Any) -> None:
    handler: Optional[RendezvousHandler] = None
    spec: Dict[str, Any] = {}
    for line in sys.stdin:
        command = json.loads(line)
        answer: Dict[str, Any] = {}
        try:
            if "open" in command:
                spec = command["open"]
                handler, size = open_handler(spec)
                answer = {"report": size}
            elif "round" in command:
                assert handler is not None
                cpu, enter = cpu_seconds(), time.monotonic()
                result = handler.next_rendezvous()
                leave, used = time.monotonic(), cpu_seconds() - cpu
                _store, rank, world_size, _info = torchcompat.rendezvous_parts(result)
                answer = {"enter": enter, "exit": leave, "cpu": used, "rank": rank}
                if command.get("bytes"):
                    answer["bytes"] = root_bytes(spec, command["round"])
            elif "close" in command:
                assert handler is not None
                handler.shutdown()
                handler = None
                answer = {"closed": True}
            elif "quit" in command:
                return
        except Exception as error:  # the parent names the node and stops the benchmark
            answer = {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
        replies.write(json.dumps(answer) + "\n")
        replies.flush()


def main() -> int:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (torch's C++ side among them) must not reach the answers
    logging.basicConfig(
        filename=sys.argv[1], level=logging.INFO, format="%(asctime)s %(name)s: %(message)s"
    )
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    replies.flush()
    serve(replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
