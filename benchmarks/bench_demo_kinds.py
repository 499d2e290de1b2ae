"""``npu-job demo --kind K`` for every registered job kind, side by side: wall and CPU time.

Each run is the installed ``npu-job demo`` as a user runs it (its own process, the whole chain:
render, every pod's bootstrap, npu-run, the DDP training, the checks), with ``--json`` so that
its own phases are read back, and must end with exit status 0. Runs are interleaved (kind A, kind
B, ..., repeated) so that the shared machine's noise hits every kind alike; the table gives
medians of the wall time and of the CPU time (user + sys of the demo and every pod process, from
``os.wait4``), each kind's ratio to Volcano's, and the median of the demo's own
``launch+rendezvous`` phase (torch's import in every worker dominates it).

    python benchmarks/bench_demo_kinds.py [--repeat 3] [--nodes 6] [--nproc-per-node 2]
        [--kinds volcano,ascendjob] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import publish  # noqa: E402
from npu_job.kinds import DEFAULT, KIND_NAMES  # noqa: E402


class Row(NamedTuple):
    kind: str
    wall: float
    cpu: float
    rendezvous: float


def one_demo(kind: str, nodes: int, nproc: int) -> Tuple[float, float, float]:
    """(wall, CPU user+sys of it and its children, its launch+rendezvous phase) of one run."""
    npu_job = shutil.which("npu-job") or sys.exit("npu-job is not on PATH: pip install -e .")
    command = [
        npu_job, "demo", "--kind", kind, "--nodes", str(nodes),
        "--nproc-per-node", str(nproc), "--json", "-q",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            errors.seek(0)
            sys.exit(f"{' '.join(command)} failed: {errors.read().decode(errors='replace')}")
        out.seek(0)
        summary = json.loads(out.read())
    phases: Dict[str, float] = summary.get("phases_s") or {}
    return wall, usage.ru_utime + usage.ru_stime, float(phases.get("launch+rendezvous", "nan"))


def run(kinds: Sequence[str], repeat: int, nodes: int, nproc: int) -> List[Row]:
    samples: Dict[str, List[Tuple[float, float, float]]] = {kind: [] for kind in kinds}
    for round_number in range(repeat):
        for kind in kinds:
            samples[kind].append(one_demo(kind, nodes, nproc))
            wall = samples[kind][-1][0]
            print(f"round {round_number + 1}/{repeat}: {kind} {wall:.1f} s", file=sys.stderr)
    return [
        Row(kind, *(statistics.median(column) for column in zip(*samples[kind]))) for kind in kinds
    ]


def table_text(rows: Sequence[Row], repeat: int, nodes: int, nproc: int, load: float) -> str:
    base = rows[0]
    lines = [
        f"# npu-job demo --kind K, {nodes} pods x {nproc} workers; medians of {repeat} interleaved "
        f"runs each ({os.cpu_count()} CPUs, load average {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end)",
        "",
        "| kind | wall s | CPU s | launch+rendezvous s | wall vs volcano | CPU vs volcano |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.kind} | {row.wall:.1f} | {row.cpu:.1f} | {row.rendezvous:.1f} "
            f"| {row.wall / base.wall:.2f} | {row.cpu / base.cpu:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per kind")
    parser.add_argument("--nodes", type=int, default=6, help="pods of each demo (default 6)")
    parser.add_argument("--nproc-per-node", type=int, default=2, help="workers per pod")
    parser.add_argument(
        "--kinds",
        default=",".join(KIND_NAMES),
        help=f"comma-separated kinds (default: every registered one; {DEFAULT} comes first)",
    )
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args(list(argv) or None)
    chosen = [kind for kind in args.kinds.split(",") if kind]
    unknown = sorted(set(chosen) - set(KIND_NAMES))
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(unknown)}; known: {', '.join(KIND_NAMES)}")
    kinds = [DEFAULT] + [kind for kind in chosen if kind != DEFAULT]  # the ratios' base first
    load = os.getloadavg()[0]
    rows = run(kinds, args.repeat, args.nodes, args.nproc_per_node)
    publish(table_text(rows, args.repeat, args.nodes, args.nproc_per_node, load), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
