"""Simulated hosts for end-to-end tests: one Linux network namespace per pod on a shared bridge.

Each host gets its own IP on a private bridge (addresses from 198.18.0.0/15, the range RFC 2544
reserves for network benchmarks, so they never collide with a real network), its own
``/etc/hosts`` (``ip netns exec`` bind-mounts ``/etc/netns/<ns>/hosts``, which is how the pod DNS
names of Volcano's ``svc`` plugin become resolvable) and a private ``/tmp`` (a mount namespace per
process), so the pod command's ``/tmp/RANK_AFTER_ACC`` is per pod, as in a real cluster.

Needs root and ``ip`` (iproute2). Everything created is removed on exit, and :func:`leftovers`
lets a test assert that.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from npu_job.demo.podsim import kill_process_groups, software_under_tmp

NETNS_ETC = Path("/etc/netns")  # `ip netns exec NAME` bind-mounts NETNS_ETC/NAME/* over /etc/*


def private_tmp_shell(private_dir: str) -> str:
    """Shell (for a fresh mount namespace) that makes ``private_dir`` the process's /tmp.

    The rule of :func:`npu_job.demo.podsim.software_under_tmp`, for processes whose mounts are set
    up with ``mount`` instead of podsim's ``enter_pod``: this machine's software under /tmp is
    bound read-only into ``private_dir`` at the same relative paths first, then ``private_dir``
    replaces /tmp.
    """
    steps = []
    for path in software_under_tmp():
        inside = shlex.quote(private_dir + path[len("/tmp") :])
        steps.append(f"mkdir -p {inside} && mount --bind -o ro {shlex.quote(path)} {inside}")
    steps.append(f"mount --rbind {shlex.quote(private_dir)} /tmp")
    return " && ".join(steps)


def delete_network_namespace(name: str, timeout: float = 5.0) -> None:
    """SIGKILL every process left in network namespace ``name``, wait (at most ``timeout``
    seconds) until none is, then delete the namespace and its ``/etc/netns/NAME`` files."""

    def pids() -> List[str]:
        listed = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30
        )
        return listed.stdout.split()

    deadline = time.monotonic() + timeout
    left = pids()
    while left:
        for pid in left:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
        left = pids()
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def netns_unavailable_reason() -> Optional[str]:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = f"npujob-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def fabric_unavailable_reason() -> Optional[str]:
    """Why ``benchmarks/bench_fabric.py`` cannot build its emulated fabric here (namespaces, and
    iproute2's ``tc`` and ``ss``), or None when it can."""
    if shutil.which("tc") is None or shutil.which("ss") is None:
        return "needs tc and ss (iproute2)"
    return netns_unavailable_reason()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Host:
    """One simulated host: its namespace, address and private /tmp directory."""

    index: int
    namespace: str
    ip: str
    tmp_dir: Path


class NetnsCluster:
    """``n`` hosts on one bridge; a context manager that tears everything down on exit.

    ``hostnames`` maps extra names (the pod DNS names) to host indexes; every host's
    ``/etc/hosts`` resolves all of them.
    """

    def __init__(
        self, n: int, *, hostnames: Optional[Mapping[str, int]] = None, tag: str = ""
    ) -> None:
        self.tag = tag or f"{os.getpid() % 100000}"
        self.bridge = f"npjbr{self.tag}"[:15]
        self.subnet_prefix = f"198.18.{os.getpid() % 250 + 1}"
        self.hostnames = dict(hostnames or {})
        self._root = Path(tempfile.mkdtemp(prefix="npujob-netns-"))
        self.hosts: List[Host] = [
            Host(
                i,
                f"npujob-{self.tag}-{i}",
                f"{self.subnet_prefix}.{i + 10}",
                self._root / f"tmp{i}",
            )
            for i in range(n)
        ]
        self._processes: List[subprocess.Popen] = []

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> NetnsCluster:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        # A veth whose peer namespace is still pinned elsewhere (e.g. a mount namespace that copied
        # /run/netns while an earlier run was up) outlives that run; clear our names first.
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for host in self.hosts:
            subprocess.run(["ip", "link", "del", self._veth(host)], capture_output=True)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet_prefix}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        hosts_text = "127.0.0.1 localhost\n" + "".join(
            f"{self.hosts[index].ip} {name}\n" for name, index in sorted(self.hostnames.items())
        )
        for host in self.hosts:
            host.tmp_dir.mkdir(parents=True)
            host.tmp_dir.chmod(0o1777)
            veth = self._veth(host)
            _ip("netns", "add", host.namespace)
            _ip(
                "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.namespace
            )
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            etc = NETNS_ETC / host.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_text + f"{host.ip} {host.namespace}\n")

    def _veth(self, host: Host) -> str:
        return f"npjv{self.tag}x{host.index}"[:15]

    def close(self) -> None:
        """Kill every process started here, then remove namespaces, bridge and files."""
        kill_process_groups(self._processes)
        for host in self.hosts:
            delete_network_namespace(host.namespace)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self._root, ignore_errors=True)

    # -- running ---------------------------------------------------------------------------
    def prefix(self, index: int) -> List[str]:
        """Words that run a command on host ``index`` (its network namespace, nothing else)."""
        return ["ip", "netns", "exec", self.hosts[index].namespace]

    def popen(
        self,
        index: int,
        argv: Sequence[str],
        *,
        env: Optional[Dict[str, str]] = None,
        **kwargs: object,
    ) -> subprocess.Popen:
        """Start ``argv`` on host ``index`` with a private /tmp, in its own process group.

        This Python and npu-job's own directories stay visible when they live under /tmp (see
        :func:`private_tmp_shell`): they are bound into the private directory at
        the same relative paths before it replaces /tmp.
        """
        host = self.hosts[index]
        wrapped = [
            "ip",
            "netns",
            "exec",
            host.namespace,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            private_tmp_shell(str(host.tmp_dir)) + ' && exec "$@"',
            "pod",
            *argv,
        ]
        process = subprocess.Popen(wrapped, env=env, start_new_session=True, **kwargs)  # type: ignore[arg-type]
        self._processes.append(process)
        return process


def leftovers(tag: str) -> List[str]:
    """Namespaces and links whose names carry ``tag`` (empty after a clean teardown)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found = [line.split()[0] for line in names.splitlines() if f"npujob-{tag}-" in line]
    found += [line.split(":")[1].strip() for line in links.splitlines() if f"npjbr{tag}" in line]
    return found
