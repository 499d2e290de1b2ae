"""A client that leaves its replies unread: which store servers stall everyone else behind it.

torch's classic store server answers every client from one thread with blocking sends, so a
client that stops reading a large reply (a frozen worker in the middle of a big GET) holds every
other client past its timeout, until it reads or its connection closes. This is what
docs/launcher.md and ``--enable_tiered_parallel_tcpstore --help`` promise about flat mode on
torch before 2.4 (whose workers' store is that server): the stall on the classic server is real,
torch's libuv server (the workers' store from 2.4) answers the others, and so does a store proxy
in front of a classic server (tiered mode), because it reads every reply its root sends.

The non-reading client is a raw socket that pipelines GETs of an 8 MiB value (more than the
kernel's socket buffers hold) and never reads; the other client is a stock torch ``TCPStore``.
"""

from __future__ import annotations

import datetime
import socket
import struct
import threading
import time
from typing import Iterator, List

import pytest
from npu_job.launcher import torchcompat
from npu_job.launcher.protocol import Op, Request
from npu_job.launcher.rendezvous.rootstore import host_store
from npu_job.launcher.storeclient import RawStoreClient

from tests.launcher.proxy_support import LOOPBACK, ProxyProcess, classic_root, tcp_store
from tests.launcher.rootsocket import root_listen_socket

torch_dist = pytest.importorskip("torch.distributed")

BIG = 8 << 20  # the largest value torch's libuv server takes
UNREAD_GETS = 8  # 64 MiB of replies: more than a socket's buffers hold on either side
OTHER_TIMEOUT = 1.0  # the answering client's store timeout, in seconds
STALLED_FOR = 3 * OTHER_TIMEOUT  # still unanswered this long: stalled past its timeout


def _unread_bytes(sock: socket.socket) -> int:
    import fcntl
    import termios

    return struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"))[0]


class NonReader:
    """A raw client that pipelines GETs of a big value and never reads their replies."""

    def __init__(self, port: int) -> None:
        self.client = RawStoreClient(LOOPBACK, port, dialect=torchcompat.store_dialect())

    def ask_and_never_read(self, key: str) -> None:
        self.client.send(*[Request(Op.GET, keys=(b"/" + key.encode(),))] * UNREAD_GETS)
        # the server has started on them once the first reply's bytes arrive
        deadline = time.monotonic() + 10
        while _unread_bytes(self.client.sock) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _unread_bytes(self.client.sock) > 0, "the server never started replying"

    def close(self) -> None:
        self.client.close()


class Asking:
    """``store.get(key)`` in a thread (torch's client releases the GIL while it waits)."""

    def __init__(self, store: object, key: str) -> None:
        self.result: List[object] = []
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._get, args=(store, key), daemon=True)
        self.thread.start()

    def _get(self, store: object, key: str) -> None:
        try:
            self.result.append(store.get(key))  # type: ignore[attr-defined]
        except Exception as error:  # torch's timeout error type differs between releases
            self.result.append(error)

    def answered_within(self, seconds: float) -> bool:
        self.thread.join(max(0.0, self.started + seconds - time.monotonic()))
        return not self.thread.is_alive()


def _client(port: int) -> object:
    return tcp_store(port, timeout=OTHER_TIMEOUT)


def _seed(port: int) -> None:
    writer = tcp_store(port)
    writer.set("big", b"x" * BIG)
    writer.set("small", b"ok")


@pytest.fixture
def non_reader() -> Iterator[List[NonReader]]:
    made: List[NonReader] = []
    yield made
    for client in made:
        client.close()


def test_the_classic_server_stalls_every_client_behind_one_that_does_not_read(non_reader):
    root = classic_root()
    _seed(root.port)
    other = _client(root.port)  # connected first: the stalled server accepts no one either
    non_reader.append(NonReader(root.port))
    non_reader[0].ask_and_never_read("big")
    asking = Asking(other, "small")
    assert not asking.answered_within(STALLED_FOR), (
        f"the classic server answered within {STALLED_FOR:g}s: {asking.result}"
    )
    non_reader.pop().close()  # the server's blocked send fails, and it serves the others again
    assert asking.answered_within(STALLED_FOR + 10)


def test_flat_modes_workers_store_answers_the_others_from_torch_2_4(non_reader, monkeypatch):
    """The store flat mode's workers use on this release: npu-run's root where torch has
    ``list_keys`` (2.10+), hosted on libuv (which takes its listen fd from 2.8); before that the
    store torch hosts for worker rank 0 (env://), libuv from 2.4 unless ``USE_LIBUV=0``."""
    if torchcompat.HAS_LIST_KEYS:
        store = host_store(LOOPBACK, 0, 10.0)
        assert getattr(store, "libuvBackend", False), "npu-run's root is not on libuv"
        port = store.port
    else:
        sock, port = root_listen_socket(LOOPBACK)
        sock.close()
        for name, value in {
            "MASTER_ADDR": LOOPBACK,
            "MASTER_PORT": str(port),
            "RANK": "0",
            "WORLD_SIZE": "1",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("USE_LIBUV", raising=False)
        store, _, _ = next(torch_dist.rendezvous("env://", timeout=datetime.timedelta(seconds=10)))
        if not getattr(store, "libuvBackend", False):
            pytest.skip("this torch hosts env:// stores on the classic server (torch before 2.4)")
    _seed(port)
    other = _client(port)
    non_reader.append(NonReader(port))
    non_reader[0].ask_and_never_read("big")
    asking = Asking(other, "small")
    assert asking.answered_within(OTHER_TIMEOUT)
    assert asking.result == [b"ok"]


def test_a_proxy_in_front_of_the_classic_server_answers_the_others(non_reader):
    root = classic_root()
    _seed(root.port)
    with ProxyProcess(root.port) as proxy, ProxyProcess(root.port) as other_node:
        same_node, next_node = _client(proxy.port), _client(other_node.port)
        non_reader.append(NonReader(proxy.port))
        non_reader[0].ask_and_never_read("big")
        asking = [Asking(same_node, "small"), Asking(next_node, "small")]
        assert [a.answered_within(OTHER_TIMEOUT) for a in asking] == [True, True]
        assert [a.result for a in asking] == [[b"ok"], [b"ok"]]
