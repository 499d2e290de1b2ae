"""What the rendezvous root pays per round: decode every node's report and plan.

For each size a cluster is generated as ``bench_plan_scaling.py`` does (uneven ToR occupancy, 1/16
as many ToRs as nodes, 1/64 of the nodes without topology, 1/128 on two ToRs), every pod's node
report is made as its bootstrap writes it (``npu_job_node.json``), keyed by a member id of the
rendezvous' shape (``<host>_<pid>_0``), and :func:`npu_job.bootstrap.nodereport.plan_round` is
timed over all of them, in process (best of ``--repeat``, wall and CPU seconds), for ring and rhd:
the root's planning time for one round. The round's plan is checked against the planner's own on
the same cluster (the same mapping digest), and the table gives the bytes one join's report adds
(median and largest over the nodes) and the plan the root publishes. ``--callgrind`` also counts
plan_round's instructions (``valgrind --tool=callgrind``: a run that plans less one that only
loads the reports, the fewer of two runs each) at the sizes up to ``--callgrind-max``.
``--predict`` times ``plan_round(reports, predict=True)`` instead: the root's round with
``npu-run --probe``, which also scores the plan against the scheduler's order (the predicted busbw
ratio probe.json names); the round's plan must be the same and its ratio set.

    python benchmarks/bench_round_plan.py [--sizes 512,4096,16384] [--repeat 5] [--callgrind]
        [--predict] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from _report import publish
from bench_bootstrap import instructions
from npu_job.bootstrap import planner
from npu_job.bootstrap.base.model import Collective
from npu_job.bootstrap.nodereport import encode_report, plan_round, report_of
from npu_job.demo.synthetic import synthetic_cluster

COLLECTIVES = (Collective.RING, Collective.RHD)
TOPOLOGY_SOURCE = "/user/config/ranktable_tor.json (cce-ranktable-tor)"

# collective, nodes, wall s, CPU s, instructions (None: not counted)
Row = Tuple[str, int, float, float, Optional[int]]
Sizes = Tuple[int, int, int, int]  # nodes, median report bytes, largest, round plan bytes

_PLAN_UNDER_CALLGRIND = """\
import json, sys
from npu_job.bootstrap import nodereport, planner
reports = {key: text.encode("latin-1") for key, text in json.load(open(sys.argv[1])).items()}
if sys.argv[2] == "plan":
    nodereport.plan_round(reports)
"""


def reports_of(nodes: int, collective: Collective) -> Tuple[Dict[str, bytes], str]:
    """Every pod's report of a generated ``nodes``-node cluster, and the planner's digest."""
    table, topology = synthetic_cluster(
        nodes,
        max(2, nodes // 16),
        seed=11,
        occupancy="uneven",
        missing_topology=nodes // 64,
        multi_tor=nodes // 128,
    )
    reports = {
        f"{server.server_id}_{1000 + server.pod_index}_0": encode_report(
            report_of(table, server.pod_index, topology, TOPOLOGY_SOURCE, collective)
        )
        for server in table.servers
    }
    return reports, planner.plan(table, topology, collective).mapping_digest


def measure(
    sizes: Sequence[int], repeat: int, callgrind_max: Optional[int], predict: bool = False
) -> Tuple[List[Row], List[Sizes]]:
    rows: List[Row] = []
    byte_rows: List[Sizes] = []
    for nodes in sizes:
        for collective in COLLECTIVES:
            reports, digest = reports_of(nodes, collective)
            wall = cpu = math.inf
            for _ in range(repeat):
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                round_plan = plan_round(reports, predict=True) if predict else plan_round(reports)
                wall = min(wall, time.perf_counter() - start_wall)
                cpu = min(cpu, time.process_time() - start_cpu)
            if round_plan.mapping_digest != digest or round_plan.problems:
                raise SystemExit(f"{nodes} nodes, {collective}: not the planner's plan")
            if predict and round_plan.predicted is None:
                raise SystemExit(f"{nodes} nodes, {collective}: no predicted ratio")
            counted = None
            if callgrind_max is not None and nodes <= callgrind_max:
                counted = _instructions(reports)
            rows.append((collective.value, nodes, wall, cpu, counted))
            if collective is Collective.RING:
                lengths = [len(data) for data in reports.values()]
                byte_rows.append(
                    (
                        nodes,
                        int(statistics.median(lengths)),
                        max(lengths),
                        len(round_plan.encode()),
                    )
                )
    return rows, byte_rows


def _instructions(reports: Dict[str, bytes]) -> int:
    """plan_round's instructions: a process that plans, less one that only loads the reports."""
    with tempfile.TemporaryDirectory(prefix="bench-round-plan-") as tmp:
        path = Path(tmp) / "reports.json"
        path.write_text(json.dumps({key: data.decode("latin-1") for key, data in reports.items()}))
        env = {"PATH": "/usr/bin:/bin"}
        command = [sys.executable, "-c", _PLAN_UNDER_CALLGRIND, str(path)]
        counts = {  # the fewer of two runs each: a first start may pay for compiling
            how: min(instructions([*command, how], env, cwd=tmp) for _ in range(2))
            for how in ("load", "plan")
        }
    return counts["plan"] - counts["load"]


def table_text(
    rows: Sequence[Row], byte_rows: Sequence[Sizes], repeat: int, predict: bool = False
) -> str:
    scored = ", score against the scheduler's order (--predict: npu-run --probe)" if predict else ""
    lines = [
        f"the rendezvous root's plan for one round: plan_round over every node's report (decode "
        f"each, build the cluster, plan{scored}), best of {repeat}"
        f" (python {sys.version.split()[0]})",
        "",
        "| collective | nodes | wall s | CPU s | CPU us per node | M instr. |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for collective, nodes, wall, cpu, counted in rows:
        instr = "" if counted is None else f"{counted / 1e6:.1f}"
        lines.append(
            f"| {collective} | {nodes} | {wall:.3f} | {cpu:.3f} | {cpu / nodes * 1e6:.1f} "
            f"| {instr} |"
        )
    lines += [
        "",
        "bytes one join's report adds, and the round plan the root publishes:",
        "",
        "| nodes | report median | report max | round plan | plan per node |",
        "|---:|---:|---:|---:|---:|",
    ]
    for nodes, median, largest, published in byte_rows:
        lines.append(f"| {nodes} | {median} | {largest} | {published} | {published / nodes:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="512,4096,16384",
        help="comma-separated node counts, smallest first (default: %(default)s)",
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed runs per case; the best counts"
    )
    parser.add_argument(
        "--callgrind", action="store_true", help="also count instructions (valgrind)"
    )
    parser.add_argument(
        "--callgrind-max",
        type=int,
        default=4096,
        metavar="N",
        help="count instructions at sizes up to N nodes only (default: %(default)s)",
    )
    parser.add_argument(
        "--predict",
        action="store_true",
        help="time the round as npu-run --probe has it planned: with the predicted ratio",
    )
    parser.add_argument("--output", metavar="FILE", help="also write the table to FILE")
    args = parser.parse_args(list(argv) or None)
    sizes = sorted(int(size) for size in args.sizes.split(",") if size.strip())
    callgrind = args.callgrind_max if args.callgrind else None
    rows, byte_rows = measure(sizes, args.repeat, callgrind, args.predict)
    publish(table_text(rows, byte_rows, args.repeat, args.predict), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
