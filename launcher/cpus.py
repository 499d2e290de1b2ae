"""How many CPUs this process may use: its CPU affinity, capped by its cgroup's CPU quota.

``--nproc_per_node=cpu`` (and ``auto`` on a node without accelerators) starts one worker per
usable CPU. ``os.sched_getaffinity`` counts every CPU of a container's host even when a quota (a
Kubernetes CPU limit, ``docker run --cpus``) lets the pod use only a few; torchrun counts
``os.cpu_count()``, which ignores the affinity too. A pod limited to 4 CPUs on a 64-CPU host
would start 64 workers that share 4 CPUs' time. The test suite sizes ``-n auto`` the same way
(the hook in ``tests/conftest.py``): on 2 CPUs, 3 xdist workers ran it slower than 2 (583 s
against 478-497 s).

The quota is read from this process's own cgroup, as ``/proc/self/cgroup`` names it, in the
kernel's documented formats: cgroup v2's ``cpu.max`` (``"<quota> <period>"`` or ``"max
<period>"``), cgroup v1's ``cpu.cfs_quota_us`` (``-1``: none) and ``cpu.cfs_period_us``. A
quota of 1.5 CPUs counts as 2. A file of another shape counts as no quota.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Tuple

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may run on, at most its cgroup's quota rounded up; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    try:
        quota = cgroup_cpu_quota(proc_cgroup, root)
    except (ValueError, ZeroDivisionError):  # a file of another shape: count without it
        quota = None
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cgroup_cpu_quota(proc_cgroup: Path, root: Path = CGROUP_ROOT) -> Optional[float]:
    """CPUs the quota of this process's cgroup allows (1.5: one and a half); None: no quota, or
    no cgroup file to read it from."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:  # v2: one unified tree
            for directory in _own_first(root, path):
                text = _read(directory / "cpu.max")
                if text is not None:
                    return quota_v2(text)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own tree
            for mount in (root / controllers, root / "cpu,cpuacct", root / "cpu"):
                for directory in _own_first(mount, path):
                    quota = _read(directory / "cpu.cfs_quota_us")
                    period = _read(directory / "cpu.cfs_period_us")
                    if quota is not None and period is not None:
                        return quota_v1(quota, period)
    return None


def _own_first(mount: Path, path: str) -> Tuple[Path, ...]:
    """The cgroup's directory under ``mount``, then the mount itself: a container without a
    cgroup namespace sees its host path in /proc/self/cgroup but its own group at the mount."""
    return (mount / path.lstrip("/"), mount)


def quota_v2(cpu_max: str) -> Optional[float]:
    """CPUs of a cgroup v2 ``cpu.max``: ``"150000 100000"`` is 1.5; ``"max 100000"`` None."""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota == "max":
        return None
    return int(quota) / int(period or "100000")


def quota_v1(cfs_quota_us: str, cfs_period_us: str) -> Optional[float]:
    """CPUs of a cgroup v1 quota and period: ``"-1"`` (no quota) is None."""
    quota = int(cfs_quota_us)
    return None if quota < 0 else quota / int(cfs_period_us)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except OSError:
        return None
