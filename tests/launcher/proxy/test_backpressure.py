"""The store proxy under a client that does not read its replies.

Real parts only: a stock torch ``TCPStore`` root, the proxy in its own process, raw sockets for
the client that pipelines (torch's own client never has more than one request in flight). The
proxy's memory is read from ``/proc/<pid>/status`` (VmRSS).
"""

from __future__ import annotations

import threading
import time

import pytest
from npu_job.launcher import torchcompat
from npu_job.launcher.protocol import Op, Request
from npu_job.launcher.proxy.client import MAX_REPLIES_OWED, WRITE_HIGH_WATER
from npu_job.launcher.storeclient import RawStoreClient

from tests.launcher.proxy_support import LOOPBACK, LOOPS, CuttableRelay, ProxyProcess, tcp_store

pytest.importorskip("torch.distributed")
DIALECT = torchcompat.store_dialect()
VALUE = 8 << 20  # the largest value a stock root takes in one SET
MIB = 1 << 20


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_does_not_read_holds_bounded_memory_and_slows_only_itself(loop):
    """32 pipelined GETs of 8 MiB values (256 MiB of replies) from a client that reads nothing:
    the proxy holds at most its stated bound for that client (``MAX_REPLIES_OWED`` replies plus
    the write high-water mark; the rest waits in the kernel's socket buffers, as straight to the
    root), another client on the same proxy is answered as usual meanwhile, and when the slow
    client reads at last it gets every reply, whole and in order."""
    root = tcp_store(0, master=True)
    keys = [f"big{i}" for i in range(4)]
    for i, key in enumerate(keys):
        root.set(key, bytes([65 + i]) * VALUE)
    gets = [Request(Op.GET, (f"/{keys[i % len(keys)]}".encode(),)) for i in range(32)]
    with ProxyProcess(root.port, loop=loop) as proxy:
        other = RawStoreClient(LOOPBACK, proxy.port, dialect=DIALECT)
        warm = RawStoreClient(LOOPBACK, proxy.port, dialect=DIALECT)
        for request in gets[:8]:  # the allocator's first large blocks, before the baseline
            assert len(warm.call(request)) == VALUE  # type: ignore[arg-type]
        warm.close()
        baseline = rss_bytes(proxy.proc.pid)

        slow = RawStoreClient(LOOPBACK, proxy.port, dialect=DIALECT)
        slow.sock.settimeout(60)
        slow.send(*gets)
        peak, latencies = baseline, []
        stop = time.monotonic() + 3.0
        while time.monotonic() < stop:  # the slow client's replies are relayed meanwhile
            started = time.monotonic()
            assert other.call(Request(Op.ADD, (b"/n",), number=1)) == len(latencies) + 1
            latencies.append(time.monotonic() - started)
            peak = max(peak, rss_bytes(proxy.proc.pid))
            time.sleep(0.02)

        bound = WRITE_HIGH_WATER + MAX_REPLIES_OWED * (VALUE + 8)
        slack = 24 * MIB  # the read buffer, a reply on its way through, allocator rounding
        assert peak - baseline <= bound + slack, (
            f"proxy RSS grew {(peak - baseline) / MIB:.0f} MiB; bound {bound / MIB:.0f} MiB"
        )
        assert max(latencies) < 1.0 and sorted(latencies)[len(latencies) // 2] < 0.1, latencies

        received: list = []

        def read_all() -> None:
            for request in gets:
                received.append(slow.receive(request))

        reader = threading.Thread(target=read_all)
        reader.start()
        reader.join(60)
        assert not reader.is_alive()
        assert len(received) == len(gets)
        for i, value in enumerate(received):
            assert value == bytes([65 + i % len(keys)]) * VALUE, f"reply {i}"
        assert other.call(Request(Op.GET, (b"/n",))) == str(len(latencies)).encode()
        slow.close()
        other.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_writes_to_a_root_that_reads_nothing_wait_in_the_clients_sockets_not_in_the_proxy(loop):
    """A client pipelines 128 SETs of 1 MiB while the path to the root reads nothing: the proxy
    stops taking requests once its connection to the root holds its high-water mark, so they
    wait in the client's socket buffers (as straight to a stalled root) and the proxy's memory
    stays flat; once the root reads again, every SET arrives and other clients go on."""
    root = tcp_store(0, master=True)
    relay = CuttableRelay(root.port)
    value = b"v" * MIB
    with ProxyProcess(relay.port, loop=loop) as proxy:
        writer = RawStoreClient(LOOPBACK, proxy.port, dialect=DIALECT)
        writer.call(Request(Op.SET, (b"/warm",), (value,)))  # the allocator's first large blocks
        assert writer.call(Request(Op.GET, (b"/warm",))) == value
        baseline = rss_bytes(proxy.proc.pid)
        relay.stalled = True
        sets = [Request(Op.SET, (b"/s%d" % i,), (value,)) for i in range(128)]
        sender = threading.Thread(target=writer.send, args=sets)
        sender.start()
        peak = baseline
        stop = time.monotonic() + 3.0
        while time.monotonic() < stop:
            peak = max(peak, rss_bytes(proxy.proc.pid))
            time.sleep(0.02)
        relay.stalled = False
        sender.join(60)
        assert not sender.is_alive()
        # without the pause: 124-129 MiB (the SETs the proxy read, queued for the root)
        assert peak - baseline < 32 * MIB, f"proxy RSS grew {(peak - baseline) / MIB:.0f} MiB"
        assert writer.call(Request(Op.GET, (b"/s127",))) == value  # after its SETs, in order
        assert root.num_keys() >= 129  # every one of them arrived
        other = RawStoreClient(LOOPBACK, proxy.port, dialect=DIALECT)
        assert other.call(Request(Op.GET, (b"/s0",))) == value
    relay.close()
