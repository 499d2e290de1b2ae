"""Rendezvous time per round, with and without re-planning: real handlers, one process per node.

Each node is a process of its own (``_round_node.py``) that runs just a rendezvous handler's
rounds on loopback, no workers: the handler torch's agent would make from the
``RendezvousParameters`` npu-run gives it, with the node report npu-run reads
(``$NPU_JOB_OUTPUT_DIR/npu_job_node.json``). The nodes of a size are started once and serve every
trial; a trial is a fresh run (new port, new run id) of one variant, whose rounds are round 0 and
round 1 (every node calls ``next_rendezvous`` again, as when the agents restart their workers).
A round's time runs from the first node entering ``next_rendezvous`` to the last one returning.
The variants, interleaved trial by trial (each repeat runs them in turn, every other repeat in
reverse order), after one untimed trial of each (so the lazy imports a fresh agent pays in its
first round, the planner's among them, are in no figure), the median of ``--repeat`` counting:

* ``parallel, re-planned``: npu-run's ``parallel`` backend, every node with its bootstrap's report
  (a ``NodeReport`` with its switch ``Placement``, written as the bootstrap writes it) of a
  generated cluster whose nodes are spread over 2-4 ToRs, joining with its bootstrap's node rank;
  the root's host (pod index 0's agent) plans each round over the reports;
* ``parallel, unknown nodes``: the same backend, no report on any node (npu-run then sends an
  unknown one at ``--node_rank``): the cheapest plan, the pod index order;
* ``c10d, ranked``: npu-job's ``RankedC10dHandler`` around torch's stock c10d handler, the nodes
  with their reports: every node publishes its report, plans, and agrees on the plan's digest;
* ``c10d, stock``: torch's own c10d handler, the same nodes (``is_host`` on pod index 0's).

Each node's ranks are checked: the re-planned variants must give every node its bootstrap's rank,
the unknown nodes their pod index. Also reported: the CPU seconds of the root's host process per
round (``getrusage`` around its ``next_rendezvous``: every thread, the root store's server among
them), the bytes each join adds to the ``parallel`` root (its report and its claim, read back
from the root store) and the plan the root publishes (``RoundPlan``), per node count.

    python benchmarks/bench_round_rendezvous.py [--nodes 4 8] [--repeat 5] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

from _report import publish
from npu_job.bootstrap import planner
from npu_job.bootstrap.base.model import Collective
from npu_job.bootstrap.nodereport import encode_report, report_of
from npu_job.demo.synthetic import synthetic_cluster
from npu_job.launcher.noderank import PLANNED_ORDER

from npu_job.podfacts import NODE_REPORT_FILE

HERE = Path(__file__).resolve().parent
ROUNDS = 2  # round 0 (the first start) and round 1 (every node joins again)
TOPOLOGY_SOURCE = "/user/config/ranktable_tor.json (cce-ranktable-tor)"
REPLY_TIMEOUT = 180.0  # seconds for one answer of a node: a round is bounded by join_timeout

# name, handler variant, whether the nodes have their bootstraps' reports
VARIANTS: Tuple[Tuple[str, str, bool], ...] = (
    ("parallel, re-planned", "parallel", True),
    ("parallel, unknown nodes", "parallel", False),
    ("c10d, ranked", "ranked", True),
    ("c10d, stock", "c10d", True),
)
PAIRS = (  # the table's ratios: re-planning ÷ not
    ("parallel, re-planned", "parallel, unknown nodes"),
    ("c10d, ranked", "c10d, stock"),
)


@dataclass(frozen=True)
class Cluster:
    """A generated job of ``nodes`` pods: each pod's report and its bootstrap's node rank."""

    nodes: int
    tors: int
    reports: Tuple[bytes, ...]  # by pod index
    ranks: Tuple[int, ...]  # the bootstrap's node rank, by pod index
    digest: str


def cluster_of(nodes: int) -> Cluster:
    tors = min(4, max(2, nodes // 2))
    table, topology = synthetic_cluster(nodes, tors, seed=11, npus_per_node=8)
    plan = planner.plan(table, topology, Collective.RING)
    reports = tuple(
        encode_report(report_of(table, pod, topology, TOPOLOGY_SOURCE, Collective.RING))
        for pod in range(nodes)
    )
    return Cluster(nodes, tors, reports, tuple(plan.node_rank_of_pod), plan.mapping_digest)


class Node:
    """One node process and its command channel."""

    def __init__(self, pod: int, log: Path) -> None:
        self.pod = pod
        self._errors = open(log.with_suffix(".err"), "w")
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "_round_node.py"), str(log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )

    def send(self, command: Dict[str, Any]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()

    def answer(self) -> Dict[str, Any]:
        stdout: Optional[IO[str]] = self.process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise SystemExit(f"node of pod index {self.pod} exited ({self.process.wait()})")
        reply: Dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise SystemExit(f"node of pod index {self.pod}: {reply['error']}")
        return reply

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.send({"quit": True})
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._errors.close()


@dataclass
class Measured:
    """Per (variant, round): the round's times, the root host's CPU, and the nodes' CPU."""

    wall: Dict[Tuple[str, int], List[float]] = field(default_factory=dict)
    root_cpu: Dict[Tuple[str, int], List[float]] = field(default_factory=dict)
    all_cpu: Dict[Tuple[str, int], List[float]] = field(default_factory=dict)
    root_bytes: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # parallel's, round 1
    wrong_ranks: List[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def trial(
    nodes: Sequence[Node],
    cluster: Cluster,
    dirs: Dict[bool, List[Path]],
    name: str,
    tag: str,
    measured: Measured,
) -> None:
    """One fresh run of variant ``name`` over every node: open, ROUNDS rounds, close."""
    _name, variant, with_reports = next(v for v in VARIANTS if v[0] == name)
    port = free_port()
    run_id = f"bench-{tag}"
    root = nodes[0]  # pod index 0: the parallel root's host, c10d's is_host
    specs = {}
    for node in nodes:
        pod = node.pod
        specs[pod] = {
            "variant": variant,
            "port": port,
            "run_id": run_id,
            "nnodes": cluster.nodes,
            "dir": str(dirs[with_reports][pod]),
            "node_rank": cluster.ranks[pod] if with_reports else pod,
            "node_order": f"{PLANNED_ORDER}{cluster.digest}" if with_reports else None,
            "is_host": pod == 0,
        }
    for node in [root, *nodes[1:]]:  # c10d's host binds its store when its handler is made
        node.send({"open": specs[node.pod]})
        node.answer()
    expected = cluster.ranks if with_reports else tuple(range(cluster.nodes))
    for number in range(ROUNDS):
        want_bytes = (
            variant == "parallel" and number == ROUNDS - 1 and name not in measured.root_bytes
        )
        for node in nodes:
            node.send({"round": number, "bytes": want_bytes and node is root})
        replies = {node.pod: node.answer() for node in nodes}
        key = (name, number)
        measured.wall.setdefault(key, []).append(
            max(reply["exit"] for reply in replies.values())
            - min(reply["enter"] for reply in replies.values())
        )
        measured.root_cpu.setdefault(key, []).append(replies[0]["cpu"])
        measured.all_cpu.setdefault(key, []).append(sum(r["cpu"] for r in replies.values()))
        if "bytes" in replies[0]:
            measured.root_bytes[name] = replies[0]["bytes"]
        if variant != "c10d":  # stock c10d ranks by host name and pid: nothing to hold it to
            got = tuple(replies[pod]["rank"] for pod in range(cluster.nodes))
            if got != expected:
                measured.wrong_ranks.append(f"{name} round {number}: ranks {got}, not {expected}")
    for node in [*nodes[1:], root]:  # the hosts last: the others still talk to their stores
        node.send({"close": True})
        node.answer()


def measure(sizes: Sequence[int], repeat: int, work: Path) -> Dict[int, Tuple[Cluster, Measured]]:
    results: Dict[int, Tuple[Cluster, Measured]] = {}
    for size in sizes:
        cluster = cluster_of(size)
        dirs: Dict[bool, List[Path]] = {True: [], False: []}
        for pod in range(size):
            for with_reports in (True, False):
                directory = work / f"{size}-{pod}-{'report' if with_reports else 'none'}"
                directory.mkdir(parents=True)
                if with_reports:
                    (directory / NODE_REPORT_FILE).write_bytes(cluster.reports[pod])
                dirs[with_reports].append(directory)
        nodes = [Node(pod, work / f"node-{size}-{pod}.log") for pod in range(size)]
        try:
            for node in nodes:
                node.answer()  # ready: torch and the launcher are imported
            names = [name for name, _variant, _reports in VARIANTS]
            for name in names:  # untimed: the lazy imports (the planner's among them) and caches
                trial(nodes, cluster, dirs, name, f"{size}-warm-{names.index(name)}", Measured())
            measured = Measured()
            for index in range(repeat):
                for name in names if index % 2 == 0 else reversed(names):
                    tag = f"{size}-{index}-{names.index(name)}-{os.getpid()}"
                    trial(nodes, cluster, dirs, name, tag, measured)
            results[size] = (cluster, measured)
        finally:
            for node in nodes:
                node.stop()
    return results


def _ratio(top: float, bottom: float) -> str:
    return f"{top / bottom:.2f}" if bottom > 0 else "-"


Cell = Callable[["Measured", Tuple[str, int]], Tuple[float, str]]


def _pair_rows(results: Dict[int, Tuple[Cluster, Measured]], cell: Cell) -> List[str]:
    """One row per size and round: each pair's two cells (figure, text) and their ratio."""
    rows = []
    for size, (_cluster, measured) in results.items():
        for number in range(ROUNDS):
            cells = []
            for top, bottom in PAIRS:
                (a, a_text), (b, b_text) = (
                    cell(measured, (top, number)),
                    cell(measured, (bottom, number)),
                )
                cells += [a_text, b_text, _ratio(a, b)]
            rows.append(f"| {size} | {number} | " + " | ".join(cells) + " |")
    return rows


def table_text(
    results: Dict[int, Tuple[Cluster, Measured]], repeat: int, load: Tuple[float, float]
) -> str:
    median = statistics.median
    lines = [
        f"rendezvous time per round, first node entering next_rendezvous to last returning, "
        f"median of {repeat}, real handlers, one process per node on loopback (python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, load {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end)",
        "",
        "| nodes | round | parallel re-planned s | parallel unknown s | ratio "
        "| c10d ranked s | c10d stock s | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += _pair_rows(results, lambda m, key: (median(m.wall[key]), f"{median(m.wall[key]):.3f}"))
    lines += [
        "",
        "CPU seconds of the root's host process per round (parallel: pod index 0's agent, which "
        "plans; c10d: the store's host), median; in brackets all nodes together:",
        "",
        "| nodes | round | parallel re-planned | parallel unknown | ratio "
        "| c10d ranked | c10d stock | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += _pair_rows(
        results,
        lambda m, key: (
            median(m.root_cpu[key]),
            f"{median(m.root_cpu[key]):.3f} ({median(m.all_cpu[key]):.2f})",
        ),
    )
    lines += [
        "",
        "bytes each join adds to the parallel root (report + claim, largest), and the plan the "
        "root publishes per round:",
        "",
        "| nodes | ToRs | re-planned: report + claim | plan | unknown: report + claim | plan "
        "| plan per node, re-planned |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, (cluster, measured) in results.items():
        placed = measured.root_bytes["parallel, re-planned"]
        bare = measured.root_bytes["parallel, unknown nodes"]
        lines.append(
            f"| {size} | {cluster.tors} | {max(placed['reports'])} + {max(placed['claims'])} "
            f"| {placed['plan']} | {max(bare['reports'])} + {max(bare['claims'])} "
            f"| {bare['plan']} | {placed['plan'] / size:.1f} |"
        )
    wrong = [line for _size, (_c, measured) in results.items() for line in measured.wrong_ranks]
    lines += [
        "",
        "every node ran with its bootstrap's rank (re-planned, ranked c10d) or its pod index "
        f"(unknown nodes): {'yes' if not wrong else 'NO'}",
        *wrong,
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[4, 8], help="node counts (default: 4 8)"
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="trials of each variant, interleaved (median)"
    )
    parser.add_argument("--output", metavar="FILE", help="also write the table to FILE")
    args = parser.parse_args(list(argv) or None)
    if min(args.nodes) < 2:
        parser.error("--nodes: at least 2 (a single node has no order to plan)")
    start_load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-round-rdzv-") as tmp:
        results = measure(args.nodes, args.repeat, Path(tmp))
    text = table_text(results, args.repeat, (start_load, os.getloadavg()[0]))
    publish(text, args.output)
    return 1 if any(measured.wrong_ranks for _cluster, measured in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
