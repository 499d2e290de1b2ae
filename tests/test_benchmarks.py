"""Every benchmark still runs, on its smallest case, the way the README says to run it.

The benchmarks carry the performance targets, so a benchmark that no longer starts is a target
nobody checks. Each one runs here as a script (``python benchmarks/<name>.py``, as the README
says), in a fresh process, on a case small enough for the test suite; the test asserts that it
finished, printed its table and its verdict, and wrote the same table to ``--output``. It asserts
no speed: timing belongs to the benchmarks themselves, not to tests on a shared machine.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from npu_job.demo.podsim import unshare_unavailable_reason
from npu_job.kinds import KINDS

from tests.e2e.netns import fabric_unavailable_reason
from tests.machine_stalls import communicate

REPO = Path(__file__).resolve().parent.parent
FABRIC_REASON = fabric_unavailable_reason()
FABRIC_MARKS = [  # the emulated fabric: namespaces, bridges, tc and torch
    pytest.mark.torch,
    pytest.mark.netns,
    pytest.mark.skipif(FABRIC_REASON is not None, reason=FABRIC_REASON or ""),
]
UNSHARE = unshare_unavailable_reason()  # the demo's pods need their own mount namespaces
# seconds at an idle machine's pace (tests.machine_stalls.Cap) for one benchmark; the slowest,
# bench_bundle.py's callgrind case, takes under 40 on the idle 2-core machine
CAP = 240


def needs_commit(commit: str) -> pytest.MarkDecorator:
    """Skip a benchmark that compares with ``commit`` where the clone does not hold it."""
    missing = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"])
    return pytest.mark.skipif(
        missing.returncode != 0,
        reason=f"needs the history that holds {commit} (a clone without --depth)",
    )


CASES = [
    (
        "bench_bootstrap.py",
        ["--sizes", "64,128", "--repeat", "1"],
        ["bash bootstrap.sh", "without msgspec", "128 nodes, with msgspec against the standard"],
    ),
    (
        "bench_bootstrap_api.py",
        ["--sizes", "8,16", "--repeat", "1"],
        [
            "(fake, on loopback, all pods in one answer)",
            "bash bootstrap.sh",
            "  without msgspec ",
            "16 pods, with msgspec against the standard library's path",
        ],
    ),
    pytest.param(
        "bench_bootstrap_api.py",
        ["--sizes", "8", "--repeat", "1", "--callgrind", "--api", "pages"],
        [
            "(fake, on loopback, pages of 500)",
            "instructions (callgrind, one run each) at 8 pods; a bare start is",
            "  bash bootstrap.sh ",
            "  without msgspec ",
            "msgspec/stdlib excess ratio",
        ],
        marks=pytest.mark.skipif(not shutil.which("valgrind"), reason="needs valgrind"),
        id="bench_bootstrap_api.py-callgrind",
    ),
    (
        "bench_bootstrap_kinds.py",
        ["--pods", "16", "--repeat", "1"],
        [
            "one pod of a 16-pod job of each kind",
            "| kind | wall s | CPU s | wall vs volcano |",
            "| volcano | ",
            *(f"| {name} | " for name in KINDS),
        ],
    ),
    pytest.param(
        "bench_demo_kinds.py",
        ["--repeat", "1", "--nodes", "3", "--nproc-per-node", "1", "--kinds", "ascendjob"],
        ["npu-job demo --kind K, 3 pods x 1 workers", "| volcano | ", "| ascendjob | "],
        marks=[
            pytest.mark.torch,
            pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or ""),
        ],
        id="bench_demo_kinds.py",
    ),
    pytest.param(
        "bench_bootstrap_revisions.py",
        # one reader: each case is two bootstraps under callgrind, a minute on a loaded machine
        ["--nodes", "8", "--baseline", "e6638b1", "--readers", "stdlib"],
        [
            "bash bootstrap.sh at 8 nodes, instructions (callgrind), e6638b1 against this",
            "| rank table | stdlib | ",
            "| API | stdlib | ",
        ],
        marks=[
            pytest.mark.skipif(not shutil.which("valgrind"), reason="needs valgrind"),
            needs_commit("e6638b1"),
        ],
        id="bench_bootstrap_revisions.py",
    ),
    pytest.param(
        "bench_bundle.py",
        ["--nodes", "16", "--repeat", "1", "--callgrind"],
        [
            "bootstrap at 16 nodes",
            "| bootstrap | installed |",
            "| bootstrap | bundle |",
            "M instr.,",
            "| npu-run start-up | bundle |",
        ],
        marks=[
            pytest.mark.skipif(not shutil.which("valgrind"), reason="needs valgrind"),
            pytest.mark.torch,
        ],
        id="bench_bundle.py",
    ),
    (
        "bench_order.py",
        ["--max-nodes", "16", "--samples", "2"],
        ["violations (ours worse than scheduler on a metric, or above the ring bound): 0"],
    ),
    (
        "bench_plan_scaling.py",
        ["--sizes", "64,256", "--repeat", "1"],
        [
            "growth exp",
            "ring: time per n*log2(n) ",
            "from 64 to 256 nodes",
            "rhd: time per n*log2(n) ",
        ],
    ),
    (
        "bench_round_plan.py",
        ["--sizes", "64,128", "--repeat", "1"],
        [
            "| ring | 64 | ",
            "| rhd | 128 | ",
            "| nodes | report median | report max | round plan | plan per node |",
        ],
    ),
    pytest.param(  # 2 node processes, one trial of each variant (and one untimed): ~30 s
        "bench_round_rendezvous.py",
        ["--nodes", "2", "--repeat", "1"],
        [
            "| nodes | round | parallel re-planned s | parallel unknown s | ratio ",
            *(f"| 2 | {number} | " for number in (0, 1)),
            "| nodes | ToRs | re-planned: report + claim | plan |",
            "or its pod index (unknown nodes): yes",
        ],
        marks=pytest.mark.torch,
    ),
    pytest.param(
        "bench_rendezvous.py",
        ["--cases", "2x2", "--repeat", "1", "--gloo-peers", "2"],
        ["| 2x2 | 4 | flat |", "| 2x2 | 4 | tiered |", "Projection to 16384 ranks"],
        marks=pytest.mark.torch,
    ),
    pytest.param(
        "bench_large_values.py",
        ["--sizes", "8", "--repeat", "1"],
        ["| MiB | direct s | relay s | proxy s |", "| 8 | "],
        marks=pytest.mark.torch,
    ),
    pytest.param(
        "bench_proxy_exactness.py",
        ["--cases", "2"],  # the one without sleeps of its own (5 s where all three take 30)
        ["| case | straight to the root | through the proxy | same |", "| 2: six ADDs behind"],
        marks=pytest.mark.torch,
    ),
    pytest.param(
        "bench_faults.py",
        [
            "--faults",
            "root-kill",
            "--launchers",
            "npu-run",
            "--keep-alive",
            "1x3",
            "--cap",
            "30",
            "--beat-nodes",
            "64",
            "--beat-interval",
            "1",
            "--beat-seconds",
            "2",
            "--repeat",
            "2",
        ],
        [
            "| root-kill | npu-run |",
            "## Heartbeat cost (64 nodes",
            "| SIGKILL of the agent to its worker's death |",
        ],
        marks=pytest.mark.torch,
    ),
    # the emulated fabric: namespaces, bridges, tc and 6 torch processes (about half a minute)
    pytest.param(
        "bench_fabric.py",
        ["--shapes", "6x3", "--rounds", "1", "--size", "256KiB"],
        [
            "| 6x3 | ring | planned | 3 (3) |",
            "6x3 ring: planned at the ring lower bound: yes",
            "gloo all_reduce in the planned order is a ring: yes",
            "never slower",
        ],
        marks=FABRIC_MARKS,
    ),
    # npu-run with --probe off against the commit before it: 2 loopback agents, 2 jobs a side
    pytest.param(
        "bench_probe_off.py",
        ["--nodes", "2", "--repeat", "1"],
        [
            "2 agents on loopback",
            "against 1f0c215 (before --probe)",
            "| baseline | ",
            "| this / baseline | ",
        ],
        marks=[
            pytest.mark.torch,
            needs_commit("1f0c215"),
        ],
        id="bench_probe_off.py",
    ),
    # npu-run --probe on the fabric: 3 namespaces, a job without the probe and one with it
    pytest.param(
        "bench_probe.py",
        ["--shapes", "3x2", "--budget", "60"],
        [
            "| 3x2 | 3 | 1048576 | ",
            "| shape | nodes | probe s | job s with --probe | job s without | difference s |",
        ],
        marks=FABRIC_MARKS,
    ),
]


@pytest.mark.parametrize(
    "script, arguments, expected", CASES, ids=lambda value: value if isinstance(value, str) else ""
)
def test_benchmark_runs_and_writes_its_table(tmp_path, script, arguments, expected):
    output = tmp_path / "table.txt"
    temporary = tmp_path / "tmp"  # the benchmark's temporary files, git worktrees among them
    temporary.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / script), *arguments, "--output", str(output)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temporary)},
        start_new_session=True,  # a cap reached kills its children too (valgrind, servers)
    )
    try:
        stdout, stderr = communicate(process, CAP)
    finally:
        left = worktrees_under(temporary)
        for worktree in left:  # a benchmark killed before its own cleanup
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", worktree])
    assert process.returncode == 0, stderr[-2000:]
    assert left == [], "the benchmark left git worktrees behind"
    for text in expected:
        assert text in stdout, f"{text!r} missing from:\n{stdout}"
    assert output.read_text() == stdout
    if script in (
        "bench_fabric.py",
        "bench_probe.py",
    ):  # its namespaces (named by its pid) are gone
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"npjfab{process.pid}-" not in listed
    if script == "bench_fabric.py":
        assert "| yes |" in stdout and "| NO |" not in stdout  # the allreduce results were exact


def worktrees_under(directory: Path) -> List[str]:
    """The repository's git worktrees inside ``directory``."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = [
        line[len("worktree ") :] for line in listed.splitlines() if line.startswith("worktree ")
    ]
    return [path for path in paths if Path(path).resolve().is_relative_to(directory.resolve())]
