"""The emulated fabric on this machine (the I/O edge of bench_fabric.py): network namespaces as
nodes, Linux bridges as ToR, spine and core switches, veth pairs as links, ``tc`` (HTB) shaping
every link so that the links, not the CPUs, set the pace.

All switches live in one namespace of their own (``<prefix>-sw``), never connected to the
machine's own network: the only traffic is between the fabric's own namespaces, and interface
names inside it cannot collide with anyone else's. Every name starts with ``npjfab<pid>``, so
concurrent runs (and the end-to-end tests' ``npujob-`` namespaces) never meet; namespaces of a
run whose process is gone are removed by the next run (:func:`remove_stale`).

Needs root, ``ip`` and ``tc`` (iproute2), ``ss`` and ``unshare`` (util-linux).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from _fabric_model import Link, Shape, Socket, link_tx_bytes, parse_ss
from npu_job.demo.podsim import kill_process_groups

# Network namespaces are made and removed as the end-to-end tests' harness does it
# (tests/e2e/netns.py); the repository's root makes it importable when this runs as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.e2e.netns import NETNS_ETC, delete_network_namespace, private_tmp_shell  # noqa: E402

PREFIX = "npjfab"
COMMAND_TIMEOUT = 30.0  # seconds for any one ip/tc/ss command
WORKSPACES = Path("/var/tmp")  # not /tmp: a pod gets a private /tmp
_OURS = re.compile(rf"^{PREFIX}(\d+)-")


def unavailable_reason() -> Optional[str]:
    """Why the fabric cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, bridges and tc)"
    missing = [tool for tool in ("ip", "tc", "ss", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (iproute2, util-linux)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=COMMAND_TIMEOUT)
    return None


def begin(program: str, log: Callable[[str], None]) -> bool:
    """A benchmark's start on the fabric: False (having said why on stderr) where it cannot be
    built; else what runs that are gone left is removed, and SIGTERM and SIGHUP raise
    KeyboardInterrupt, so that the benchmark cleans up as on Ctrl-C."""
    reason = unavailable_reason()
    if reason is not None:
        print(f"{program}: cannot build the emulated fabric: {reason}", file=sys.stderr)
        return False
    for stale in remove_stale():
        log(f"removed {stale}, left by a run that is gone")

    def terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    return True


def run(*argv: str, timeout: float = COMMAND_TIMEOUT) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def batch(tool: str, namespace: Optional[str], lines: Sequence[str]) -> None:
    """Run ``lines`` through one ``ip -batch`` or ``tc -batch`` (in ``namespace``); stops at the
    first failing line and says which."""
    argv = [tool, *(["-n", namespace] if namespace else []), "-batch", "-"]
    done = subprocess.run(
        argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def our_namespaces(pid: Optional[int] = None) -> List[str]:
    """Namespaces made by bench_fabric (by the process ``pid`` when given)."""
    listed = run("ip", "netns", "list")
    names = [line.split()[0] for line in listed.splitlines() if line.strip()]
    return [
        name
        for name in names
        if _OURS.match(name) and (pid is None or int(_OURS.match(name)[1]) == pid)
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> List[str]:
    """Remove what earlier runs whose process is gone left (a run killed with SIGKILL cannot
    clean up): their namespaces, ``/etc/netns`` files and workspaces; their names."""
    stale = []
    for name in our_namespaces():
        if not _alive(int(_OURS.match(name)[1])):
            delete_network_namespace(name)
            stale.append(name)
    for parent in (NETNS_ETC, WORKSPACES):
        for path in sorted(parent.glob(f"{PREFIX}*")):
            match = _OURS.match(path.name)
            if match and not _alive(int(match[1])):
                shutil.rmtree(path, ignore_errors=True)
                stale.append(str(path))
    return stale


def pod_ip(pod: int) -> str:
    return f"198.18.{pod // 200}.{pod % 200 + 10}"


class Fabric:
    """The namespaces, bridges and shaped links of one shape; a context manager that removes
    everything it made (processes first) on exit, also on errors and Ctrl-C."""

    def __init__(
        self,
        shape: Shape,
        tor_of_pod: Sequence[int],
        rate_mbit: float,
        *,
        mtu: int = 9000,
        congestion: str = "reno",
        queue_ms: float = 20.0,
    ) -> None:
        self.shape = shape
        self.tor_of_pod = tuple(tor_of_pod)
        self.rate_mbit = rate_mbit
        self.mtu = mtu
        self.congestion = congestion
        self.queue_bytes = max(8 * mtu, int(rate_mbit * 1e6 / 8 * queue_ms / 1000))
        self.prefix = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.prefix}-sw"
        self.nodes = [f"{self.prefix}-n{pod}" for pod in range(shape.nodes)]
        self.processes: List[subprocess.Popen] = []
        self._made: List[str] = []

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Fabric:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _shaping(self, device: str, mbit: float) -> List[str]:
        """``tc`` lines: HTB at ``mbit`` on the device's egress, a short byte-limited FIFO queue."""
        burst = max(2 * self.mtu, int(mbit * 1e6 / 8 / 1000))  # about 1 ms at the rate
        return [
            f"qdisc add dev {device} root handle 1: htb default 1",
            f"class add dev {device} parent 1: classid 1:1 htb rate {mbit}mbit ceil {mbit}mbit"
            f" burst {burst} cburst {burst} quantum {self.mtu + 100}",
            f"qdisc add dev {device} parent 1:1 handle 10: bfifo limit {self.queue_bytes}",
        ]

    def _build(self) -> None:
        """Few processes on a busy machine: one ``ip -batch``/``tc -batch`` per namespace."""
        shape, mtu = self.shape, self.mtu
        self._made = [self.switch, *self.nodes]  # close() removes whatever of these exists
        batch("ip", None, [f"netns add {name}" for name in self._made])
        for name in self._made:
            run(
                "ip",
                "netns",
                "exec",
                name,
                "sysctl",
                "-qw",
                f"net.ipv4.tcp_congestion_control={self.congestion}",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            )
        links = ["link set lo up"]
        shaping: List[str] = []
        bridges = [
            "core",
            *(f"spine{g}" for g in range(shape.spines)),
            *(f"tor{t}" for t in range(shape.tors)),
        ]
        for bridge in bridges:
            links += [
                f"link add {bridge} type bridge stp_state 0",
                f"link set {bridge} mtu {mtu} up",
            ]

        def wire(upper_bridge: str, upper: str, lower_bridge: str, lower: str, mbit: float) -> None:
            # ``lower`` (on the lower bridge) sends up, ``upper`` sends down; both shaped
            links.extend(
                [
                    f"link add {lower} mtu {mtu} type veth peer name {upper} mtu {mtu}",
                    f"link set {lower} master {lower_bridge} up",
                    f"link set {upper} master {upper_bridge} up",
                ]
            )
            shaping.extend(self._shaping(lower, mbit) + self._shaping(upper, mbit))

        for spine in range(shape.spines):
            mbit = self.rate_mbit * shape.tors_under_spine(spine) / shape.oversubscription
            wire("core", f"s{spine}d", f"spine{spine}", f"s{spine}u", mbit)
        for tor in range(shape.tors):
            above = f"spine{shape.spine_of_tor(tor)}" if shape.spines else "core"
            wire(above, f"t{tor}d", f"tor{tor}", f"t{tor}u", self.rate_mbit)
        for pod, name in enumerate(self.nodes):
            links += [
                f"link add n{pod} mtu {mtu} type veth peer name eth0 mtu {mtu} netns {name}",
                f"link set n{pod} master tor{self.tor_of_pod[pod]} up",
            ]
            shaping += self._shaping(f"n{pod}", self.rate_mbit)
        batch("ip", self.switch, links)
        batch("tc", self.switch, shaping)
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{pod_ip(pod)} {name}\n" for pod, name in enumerate(self.nodes)
        )
        for pod, name in enumerate(self.nodes):
            etc = NETNS_ETC / name  # names resolve from files: no DNS lookup leaves the fabric
            etc.mkdir(parents=True, exist_ok=True)
            # this machine's name too, as the node's own address (torch looks it up)
            (etc / "hosts").write_text(hosts + f"{pod_ip(pod)} {socket.gethostname()}\n")
            (etc / "resolv.conf").write_text("options timeout:1 attempts:1\n")
            batch(
                "ip",
                name,
                ["link set lo up", f"addr add {pod_ip(pod)}/16 dev eth0", "link set eth0 up"],
            )
            batch("tc", name, self._shaping("eth0", self.rate_mbit))

    def close(self) -> None:
        """Kill every process started here, then remove every namespace (and so every bridge and
        link) and the ``/etc/netns`` files. Safe to call twice."""
        kill_process_groups(self.processes)
        for name in reversed(self._made):
            delete_network_namespace(name)
        self._made.clear()

    # -- running -------------------------------------------------------------------------------
    def popen(
        self,
        pod: int,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        private_tmp: Optional[Path] = None,
        **kwargs: object,
    ) -> subprocess.Popen:
        """Start ``argv`` in pod ``pod``'s namespace (own process group); with ``private_tmp``,
        in a mount namespace where that directory is /tmp (a pod's own /tmp)."""
        wrapped = ["ip", "netns", "exec", self.nodes[pod]]
        if private_tmp is not None:
            wrapped += [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                private_tmp_shell(str(private_tmp)) + ' && exec "$@"',
                "pod",
            ]
        process = subprocess.Popen(
            [*wrapped, *argv], env=dict(env), start_new_session=True, **kwargs
        )  # type: ignore[arg-type]
        self.processes.append(process)
        return process

    def uplink_bytes(self) -> Dict[Link, int]:
        """Bytes sent so far on every link above the ToRs (the veth end that sends that way)."""
        sent = link_tx_bytes(run("ip", "-n", self.switch, "-j", "-s", "link", "show"))
        counters: Dict[Link, int] = {}
        for tor in range(self.shape.tors):
            counters[("tor-up", tor)] = sent[f"t{tor}u"]
            counters[("tor-down", tor)] = sent[f"t{tor}d"]
        for spine in range(self.shape.spines):
            counters[("spine-up", spine)] = sent[f"s{spine}u"]
            counters[("spine-down", spine)] = sent[f"s{spine}d"]
        return counters

    def sockets(self, pod: int) -> Sequence[Socket]:
        return parse_ss(
            run("ip", "netns", "exec", self.nodes[pod], "ss", "-tinH", "state", "established")
        )
