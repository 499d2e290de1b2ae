"""Hosting and finding the root store: pod index 0 binds it, the others wait for it and check it.

The root's host is the agent of the scheduler's pod index 0
(:attr:`.config.ParallelSettings.hosts_root`), whose address stays the same when other pods are
replaced; node ranks are the root's plan of each round and may put that pod anywhere.

* **Hosting** (pod index 0, :func:`host_root`): a stock torch ``TCPStore`` server on
  ``master_addr:master_port``, multi-tenant, no worker barrier, listening on an IPv4 socket of its
  own when the master address is IPv4 (:func:`ipv4_listen_fd`). A port still held by the previous
  run of this job (its root's host lingers up to ``close_timeout``) is tried again for a while.
* **Identity**: the root says who it is (:func:`root_identity`: a random id, its pid, pod, host
  and its agent's member number) under the run's ``root`` key; each agent's client checks it on
  every new connection, so nobody carries on against a root that replaced the one it joined
  (:mod:`.rootclient`).
* **Finding it** (the other nodes): a quiet TCP probe until it listens
  (:func:`await_root_listening`), then trust it only once it says it is npu-run's root of this
  run (:func:`verify_root`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import uuid
from typing import List, Optional, Tuple

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousTimeoutError,
)

from npu_job.errors import LaunchError
from npu_job.polling import Backoff, Every, poll_until

from .. import torchcompat
from ..torchcompat import StoreError
from . import verdict
from .config import ParallelSettings
from .rootclient import RootClient, RootError, RootSilent
from .verdict import Identity

logger = logging.getLogger(__name__)

BIND_GRACE = 2.0  # on top of close_timeout: how long the root's host retries a busy root port
PROGRESS_INTERVAL = 30.0


ROOT_LISTEN_BACKLOG = 16384  # the kernel caps it at net.core.somaxconn


def ipv4_listen_fd(master_addr: str, port: int) -> Optional[int]:
    """A listening IPv4 socket (as an fd for ``TCPStore(master_listen_fd=...)``), or None.

    ``port`` 0 picks a free port.

    The stock store server reverse-resolves every accepted peer. On its default dual-stack
    listener an IPv4 peer shows up as ``::ffff:a.b.c.d``, which /etc/hosts never answers, so each
    accept costs a DNS query (seconds with a slow resolver). When the master address is
    IPv4 the root listens on IPv4 instead, on every interface as the stock server does; for IPv6
    or unresolvable names the stock listener is kept (None).
    """
    try:
        families = {
            info[0] for info in socket.getaddrinfo(master_addr, port, type=socket.SOCK_STREAM)
        }
    except OSError:
        return None
    if families != {socket.AF_INET}:
        return None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))
        sock.listen(ROOT_LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def host_store(host: str, port: int, timeout: float) -> TCPStore:
    """A stock ``TCPStore`` server on ``port`` (0: a free one), IPv4-only for an IPv4 ``host``."""
    listen_fd = ipv4_listen_fd(host, port)
    if listen_fd is not None and port == 0:  # torch wants the port the fd is bound to
        with socket.socket(fileno=os.dup(listen_fd)) as bound:
            port = int(bound.getsockname()[1])
    return torchcompat.host_tcpstore(host, port, timeout, listen_fd)


def free_port_near(master_addr: str) -> int:
    """A port that is free now on every interface of this host, in ``master_addr``'s family."""
    try:
        family = socket.getaddrinfo(master_addr, 0, type=socket.SOCK_STREAM)[0][0]
    except OSError:
        family = socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        return int(probe.getsockname()[1])


def _port_in_use(error: BaseException) -> bool:
    """``error`` says the port is taken (a reason to retry while a finishing run lets go)."""
    if isinstance(error, OSError):
        return error.errno == errno.EADDRINUSE
    text = str(error).lower()
    return "eaddrinuse" in text or "address already in use" in text


class _HostingFailed(Exception):
    """Hosting the root failed for a reason that retrying will not change."""


def host_root(settings: ParallelSettings) -> TCPStore:
    """Start the root store server; retry while the port is still held by a finishing run.

    After a pod restart, the previous root host's agent of this job may still hold the port
    for up to ``close_timeout`` (it waits for the other agents to sign off); a port held
    longer than that belongs to something else and is reported.
    """
    servers: List[TCPStore] = []
    errors: List[BaseException] = []

    def bound() -> bool:
        try:
            servers.append(
                host_store(settings.master_addr, settings.master_port, settings.store_timeout)
            )
            return True
        except (StoreError, RuntimeError, OSError) as error:
            if not _port_in_use(error):
                raise _HostingFailed(error) from None
            errors[:] = [error]
            return False

    try:
        busy = Backoff.exponential(0.1, 1.0)
        hosted = poll_until(bound, settings.close_timeout + BIND_GRACE, busy)
    except _HostingFailed as failed:
        raise LaunchError(
            f"pod index 0 (the root's host) cannot host the root store on {settings.root}: "
            f"{failed.args[0]}"
        ) from None
    if not hosted:
        raise LaunchError(
            f"pod index 0 (the root's host) cannot host the root store on port "
            f"{settings.master_port}: {errors[-1]}",
            tip="pick a free --master_port, or stop the process that holds it",
        ) from None
    logger.info("hosting the root store on %s", settings.root)
    return servers[0]


def root_identity(who: Identity, member: int) -> str:
    """What the root says it is: a new random id, this process, ``who`` and the member number of
    its host's agent (JSON)."""
    return json.dumps(
        {
            "root_id": uuid.uuid4().hex,
            "pid": os.getpid(),
            "member": member,
            **json.loads(who.to_json()),
        },
        sort_keys=True,
    )


def open_client(settings: ParallelSettings) -> RootClient:
    """A deadline-bound client of the root (:mod:`.rootclient`), as every agent talks to it."""
    return RootClient(
        settings.master_addr,
        settings.master_port,
        timeout=settings.store_timeout,
        call_timeout=settings.call_timeout,
        dialect=torchcompat.store_dialect(),
    )


def await_root_listening(settings: ParallelSettings) -> None:
    """Wait (quietly, with progress lines) until pod index 0's root store accepts connections.

    TCPStore's own connect loop logs a C++ stack trace per retry; a plain TCP connect probe
    keeps the pod log readable while pod index 0 is still starting.
    """
    last_error: List[OSError] = []

    def listening() -> bool:
        try:
            with socket.create_connection((settings.master_addr, settings.master_port), timeout=5):
                return True
        except OSError as error:
            last_error[:] = [error]
            return False

    progress = Every(
        PROGRESS_INTERVAL,
        lambda _elapsed: logger.info(
            "still waiting for the root store of pod index 0 at %s (%s)",
            settings.root,
            last_error[-1],
        ),
    )
    waiting = Backoff.exponential(0.05, 1.0)
    if not poll_until(listening, settings.join_timeout, waiting, tick=progress):
        raise RendezvousTimeoutError(
            f"node rank {settings.node_rank} timed out after {settings.join_timeout:g}s "
            f"waiting for the root store {settings.root} (missing its host, pod index 0; "
            f"last error: {last_error[-1] if last_error else 'none'})"
        )


def verify_root(settings: ParallelSettings, client: RootClient, key: str) -> Tuple[Identity, int]:
    """Trust the root only once it says it is npu-run's root of this run (its identity key);
    its host and its host's member number (-1 if it does not say).

    A program squatting on the port (accepts, never answers) or a store of another job is
    refused naming the address, within the liveness window, instead of hanging.
    """
    wait = min(settings.liveness.window, settings.join_timeout)
    try:
        if not poll_until(lambda: client.check([key]), wait, Backoff.fixed(0.1)):
            raise RendezvousConnectionError(
                f"node rank {settings.node_rank}: {settings.root} answers as a store but "
                f"is not npu-run's root of run {settings.run_id!r} (no {key} after "
                f"{wait:g}s): the store of another job, or another program on --master_port"
            )
        identity = bytes(client.get(key))
    except RootSilent:
        client.close()
        raise RendezvousConnectionError(
            f"node rank {settings.node_rank}: the process at {settings.root} accepts "
            f"connections but did not answer as a store within {client.call_timeout:g}s: not "
            "npu-run's root store (does another program hold --master_port?)"
        ) from None
    except RootError as error:
        client.close()
        raise RendezvousConnectionError(
            f"node rank {settings.node_rank} cannot use the root store {settings.root}: {error}"
        ) from None
    client.expect_identity(key, identity)
    try:
        text = identity.decode()
        member = json.loads(text).get("member", -1)
        return Identity.from_json(text), member if isinstance(member, int) else -1
    except (ValueError, AttributeError):
        return verdict.UNKNOWN, -1


def literal_ip(host: str, port: int) -> str:
    """``host`` as a literal IP address (one forward lookup; never a reverse one)."""
    try:
        return str(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as error:
        raise RendezvousConnectionError(
            f"cannot resolve the root store host {host!r}: {error}"
        ) from None


def this_node(local_address: Optional[str]) -> Identity:
    """This pod's name (its host name, as Volcano's svc plugin sets it) and its host's address."""
    host = os.environ.get("MA_CURRENT_HOST_IP") or local_address or "?"
    return Identity(pod=socket.gethostname(), host=host)


def own_address(master_addr: str) -> Optional[str]:
    """The address this host reaches ``master_addr`` from (the root's host: its own), or None."""
    try:
        family, _, _, _, address = socket.getaddrinfo(master_addr, 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)  # UDP: picks a route, sends nothing
            return str(probe.getsockname()[0])
    except OSError:
        return None
