"""Instructions of ``bash bootstrap.sh`` at one size, this checkout against an earlier revision.

The pod-side target: the bootstrap is no slower than the standard-library path was at
``--baseline`` (default e6638b1, the last commit before the speed layer was retired), counted side
by side with ``valgrind --tool=callgrind`` (following bash into python and every child it starts):
instructions, not seconds, so a busy machine does not move them.

Both revisions run the same generated job (the rank table path: a CCE ``jobstart_hccl.json`` and
``ranktable_tor.json``; the API path: the job's pods, Nodes and HyperNodes from the fake
Kubernetes API of ``tests/bootstrap/fake_kube_api.py`` on a real HTTPS server) as one pod (the
middle index), each from a link tree of its own checkout (``git worktree``; the folders laid out
as they install, .ci/typecheck.py's ``build_link_tree``), on a fresh interpreter that sees the
tree and this environment's site-packages but no installed npu-job. Readers (``--readers``, both
by default):

* ``msgspec``: as installed here (the row is left out where msgspec is not installed);
* ``stdlib``: msgspec and zlib-ng hidden (the standard library only: the path the target names;
  the baseline also used zlib-ng where present, a hard requirement then).

Every run is checked to have planned (``status: success``).

    python benchmarks/bench_bootstrap_revisions.py [--nodes 4096] [--baseline e6638b1]
        [--readers msgspec,stdlib] [--output FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from _hidden import hidden
from _report import publish
from bench_bootstrap import instructions, write_job
from bench_bootstrap_api import make_self_signed, serve_job

REPO = Path(__file__).resolve().parent.parent
PATHS = ("rank table", "API")
READERS = ("msgspec", "stdlib")


def link_tree(checkout: Path, dest: Path) -> Path:
    """``dest/npu_job`` laid out from ``checkout`` as it installs."""
    spec = importlib.util.spec_from_file_location("typecheck", REPO / ".ci" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    typecheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(typecheck)
    return typecheck.build_link_tree(dest, checkout)


def baseline_worktree(commit: str, dest: Path, stack: ExitStack) -> Path:
    """A detached ``git worktree`` of ``commit`` at ``dest``, removed when ``stack`` closes."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(dest),
                    commit], check=True)  # fmt: skip
    stack.callback(
        subprocess.run, ["git", "-C", str(REPO), "worktree", "remove", "--force", str(dest)]
    )
    return dest


def pod_environments(tmp: Path, nodes: int, stack: ExitStack) -> Dict[str, Dict[str, str]]:
    """The pod's environment on each path (without PYTHONPATH, which is per revision)."""
    keep = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("NPU_JOB_", "KUBERNETES_", "MA_", "VC_", "PYTHON", "VIRTUAL_ENV"))
    }
    keep["PYTHONHASHSEED"] = "0"
    rank_table = write_job(tmp / "rank-table", nodes)
    rank_table = {**keep, **{k: v for k, v in rank_table.items() if k not in os.environ}}
    _, api = serve_job(stack, tmp, nodes, make_self_signed(tmp))
    return {"rank table": rank_table, "API": {**keep, **api}}


def run_case(script: Path, env: Dict[str, str]) -> int:
    """Instructions of one planned run (a warm-up first compiles the bytecode)."""
    out = Path(env["NPU_JOB_OUTPUT_DIR"]) / "route_plan.json"
    counted = 0
    for attempt in ("warm-up", "counted"):
        out.unlink(missing_ok=True)
        command = ["bash", str(script)]
        if attempt == "warm-up":
            subprocess.run(command, env=env, cwd="/", capture_output=True, check=True)
        else:
            # every process: a tool the script starts counts too. From "/": python -c puts the
            # working directory first on sys.path, where a checkout would shadow the link tree
            counted = instructions(command, env, every_process=True, cwd="/")
        plan = json.loads(out.read_text())
        if plan["status"] != "success":
            raise SystemExit(f"{script}: did not plan: {plan.get('reason')}")
    return counted


def measure(
    nodes: int, baseline: str, readers: Sequence[str] = READERS
) -> Tuple[List[Tuple[str, str, int, int]], int]:
    """(path, reader, baseline instructions, this checkout's) per case, and a bare start's."""
    with tempfile.TemporaryDirectory(prefix="bench-revisions-") as name, ExitStack() as stack:
        tmp = Path(name)
        old = baseline_worktree(baseline, tmp / "baseline", stack)
        trees = {
            "baseline": (old / "scripts" / "bootstrap.sh", link_tree(old, tmp / "tree-baseline")),
            "this": (REPO / "scripts" / "bootstrap.sh", link_tree(REPO, tmp / "tree-this")),
        }
        # a python that sees no installed npu-job: site-packages on PYTHONPATH, its .pth files
        # (an editable install's finder among them) unread
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True
        )
        python = str(tmp / "venv" / "bin" / "python")
        site = sysconfig.get_paths()["purelib"]
        envs = pod_environments(tmp, nodes, stack)
        rows = []
        if not importlib.util.find_spec("msgspec"):
            readers = [reader for reader in readers if reader != "msgspec"]
        for path in PATHS:
            for reader in readers:
                counts = []
                for script, tree in trees.values():
                    env = {**envs[path], "NPU_JOB_PYTHON": python}
                    env["PYTHONPATH"] = os.pathsep.join([str(tree), site])
                    if reader == "stdlib":
                        for package in ("msgspec", "zlib_ng"):
                            env = hidden(package, tmp / "hidden", env)
                    counts.append(run_case(script, env))
                rows.append((path, reader, counts[0], counts[1]))
        bare = instructions([python, "-c", "pass"], envs["rank table"], cwd="/")
    return rows, bare


def table(rows: List[Tuple[str, str, int, int]], bare: int, nodes: int, baseline: str) -> str:
    lines = [
        f"bash bootstrap.sh at {nodes} nodes, instructions (callgrind), {baseline} against this"
        f" checkout; a bare python start is {bare / 1e6:,.1f} M",
        "",
        f"| path | reader | {baseline} | this checkout | this / {baseline} |",
        "|---|---|---|---|---|",
    ]
    for path, reader, before, after in rows:
        lines.append(
            f"| {path} | {reader} | {before / 1e6:,.1f} M | {after / 1e6:,.1f} M"
            f" | {after / before:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4096, help="the job's size (default 4096)")
    parser.add_argument("--baseline", default="e6638b1", help="the revision to compare with")
    parser.add_argument(
        "--readers",
        default=",".join(READERS),
        help="comma-separated, of msgspec and stdlib (default both)",
    )
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args()
    readers = args.readers.split(",")
    if not set(readers) <= set(READERS):
        parser.error(f"--readers: expected some of {','.join(READERS)}, got {args.readers}")
    rows, bare = measure(args.nodes, args.baseline, readers)
    publish(table(rows, bare, args.nodes, args.baseline), args.output)


if __name__ == "__main__":
    main()
