"""Every difference between the torch releases npu-run supports (2.1 through 2.14), in one place.

The rest of the launcher asks this module instead of importing names that some supported release
lacks. Each answer comes from a feature of the installed torch (an attribute, a parameter, the
bytes its own store client sends), never from its version string, so a backport or a vendor build
(torch_npu's images patch torch) is judged by what it does:

==============================  =======  ===================================================
feature                         since    what npu-run does without it
==============================  =======  ===================================================
``torch.distributed.DistError``  2.2      store failures are plain ``RuntimeError``
``Store.check`` (Python)        2.2      :func:`key_exists` asks over a connection of
                                         npu-run's own (:class:`_SideChannel`)
VALIDATE opcode (store wire)    2.2      2.1 numbers SET as 0: the proxy speaks that dialect
``RendezvousInfo`` and          2.4      the agent reads ``MASTER_ADDR``/``MASTER_PORT`` from
``bootstrap_store_info``                 the rendezvous store: the handler answers those two
                                         keys with this node's address (:class:`NodeStoreView`);
                                         re-ranked c10d returns torch's tuple with the planned
                                         rank, and the agent of planned rank 0 writes its own
                                         address there (:func:`rendezvous_with_rank`)
``Store.multi_get`` (Python)    probed   :func:`get_values` asks one GET per key
libuv server takes a listen fd  2.8      the root is hosted with ``use_libuv=False``
PING opcode                     2.5      the proxy checks the root with GETNUMKEYS instead
QUEUE_* opcodes                 2.8      the proxy refuses them like the root would
``TCPStore.list_keys``          2.10     global rank 0 hosts a fresh workers' store each round,
                                         as torch's c10d backend does (no stale key to list, and
                                         no agent-store prefix by restart count, which differs
                                         between nodes before 2.6); workers get
                                         ``TORCHELASTIC_USE_AGENT_STORE=False``
BARRIER opcode                  2.12     as QUEUE_*
``torchrun.handlers`` entry     after    plain ``torchrun --rdzv_backend=parallel`` needs it;
points                          2.4      npu-run registers the backend itself
``torch.accelerator``           2.6      ``--nproc_per_node=auto`` counts CUDA GPUs (then CPUs),
                                         as torchrun did (:func:`accelerator_devices`)
==============================  =======  ===================================================

The store dialect is learned by watching the installed client talk to a socket of ours
(:func:`store_dialect`): the root and the proxies run in the agents of one image, so what that
client sends is what the root understands.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import torch.distributed as dist
from torch.distributed import TCPStore
from torch.distributed.elastic import rendezvous as elastic_rendezvous

from .protocol import (
    VALIDATION_MAGIC,
    CheckReply,
    Dialect,
    Op,
    ProtocolError,
    ReplyValue,
    Request,
    make_dialect,
)
from .storeclient import RawStoreClient

logger = logging.getLogger(__name__)

#: What a failed store call raises on this torch (``DistError`` from 2.2, ``RuntimeError`` before).
StoreError: Type[Exception] = getattr(dist, "DistError", RuntimeError)
#: What a store wait that ran out of time raises (``DistStoreError`` from 2.2).
StoreTimeoutError: Type[Exception] = getattr(dist, "DistStoreError", StoreError)

HAS_RENDEZVOUS_INFO = hasattr(elastic_rendezvous, "RendezvousInfo")
HAS_LIST_KEYS = hasattr(TCPStore, "list_keys")
HAS_QUEUES = hasattr(dist.Store, "queue_push")
HAS_BARRIER = hasattr(dist.Store, "barrier")
HAS_MULTI_GET = hasattr(dist.Store, "multi_get")


def accelerator_devices() -> Tuple[str, int]:
    """``(type, device count)`` of the accelerator ``torch.accelerator`` has available, as
    torchrun's ``--nproc_per_node=auto`` reads it; ``("", 0)`` without one, or before 2.6."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not hasattr(accelerator, "current_accelerator"):
        return "", 0
    try:
        if not accelerator.is_available():
            return "", 0
        device = accelerator.current_accelerator()
        return (str(device.type) if device is not None else ""), int(accelerator.device_count())
    except Exception as error:  # a driver that fails: as torch_npu's, no devices
        logger.warning("torch.accelerator cannot count its devices: %s", error)
        return "", 0


def has_entry_point_handlers() -> bool:
    """torch's rendezvous registry loads ``torchrun.handlers`` entry points (plain torchrun)."""
    from torch.distributed.elastic.rendezvous import registry

    return "torchrun.handlers" in inspect.getsource(registry)


# -- store calls -------------------------------------------------------------------------------

#: Where ``Store.check`` is missing (2.1), :func:`key_exists` asks over a connection of npu-run's
#: own. COMPARE_SET would answer the same question through torch's client, but 2.1's and 2.2's
#: ``compare_set`` builds its Python result with the GIL released: called while another Python
#: thread runs (the proxy's event loop, torch's agent threads) it crashes the process (seen as
#: segfaults in the matrix's 2.1 rendezvous tests, and with two threads and nothing of npu-run's
#: on 2.1 and 2.2; not on 2.4). npu-run calls no ``compare_set`` at all.
_BINDINGS_NEED_SIDE_CHANNEL = not hasattr(dist.Store, "check")


def key_exists(store: Any, key: str) -> bool:
    """``store.check([key])``, on every supported torch (2.1's ``check`` is C++ only).

    A store that says it ``answers_check`` (the agents'
    :class:`~.rendezvous.rootclient.RootClient`) is asked directly; only torch's own clients on
    2.1 need the side channel.
    """
    if not _BINDINGS_NEED_SIDE_CHANNEL or getattr(store, "answers_check", False):
        return bool(store.check([key]))
    request = Request(Op.CHECK, keys=(_wire_key(key),))
    return _side_channel(store).call(request) == CheckReply.READY


def _wire_key(key: str) -> bytes:
    # torch's TCPStore client puts "/" before every key it sends; the side channel must name the
    # keys that client names.
    return b"/" + key.encode()


class _SideChannel:
    """One raw-protocol connection to a ``TCPStore``'s server, for what its bindings cannot ask.

    It is a connection of its own, so a call here is not ordered after what the same
    ``TCPStore`` sent before it: npu-run uses it only to poll for keys other agents write. A broken
    connection is opened again once per call (the
    root may have been restarted on the same port), then the call fails with :data:`StoreError`.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._address = (host, port)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._client: Optional[RawStoreClient] = None

    def call(self, request: Request) -> ReplyValue:
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._client is None:
                        self._client = RawStoreClient(
                            *self._address, timeout=self._timeout, dialect=store_dialect()
                        )
                    return self._client.call(request)
                except (OSError, ProtocolError) as error:
                    self._drop()
                    if attempt == 2:
                        host, port = self._address
                        raise StoreError(f"store {host}:{port}: {error}") from None
            raise AssertionError("unreachable")

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


_SIDE_CHANNELS: Dict[Tuple[str, int], _SideChannel] = {}
_SIDE_CHANNELS_LOCK = threading.Lock()


def _side_channel(store: Any) -> _SideChannel:
    address = (str(store.host), int(store.port))
    with _SIDE_CHANNELS_LOCK:
        channel = _SIDE_CHANNELS.get(address)
        if channel is None:
            timeout = store.timeout.total_seconds()
            channel = _SIDE_CHANNELS[address] = _SideChannel(*address, timeout)
        return channel


# -- the rendezvous result ---------------------------------------------------------------------

MASTER_ADDR_KEY = "MASTER_ADDR"
MASTER_PORT_KEY = "MASTER_PORT"


class NodeStoreView:
    """The rendezvous store as an agent of torch < 2.4 sees it: this node's workers' store address.

    Those agents read ``MASTER_ADDR``/``MASTER_PORT`` from the rendezvous store (node rank 0 writes
    its own guess there first) and hand them to the workers. This view answers those two keys with
    the address this node chose (its proxy, or the root) and passes everything else through, so
    each node's workers reach their own proxy as they do through ``bootstrap_store_info`` on
    newer releases.
    """

    def __init__(self, store: Any, master_addr: str, master_port: int) -> None:
        self._store = store
        self._answers = {
            MASTER_ADDR_KEY: master_addr.encode(),
            MASTER_PORT_KEY: str(master_port).encode(),
        }

    def get(self, key: str) -> bytes:
        answer = self._answers.get(key)
        return answer if answer is not None else self._store.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def rendezvous_result(
    store: Any, rank: int, world_size: int, master_addr: str, master_port: int
) -> Any:
    """What ``next_rendezvous`` returns on this torch: ``RendezvousInfo`` or the older tuple."""
    if HAS_RENDEZVOUS_INFO:
        info = elastic_rendezvous.RendezvousInfo
        store_info = elastic_rendezvous.RendezvousStoreInfo
        return info(store, rank, world_size, store_info(master_addr, master_port))
    return NodeStoreView(store, master_addr, master_port), rank, world_size


def rendezvous_parts(result: Any) -> Tuple[Any, int, int, Optional[Any]]:
    """``(store, rank, world_size, bootstrap_store_info)`` of what a torch handler's
    ``next_rendezvous`` returned (``RendezvousInfo`` from 2.4, a tuple before: info None)."""
    if HAS_RENDEZVOUS_INFO and isinstance(result, elastic_rendezvous.RendezvousInfo):
        return result.store, result.rank, result.world_size, result.bootstrap_store_info
    store, rank, world_size = result
    return store, int(rank), int(world_size), None


def store_info(master_addr: str, master_port: int) -> Any:
    """A ``RendezvousStoreInfo`` (torch 2.4+ only: older agents never read one)."""
    return elastic_rendezvous.RendezvousStoreInfo(master_addr, master_port)


def rendezvous_with_rank(store: Any, rank: int, world_size: int, info: Any) -> Any:
    """What ``next_rendezvous`` returns with another ``rank``: ``RendezvousInfo`` with ``info``,
    or before 2.4 the plain tuple, whose agent of rank 0 publishes ``MASTER_ADDR``/``PORT``
    itself (its ``--local_addr`` or host name and a free port, where its global rank 0 hosts the
    workers' store), so they follow the new rank."""
    if HAS_RENDEZVOUS_INFO:
        return elastic_rendezvous.RendezvousInfo(store, rank, world_size, info)
    return store, rank, world_size


def get_values(store: Any, keys: Sequence[str]) -> List[bytes]:
    """The values of ``keys`` (all set already): one MULTI_GET where the bindings have it."""
    if HAS_MULTI_GET:
        return [bytes(value) for value in store.multi_get(list(keys))]
    return [bytes(store.get(key)) for key in keys]


# -- hosting the root store --------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _accepts(parameter: str) -> bool:
    doc = dist.TCPStore.__init__.__doc__ or ""
    return f"{parameter}:" in doc


def host_tcpstore(host: str, port: int, timeout: float, listen_fd: Optional[int]) -> TCPStore:
    """A stock ``TCPStore`` server (multi-tenant, no worker barrier) on ``port`` or ``listen_fd``.

    The libuv server of torch 2.4-2.7 refuses a listen fd ("does not support initialization with
    an listen fd"); there the classic server takes it. That is safe for the root: before 2.10
    only the agents use it (workers use global rank 0's store), and they read every reply,
    whereas the classic server stalls all its clients behind one that stops reading. Passing
    the port instead would bring back the reverse lookup of every peer the fd avoids.
    ``listen_fd`` is closed when hosting fails, so a retry never meets our own socket.
    """
    delta = datetime.timedelta(seconds=timeout)
    common = dict(wait_for_workers=False, multi_tenant=True)
    if listen_fd is None:
        return TCPStore(host, port, None, True, delta, **common)
    try:
        try:
            return TCPStore(host, port, None, True, delta, master_listen_fd=listen_fd, **common)
        except (StoreError, RuntimeError) as error:
            if not _refuses_listen_fds(error) or not _accepts("use_libuv"):
                raise
            logger.debug(
                "this torch's libuv store server takes no listen fd: hosting the classic one"
            )
            return TCPStore(
                host, port, None, True, delta, master_listen_fd=listen_fd, use_libuv=False, **common
            )
    except BaseException:
        _close_fd(listen_fd)
        raise


def _refuses_listen_fds(error: BaseException) -> bool:
    # torch 2.4-2.7: "The libuv TCPStore backend does not support initialization with an listen fd"
    text = str(error)
    return "does not support" in text and "listen fd" in text


def _close_fd(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:  # torch took it over and closed it already
        pass


# -- the store's wire dialect ------------------------------------------------------------------

_PROBE_TIMEOUT = 10.0
_PROBE_KEY = "npu_run_probe"
_PROBE_ADD = 7


@dataclass(frozen=True)
class _Handshake:
    validates: bool
    pings: bool
    add_byte: int


def _serve_probe(listener: socket.socket, seen: list) -> None:
    """Answer one client as a root would, recording what it sent before its first ADD."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(_PROBE_TIMEOUT)

        def read(count: int) -> bytes:
            data = b""
            while len(data) < count:
                chunk = conn.recv(count - len(data))
                if not chunk:
                    raise ConnectionError("the probing client hung up")
                data += chunk
            return data

        validates = pings = False
        first = read(1)[0]
        if first == 0:  # VALIDATE (2.2+); 2.1 sends its ADD (byte 3) first
            magic = struct.unpack("<I", read(4))[0]
            if magic != VALIDATION_MAGIC:
                raise ConnectionError(f"unexpected first request 0 with {magic:#x}")
            validates = True
            first = read(1)[0]
            if first == Op.PING:
                pings = True
                conn.sendall(read(4))  # PING echoes its nonce
                first = read(1)[0]
        key_length = struct.unpack("<Q", read(8))[0]
        read(key_length + 8)  # the key and the i64 delta
        conn.sendall(struct.pack("<q", _PROBE_ADD))
        seen.append(_Handshake(validates, pings, first))


@functools.lru_cache(maxsize=None)
def store_dialect() -> Dialect:
    """The store protocol of the installed torch: watched on its own client, once per process."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(_PROBE_TIMEOUT)
    seen: list = []
    errors: list = []

    def serve() -> None:
        try:
            _serve_probe(listener, seen)
        except (OSError, ValueError, struct.error) as error:
            errors.append(error)

    thread = threading.Thread(target=serve, name="npu-run-store-probe", daemon=True)
    thread.start()
    try:
        client = TCPStore(
            "127.0.0.1",
            listener.getsockname()[1],
            None,
            False,
            datetime.timedelta(seconds=_PROBE_TIMEOUT),
        )
        client.add(_PROBE_KEY, 1)
        del client
    finally:
        thread.join(_PROBE_TIMEOUT)
        listener.close()
    if not seen:
        raise RuntimeError(f"could not learn this torch's store protocol: {errors or 'no answer'}")
    shake = seen[0]
    shift = int(Op.ADD) - shake.add_byte
    if shift not in (0, 1) or (shift == 1) == shake.validates:
        raise RuntimeError(
            f"unknown store protocol: ADD is {shake.add_byte}, VALIDATE {shake.validates}"
        )
    dialect = make_dialect(
        validate=shake.validates,
        ping=shake.pings,
        queues=HAS_QUEUES,
        list_keys=HAS_LIST_KEYS,
        barrier=HAS_BARRIER,
    )
    logger.debug("store protocol of this torch: %s", dialect.name)
    return dialect


def describe() -> Tuple[Tuple[str, bool], ...]:
    """The detected features, for ``npu-run --version``-like diagnostics and the test matrix."""
    return (
        ("DistError", StoreError is not RuntimeError),
        ("RendezvousInfo", HAS_RENDEZVOUS_INFO),
        ("list_keys", HAS_LIST_KEYS),
        ("queues", HAS_QUEUES),
        ("barrier", HAS_BARRIER),
        ("torchrun.handlers", has_entry_point_handlers()),
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m npu_job.launcher.torchcompat [--json]``: what npu-run found in this torch."""
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m npu_job.launcher.torchcompat", description=main.__doc__
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object (the version matrix reads it)"
    )
    args = parser.parse_args(argv)
    import torch

    features = [
        *describe(),
        ("PING", Op.PING in store_dialect()),
        ("VALIDATE", store_dialect().validates),
    ]
    if args.json:
        print(
            json.dumps(
                {
                    "torch_version": torch.__version__,
                    "features": features,
                    "dialect": store_dialect().name,
                }
            )
        )
    else:
        print(f"torch {torch.__version__}; store protocol: {store_dialect().name}")
        for name, present in features:
            print(f"  {name:<18} {'yes' if present else 'no'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
