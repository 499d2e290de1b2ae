"""Test helpers for the store proxy: a proxy in its own process, root-side connection counts.

The proxy runs in a child process (``python -m npu_job.launcher.proxy``) because some torch
client calls (``list_keys``, ``queue_len``, ``queue_pop``) hold the GIL while they block on the
socket: a proxy thread in the test process would starve. Roots are stock ``TCPStore`` servers.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from typing import Mapping, Optional, Sequence

import pytest

from .rootsocket import root_listen_socket

LOOPBACK = "127.0.0.1"

#: The proxy's event loops, as test parameters. The standard library's is marked
#: ``standard_loop``: the loop is the proxy's own code, alike under every torch release, so the
#: torch matrix (noxfile.py) runs only uvloop, which the launcher extra installs and the proxy
#: then runs on, and leaves the standard loop to the main suite.
LOOPS = (
    pytest.param("asyncio", marks=pytest.mark.standard_loop),
    pytest.param(
        "uvloop",
        marks=pytest.mark.skipif(
            find_spec("uvloop") is None, reason="uvloop is not installed (an optional accelerator)"
        ),
    ),
)


def tcp_store(port: int, *, master: bool = False, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    """A torch TCPStore client, or (``master=True``) a root listening on 127.0.0.1 only.

    A root on torch's default dual-stack listener sees peers as ``::ffff:127.0.0.1`` and reverse
    resolves each through the DNS server (traffic off the machine, milliseconds per accept); the
    IPv4 listener from :func:`root_listen_socket` resolves them through /etc/hosts.
    """
    import torch.distributed as dist

    if master:
        from npu_job.launcher.torchcompat import host_tcpstore  # libuv of 2.4-2.7 takes no fd

        assert port == 0, "roots take a free port below the ephemeral range"
        sock, port = root_listen_socket(LOOPBACK)
        return host_tcpstore(LOOPBACK, port, timeout, sock.detach())
    return dist.TCPStore(
        LOOPBACK,
        port,
        is_master=False,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )


def classic_root():  # type: ignore[no-untyped-def]
    """A root on torch's classic store server, whatever server this torch hosts by default.

    The classic server is the only one on torch 2.1 and the one a listen fd gets on 2.4-2.7; it
    differs from the libuv one (the default since 2.4) in what it drops a connection for (a GET
    or MULTI_GET of a missing key) and in which writes wake a WAIT. ``use_libuv=False`` asks for
    it where ``TCPStore`` takes that parameter (still on 2.13); before that parameter the classic
    server is the only one.
    """
    import torch.distributed as dist

    sock, port = root_listen_socket(LOOPBACK)
    fd = sock.detach()
    common = dict(wait_for_workers=False, multi_tenant=True, master_listen_fd=fd)
    timeout = datetime.timedelta(seconds=5)
    try:
        root = dist.TCPStore(LOOPBACK, port, None, True, timeout, use_libuv=False, **common)
    except TypeError:  # no use_libuv parameter: before it, the classic server is the only one
        root = dist.TCPStore(LOOPBACK, port, None, True, timeout, **common)
    if getattr(root, "libuvBackend", False):  # a release that dropped the classic server
        import pytest

        pytest.skip("this torch hosts no classic store server")
    return root


class ProxyProcess:
    """``python -m npu_job.launcher.proxy`` as a child; ``stats()`` asks it for its counters."""

    def __init__(
        self,
        upstream_port: int,
        *,
        timeout: float = 10.0,
        wait_connections: int = 2,
        loop: str = "auto",
        python: str = sys.executable,
        dialect: str = "torch",
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> None:
        """``loop``: the proxy's event loop (``NPU_JOB_PROXY_LOOP``: auto, asyncio or uvloop);
        ``python``, ``dialect``, ``env`` (instead of this process's environment) and ``cwd``:
        another interpreter and install, which need not have torch with ``dialect="newest"``."""
        self.proc = subprocess.Popen(
            [
                python,
                "-m",
                "npu_job.launcher.proxy",
                f"{LOOPBACK}:{upstream_port}",
                "--timeout",
                str(timeout),
                "--wait-connections",
                str(wait_connections),
                "--dialect",
                dialect,
            ],  # "torch": the installed torch's store protocol, as npu-run runs it
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**(os.environ if env is None else env), "NPU_JOB_PROXY_LOOP": loop},
            cwd=cwd,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"proxy exited with {self.proc.wait()}")
        self.port: int = json.loads(line)["port"]

    def stats(self) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.resume()
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        return self.proc.returncode

    def __enter__(self) -> ProxyProcess:  # noqa: PYI034 - typing.Self needs 3.11 or typing_extensions
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class CuttableRelay:
    """A TCP relay in front of a root, as a network path that can break: ``hold()`` makes the
    bytes clients send on the connections open now go nowhere, ``cut()`` closes those
    connections (both ways, a FIN each); connections made afterwards are relayed whole.

    ``gates``: the ``k``-th connection accepted (0-based) is relayed only once ``gates[k]`` is
    set (None, or beyond the list: at once), so a test can order when the proxy's connections
    to the root come up; ``accepted`` counts the connections accepted so far. ``reply_delay``
    (seconds, settable at any time) holds each chunk the root sends back that long: a slow
    path, along which a request's answer comes late. ``stalled`` (settable at any time) stops
    reading what clients send, as a root that reads nothing: their writes back up."""

    def __init__(self, upstream_port: int, gates: Sequence[Optional[threading.Event]] = ()) -> None:
        self._upstream_port = upstream_port
        self._gates = list(gates)
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list = []  # [client side, root side], the connections open now
        self._held: set = set()  # client sides whose bytes go nowhere
        self.accepted = 0
        self.reply_delay = 0.0
        self.stalled = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return
            gate = self._gates[self.accepted] if self.accepted < len(self._gates) else None
            self.accepted += 1
            threading.Thread(target=self._relay, args=(near, gate), daemon=True).start()

    def _relay(self, near: socket.socket, gate: Optional[threading.Event]) -> None:
        if gate is not None:
            gate.wait()
        far = socket.create_connection((LOOPBACK, self._upstream_port))
        with self._lock:
            self._pairs.append((near, far))
        for source, sink in ((near, far), (far, near)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source, sink) -> None:  # type: ignore[no-untyped-def]
        from_root = source.getpeername()[1] == self._upstream_port
        while True:
            while self.stalled and not from_root:
                time.sleep(0.01)
            try:
                data = source.recv(1 << 16)
                if not data:
                    break
                if from_root and self.reply_delay:
                    time.sleep(self.reply_delay)
                if source not in self._held:
                    sink.sendall(data)
            except OSError:
                break
        self._close(source, sink)

    @staticmethod
    def _close(*sockets) -> None:  # type: ignore[no-untyped-def]
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def hold(self) -> None:
        with self._lock:
            self._held.update(near for near, _ in self._pairs)

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for near, far in pairs:
            self._close(near, far)

    def close(self) -> None:
        self._listener.close()
        self.cut()
