"""The pod side from the job's bundle (``npu-job.pyz``) against the installed package, side by side.

What zipimport costs a pod: the bootstrap of one pod of a generated CCE job (``--nodes``, default
4096) through ``bash scripts/bootstrap.sh``, once with the bundle beside it (``NPU_JOB_BUNDLE``)
and once with the installed ``npu_job`` (no bundle), and npu-run's start-up: a one-node job of one
worker that does nothing (``--standalone``), from the bundle (``sh npu-job.pyz run``) and from the
installed ``npu-run``. Repetitions are interleaved (installed, bundle, installed, ...) so that the
shared machine's noise hits both alike; the table gives medians of wall and CPU time (user + sys
of the child and its children, from ``os.wait4``) and the bundle's ratio to the installed package.

``--callgrind`` also counts the instructions of the bootstrap's Python process in both cases
(``valgrind --tool=callgrind``; steady whatever the machine does): the installed package as
``bootstrap.sh`` runs it, the bundle as its preamble runs it (the loader, then the zip).

    python benchmarks/bench_bundle.py [--nodes 4096] [--repeat 7] [--callgrind] [--output FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from _report import publish
from bench_bootstrap import SCRIPT, check_success, timed, write_job

REPO = Path(__file__).resolve().parent.parent
NOOP_WORKER = "import os\nassert os.environ['RANK'] == '0'\n"


def _bundle(directory: Path) -> Path:
    from npu_job.bundle import installed_bundle

    path = directory / "npu-job.pyz"
    path.write_bytes(installed_bundle().data)
    return path


def _instructions(command: Sequence[str], env: Dict[str, str], directory: Path) -> int:
    """Instructions callgrind counts for ``command`` (one process, its children not followed)."""
    out = directory / "callgrind.out"
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    match = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
    if not match:
        raise SystemExit(f"no instruction count in {out}")
    out.unlink()
    return int(match.group(1))


def run(nodes: int, repeat: int, callgrind: bool) -> List[Tuple[str, str, float, float, str]]:
    with tempfile.TemporaryDirectory(prefix="bench-bundle-") as tmp:
        directory = Path(tmp)
        bundle = _bundle(directory)
        installed = write_job(directory / "job", nodes)
        from_bundle = dict(installed, NPU_JOB_BUNDLE=str(bundle), NPU_JOB_PYTHON=sys.executable)
        installed["NPU_JOB_PYTHON"] = sys.executable
        worker = directory / "noop.py"
        worker.write_text(NOOP_WORKER)
        npu_run = shutil.which("npu-run") or str(Path(sys.executable).parent / "npu-run")
        launch = ["--standalone", "--nproc_per_node", "1", str(worker)]
        commands = {
            ("bootstrap", "installed"): (["bash", str(SCRIPT)], installed),
            ("bootstrap", "bundle"): (["bash", str(SCRIPT)], from_bundle),
            ("npu-run start-up", "installed"): ([npu_run, *launch], installed),
            ("npu-run start-up", "bundle"): (["sh", str(bundle), "run", *launch], from_bundle),
        }
        for (what, _), (command, env) in commands.items():  # warm caches, check each works
            timed(command, env)
            if what == "bootstrap":
                check_success(env)
        samples: Dict[Tuple[str, str], List[Tuple[float, float]]] = {key: [] for key in commands}
        for _ in range(repeat):
            for key, (command, env) in commands.items():
                samples[key].append(timed(command, env))
        counts: Dict[str, int] = {}
        if callgrind:
            counts["installed"] = _instructions(
                [
                    sys.executable,
                    "-c",
                    "import sys; from npu_job.bootstrap.command import pod_main; "
                    "pod_main(sys.argv[1:])",
                ],
                installed,
                directory,
            )
            counts["bundle"] = _instructions(
                [sys.executable, str(bundle), "bootstrap"], from_bundle, directory
            )
    rows = []
    for what in ("bootstrap", "npu-run start-up"):
        base_cpu = statistics.median(c for _, c in samples[what, "installed"])
        for how in ("installed", "bundle"):
            wall = statistics.median(w for w, _ in samples[what, how])
            cpu = statistics.median(c for _, c in samples[what, how])
            ratio = f"{cpu / base_cpu:.2f}"
            if what == "bootstrap" and counts:
                ratio += (
                    f" ({counts[how] / 1e6:.0f} M instr., {counts[how] / counts['installed']:.3f})"
                )
            rows.append((what, how, wall, cpu, ratio))
    return rows


def table_text(rows: Sequence[Tuple[str, str, float, float, str]], nodes: int, repeat: int) -> str:
    lines = [
        f"# the pod side from the bundle vs installed: bootstrap at {nodes} nodes, npu-run with one",
        f"# worker; medians of {repeat} interleaved runs each",
        "",
        "| what | from | wall s | CPU s | CPU vs installed (instructions) |",
        "|---|---|---|---|---|",
    ]
    for what, how, wall, cpu, ratio in rows:
        lines.append(f"| {what} | {how} | {wall:.3f} | {cpu:.3f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096, help="nodes of the generated job")
    parser.add_argument("--repeat", type=int, default=7, help="interleaved repetitions per case")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions")
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args(list(argv) or None)
    if args.callgrind and shutil.which("valgrind") is None:
        parser.error("--callgrind needs valgrind (apt-get install valgrind)")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    publish(
        table_text(run(args.nodes, args.repeat, args.callgrind), args.nodes, args.repeat),
        args.output,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
