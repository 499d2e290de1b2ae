"""The CPUs a process may use: its affinity, capped by its cgroup's CPU quota
(:mod:`npu_job.launcher.cpus`). npu-run's ``--nproc_per_node=cpu`` starts that many workers, and
the test suite's ``-n auto`` that many xdist workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from npu_job.launcher.cpus import cgroup_cpu_quota, quota_v1, quota_v2, usable_cpus

ROOT = Path(__file__).resolve().parents[2]
CPU_V1 = Path("/sys/fs/cgroup/cpu")


def test_the_kernels_quota_formats_read_as_cpus():
    assert quota_v2("150000 100000\n") == 1.5
    assert quota_v2("max 100000\n") is None
    assert quota_v1("50000\n", "100000\n") == 0.5
    assert quota_v1("-1\n", "100000\n") is None


def test_the_own_cgroup_is_read_and_a_namespaceless_container_falls_back_to_the_mount(tmp_path):
    """A file tree laid out as the kernel's cgroup mounts are (a fake: the real ones are
    read by the test below)."""
    proc = tmp_path / "cgroup"
    (tmp_path / "fs" / "job" / "a").mkdir(parents=True)
    (tmp_path / "fs" / "job" / "a" / "cpu.max").write_text("250000 100000\n")
    proc.write_text("0::/job/a\n")
    assert cgroup_cpu_quota(proc, tmp_path / "fs") == 2.5
    proc.write_text("0::/elsewhere/b\n")  # the host's path; the container's group is the mount
    (tmp_path / "fs" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(proc, tmp_path / "fs") is None
    v1 = tmp_path / "fs" / "cpu,cpuacct" / "docker" / "c1"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("12:memory:/docker/c1\n4:cpu,cpuacct:/docker/c1\n")
    assert cgroup_cpu_quota(proc, tmp_path / "fs") == 1.0
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path / "fs") is None
    (v1 / "cpu.cfs_period_us").write_text("0\n")  # a file no kernel writes: no cap, no crash
    assert usable_cpus(proc, tmp_path / "fs") == len(os.sched_getaffinity(0))


def run_under_one_cpu_of_quota(argv: List[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``argv`` in a new real cgroup (v1) whose quota is one CPU, on a machine of more."""
    if os.geteuid() != 0 or not (CPU_V1 / "cpu.cfs_quota_us").is_file():
        pytest.skip("needs root and a cgroup v1 cpu controller to make a group with a quota")
    if usable_cpus() < 2:
        pytest.skip("this process may use one CPU already: a quota of one lowers nothing")
    group = CPU_V1 / f"npujob-quota-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")
        return subprocess.run(
            ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh", *argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            env={
                **{k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_AUTO_NUM_WORKERS"},
                "PYTHONPATH": str(ROOT),
            },
        )
    finally:
        group.rmdir()


def test_a_quota_below_the_affinity_caps_the_workers_of_n_auto(tmp_path):
    """A pytest started in a group with one CPU's quota, with ``-n auto`` and this suite's hook,
    brings up one worker, not one per CPU."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_xdist_auto_num_workers  # noqa: F401\n"
    )
    (tmp_path / "test_probe.py").write_text("def test_one():\n    pass\n")
    done = run_under_one_cpu_of_quota(
        [sys.executable, "-m", "pytest", "-n", "auto", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path)],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "created: 1/1 worker\n" in done.stdout, done.stdout


def test_npu_run_counts_one_cpu_under_a_quota_of_one(tmp_path):
    """What ``--nproc_per_node=cpu`` (and ``auto`` with no accelerator) starts in a pod limited to
    one CPU: one worker, however many CPUs its host has."""
    probe = "from npu_job.launcher import devices; print(devices.probe_devices().cpu)"
    done = run_under_one_cpu_of_quota([sys.executable, "-c", probe], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "1", done.stdout
