"""The fabric benchmark's edges: it cleans up after Ctrl-C, and it refuses to start without root.

(A whole small run, its table, its exact allreduce results and that it leaves no namespace
behind is bench_fabric's case in tests/test_benchmarks.py.)
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.netns import fabric_unavailable_reason
from tests.machine_stalls import Cap

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fabric.py"
REASON = fabric_unavailable_reason()
AS_NOBODY = (
    None
    if os.geteuid() == 0 and shutil.which("setpriv")
    else "needs root and setpriv (util-linux) to run the benchmark as nobody"
)


def _ours(pid: int) -> list:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"npjfab{pid}-")]


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT at its default in the child, so that Python turns it into KeyboardInterrupt: a
    suite started in the background of a non-interactive shell (`.ci/run &`) inherits it ignored,
    and Python then leaves it ignored (the benchmark ran on through a Ctrl-C, as nohup asks)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.netns
@pytest.mark.torch
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_ctrl_c_while_measuring_removes_every_namespace_process_and_file(tmp_path):
    process = subprocess.Popen(
        [sys.executable, str(BENCH), "--shapes", "6x3", "--rounds", "50", "--size", "256KiB"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    seen = []
    try:
        cap = Cap(180)
        while not cap.reached():
            line = process.stderr.readline()
            seen.append(line)
            if "round 1/50 done" in line or not line:
                break
        assert "round 1/50 done" in seen[-1], "".join(seen)
        made = _ours(process.pid)
        assert len(made) == 7  # six nodes and the switches
        workers = [
            pid
            for name in made
            for pid in subprocess.run(
                ["ip", "netns", "pids", name], capture_output=True, text=True
            ).stdout.split()
        ]
        assert len(workers) >= 6  # a torch worker in every node
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # a failed assertion: let it clean up, SIGKILL only if stuck
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 130, err
    assert "interrupted; everything it made is removed" in err
    assert _ours(process.pid) == []
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists()
    assert glob.glob(f"/etc/netns/npjfab{process.pid}-*") == []
    assert glob.glob(f"/var/tmp/npjfab{process.pid}-*") == []


@pytest.mark.skipif(AS_NOBODY is not None, reason=AS_NOBODY or "")
def test_without_root_it_says_so_and_exits_77(tmp_path):
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            str(BENCH),
            "--shapes",
            "6x3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 77, done.stderr
    assert done.stderr.strip() == (
        "bench_fabric: cannot build the emulated fabric: needs root (network namespaces,"
        " bridges and tc)"
    )
