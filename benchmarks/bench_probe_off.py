"""npu-run's job start with ``--probe`` off: this checkout against the commit before the probe.

The probe must cost nothing when it is off; this measures that side by side. The baseline
(``--baseline``, default 1f0c215) is the parent of 633dd66, the commit that brought ``--probe``
into npu-run; everything since on the start path (the probe's option in the backend, the
``follow`` call, the root's ``predict`` argument) is in the other side.

Both sides start the same job: ``--nodes`` agents (default 3) on loopback, the ``parallel``
rendezvous with its root on pod index 0, one gloo CPU worker each, every agent started from its
bootstrap's report (two ToRs, so the root's plan is not the scheduler's order) with the command
and environment of the fabric job of ``bench_probe.py`` (``_probe_job.commands``), without
``--probe``. Loopback rather than the fabric's network namespaces: the start path (agents'
start, rendezvous, the root's plan, the workers' start) is the same, it needs no root and a run
takes seconds. Each side runs from a link tree of its own checkout (``git worktree`` of the
baseline; the folders laid out as they install, ``bench_bootstrap_revisions.link_tree``) first on
``PYTHONPATH``, with this interpreter and its site-packages. The baseline takes the same flags:
the job is the same on both.

Runs alternate, baseline first (A B A B ...), ``--repeat`` each, after one untimed warm-up run of
each (bytecode compiled). Per run: wall seconds from launching the agents until every worker
has started (each worker writes its start time as its first statement: bench_probe's measure of
the job start), the wall seconds to the agents' exit, and CPU seconds of the whole job (agents
and their workers, user + system, ``getrusage`` of the reaped children). Reported: the medians
(with the fastest and slowest run) and this side's ratio of the medians to the baseline's, with
the load average before and after.

    python benchmarks/bench_probe_off.py [--nodes 3] [--repeat 5] [--baseline 1f0c215]
        [--output FILE]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import _probe_job as probe_job
from _report import publish
from bench_bootstrap_revisions import baseline_worktree, link_tree

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "1f0c215"  # the parent of 633dd66 "launcher: npu-run --probe[=SECONDS] ..."
CAP = 180.0  # seconds a job may take to end
SIDES = ("baseline", "this")
WORKER = """\
import os, sys, time
stamp = repr(time.time())
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".start"), "w") as out:
    out.write(stamp)
"""


@dataclass
class Side:
    tree: Path
    started: List[float] = field(default_factory=list)  # launch -> every worker started, s
    ended: List[float] = field(default_factory=list)  # launch -> every agent exited, s
    cpu: List[float] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tor_of_pod(nodes: int) -> Tuple[int, ...]:
    """Pod 0 alone under one ToR, the others under another: the plan moves pod 0 off rank 0."""
    return (1,) + (0,) * (nodes - 1)


def run_job(tree: Path, workdir: Path, nodes: int) -> Tuple[float, float, float]:
    """(launch -> every worker started, launch -> every agent exited, CPU s) of one job."""
    marks = workdir / "started"
    marks.mkdir(parents=True)
    script = workdir / "worker.py"
    script.write_text(WORKER)
    places = tor_of_pod(nodes)
    job = probe_job.ProbeJob(
        workdir, f"bench-probe-off-{os.getpid()}", probe_job.planned_ranks(places)
    )
    commands = list(
        probe_job.commands(
            job,
            places,
            [str(script), str(marks)],
            probe=None,
            master=("127.0.0.1", free_port()),
            ifname="lo",
        )
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()
    for pod, argv, env in commands:
        env = {**env, "PYTHONPATH": str(tree)}  # this side's npu_job before the installed one
        with open(job.log_path(pod), "wb") as log:
            # from the work directory: python -m puts it first on sys.path, no checkout there
            job.agents.append(
                subprocess.Popen(argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
            )
    deadline = time.monotonic() + CAP
    try:
        for agent in job.agents:
            agent.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for agent in job.agents:
            agent.kill()
            agent.wait()
        raise SystemExit(f"the job did not end within {CAP:.0f} s:\n{job.logs()[-3000:]}") from None
    ended = time.time() - launched
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    codes = [agent.returncode for agent in job.agents]
    stamps = sorted(marks.glob("*.start"))
    if any(codes) or len(stamps) != nodes:
        raise SystemExit(f"agents exited {codes}, {len(stamps)} workers:\n{job.logs()[-3000:]}")
    started = max(float(path.read_text()) for path in stamps) - launched
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return started, ended, cpu


def check_tree(tree: Path) -> None:
    """The agents of this side import npu-run from ``tree``, not the installed one."""
    found = subprocess.run(
        [sys.executable, "-c", "import npu_job.launcher.run as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not found.startswith(str(tree)):
        raise SystemExit(f"{tree}: npu-run comes from {found}")


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def measure(nodes: int, repeat: int, baseline: str) -> Tuple[Dict[str, Side], str, str]:
    with tempfile.TemporaryDirectory(prefix="bench-probe-off-") as name, ExitStack() as stack:
        tmp = Path(name)
        old = baseline_worktree(baseline, tmp / "baseline", stack)
        sides = {
            "baseline": Side(link_tree(old, tmp / "tree-baseline")),
            "this": Side(link_tree(REPO, tmp / "tree-this")),
        }
        for side in SIDES:  # warm-up: compile each tree's bytecode
            check_tree(sides[side].tree)
            run_job(sides[side].tree, tmp / f"warm-up-{side}", nodes)
        before = load()
        for index in range(repeat):
            for side in SIDES:
                started, ended, cpu = run_job(sides[side].tree, tmp / f"{side}-{index}", nodes)
                sides[side].started.append(started)
                sides[side].ended.append(ended)
                sides[side].cpu.append(cpu)
        return sides, before, load()


def table(
    sides: Dict[str, Side], nodes: int, repeat: int, baseline: str, loads: Tuple[str, str]
) -> str:
    lines = [
        f"npu-run job start with --probe off: {nodes} agents on loopback (parallel rendezvous, one"
        f" gloo CPU worker each), this checkout against {baseline} (before --probe), interleaved"
        f" A B, {repeat} run(s) each, medians (python {sys.version.split()[0]};"
        f" load average {loads[0]} before, {loads[1]} after)",
        "",
        "| side | workers started s | agents exited s | CPU s |",
        "|---|---:|---:|---:|",
    ]
    medians = {
        side: tuple(statistics.median(values) for values in (s.started, s.ended, s.cpu))
        for side, s in sides.items()
    }
    for side in SIDES:
        cells = [
            f"{statistics.median(values):.3f} ({min(values):.2f}–{max(values):.2f})"
            for values in (sides[side].started, sides[side].ended, sides[side].cpu)
        ]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    ratios = [mine / theirs for mine, theirs in zip(medians["this"], medians["baseline"])]
    lines.append("| this / baseline | " + " | ".join(f"{ratio:.3f}" for ratio in ratios) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3, help="agents (default: %(default)s)")
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed runs per side (default: %(default)s)"
    )
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        help="the commit to compare with (default: %(default)s, before --probe)",
    )
    parser.add_argument("--output", metavar="FILE", help="also write the table to FILE")
    args = parser.parse_args(list(argv) or None)
    sides, before, after = measure(args.nodes, args.repeat, args.baseline)
    publish(table(sides, args.nodes, args.repeat, args.baseline, (before, after)), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
