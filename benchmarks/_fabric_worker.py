"""One node of the emulated fabric (started by bench_fabric.py inside the node's namespace).

``python _fabric_worker.py CONFIG.json POD`` loads torch, reads ``{"orders": {NAME: [pod of
rank 0, ...]}}`` from stdin (the planned orders come from the pods' bootstraps, which run
meanwhile), joins a TCPStore on pod 0, builds one gloo process group per order
(``ProcessGroupGloo`` on a ``PrefixStore``: the same nodes ranked in another order, each group with
its own TCP connections), prints ``{"ready": ...}`` and then serves commands read from stdin, one
JSON object a line, answering each with one JSON line on stdout:

* ``{"run": "ring"|"rhd"|"nhr", "order": NAME, "bytes": B}``: one allreduce of ``B`` bytes of
  float32 in that order's group, between a barrier and the answer ``{"t0", "t1", "cpu", "ok"}``
  (monotonic seconds; all namespaces share the machine's clock; ``ok`` is whether the result is
  the exact sum, None when the schedule computes none). ``ring`` is gloo's own all_reduce;
  ``rhd`` and ``nhr`` run the schedules of ``_fabric_model`` from send/recv;
* ``{"quit": true}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Dict, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _fabric_model import Schedule, schedule  # noqa: E402
from npu_job.bootstrap.base.model import Collective  # noqa: E402

PATTERN = 7  # inputs are (pod + 1) * (1 + i % 7): a misplaced block changes the sum


def inputs(pod: int, elements: int) -> torch.Tensor:
    return (pod + 1) * (1 + torch.arange(elements, dtype=torch.float32) % PATTERN)


def expected(nodes: int, elements: int) -> torch.Tensor:
    return nodes * (nodes + 1) // 2 * (1 + torch.arange(elements, dtype=torch.float32) % PATTERN)


def run_schedule(
    group: dist.ProcessGroupGloo, plan: Schedule, rank: int, data: torch.Tensor
) -> None:
    chunks = torch.tensor_split(data, plan.blocks)
    for tag, step in enumerate(plan.steps):
        works = []
        receiving = []
        for transfer in step.transfers:
            if transfer.source == rank:
                payload = torch.cat([chunks[b] for b in transfer.blocks])
                works.append(group.send([payload], transfer.target, tag))
            if transfer.target == rank:
                into = torch.empty(sum(chunks[b].numel() for b in transfer.blocks))
                works.append(group.recv([into], transfer.source, tag))
                receiving.append((transfer, into))
        for work in works:
            work.wait()
        for transfer, into in receiving:
            offset = 0
            for block in transfer.blocks:
                chunk = chunks[block]
                part = into[offset : offset + chunk.numel()]
                offset += chunk.numel()
                if transfer.reduce:
                    chunk.add_(part)
                else:
                    chunk.copy_(part)


def main(config_path: str, pod: int) -> int:
    with open(config_path) as handle:
        config = json.load(handle)
    orders = json.loads(sys.stdin.readline())["orders"]
    nodes = int(config["nodes"])
    store = dist.TCPStore(
        config["master"],
        int(config["port"]),
        nodes,
        is_master=pod == 0,
        timeout=timedelta(seconds=float(config["timeout"])),
    )
    groups: Dict[str, Tuple[dist.ProcessGroupGloo, int]] = {}
    for name, order in sorted(orders.items()):
        rank = order.index(pod)
        group = dist.ProcessGroupGloo(
            dist.PrefixStore(name, store), rank, nodes, timedelta(seconds=float(config["timeout"]))
        )
        groups[name] = (group, rank)
    for group, _ in groups.values():  # connect every group before the first measurement
        group.barrier().wait()
    print(json.dumps({"ready": pod, "groups": len(groups)}), flush=True)
    plans: Dict[str, Schedule] = {}
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        group, rank = groups[command["order"]]
        collective = command["run"]
        elements = int(command["bytes"]) // 4
        data = inputs(pod, elements)
        if collective != "ring" and collective not in plans:
            plans[collective] = schedule(Collective(collective), nodes)
        group.barrier().wait()
        cpu0, t0 = time.process_time(), time.monotonic()
        if collective == "ring":
            group.allreduce([data]).wait()
            exact = True
        else:
            run_schedule(group, plans[collective], rank, data)
            exact = plans[collective].exact
        t1, cpu1 = time.monotonic(), time.process_time()
        ok = bool(torch.equal(data, expected(nodes, elements))) if exact else None
        print(json.dumps({"t0": t0, "t1": t1, "cpu": cpu1 - cpu0, "ok": ok}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
