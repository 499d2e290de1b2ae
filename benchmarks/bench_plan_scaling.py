"""Does planning stay O(n log n)? The pure planner timed from 1024 to 65536 nodes.

For each size a cluster is generated (uneven ToR occupancy, 1/16 as many ToRs as nodes, 1/64 of
the nodes without topology, 1/128 on two ToRs) and :func:`npu_job.bootstrap.planner.plan` is timed
on it, in process (best of ``--repeat``), for ring (sort and group) and rhd (three candidate orders
scored over the log2(n) halving-doubling steps). Input reading is the other benchmark's business
(``bench_bootstrap.py``); this one isolates the algorithm.

The table shows the time, the time per ``n·log2(n)`` (constant for an O(n log n) planner) and the
growth exponent between neighbouring sizes (``log(t2/t1) / log(n2/n1)``; 1.0 is linear, n log n
gives ~1.1 at these sizes, a quadratic step would show 2.0). Target: planning O(n log n),
judged as the time per ``n·log2(n)`` at the largest size within 1.5x of the smallest.

    python benchmarks/bench_plan_scaling.py [--sizes 1024,4096,16384,65536] [--repeat 5] [--output FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import List, Sequence, Tuple

from _report import publish
from npu_job.bootstrap import planner
from npu_job.bootstrap.base.model import Collective, PlanStatus
from npu_job.demo.synthetic import synthetic_cluster

TOLERANCE = 1.5  # allowed growth of time / (n log2 n) from the smallest to the largest size

Row = Tuple[str, int, float, float]  # collective, nodes, seconds, ns per n*log2(n)


def time_plans(sizes: Sequence[int], repeat: int) -> List[Row]:
    rows: List[Row] = []
    for nodes in sizes:
        table, topology = synthetic_cluster(
            nodes,
            max(2, nodes // 16),
            seed=11,
            occupancy="uneven",
            missing_topology=nodes // 64,
            multi_tor=nodes // 128,
        )
        for collective in (Collective.RING, Collective.RHD):
            best = math.inf
            for _ in range(repeat):
                start = time.perf_counter()
                plan = planner.plan(table, topology, collective)
                best = min(best, time.perf_counter() - start)
            if plan.status is not PlanStatus.SUCCESS:
                raise SystemExit(f"{nodes} nodes, {collective}: no plan: {plan.reasons}")
            rows.append((collective.value, nodes, best, best / (nodes * math.log2(nodes)) * 1e9))
    return rows


def table_text(rows: Sequence[Row], repeat: int) -> str:
    lines = [
        f"planner time, best of {repeat} (python {sys.version.split()[0]}); target: O(n log n), "
        f"i.e. time per n*log2(n) at the largest size within {TOLERANCE}x of the smallest",
        "",
        f"{'collective':<10} {'nodes':>6} {'seconds':>9} {'ns/(n log n)':>13} {'growth exp':>11}",
    ]
    verdicts = []
    for collective in dict.fromkeys(row[0] for row in rows):
        mine = [row for row in rows if row[0] == collective]
        previous = None
        for name, nodes, seconds, normalised in mine:
            exponent = ""
            if previous is not None:
                exponent = f"{math.log(seconds / previous[2]) / math.log(nodes / previous[1]):.2f}"
            lines.append(
                f"{name:<10} {nodes:>6} {seconds:>9.4f} {normalised:>13.1f} {exponent:>11}"
            )
            previous = (name, nodes, seconds)
        growth = mine[-1][3] / mine[0][3]
        verdict = "met" if growth <= TOLERANCE else "NOT met"
        verdicts.append(
            f"  {collective}: time per n*log2(n) x{growth:.2f} from {mine[0][1]} to "
            f"{mine[-1][1]} nodes: {verdict}"
        )
    return "\n".join(lines + ["", "target (O(n log n)):"] + verdicts) + "\n"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="1024,4096,16384,65536",
        help="comma-separated node counts, smallest first (default: %(default)s)",
    )
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed runs per case; the best counts"
    )
    parser.add_argument("--output", metavar="FILE", help="also write the table to FILE")
    args = parser.parse_args(list(argv) or None)
    sizes = sorted(int(size) for size in args.sizes.split(",") if size.strip())
    text = table_text(time_plans(sizes, args.repeat), args.repeat)
    publish(text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
