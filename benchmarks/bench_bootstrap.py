"""Whole-process wall time of ``bash scripts/bootstrap.sh`` against a bare ``python3 -c pass``.

For each size (default 64, 1024 and 4096 nodes) a CCE job is generated with
:func:`npu_job.demo.synthetic.synthetic_cluster` and written to a temporary directory as the
platform mounts it: ``jobstart_hccl.json`` (plain JSON, status completed) and ``ranktable_tor.json``
(base64(gzip(JSON))). The bootstrap runs as one pod of that job (the middle pod index), end to end:
locate, read, decode, validate, plan, write the five output files. Every run is checked to have
succeeded (route plan ``status: success``), so a fast fallback can never pass for a fast plan.

Bytecode is cached (as after ``pip install``) before timing. Repetitions are interleaved
(baseline, 64, 1024, 4096, baseline, ...) so that the shared machine's noise hits every case
alike. The table reports medians and the fastest run of wall time and of CPU time (user + sys of
the child from ``os.wait4``, which a busy machine inflates far less), and each median's excess
over the bare interpreter start in the same run.

Each size also runs with msgspec hidden (``import msgspec`` fails, as in an image without it) in the
same interleaved loop: the standard-library path, side by side. The pod-side target is that the
bootstrap gets no slower than that path was; ``--callgrind`` counts the instructions of a
bare start and of one run of each case at the biggest size (``valgrind --tool=callgrind``,
following bash's exec into python): a steady figure where a busy machine makes CPU times wander.

    python benchmarks/bench_bootstrap.py [--sizes 64,1024,4096] [--repeat 11] [--callgrind]
        [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from _hidden import hidden
from _report import publish

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "bootstrap.sh"


def write_job(directory: Path, nodes: int, seed: int = 7) -> Dict[str, str]:
    """Write a generated ``nodes``-node job into ``directory``; return the pod's environment."""
    from npu_job.bootstrap.ranktable import rank_table_document
    from npu_job.bootstrap.topology import encode_ranktable_tor
    from npu_job.demo.synthetic import synthetic_cluster

    table, topology = synthetic_cluster(nodes, max(2, nodes // 16), seed=seed, occupancy="uneven")
    config = directory / "config"
    config.mkdir(parents=True)
    (config / "jobstart_hccl.json").write_text(json.dumps(rank_table_document(table)))
    (config / "ranktable_tor.json").write_bytes(encode_ranktable_tor(table, topology))
    me = table.servers[nodes // 2]
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("NPU_JOB_", "KUBERNETES_"))
    }
    # A pod runs an installed package, whose bytecode pip compiled: let the warm-up run cache it
    # here too instead of timing the compiler (this checkout may set PYTHONDONTWRITEBYTECODE).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        RANK_TABLE_FILE=str(config),
        MA_CURRENT_HOST_IP=me.server_id,
        VC_TASK_INDEX=str(me.pod_index),
        NPU_JOB_OUTPUT_DIR=str(directory / "out"),
        NPU_JOB_K8S_TOPOLOGY="0",
    )
    return env


def timed(command: Sequence[str], env: Dict[str, str]) -> Tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one run of ``command``, children included.

    CPU comes from ``os.wait4`` on the child: bash's own time and the python it execs (the same
    process), as the kernel accounts them, unaffected by what else the machine runs.
    """
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            errors.seek(0)
            message = errors.read().decode(errors="replace")
            raise SystemExit(f"{' '.join(command)} failed ({child.returncode}): {message}")
    return elapsed, usage.ru_utime + usage.ru_stime


def check_success(env: Dict[str, str]) -> None:
    plan = json.loads((Path(env["NPU_JOB_OUTPUT_DIR"]) / "route_plan.json").read_text())
    if plan["status"] != "success":
        raise SystemExit(f"bootstrap did not plan: {plan['reason']}")


Row = Tuple[str, int, float, float, float, float, float]
WITH_MSGSPEC = "bash bootstrap.sh"
WITHOUT_MSGSPEC = "  without msgspec"
CASES = (WITH_MSGSPEC, WITHOUT_MSGSPEC)
BARE = "python3 -c pass"
Counted = Dict[str, int]  # instructions of one run, by case (and the bare start)


def instructions(
    command: Sequence[str], env: Dict[str, str], *, every_process: bool = False, cwd: str = "."
) -> int:
    """Instructions (callgrind's ``I refs``) of the command's last process image, or summed over
    every process it ran (``every_process``: bash, the python it execs, any tool it starts)."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--trace-children=yes", "--callgrind-out-file=/dev/null"]
        + list(command),
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    counts = [int(line.split()[-1].replace(",", "")) for line in done.stderr.splitlines()
              if "I   refs:" in line]  # fmt: skip
    return sum(counts) if every_process else counts[-1]


def run(sizes: Sequence[int], repeat: int, callgrind: bool = False) -> Tuple[List[Row], Counted]:
    with tempfile.TemporaryDirectory(prefix="bench-bootstrap-") as tmp:
        cases: Dict[Tuple[str, int], Dict[str, str]] = {}
        for nodes in sizes:
            env = write_job(Path(tmp) / f"n{nodes}", nodes)
            cases[WITH_MSGSPEC, nodes] = env
            cases[WITHOUT_MSGSPEC, nodes] = hidden("msgspec", Path(tmp) / "no-msgspec", env)
        baseline_env = cases[WITH_MSGSPEC, sizes[0]]
        samples: Dict[Tuple[str, int], List[Tuple[float, float]]] = {("python3 -c pass", 0): []}
        samples.update({case: [] for case in cases})
        for env in cases.values():  # warm the page cache and check it works before timing
            timed(["bash", str(SCRIPT)], env)
            check_success(env)
        for _ in range(repeat):
            samples["python3 -c pass", 0].append(timed(["python3", "-c", "pass"], baseline_env))
            for case, env in cases.items():
                samples[case].append(timed(["bash", str(SCRIPT)], env))
                check_success(env)
        counted: Counted = {}
        if callgrind:
            counted[BARE] = instructions(["python3", "-c", "pass"], baseline_env)
            for case in CASES:
                env = cases[case, sizes[-1]]
                counted[case] = instructions(["bash", str(SCRIPT)], env)
                check_success(env)

    def summary(case: Tuple[str, int]) -> Row:
        wall = [w for w, _ in samples[case]]
        cpu = [c for _, c in samples[case]]
        median = statistics.median
        return (case[0], case[1], median(wall), min(wall), median(cpu), min(cpu), 0.0)

    base = summary(("python3 -c pass", 0))
    rows = [base]
    for case in sorted(cases, key=lambda case: (case[1], CASES.index(case[0]))):
        row = summary(case)
        rows.append(row[:6] + (row[2] - base[2],))
    return rows, counted


def table_text(rows: Sequence[Row], repeat: int, counted: Optional[Counted] = None) -> str:
    base = rows[0]
    lines = [
        f"bootstrap wall time, {repeat} interleaved runs each (python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})",
        "",
        f"{'command':<18} {'nodes':>6} {'wall med':>9} {'wall min':>9} "
        f"{'cpu med':>8} {'cpu min':>8} "
        f"{'excess s':>9} {'cpu excess':>10} {'ratio':>6}",
    ]
    for name, nodes, wall, wall_min, cpu, cpu_min, excess in rows:
        lines.append(
            f"{name:<18} {nodes or '-':>6} {wall:>9.3f} {wall_min:>9.3f} "
            f"{cpu:>8.3f} {cpu_min:>8.3f} "
            f"{excess:>9.3f} {cpu - base[4]:>10.3f} {wall / base[2]:>6.2f}"
        )
    by_case = {(row[0], row[1]): row for row in rows[1:]}
    biggest = max(nodes for _name, nodes in by_case)
    shipped, stdlib = by_case[WITH_MSGSPEC, biggest], by_case[WITHOUT_MSGSPEC, biggest]
    lines += [
        "",
        f"{biggest} nodes, with msgspec against the standard library's path (msgspec hidden): "
        f"median excess {shipped[6]:.3f} against {stdlib[6]:.3f} s wall, "
        f"{shipped[4] - base[4]:.3f} against {stdlib[4] - base[4]:.3f} s cpu; ratio "
        f"{shipped[6] / stdlib[6]:.2f} wall, {(shipped[4] - base[4]) / (stdlib[4] - base[4]):.2f} cpu",
    ]
    if counted:
        lines += ["", *instruction_lines(counted, f"{biggest} nodes")]
    return "\n".join(lines) + "\n"


def instruction_lines(counted: Counted, size: str) -> List[str]:
    """The instructions of each case, its excess over a bare start, and msgspec's ratio."""
    bare = counted[BARE]
    lines = [f"instructions (callgrind, one run each) at {size}; a bare start is {bare:,}:"]
    for case in CASES:
        count = counted[case]
        lines.append(f"  {case.strip():<18} {count:>15,}  (excess {count - bare:,})")
    with_it, without = counted[WITH_MSGSPEC] - bare, counted[WITHOUT_MSGSPEC] - bare
    lines.append(f"  msgspec/stdlib excess ratio {with_it / without:.2f}")
    return lines


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,1024,4096", help="comma-separated node counts")
    parser.add_argument("--repeat", type=int, default=11, help="interleaved repetitions per case")
    parser.add_argument(
        "--callgrind", action="store_true", help="also count instructions (valgrind)"
    )
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args(list(argv) or None)
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    rows, counted = run(sizes, args.repeat, args.callgrind)
    text = table_text(rows, args.repeat, counted)
    publish(text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
