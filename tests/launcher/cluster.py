"""Test helpers: several real ``npu-run`` processes on loopback acting as the nodes of one job.

Every process a test starts carries a unique ``NPU_RUN_TEST_TAG`` in its environment, and the
workers inherit it; :meth:`LocalCluster.kill_all` finds them by that tag in ``/proc`` (workers run
in their own sessions; npu-run makes them die with their agent, but the harness does not count
on the code under test), so a failing test leaves nothing behind.
Connection counts come from ``/proc/net/tcp*`` joined with each process's socket inodes: the
same view ``ss -tnp`` gives, asserted from outside the launcher.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Union

from tests.machine_stalls import Cap, capped, wait_process
from tests.machine_stalls import wait_until as wait_for  # noqa: F401  (the launcher tests' name)

WORKERS = Path(__file__).resolve().parent / "workers"
TAG_VARIABLE = "NPU_RUN_TEST_TAG"
ESTABLISHED = "01"
LISTEN = "0A"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Nothing listens on ``port`` (no LISTEN socket in /proc/net/tcp or tcp6)."""
    return not any(state == LISTEN and local == port for _, local, _, state in _tcp_sockets())


def _tcp_sockets() -> Iterable[tuple]:
    """``(inode, local_port, remote_port, state)`` of every TCP socket on this host."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            yield int(fields[9]), local_port, remote_port, fields[3]


def _socket_inodes(pid: int) -> Set[int]:
    inodes = set()
    try:
        for entry in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(entry.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        pass
    return inodes


def _parent_of(pid: int) -> Optional[int]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(pid: int) -> List[int]:
    """``pid`` and every living process below it."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent_of(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def tagged_processes(tag: str) -> List[int]:
    """Living processes whose environment carries ``NPU_RUN_TEST_TAG=tag``."""
    needle = f"{TAG_VARIABLE}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry))
    return found


def is_probe_process(pid: int) -> bool:
    """``pid`` is one of npu-run's probe processes (its environment holds the probe's config)."""
    from npu_job.launcher.probe.worker import CONFIG_ENV

    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(item.startswith(f"{CONFIG_ENV}=".encode()) for item in environ)


def connections_to(port: int, pids: Iterable[int]) -> int:
    """Established TCP connections from ``pids`` to ``port`` (the client ends)."""
    inodes: Set[int] = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    return sum(
        1
        for inode, _, remote, state in _tcp_sockets()
        if state == ESTABLISHED and remote == port and inode in inodes
    )


def listening_ports(pid: int) -> Set[int]:
    """Ports that process ``pid`` itself listens on."""
    inodes = _socket_inodes(pid)
    return {
        local for inode, local, _, state in _tcp_sockets() if state == LISTEN and inode in inodes
    }


def training_node_argv(
    nnodes: Union[int, str],
    node_rank: int,
    master: str,
    port: int,
    rdzv_conf: str,
    out: Path,
    done: Path,
    extra: Sequence[str] = (),
) -> List[str]:
    """npu-run as one tiered node of a job of ``nnodes`` one-worker nodes that train with gloo
    (``workers/faulty.py``) until ``done`` exists: the multi-host tests' command line."""
    return [
        sys.executable,
        "-m",
        "npu_job.launcher",
        f"--nnodes={nnodes}",
        "--nproc_per_node=1",
        f"--node_rank={node_rank}",
        "--rdzv_backend=parallel",
        "--enable_tiered_parallel_tcpstore=true",
        f"--master_addr={master}",
        f"--master_port={port}",
        "--monitor_interval=0.1",
        *extra,
        f"--rdzv_conf={rdzv_conf}",
        str(WORKERS / "faulty.py"),
        str(out),
        "--hold-until",
        str(done),
    ]


@dataclass
class Node:
    node_rank_label: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: Union[float, Cap]) -> int:
        """The exit code, within ``timeout`` (a :class:`~tests.machine_stalls.Cap`'s seconds, or
        the cap itself)."""
        cap = capped(timeout)
        try:
            return wait_process(self.process, cap)
        except subprocess.TimeoutExpired as still_running:
            raise AssertionError(
                f"node {self.node_rank_label} still running after {cap}:\n{self.log()}"
            ) from still_running


@dataclass
class LocalCluster:
    """Start ``npu-run`` nodes of one job on loopback; :meth:`kill_all` in a ``finally``."""

    workdir: Path
    nnodes: int
    nproc_per_node: int = 2
    master_port: int = field(default_factory=free_port)
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    nodes: List[Node] = field(default_factory=list)
    # what runs npu-run (the bundle's tests: ``sh npu-job.pyz run``), and in which directory
    launcher: Sequence[str] = (sys.executable, "-m", "npu_job.launcher")
    cwd: Optional[Path] = None

    def start(
        self,
        node_rank: str,
        script: str,
        script_args: Sequence[str] = (),
        *,
        launcher_args: Sequence[str] = (),
        env: Optional[Mapping[str, str]] = None,
    ) -> Node:
        command = [
            *self.launcher,
            f"--nnodes={self.nnodes}",
            f"--nproc_per_node={self.nproc_per_node}",
            f"--node_rank={node_rank}",
            "--rdzv_backend=parallel",
            "--master_addr=127.0.0.1",
            f"--master_port={self.master_port}",
            "--monitor_interval=0.1",
            *launcher_args,
            str(WORKERS / script),
            *script_args,
        ]
        full_env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("PET_", "TORCHELASTIC_"))
            and key not in ("RANK_AFTER_ACC", "VC_TASK_INDEX")
        }
        full_env.update(env or {})
        full_env[TAG_VARIABLE] = self.tag
        full_env.setdefault("NPU_JOB_OUTPUT_DIR", str(self.workdir / "no-bootstrap-output"))
        full_env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5")
        log_path = self.workdir / f"npu-run-{len(self.nodes)}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=self.cwd,
                start_new_session=True,
            )
        node = Node(node_rank, process, log_path)
        self.nodes.append(node)
        return node

    def wait_all(self, timeout: Union[float, Cap]) -> List[int]:
        """Every node's exit code, within one :class:`~tests.machine_stalls.Cap` for them all."""
        return wait_exits(self.nodes, timeout)

    def logs(self) -> str:
        return "\n".join(f"--- node {n.node_rank_label} ---\n{n.log()}" for n in self.nodes)

    def kill_all(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                for pid in descendants(node.process.pid):
                    _kill(pid)
        for pid in tagged_processes(self.tag):
            _kill(pid)
        for node in self.nodes:
            try:
                node.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def wait_exits(nodes: Iterable[Node], timeout: Union[float, Cap]) -> List[int]:
    """The exit codes of ``nodes``, within one :class:`~tests.machine_stalls.Cap` for them all."""
    cap = capped(timeout)
    return [node.wait(cap) for node in nodes]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


_SYS_PIDFD_GETFD = 438  # the same number on x86-64 and arm64 (Linux 5.6+)


def shut_down_sockets(pid: int, port: int) -> int:
    """Break every socket process ``pid`` has on local ``port``: its listener stops listening and
    its connections are reset, as if that part of the process died (the process lives on).

    Takes a duplicate of each socket with pidfd_getfd(2) (root, Linux 5.6+) and calls
    shutdown(2) on it, which acts on the socket itself, not on our duplicate. Returns how many.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    inodes = {inode for inode, local, _, _ in _tcp_sockets() if local == port}
    pidfd = os.pidfd_open(pid)
    broken = 0
    try:
        for entry in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(entry.path)
            except OSError:
                continue
            if not target.startswith("socket:[") or int(target[8:-1]) not in inodes:
                continue
            fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(entry.name), 0)
            if fd < 0:
                raise OSError(ctypes.get_errno(), f"pidfd_getfd({pid}, {entry.name}) failed")
            with socket.socket(fileno=fd) as sock:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    broken += 1
                except OSError:
                    pass
    finally:
        os.close(pidfd)
    return broken
