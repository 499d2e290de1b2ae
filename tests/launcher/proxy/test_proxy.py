"""The store proxy, specified against a real torch ``TCPStore`` root and real torch clients.

Clients are unmodified ``torch.distributed.TCPStore(..., is_master=False)`` objects (or the raw
client where a test needs several requests to arrive at once). The proxy runs as a child process
(``ProxyProcess``) except where the in-process ``StoreProxy`` API itself is under test.
Coalescing tests freeze the proxy with SIGSTOP, send the requests, and let it go: the requests
then arrive together, so the merge is deterministic.
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from npu_job.launcher import torchcompat
from npu_job.launcher.protocol import NEWEST, Op, Request, WaitReply, encode_request
from npu_job.launcher.proxy.server import DEFAULT_WAIT_CONNECTIONS, AsyncStoreProxy
from npu_job.launcher.proxy.storeproxy import StoreProxy, new_event_loop
from npu_job.launcher.proxy.upstream import Upstream, UpstreamLost
from npu_job.launcher.storeclient import RawStoreClient

from tests.launcher.cluster import connections_to
from tests.launcher.proxy_support import (
    LOOPBACK,
    LOOPS,
    CuttableRelay,
    ProxyProcess,
    tcp_store,
)
from tests.launcher.torch_features import needs, store_errors
from tests.machine_stalls import Cap, communicate

torch_dist = pytest.importorskip("torch.distributed")
REPO = Path(__file__).resolve().parents[3]
DIALECT = torchcompat.store_dialect()  # the installed torch's, as npu-run's proxies speak it
TIMEOUT = "(?i)timeout"  # torch's wording of a timed-out wait varies between releases


def raw_client(port: int) -> RawStoreClient:
    return RawStoreClient(LOOPBACK, port, dialect=DIALECT)


@pytest.fixture
def root():
    store = tcp_store(0, master=True)
    yield store
    del store


@pytest.fixture
def proxy(root):
    """A proxy whose main and wait connections are open. A wait that arrives while they are still
    opening gets an extra connection, so tests that count root connections start here."""
    with ProxyProcess(root.port) as process:
        assert wait_until(lambda: process.stats()["upstream_open"] == 1 + DEFAULT_WAIT_CONNECTIONS)
        yield process


def wait_until(predicate, timeout=10.0, interval=0.02):
    """Whether ``predicate()`` came true within a cap of ``timeout`` at the machine's pace."""
    cap = Cap(timeout)
    while not cap.reached():
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def test_every_opcode_a_stock_client_sends_works_through_the_proxy(root, proxy):
    s = tcp_store(proxy.port)
    s.set("k", "v")
    assert s.get("k") == b"v"
    assert root.get("k") == b"v"  # keys pass through unchanged, with torch's "/" prefix
    assert [s.add("n", 3), s.add("n", 4)] == [3, 7]
    if hasattr(s, "check"):  # torch 2.1's Python store has none
        assert s.check(["k", "n"]) and not s.check(["k", "missing"])
    assert s.compare_set("k", "v", "w") == b"w"
    assert s.compare_set("k", "nope", "x") == b"w"
    s.append("k", "!")
    s.multi_set(["a", "b"], ["1", "2"])
    assert s.multi_get(["k", "a", "b"]) == [b"w!", b"1", b"2"]
    assert s.num_keys() == root.num_keys()
    if torchcompat.HAS_LIST_KEYS:
        assert sorted(s.list_keys()) == ["a", "b", "k", "n"]
    assert s.delete_key("a") and not s.delete_key("a")
    if torchcompat.HAS_QUEUES:
        s.queue_push("q", "x")
        s.queue_push("q", "y")
        assert s.queue_len("q") == 2
        assert [s.queue_pop("q"), s.queue_pop("q", block=False)] == [b"x", b"y"]
        with pytest.raises(torch_dist.QueueEmptyError):
            s.queue_pop("q", block=False)
    s.wait(["k", "b"])
    if not torchcompat.HAS_BARRIER:
        return
    s.barrier("solo", 1)
    other = tcp_store(proxy.port)
    worker = threading.Thread(target=other.barrier, args=("pair", 2))
    worker.start()
    s.barrier("pair", 2)
    worker.join(10)
    assert not worker.is_alive()


def test_wait_timeout_cancels_upstream_and_the_connection_stays_usable(root, proxy):
    s = tcp_store(proxy.port)
    started = time.monotonic()
    with pytest.raises(store_errors(), match=TIMEOUT):
        s.wait(["never"], datetime.timedelta(milliseconds=300))
    assert time.monotonic() - started < 3
    cancelled = 1
    if torchcompat.HAS_BARRIER:
        with pytest.raises(store_errors(), match="barrier timeout"):
            s.barrier("half", 2, datetime.timedelta(milliseconds=300))
        cancelled += 1
    s.set("after", "1")
    assert s.get("after") == b"1"
    stats = proxy.stats()
    assert stats["upstream_by_op"]["CANCEL_WAIT"] == cancelled
    assert wait_until(lambda: proxy.stats()["waits_active"] == 0)
    root.set("never", "now")  # a stale upstream wake-up must not reach the client
    s.wait(["never"])
    assert s.get("never") == b"now"


def test_identical_concurrent_waits_share_one_upstream_wait(root, proxy):
    clients = [tcp_store(proxy.port) for _ in range(6)]
    before = proxy.stats()["upstream_by_op"].get("WAIT", 0)
    done = []
    threads = [
        threading.Thread(target=lambda c=c: (c.wait(["go"]), done.append(1))) for c in clients
    ]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: proxy.stats()["received_by_op"].get("WAIT", 0) == 6)
    root.set("go", "1")
    for thread in threads:
        thread.join(10)
    assert len(done) == 6
    stats = proxy.stats()
    # one WAIT for those that arrived before it was sent, and one more, once it is answered, for
    # those that joined it later (their answer must come from a request sent after they asked)
    assert 1 <= stats["upstream_by_op"].get("WAIT", 0) - before <= 2
    assert stats["coalesced"] >= 5


def test_a_timed_out_waiter_leaves_the_others_waiting(root, proxy):
    patient, impatient = tcp_store(proxy.port), tcp_store(proxy.port)
    result = []
    thread = threading.Thread(target=lambda: (patient.wait(["late"]), result.append("woken")))
    thread.start()
    assert wait_until(lambda: proxy.stats()["received_by_op"].get("WAIT", 0) == 1)
    with pytest.raises(store_errors(), match=TIMEOUT):
        impatient.wait(["late"], datetime.timedelta(milliseconds=200))
    assert proxy.stats()["upstream_by_op"].get("CANCEL_WAIT", 0) == 0
    root.set("late", "1")
    thread.join(10)
    assert result == ["woken"]


def _grown(before: dict, after: dict, *ops: str) -> dict:
    return {op: after.get(op, 0) - before.get(op, 0) for op in ops}


@needs("queues")
def test_waiters_on_a_key_already_there_share_one_check_and_no_wait(root, proxy):
    """A WAIT on a key that is there returns at once at the root, whoever sends it, so waiters
    that find it there are answered by one CHECK: no upstream WAIT, and no QUEUE_LEN to tell a
    queue push from a write (gloo's address exchange reads keys set before they are read)."""
    root.set("addr", "10.0.0.1:29500")
    root.get("addr")
    clients = [raw_client(proxy.port) for _ in range(8)]
    before = proxy.stats()["upstream_by_op"]
    replies = _frozen_burst(proxy, clients, [Request(Op.WAIT, (b"/addr",))] * 8)
    assert replies == [WaitReply.STOP_WAITING] * 8
    grown = _grown(before, proxy.stats()["upstream_by_op"], "CHECK", "WAIT", "QUEUE_LEN")
    assert grown["WAIT"] == 0 and grown["QUEUE_LEN"] == 0
    assert 1 <= grown["CHECK"] <= 3  # a few when reads land in later loop turns (see GETs)


@needs("queues")
def test_waiters_on_a_missing_key_wait_upstream_after_the_check(root, proxy):
    clients = [raw_client(proxy.port) for _ in range(4)]
    before = proxy.stats()["upstream_by_op"]
    wait = Request(Op.WAIT, (b"/later",))
    for client in clients:
        client.send(wait)
    assert wait_until(
        lambda: proxy.stats()["upstream_by_op"].get("WAIT", 0) > before.get("WAIT", 0)
    )
    root.set("later", "1")
    assert [client.receive(wait) for client in clients] == [WaitReply.STOP_WAITING] * 4
    grown = _grown(before, proxy.stats()["upstream_by_op"], "CHECK", "WAIT", "QUEUE_LEN")
    assert grown["CHECK"] >= 1 and grown["WAIT"] >= 1
    assert grown["QUEUE_LEN"] == 1  # the shared wake-up may have been a push: asked once


@needs("queues")
def test_a_waiter_a_moment_behind_the_others_is_answered_with_them():
    """Workers a moment apart come back in step: a waiter that arrives while the CHECK answering
    the first one is out (here: a slow path to the root, 0.4 s each way back) is asked for once
    more, and the first waits for that answer too, so all are answered together and their next
    requests share one upstream request again."""
    root = tcp_store(0, master=True)
    root.set("addr", "10.0.0.1:29500")
    root.get("addr")
    relay = CuttableRelay(root.port)
    with ProxyProcess(relay.port) as proxy:
        assert wait_until(lambda: proxy.stats()["upstream_open"] == 1 + DEFAULT_WAIT_CONNECTIONS)
        first, *behind = [raw_client(proxy.port) for _ in range(3)]
        for client in (first, *behind):
            client.call(Request(Op.GETNUMKEYS))
        relay.reply_delay = 0.4
        wait = Request(Op.WAIT, (b"/addr",))
        first.send(wait)
        assert wait_until(lambda: proxy.stats()["upstream_by_op"].get("CHECK", 0) == 1)
        for client in behind:
            client.send(wait)
        answered = {}

        def receive(name: str, client: RawStoreClient) -> None:
            assert client.receive(wait) == WaitReply.STOP_WAITING
            answered[name] = time.monotonic()

        threads = [
            threading.Thread(target=receive, args=(name, client))
            for name, client in [
                ("first", first),
                *((f"behind{i}", c) for i, c in enumerate(behind)),
            ]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        relay.reply_delay = 0.0
        assert sorted(answered) == ["behind0", "behind1", "first"]
        spread = max(answered.values()) - min(answered.values())
        assert spread < 0.2, answered  # one slow answer apart (0.4 s) if the first went alone
        assert proxy.stats()["upstream_by_op"]["CHECK"] == 2
    relay.close()


def _frozen_burst(proxy, clients, requests):
    """Send one request per client while the proxy is stopped, so all arrive together.

    A round trip on each connection first: a connection the proxy had not accepted before the
    pause is accepted after it, and its request read one loop turn later than the others (seen
    as 3 upstream GETs instead of 1 on a loaded machine with torch 2.1's root).
    """
    for client in clients:
        client.call(Request(Op.GETNUMKEYS))
    proxy.pause()
    try:
        for client, request in zip(clients, requests):
            client.send(request)
    finally:
        proxy.resume()
    return [client.receive(request) for client, request in zip(clients, requests)]


def test_identical_concurrent_gets_become_one_upstream_get(root, proxy):
    root.set("nccl_id", "x" * 128)
    root.get("nccl_id")  # SET has no reply: make sure the root applied it before the proxy asks
    clients = [raw_client(proxy.port) for _ in range(8)]
    before = proxy.stats()["upstream_by_op"].get("GET", 0)
    replies = _frozen_burst(proxy, clients, [Request(Op.GET, (b"/nccl_id",))] * 8)
    assert replies == [b"x" * 128] * 8
    # one, or a few when clients' reads land in later loop turns than the first GET left in (a
    # loaded machine; seen: 3 of 8): a GET only joins one that is sent after it arrived
    assert proxy.stats()["upstream_by_op"]["GET"] - before <= 3


def test_concurrent_adds_merge_into_one_batch_with_distinct_serial_results(root, proxy):
    root.add("counter", 100)
    clients = [raw_client(proxy.port) for _ in range(8)]
    deltas = [1, 2, 3, 4, 5, 6, 7, 8]
    replies = _frozen_burst(
        proxy, clients, [Request(Op.ADD, (b"/counter",), number=d) for d in deltas]
    )
    assert root.add("counter", 0) == 100 + sum(deltas)
    # some serial order of the ADDs yields exactly these results
    order = sorted(zip(replies, deltas))
    running = 100
    for reply, delta in order:
        running += delta
        assert reply == running
    # the first goes alone and the rest as one batch, or two when a client's read lands after
    # the batch left (seen with torch 2.1's faster root on a loaded machine)
    assert proxy.stats()["upstream_by_op"]["ADD"] <= 3


def test_a_worker_reads_its_own_write_even_when_a_get_for_it_is_in_flight(root, proxy):
    root.set("k", "old")
    root.get("k")  # SET has no reply: without this round trip the proxy's GET may overtake it (b"")
    reader, writer = raw_client(proxy.port), raw_client(proxy.port)
    get = Request(Op.GET, (b"/k",))
    proxy.pause()
    try:
        reader.send(get)
        writer.send(Request(Op.SET, (b"/k",), (b"new",)), get)
    finally:
        proxy.resume()
    assert reader.receive(get) in (b"old", b"new")
    assert writer.receive(get) == b"new"


@pytest.mark.parametrize("clients", [4, 16], ids=["4-clients", "16-clients"])
def test_root_connections_stay_bounded_whatever_the_number_of_clients_waiting_alike(
    root, proxy, clients
):
    stores = [tcp_store(proxy.port) for _ in range(clients)]
    done = []
    threads = [
        threading.Thread(target=lambda i=i, s=s: (s.wait(["key"]), done.append(i)))
        for i, s in enumerate(stores)
    ]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: proxy.stats()["received_by_op"].get("WAIT", 0) == clients)
    assert connections_to(root.port, [proxy.proc.pid]) == 3  # main + the two of the wait pool
    root.set("key", "1")
    for thread in threads:
        thread.join(15)
    assert sorted(done) == list(range(clients))
    assert proxy.stats()["upstream_connections"] == 3


def test_distinct_waits_beyond_the_pool_get_a_connection_each_and_give_it_back(root, proxy):
    """A WAIT must be registered at the root to see a key set and deleted at once, so waits on
    distinct keys are not merged or polled: each beyond the pool of two gets an extra
    connection, closed once answered."""
    clients = 6
    workers = [raw_client(proxy.port) for _ in range(clients)]

    def wait_each(prefix: str) -> None:
        waits = [Request(Op.WAIT, (f"/{prefix}{i}".encode(),)) for i in range(clients)]
        for worker, wait in zip(workers, waits):
            worker.send(wait)
        assert wait_until(lambda: proxy.stats()["waits_active"] == clients)
        assert connections_to(root.port, [proxy.proc.pid]) == 1 + clients
        for i in range(clients):
            root.set(f"{prefix}{i}", "1")
        for worker, wait in zip(workers, waits):
            assert worker.receive(wait) == WaitReply.STOP_WAITING

    wait_each("key")
    assert wait_until(lambda: connections_to(root.port, [proxy.proc.pid]) == 3)
    wait_each("again")
    assert wait_until(lambda: connections_to(root.port, [proxy.proc.pid]) == 3)
    for worker in workers:
        worker.close()


def test_a_dead_worker_has_its_waits_dropped_and_cancelled_upstream(root, proxy):
    code = (
        "import sys, datetime, torch.distributed as d\n"
        f"s = d.TCPStore('{LOOPBACK}', {proxy.port}, is_master=False, timeout=datetime.timedelta(seconds=60))\n"
        "print('ready', flush=True)\n"
        "s.wait(['never'])\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        assert wait_until(lambda: proxy.stats()["waits_active"] == 1, timeout=30)
        worker.kill()
        worker.wait()
    finally:
        worker.kill()
        worker.stdout.close()
    assert wait_until(
        lambda: proxy.stats()["waits_active"] == 0 and proxy.stats()["clients_open"] == 0
    )
    assert proxy.stats()["upstream_by_op"]["CANCEL_WAIT"] == 1
    survivor = tcp_store(proxy.port)  # the proxy survives worker restarts
    survivor.set("x", "1")
    assert survivor.get("x") == b"1"


@pytest.mark.parametrize(
    "chunk", [5, 4099, 1 << 20], ids=["5-byte-writes", "4099-byte-writes", "one-write"]
)
def test_requests_split_across_reads_or_packed_into_one_are_answered_alike(root, proxy, chunk):
    """The proxy decodes reads in place: a request may end mid-read or span many reads (a value
    bigger than its read buffer always does), and several may arrive in one read."""
    big = bytes(range(256)) * 384  # 96 KiB: more than the proxy reads at once
    requests = [
        Request(Op.SET, (b"/split/a",), (b"1",)),
        Request(Op.SET, (b"/split/big",), (big,)),
        Request(Op.ADD, (b"/split/n",), number=5),
        Request(Op.GET, (b"/split/big",)),
        Request(Op.MULTI_GET, (b"/split/a", b"/split/big")),
        Request(Op.ADD, (b"/split/n",), number=-2),
    ]
    client = raw_client(proxy.port)
    data = b"".join(encode_request(r, DIALECT) for r in requests)
    for start in range(0, len(data), chunk):
        client.sock.sendall(data[start : start + chunk])
    assert [client.receive(r) for r in requests] == [None, None, 5, big, (b"1", big), 3]
    assert root.get("split/big") == big


def test_unknown_opcode_closes_that_client_only(root, proxy):
    bad, good = raw_client(proxy.port), tcp_store(proxy.port)
    bad.sock.sendall(b"\x63")
    bad.sock.settimeout(5)
    assert bad.sock.recv(1) == b""
    good.set("still", "fine")
    assert good.get("still") == b"fine"


ROOT_CODE = (
    "import sys, time\n"
    "from tests.launcher.proxy_support import tcp_store\n"
    "s = tcp_store(0, master=True)\n"
    "print(s.port, flush=True)\n"
    "time.sleep(600)\n"
)


DOOMED_WORKER = """
import datetime, sys, threading, time, torch.distributed as d
port = int(sys.argv[1])
waiting = d.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
idle = d.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
idle.set("a", "1")
failures, messages = [], []
def blocked():
    try:
        waiting.wait(["never"])
    except Exception as exc:
        failures.append(type(exc).__name__)
        messages.append(str(exc).replace("\\n", " "))
thread = threading.Thread(target=blocked)
thread.start()
print("waiting", flush=True)
thread.join()
try:
    idle.get("a")
except Exception as exc:
    failures.append(type(exc).__name__)
    messages.append(str(exc).replace("\\n", " "))
print(" ".join(failures), flush=True)
print(" | ".join(messages), flush=True)
"""


def test_root_death_fails_every_client_promptly_naming_the_store_address():
    root_proc = subprocess.Popen(
        [sys.executable, "-c", ROOT_CODE], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        root_port = int(root_proc.stdout.readline())
        with ProxyProcess(root_port, timeout=3) as proxy:
            worker = subprocess.Popen(
                [sys.executable, "-c", DOOMED_WORKER, str(proxy.port)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert worker.stdout.readline().strip() == "waiting"
            assert wait_until(lambda: proxy.stats()["waits_active"] == 1)
            started = time.monotonic()
            root_proc.kill()
            out, err = worker.communicate(timeout=60)
            assert time.monotonic() - started < 20
            kinds, messages = out.splitlines()[0].split(), out.splitlines()[1]
            if hasattr(torch_dist, "DistNetworkError"):
                assert kinds == ["DistNetworkError", "DistNetworkError"]
                # torch's own report (2.5+: "remote=...") names the address it talked to: the proxy's
                if "remote=" in err + messages:
                    assert f"127.0.0.1]:{proxy.port}" in err + messages, (err, messages)
            else:  # torch 2.1 raises plain RuntimeErrors that name no address
                assert kinds == ["RuntimeError", "RuntimeError"]
    finally:
        root_proc.kill()
        root_proc.wait()
        root_proc.stdout.close()


def test_in_process_store_proxy_starts_stops_idempotently_and_leaks_nothing(root):
    threads_before = set(threading.enumerate())
    proxy = StoreProxy(LOOPBACK, root.port, timeout=5, dialect=DIALECT)
    port = proxy.start()
    assert proxy.start() == port
    client = tcp_store(port)
    client.set("via", "thread")
    assert root.get("via") == b"thread"
    assert proxy.stats.client_connections == 1
    assert wait_until(lambda: proxy.stats.upstream_open == 3)
    proxy.stop()
    proxy.stop()
    assert set(threading.enumerate()) <= threads_before
    with socket.socket() as probe:
        assert probe.connect_ex((LOOPBACK, port)) != 0
    # only the root's own client is left
    assert wait_until(lambda: connections_to(root.port, [os.getpid()]) == 1)


def test_a_stopping_proxy_gives_up_reaching_its_root_at_the_next_refusal():
    """While the root refuses connections, a connection being opened retries with backoff until
    the store timeout; once the proxy is stopping, the next refusal ends it. (Stopping cancels the
    attempt, but before Python 3.12 ``asyncio.wait_for`` loses a cancellation that lands as the
    connect fails, and the retries went on: stopping took up to the timeout, ~9 s in the matrix's
    torch 2.4 runs.)"""
    with socket.socket() as unused:  # a port nothing listens on: every connect is refused
        unused.bind((LOOPBACK, 0))
        refused = unused.getsockname()[1]
    proxy = AsyncStoreProxy(LOOPBACK, refused, timeout=30, dialect=DIALECT)
    loop = new_event_loop()
    try:
        loop.run_until_complete(proxy.aclose())  # stopping: what StoreProxy.stop() awaits first
        opening = Upstream(proxy, "main").open(loop.time() + 30)
        started = time.monotonic()
        with pytest.raises(UpstreamLost, match="proxy stopping"):
            loop.run_until_complete(opening)
        assert time.monotonic() - started < 15  # not the 30 s of retries
    finally:
        loop.close()


def test_a_stopping_proxy_keeps_no_connection_it_opened_as_it_stopped(root):
    """The other side of the lost cancellation: the connect succeeds as the proxy stops. The new
    connection is closed at once, never counted as open, so stopping leaves none to the root."""
    proxy = AsyncStoreProxy(LOOPBACK, root.port, timeout=30, dialect=DIALECT)
    loop = new_event_loop()
    try:
        loop.run_until_complete(proxy.aclose())
        with pytest.raises(UpstreamLost, match="proxy stopping"):
            loop.run_until_complete(Upstream(proxy, "main").open(loop.time() + 30))
        assert proxy.upstream_open == set() and proxy.counters.upstream_connections == 0
        assert wait_until(lambda: connections_to(root.port, [os.getpid()]) == 1)  # root's own
    finally:
        loop.close()


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_the_proxy_serves_alike_on_the_standard_loop_and_on_optional_uvloop(
    root, monkeypatch, loop_kind
):
    monkeypatch.setenv("NPU_JOB_PROXY_LOOP", loop_kind)
    loop = new_event_loop()  # what StoreProxy.start() runs on
    assert type(loop).__module__.split(".")[0] == loop_kind
    loop.close()
    with StoreProxy(LOOPBACK, root.port, timeout=5, dialect=DIALECT) as proxy:
        a, b = tcp_store(proxy.port), tcp_store(proxy.port)
        waiter = threading.Thread(target=b.wait, args=(["late"],))
        waiter.start()
        assert wait_until(lambda: proxy.stats.waits_active == 1)
        a.set("late", "now")
        waiter.join(10)
        assert not waiter.is_alive()
        assert [a.add("n", 2), b.add("n", 3)] == [2, 5]
        assert b.get("late") == b"now"


def test_an_unknown_event_loop_kind_is_refused(monkeypatch):
    monkeypatch.setenv("NPU_JOB_PROXY_LOOP", "tokio")
    with pytest.raises(ValueError, match="auto, asyncio or uvloop"):
        new_event_loop()


WORKER = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(dist.get_rank(), dist.get_world_size(), int(t.item()), flush=True)
dist.destroy_process_group()
"""


def test_unmodified_init_process_group_works_through_the_proxy(root, proxy):
    world = 3
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR=LOOPBACK,
            MASTER_PORT=str(proxy.port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            TORCHELASTIC_USE_AGENT_STORE="True",
            TORCHELASTIC_RESTART_COUNT="0",
        )  # torch < 2.6 prefixes the store by it
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    outputs = []
    for proc in procs:
        out, _ = communicate(proc, 120)  # three torch imports and a gloo group: slow when busy
        assert proc.returncode == 0
        outputs.append(out.strip().splitlines()[-1].split())  # gloo of 2.9 prints lines of its own
    assert sorted(outputs) == [
        [str(r), str(world), str(sum(range(1, world + 1)))] for r in range(world)
    ]
    # gloo's ranks wait on keys of their own: beyond the pool of two, a connection each, closed
    # once answered
    assert proxy.stats()["client_connections"] == world
    assert wait_until(lambda: proxy.stats()["upstream_open"] == 3)


@needs("barrier")
def test_a_barrier_wider_than_the_wait_pool_completes_on_short_lived_extra_connections(root, proxy):
    stores = [tcp_store(proxy.port) for _ in range(4)]
    threads = [threading.Thread(target=s.barrier, args=("wide", 4)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    assert root.get("wide") == b"4"  # the barrier's counter, as the root keeps it
    assert wait_until(lambda: proxy.stats()["upstream_open"] == 3)  # the extras are closed again


@needs("barrier")
def test_extra_barrier_connections_are_closed_even_when_the_wait_pool_came_up_meanwhile(root):
    """Barriers that found no wait connection open extra ones; if the pool's connections come up
    before the extras do, the barriers still take the extras they asked for, so every extra is
    closed afterwards and the root keeps seeing main + pool (a relay orders the connections)."""
    pool, extras = threading.Event(), threading.Event()
    relay = CuttableRelay(root.port, gates=[None, pool, pool] + [extras] * 4)
    try:
        with ProxyProcess(relay.port) as proxy:
            stores = [tcp_store(proxy.port) for _ in range(4)]
            threads = [threading.Thread(target=s.barrier, args=("late-pool", 4)) for s in stores]
            for thread in threads:
                thread.start()
            # main, the pool's two, and one extra per barrier: all asked for, none up
            assert wait_until(lambda: relay.accepted == 7), relay.accepted
            pool.set()
            time.sleep(0.5)  # the pool's handshakes, through before any extra can answer
            extras.set()
            for thread in threads:
                thread.join(20)
            assert not any(thread.is_alive() for thread in threads)
            assert root.get("late-pool") == b"4"

            def open_now() -> int:
                return proxy.stats()["upstream_open"]

            assert wait_until(lambda: open_now() == 3), open_now()
    finally:
        relay.close()


@needs("barrier")
def test_an_extra_barrier_connection_is_closed_when_its_client_left_while_it_opened(root):
    """A BARRIER that found no idle wait connection opens an extra one. A client that leaves
    meanwhile is seen to go only once the extra is up (the proxy stops reading a client while
    its request waits), so the BARRIER goes out on the extra and is cancelled at once; the
    cancellation's answer closes the extra, and the root is left with main + pool, not one
    more connection until the proxy stops (a relay holds the connections up)."""
    held = threading.Event()
    relay = CuttableRelay(root.port, gates=[None, held, held, held])
    try:
        with ProxyProcess(relay.port) as proxy:
            leaving = raw_client(proxy.port)
            leaving.send(Request(Op.BARRIER, (b"/left",), number=2))
            # main, the pool's two and the barrier's extra: all asked for, only main up
            assert wait_until(lambda: relay.accepted == 4), relay.accepted
            leaving.sock.close()
            time.sleep(0.3)  # the close reaches the proxy before the extra is up
            held.set()

            def open_now() -> int:
                return proxy.stats()["upstream_open"]

            assert wait_until(lambda: open_now() == 3), open_now()
            time.sleep(0.5)  # and it stays at main + pool: the extra is not merely late
            assert open_now() == 3
            store = tcp_store(proxy.port)  # the proxy serves on, the pool's connections too
            store.set("after", "ok")
            assert store.get("after") == b"ok"
    finally:
        relay.close()


def _opcodes_this_torch_lacks() -> list:
    """Bytes a client of the newest torch could send that the installed torch's store does not
    know: each missing op under its newest number, and a byte no release uses."""
    lacking = [NEWEST.opcodes[op] for op in Op if op not in DIALECT]
    return [byte for byte in lacking if DIALECT.ops_by_byte[byte] is None] + [0x63]


@pytest.mark.parametrize("byte", _opcodes_this_torch_lacks())
def test_an_opcode_this_torch_does_not_know_ends_that_client_cleanly_after_its_replies(
    root, proxy, byte
):
    """As a root would, the proxy stops serving the client; unlike a reset, the client first gets
    every reply it was owed, then the end of the stream, and the other clients go on."""
    bad, good = raw_client(proxy.port), tcp_store(proxy.port)
    bad.sock.settimeout(10)
    owed = Request(Op.ADD, (b"/owed",), number=5)
    bad.sock.sendall(encode_request(owed, DIALECT) + bytes([byte]) + b"\x00" * 64)
    assert bad.receive(owed) == 5
    assert bad.sock.recv(1) == b""  # end of stream: a reset would raise ConnectionResetError here
    good.set("still", "fine")
    assert good.get("still") == b"fine"


def test_a_session_of_every_request_this_torch_has_never_costs_the_proxy_its_root(root, proxy):
    """The proxy speaks the root's own dialect: no request makes the root drop a connection."""
    client = raw_client(proxy.port)
    session = [
        Request(Op.SET, (b"/s/a",), (b"1",)),
        Request(Op.GET, (b"/s/a",)),
        Request(Op.ADD, (b"/s/n",), number=2),
        Request(Op.CHECK, (b"/s/a", b"/s/n")),
        Request(Op.COMPARE_SET, (b"/s/a",), (b"1", b"2")),
        Request(Op.GETNUMKEYS),
        Request(Op.APPEND, (b"/s/a",), (b"!",)),
        Request(Op.MULTI_SET, (b"/s/b", b"/s/c"), (b"x", b"y")),
        Request(Op.MULTI_GET, (b"/s/a", b"/s/b")),
        Request(Op.WAIT, (b"/s/c",)),
        Request(Op.DELETE_KEY, (b"/s/c",)),
        Request(Op.PING, number=7),
        Request(Op.QUEUE_PUSH, (b"/s/q",), (b"v",)),
        Request(Op.QUEUE_LEN, (b"/s/q",)),
        Request(Op.QUEUE_POP, (b"/s/q",)),
        Request(Op.LIST_KEYS),
        Request(Op.BARRIER, (b"/s/bar",), number=1),
    ]
    session = [request for request in session if request.op in DIALECT]
    for request in session:
        client.send(request)
        client.receive(request)
    stats = proxy.stats()
    assert sum(stats["upstream_by_op"].get(op.name, 0) for op in Op if op not in DIALECT) == 0
    assert stats["upstream_connections"] == 3  # main + 2 waits, never reopened
    assert root.get("s/a") == b"2!"
