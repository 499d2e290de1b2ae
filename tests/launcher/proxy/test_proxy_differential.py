"""Differential test: the same random operations straight to a stock TCPStore and through the proxy.

Two worlds, each with a fresh stock torch ``TCPStore`` root and three unmodified torch clients:
``direct`` (clients -> root) and ``proxied`` (clients -> proxy -> root). A seeded generator draws
a sequence of steps over every client-visible opcode (set, get, add, compare_set, check, wait,
num_keys, delete_key, append, multi_get, multi_set, list_keys, queue push/pop/len, barrier),
timed-out waits on missing or deleted keys (CANCEL_WAIT), and concurrent blocks where several
clients wait at once on shared keys (coalesced in the proxy) while another client sets them.
Each step runs in both worlds and every result, including the exception type, must be equal.
"""

from __future__ import annotations

import datetime
import random
import socket
import threading
import time
from typing import Callable

import pytest
from npu_job.launcher import torchcompat
from npu_job.launcher.protocol import VALIDATION_MAGIC, Op, Request, encode_request
from npu_job.launcher.storeclient import RawStoreClient

from tests.launcher.proxy_support import (
    LOOPBACK,
    LOOPS,
    CuttableRelay,
    ProxyProcess,
    classic_root,
    tcp_store,
)
from tests.launcher.torch_features import store_errors

torch_dist = pytest.importorskip("torch.distributed")

KEYS = ["k0", "k1", "k2", "k3"]
COUNTERS = ["c0", "c1"]
QUEUES = ["q0", "q1"]
CLIENTS = 3
# every client-visible operation the installed torch has (older releases lack some)
KINDS = [
    kind
    for kind, present in [
        ("set", True),
        ("get", True),
        ("add", True),
        ("compare_set", True),
        ("check", hasattr(torch_dist.TCPStore, "check")),
        ("wait", True),
        ("num_keys", True),
        ("delete", True),
        ("append", True),
        ("multi_get", True),
        ("multi_set", True),
        ("list_keys", torchcompat.HAS_LIST_KEYS),
        ("queue_push", torchcompat.HAS_QUEUES),
        ("queue_len", torchcompat.HAS_QUEUES),
        ("queue_pop", torchcompat.HAS_QUEUES),
        ("queue_pop_nonblock", torchcompat.HAS_QUEUES),
        ("barrier", torchcompat.HAS_BARRIER),
        ("wait_timeout", True),
        ("concurrent_waits", True),
    ]
    if present
]
SHORT = datetime.timedelta(milliseconds=150)
GET_K = Request(Op.GET, (b"/k",))


class World:
    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.clients = [tcp_store(port, timeout=3) for _ in range(CLIENTS)]


def outcome(call: Callable[[], object]) -> object:
    try:
        result = call()
    except store_errors() as exc:
        return ("raised", type(exc).__name__)
    if isinstance(result, list):  # list_keys order is the root's hash order; compare contents
        return sorted(result) if all(isinstance(r, str) for r in result) else result
    return result


Step = tuple[str, Callable[[World], object]]


def fenced(world: World, client: int, op: Callable[..., object], *args: object) -> object:
    """A no-reply op, then a round trip on the same connection: the root has applied it before
    another client's next request (even straight to the root, two connections are not ordered)."""
    result = op(*args)
    world.clients[client].add("fence", 0)
    return result


def random_steps(rng: random.Random, count: int) -> list[Step]:
    """Steps valid in any state (no ADD on non-numbers, no unbounded blocking)."""
    steps: list[Step] = []
    known = set()  # keys set so far (so a plain get never blocks on a missing key)
    queued = {q: 0 for q in QUEUES}
    for _ in range(count):
        c = rng.randrange(CLIENTS)
        key, counter, queue = rng.choice(KEYS), rng.choice(COUNTERS), rng.choice(QUEUES)
        value = rng.choice(["", "v", "w" * 5, "\x00\xff"]) + str(rng.randrange(100))
        kind = rng.choice(KINDS)
        if kind == "set":
            known.add(key)
            steps.append(
                (
                    f"{c}.set({key})",
                    lambda w, c=c, k=key, v=value: fenced(w, c, w.clients[c].set, k, v),
                )
            )
        elif kind == "get" and key in known:
            steps.append((f"{c}.get({key})", lambda w, c=c, k=key: w.clients[c].get(k)))
        elif kind == "add":
            delta = rng.randrange(-5, 10)
            steps.append(
                (
                    f"{c}.add({counter},{delta})",
                    lambda w, c=c, k=counter, d=delta: w.clients[c].add(k, d),
                )
            )
        elif kind == "compare_set":
            expected = rng.choice(["", value, "v1"])
            known.add(key) if expected == "" else None
            steps.append(
                (
                    f"{c}.compare_set({key})",
                    lambda w, c=c, k=key, e=expected, v=value: w.clients[c].compare_set(k, e, v),
                )
            )
        elif kind == "check":
            keys = rng.sample(KEYS + COUNTERS, 2)
            steps.append((f"{c}.check({keys})", lambda w, c=c, ks=keys: w.clients[c].check(ks)))
        elif kind == "wait" and key in known:
            steps.append((f"{c}.wait({key})", lambda w, c=c, k=key: w.clients[c].wait([k])))
        elif kind == "num_keys":
            steps.append((f"{c}.num_keys", lambda w, c=c: w.clients[c].num_keys()))
        elif kind == "delete":
            known.discard(key)
            steps.append(
                (f"{c}.delete_key({key})", lambda w, c=c, k=key: w.clients[c].delete_key(k))
            )
        elif kind == "append":
            known.add(key)
            steps.append(
                (
                    f"{c}.append({key})",
                    lambda w, c=c, k=key, v=value: fenced(w, c, w.clients[c].append, k, v),
                )
            )
        elif kind == "multi_get":
            present = sorted(known)[:2]
            if present:
                steps.append(
                    (
                        f"{c}.multi_get({present})",
                        lambda w, c=c, ks=present: w.clients[c].multi_get(ks),
                    )
                )
        elif kind == "multi_set":
            keys = rng.sample(KEYS, 2)
            known.update(keys)
            steps.append(
                (
                    f"{c}.multi_set({keys})",
                    lambda w, c=c, ks=keys, v=value: fenced(
                        w, c, w.clients[c].multi_set, ks, [v, v + "!"]
                    ),
                )
            )
        elif kind == "list_keys":
            steps.append((f"{c}.list_keys", lambda w, c=c: w.clients[c].list_keys()))
        elif kind == "queue_push":
            queued[queue] += 1
            steps.append(
                (
                    f"{c}.queue_push({queue})",
                    lambda w, c=c, q=queue, v=value: fenced(w, c, w.clients[c].queue_push, q, v),
                )
            )
        elif kind == "queue_len":
            steps.append(
                (f"{c}.queue_len({queue})", lambda w, c=c, q=queue: w.clients[c].queue_len(q))
            )
        elif kind == "queue_pop" and queued[queue] > 0:
            queued[queue] -= 1
            steps.append(
                (f"{c}.queue_pop({queue})", lambda w, c=c, q=queue: w.clients[c].queue_pop(q))
            )
        elif kind == "queue_pop_nonblock":
            queued[queue] = max(0, queued[queue] - 1)
            steps.append(
                (
                    f"{c}.queue_pop({queue},block=False)",
                    lambda w, c=c, q=queue: w.clients[c].queue_pop(q, block=False),
                )
            )
        elif kind == "barrier":
            name = f"b{rng.randrange(1000)}"
            steps.append(
                (f"{c}.barrier({name},1)", lambda w, c=c, b=name: w.clients[c].barrier(b, 1))
            )
        elif kind == "wait_timeout":
            missing = key if key not in known else f"missing{rng.randrange(3)}"
            steps.append(
                (
                    f"{c}.wait({missing},150ms)",
                    lambda w, c=c, k=missing: w.clients[c].wait([k], SHORT),
                )
            )
        elif kind == "concurrent_waits":
            fresh = [f"cw{len(steps)}a", f"cw{len(steps)}b"]
            known.update(fresh)
            steps.append(
                (f"concurrent_waits({fresh})", lambda w, ks=fresh: concurrent_waits(w, ks))
            )
    return steps


def concurrent_waits(world: World, keys: list[str]) -> object:
    """Clients 0 and 1 wait on the same key list, client 1 also on a key nobody sets (timeout);
    client 2 sets the keys 100 ms later. Returns each waiter's fate."""
    fates = {}

    def waiter(index: int, wait_keys: list[str], timeout: datetime.timedelta) -> None:
        fates[index] = outcome(lambda: world.clients[index].wait(wait_keys, timeout))

    threads = [
        threading.Thread(target=waiter, args=(0, keys, datetime.timedelta(seconds=5))),
        threading.Thread(
            target=waiter, args=(1, keys + ["never"], datetime.timedelta(milliseconds=400))
        ),
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.1)
    for key in keys:
        world.clients[2].set(key, "set-by-2")
    for thread in threads:
        thread.join(10)
    return sorted(fates.items())


@pytest.mark.parametrize("seed", range(4))
def test_proxy_answers_exactly_like_the_root(seed):
    direct_root = tcp_store(0, master=True)
    proxied_root = tcp_store(0, master=True)
    with ProxyProcess(proxied_root.port) as proxy:
        direct = World("direct", direct_root.port)
        proxied = World("proxied", proxy.port)
        steps = random_steps(random.Random(seed), 45)
        for index, (label, step) in enumerate(steps):
            expected = outcome(lambda step=step: step(direct))
            actual = outcome(lambda step=step: step(proxied))
            assert actual == expected, (
                f"seed {seed} step {index} {label}: proxy {actual!r} != root {expected!r}"
            )
        # the stores end up identical, key by key
        if torchcompat.HAS_LIST_KEYS:
            keys = sorted(direct.clients[0].list_keys())
            assert sorted(proxied.clients[0].list_keys()) == keys
        else:  # no listing: the keys the steps touch, present in both or in neither
            keys = [k for k in KEYS + COUNTERS if torchcompat.key_exists(direct.clients[0], k)]
            assert [
                k for k in KEYS + COUNTERS if torchcompat.key_exists(proxied.clients[0], k)
            ] == keys
        assert direct.clients[0].multi_get(keys) == proxied.clients[0].multi_get(keys)
        stats = proxy.stats()
        assert stats["upstream_connections"] <= 3


# ----------------------------------------------------------------- exactness: one case at a time
#
# Each case runs the same scripted calls straight to a stock root and through a proxy (on each
# event loop) and compares what the clients see.

needs_queues = pytest.mark.skipif(not torchcompat.HAS_QUEUES, reason="this torch has no queues")
DIALECT = torchcompat.store_dialect()


def _raw(port: int) -> RawStoreClient:
    return RawStoreClient(LOOPBACK, port, dialect=DIALECT)


def _raw_outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except OSError as exc:  # the raw client's "store closed the connection" (ConnectionError)
        return ("raised", type(exc).__name__)


ROOTS = ["default", "classic"]  # the server this torch hosts (libuv on 2.13), the classic one


def _root(kind: str):  # type: ignore[no-untyped-def]
    return classic_root() if kind == "classic" else tcp_store(0, master=True)


def _both_worlds(
    loop: str, scenario: Callable[..., object], root: str = "default"
) -> tuple[object, object]:
    """``scenario(port, root[, proxy])`` against a root directly and then through a proxy."""
    direct_root = _root(root)
    expected = scenario(direct_root.port, direct_root)
    proxied_root = _root(root)
    with ProxyProcess(proxied_root.port, loop=loop) as proxy:
        actual = scenario(proxy.port, proxied_root, proxy)
    return expected, actual


def _stale_read_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    """Case 1: a node's worker reads a key after another node's write to it was answered, while an
    earlier read of that key by a neighbour is still queued behind large replies."""
    root.set("big", "x" * (8 << 20))
    root.set("k", "old")
    root.get("k")
    loader, early, late = _raw(port), _raw(port), _raw(port)
    big = Request(Op.MULTI_GET, (b"/big",))
    loader.send(*[big] * 16)  # 128 MiB of replies ahead of everything on its upstream connection
    early.send(Request(Op.GET, (b"/k",)))
    other_node = tcp_store(root.port)  # straight to the root, as a worker of another node
    other_node.set("k", "new")
    other_node.get("k")  # answered: the write is applied at the root
    seen = late.call(Request(Op.GET, (b"/k",)))
    early_seen = early.receive(Request(Op.GET, (b"/k",)))
    for _ in range(16):
        loader.receive(big)
    return {"late": seen, "early in (old, new)": early_seen in (b"old", b"new")}


def _root_serves_others_while_a_client_lags() -> bool:
    """Whether the root this torch hosts (``host_tcpstore``) is the libuv server. The classic one
    (the only one before 2.2, the one a listen fd gets on 2.4-2.7) writes each reply with blocking
    sends on its single thread: a client that leaves 128 MiB of replies unread stalls every other
    client, so the stale-read scenario cannot run straight to it (it hangs in the direct world)."""
    return bool(getattr(tcp_store(0, master=True), "libuvBackend", False))


@pytest.mark.parametrize("loop", LOOPS)
def test_a_read_after_a_completed_remote_write_sees_it(loop):
    if not _root_serves_others_while_a_client_lags():
        pytest.skip("this torch's root is the classic server, which stalls behind a lagging client")
    expected, actual = _both_worlds(loop, _stale_read_scenario)
    assert expected == {"late": b"new", "early in (old, new)": True}
    assert actual == expected


def _partial_multi_set_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    """Case 3: a client dies after sending the first complete key/value pair of a MULTI_SET."""
    head = encode_request(Request(Op.MULTI_SET, (b"/m1", b"/m2"), (b"one", b"two")), DIALECT)
    pair1_end = 1 + 8 + (8 + 3 + 8 + 3)  # opcode, count, /m1 and its value
    sock = socket.create_connection((LOOPBACK, port))
    if DIALECT.validates:
        sock.sendall(encode_request(Request(Op.VALIDATE, number=VALIDATION_MAGIC), DIALECT))
    sock.sendall(head[: pair1_end + 5])  # and part of /m2's key
    time.sleep(0.2)
    sock.close()
    observer = tcp_store(root.port)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not torchcompat.key_exists(observer, "m1"):
        time.sleep(0.05)
    return {
        "m1": torchcompat.key_exists(observer, "m1") and observer.get("m1"),
        "m2": torchcompat.key_exists(observer, "m2"),
    }


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_dying_mid_multi_set_leaves_its_complete_pairs_as_at_the_root(loop):
    expected, actual = _both_worlds(loop, _partial_multi_set_scenario)
    assert expected == {"m1": b"one", "m2": False}
    assert actual == expected


def _bystanders_behind(
    port: int,
    root,
    proxy: ProxyProcess | None,
    culprit: Callable[[], Callable[[], object]],
    ask: Request = GET_K,
) -> object:
    """``culprit()`` sends one worker's request, then six other workers' ``ask`` (a GET of k by
    default) go right behind it (through a proxy: frozen, so that all arrive at once and share
    the upstream connection). ``culprit`` returns how to learn that worker's fate; returns every
    worker's, the bystanders' in sorted order."""
    root.set("k", "v")
    root.get("k")
    bystanders = [_raw(port) for _ in range(6)]
    for bystander in bystanders:
        bystander.call(Request(Op.GETNUMKEYS))
    if proxy is not None:
        proxy.pause()
    try:
        fate = culprit()
        time.sleep(0.1)
        for bystander in bystanders:
            bystander.send(ask)
    finally:
        if proxy is not None:
            proxy.resume()
    culprit_fate = fate()
    seen = sorted((_raw_outcome(lambda b=b: b.receive(ask)) for b in bystanders), key=repr)
    after = [
        _raw_outcome(lambda b=b: b.call(Request(Op.ADD, (b"/n",), number=1))) for b in bystanders
    ]
    return {"culprit": culprit_fate, "bystanders": seen, "their adds": sorted(after, key=repr)}


def _bad_add_scenario(
    port: int, root, proxy: ProxyProcess | None = None, ask: Request = GET_K
) -> object:
    """Case 2: one worker's ADD on a key holding "abc" (the root drops that connection) with six
    other workers' ``ask`` right behind it: only that worker fails."""
    root.set("s", "abc")
    adder = tcp_store(port)

    def culprit() -> Callable[[], object]:
        fate: list = []
        adding = threading.Thread(target=lambda: fate.append(outcome(lambda: adder.add("s", 1))))
        adding.start()
        return lambda: adding.join(30) or fate

    return _bystanders_behind(port, root, proxy, culprit, ask)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_request_the_root_drops_its_connection_for_fails_only_its_own_client(loop):
    expected, actual = _both_worlds(loop, _bad_add_scenario)
    assert expected["bystanders"] == [b"v"] * 6
    assert expected["their adds"] == [1, 2, 3, 4, 5, 6]
    assert actual == expected


def _bad_add_among_adds_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    return _bad_add_scenario(port, root, proxy, Request(Op.ADD, (b"/c",), number=1))


@pytest.mark.parametrize("loop", LOOPS)
def test_an_innocent_add_is_not_failed_for_another_workers_bad_add(loop):
    """The bystanders' ADDs to one counter arrive behind the bad ADD; through
    the proxy the first is in flight when the root drops the connection and the others wait for
    it (group commit). All of them must be answered, as at the root, not only the one in flight."""
    expected, actual = _both_worlds(loop, _bad_add_among_adds_scenario)
    assert expected["culprit"][0][0] == "raised"  # the type differs across torch releases
    assert expected["bystanders"] == [1, 2, 3, 4, 5, 6]
    assert actual == expected


def _missing_get_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    """A worker's GET of a key that is missing (its WAIT raced a DELETE), with six other workers'
    GETs right behind it. The classic root drops that worker's connection; the libuv one answers
    b""."""
    getter, missing = _raw(port), Request(Op.GET, (b"/gone",))
    getter.call(Request(Op.GETNUMKEYS))

    def culprit() -> Callable[[], object]:
        getter.send(missing)
        return lambda: _raw_outcome(lambda: getter.receive(missing))

    return _bystanders_behind(port, root, proxy, culprit)


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("loop", LOOPS)
def test_a_get_of_a_missing_key_fails_at_most_its_own_client(loop, root):
    """On the classic root the GET is a second request the root drops its connection for
    (``classic_root``: ``use_libuv=False`` on this torch): through the proxy, as straight to the
    root, only its client fails and the GETs queued behind it on the shared upstream connection
    are answered."""
    expected, actual = _both_worlds(loop, _missing_get_scenario, root)
    classic = root == "classic" or not _root_serves_others_while_a_client_lags()
    assert expected["culprit"] == (("raised", "ConnectionError") if classic else b"")
    assert expected["bystanders"] == [b"v"] * 6
    assert expected["their adds"] == [1, 2, 3, 4, 5, 6]
    assert actual == expected


def _wait_after_delete_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    """A worker waits on k while a sibling sets it (one wait group in the proxy), the sibling
    deletes k, then a worker waits on k again: it keeps waiting until its timeout. Then it waits
    once more and a third worker's compare_set on the missing k (expected value not empty: k
    stays missing) is made: the libuv root wakes that wait, the classic one does not."""
    deleter, waiter, toucher = tcp_store(port), tcp_store(port), tcp_store(port)
    fates: dict[str, object] = {}

    def wait_in_thread(name: str, seconds: float) -> threading.Thread:
        timeout = datetime.timedelta(seconds=seconds)
        thread = threading.Thread(
            target=lambda: fates.update({name: outcome(lambda: waiter.wait(["k"], timeout))})
        )
        thread.start()
        time.sleep(0.3)  # the wait is at the root (through a proxy: its upstream WAIT is sent)
        return thread

    first = wait_in_thread("before the set", 5)
    deleter.set("k", "v")
    first.join(10)
    fates["delete"] = deleter.delete_key("k")
    fates["after the delete"] = outcome(
        lambda: waiter.wait(["k"], datetime.timedelta(milliseconds=300))
    )
    touched = wait_in_thread("touched", 1.5)
    fates["compare_set"] = toucher.compare_set("k", "x", "y")
    touched.join(10)
    fates["k exists"] = torchcompat.key_exists(toucher, "k")
    return fates


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("loop", LOOPS)
def test_a_wait_after_a_siblings_delete_waits_as_at_the_root(loop, root):
    """A WAIT answered "ready" for a key a sibling deleted first is the libuv root's own doing:
    its compare_set wakes a key's waiters also when the key is missing and
    stays so. Through the proxy the WAIT answers as straight to each kind of root."""
    expected, actual = _both_worlds(loop, _wait_after_delete_scenario, root)
    timed_out = ("raised", type(_timeout_error()).__name__)
    libuv = root == "default" and _root_serves_others_while_a_client_lags()
    assert expected == {
        "before the set": None,
        "delete": 1,
        "after the delete": timed_out,
        "compare_set": b"x",
        "touched": None if libuv else timed_out,
        "k exists": False,
    }
    assert actual == expected


def _set_then_delete_beyond_the_pool_scenario(
    port: int, root, proxy: ProxyProcess | None = None
) -> object:
    """Two workers wait on keys of their own (through a proxy: both wait
    connections of its pool are busy), a third waits on k (timeout 4 s), and after 1 s another
    worker sets k and deletes it at once. The root wakes the third wait at the set."""
    busy = [tcp_store(port, timeout=10) for _ in range(2)]
    waiter, writer = tcp_store(port, timeout=4), tcp_store(port)
    fates: dict[str, object] = {}
    threads = [
        threading.Thread(target=lambda s=s, i=i: s.wait([f"never{i}"]), daemon=True)
        for i, s in enumerate(busy)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    start = time.monotonic()

    def wait() -> None:
        fates["wait"] = outcome(lambda: waiter.wait(["k"]))
        fates["woken within 2 s"] = time.monotonic() - start < 2.0

    third = threading.Thread(target=wait)
    third.start()
    time.sleep(1.0)
    writer.set("k", "v")
    fates["delete"] = writer.delete_key("k")
    third.join(10)
    writer.set("never0", "x")
    writer.set("never1", "x")
    for thread in threads:
        thread.join(10)
    return fates


@pytest.mark.parametrize("loop", LOOPS)
def test_a_wait_beyond_the_wait_pool_sees_a_key_set_and_deleted_at_once(loop):
    expected, actual = _both_worlds(loop, _set_then_delete_beyond_the_pool_scenario)
    assert expected == {"wait": None, "woken within 2 s": True, "delete": True}
    assert actual == expected


def _shared_wake_ups_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    """Four workers wait on one key, twice (a second key), that another node sets, while a fifth
    worker adds: every wait wakes at the write, and the fifth worker's requests are answered.
    Through a proxy each wake-up is shared, and on a root without queues (torch's classic server)
    the proxy's QUEUE_LEN after the first one makes the root drop its main connection once."""
    waiters, busy = [tcp_store(port) for _ in range(4)], tcp_store(port)
    other_node = tcp_store(root.port)  # its writes are none the proxy sees
    fates: dict[str, object] = {}
    for key in ("first", "second"):
        threads = [
            threading.Thread(target=lambda w=w, i=i, k=key: fates.update({f"{k}{i}": w.get(k)}))
            for i, w in enumerate(waiters)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        other_node.set(key, key)
        fates[f"busy after {key}"] = [busy.add("n", 1) for _ in range(3)]
        for thread in threads:
            thread.join(10)
    # through a proxy: a QUEUE_LEN per shared wake-up at most, and on a root without queues one
    # in all (it dropped the main connection for it, and the proxy does not ask again)
    asked = proxy.stats()["upstream_by_op"].get("QUEUE_LEN", 0) if proxy is not None else 0
    fates["asked about queues as it should"] = asked <= (2 if _has_queues(root) else 1)
    return fates


def _has_queues(root) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``root`` serves queues (the libuv server of a torch that has them)."""
    return bool(getattr(root, "libuvBackend", False)) and torchcompat.HAS_QUEUES


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("loop", LOOPS)
def test_shared_wake_ups_answer_every_waiter_on_either_root(loop, root):
    expected, actual = _both_worlds(loop, _shared_wake_ups_scenario, root)
    assert expected["first0"] == b"first" and expected["busy after second"] == [4, 5, 6]
    assert actual == expected


def _timeout_error() -> BaseException:
    """What this torch raises for a timed-out wait."""
    root = tcp_store(0, master=True)
    try:
        tcp_store(root.port).wait(["never"], datetime.timedelta(milliseconds=10))
    except store_errors() as exc:
        return exc
    raise AssertionError("a wait on a missing key returned")


def _two_poppers_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    """Case 4: two workers block in queue_pop on a queue nobody used before; one push wakes one
    of them, the other keeps waiting until a second push."""
    poppers = [tcp_store(port, timeout=10), tcp_store(port, timeout=10)]
    got: dict[int, object] = {}
    threads = [
        threading.Thread(
            target=lambda i=i: got.update({i: outcome(lambda: poppers[i].queue_pop("q"))})
        )
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # both are waiting (through a proxy: in one shared upstream WAIT)
    pusher = tcp_store(port)
    pusher.queue_push("q", "first")
    time.sleep(1.0)
    after_one_push = sorted(map(repr, got.values()))
    pusher.queue_push("q", "second")
    for thread in threads:
        thread.join(15)
    return {"after one push": after_one_push, "in the end": sorted(map(repr, got.values()))}


@needs_queues
@pytest.mark.parametrize("loop", LOOPS)
def test_one_push_wakes_one_of_two_blocked_poppers_on_a_new_queue(loop):
    expected, actual = _both_worlds(loop, _two_poppers_scenario)
    assert expected == {"after one push": ["b'first'"], "in the end": ["b'first'", "b'second'"]}
    assert actual == expected


def _write_then_wait_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    """A worker sets k (behind 64 MiB of other writes on the node's upstream connection), then
    waits on a key that exists: once that wait returns, a worker elsewhere reads its write."""
    root.set("flag", "up")
    root.set("k", "old")
    root.get("k")
    uploader, writer = _raw(port), tcp_store(port)
    uploader.send(*[Request(Op.SET, (b"/bulk%d" % i,), (b"x" * (8 << 20),)) for i in range(8)])
    writer.set("k", "new")
    writer.wait(["flag"])
    seen = tcp_store(root.port).get("k")  # another node, straight to the root
    uploader.call(Request(Op.GETNUMKEYS))
    return seen


@pytest.mark.parametrize("loop", LOOPS)
def test_a_wait_answered_after_a_write_means_the_write_is_applied(loop):
    expected, actual = _both_worlds(loop, _write_then_wait_scenario)
    assert expected == b"new"
    assert actual == expected


def _write_lost_on_a_broken_path(client_port: int, relay: CuttableRelay, root) -> object:
    """A worker's SET (no reply) leaves, the network path to the root breaks before the root has
    read it, and a new path works at once; the worker then asks whether its key exists."""
    writer = _raw(client_port)
    writer.call(Request(Op.GETNUMKEYS))  # connected all the way to the root
    relay.hold()
    writer.send(Request(Op.SET, (b"/mine",), (b"v",)))
    time.sleep(0.3)  # the SET is on its way (through the proxy: on the proxy's main connection)
    relay.cut()
    time.sleep(0.5)  # through the proxy: it has seen the loss and reconnected
    outcome = _raw_outcome(lambda: writer.call(Request(Op.CHECK, (b"/mine",))))
    writer.close()
    return {
        "failed": isinstance(outcome, tuple),
        "root has it": torchcompat.key_exists(root, "mine"),
    }


@pytest.mark.parametrize("loop", LOOPS)
def test_a_write_lost_with_a_broken_connection_fails_its_client_as_at_the_root(loop):
    """Straight to the root the worker's own connection broke, so its next call raises; through
    the proxy it must too (its SET went with the proxy's connection), not answer from a new
    connection as if the write had been applied."""
    results = []
    for proxied in (False, True):
        root = tcp_store(0, master=True)
        relay = CuttableRelay(root.port)
        try:
            if proxied:
                with ProxyProcess(relay.port, loop=loop) as proxy:
                    results.append(_write_lost_on_a_broken_path(proxy.port, relay, root))
            else:
                results.append(_write_lost_on_a_broken_path(relay.port, relay, root))
        finally:
            relay.close()
    expected, actual = results
    assert expected == {"failed": True, "root has it": False}
    assert actual == expected


def _popper_times_out_scenario(port: int, root, proxy: ProxyProcess | None = None) -> object:
    """Two workers with a 3 s timeout block in queue_pop on a new queue; one item is pushed. The
    one left waiting must give up at its timeout, and an item pushed after that must stay in
    the queue for the next popper."""
    poppers = [tcp_store(port, timeout=3), tcp_store(port, timeout=3)]
    got: dict[int, object] = {}
    took: dict[int, float] = {}
    start = time.monotonic()

    def pop(i: int) -> None:
        got[i] = outcome(lambda: poppers[i].queue_pop("q"))
        took[i] = time.monotonic() - start

    threads = [threading.Thread(target=pop, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    pusher = tcp_store(port)
    pusher.queue_push("q", "first")
    for thread in threads:
        thread.join(5)  # the loser's timeout is 3 s
    pusher.queue_push("q", "second")
    later = outcome(lambda: tcp_store(port, timeout=3).queue_pop("q"))
    for thread in threads:
        thread.join(15)
    loser = next((i for i in got if got[i] != b"first"), None)
    return {
        "popped": sorted(map(repr, got.values())),
        "loser gave up within 4 s": loser is not None and took[loser] < 4.0,
        "the next popper": later,
    }


@needs_queues
@pytest.mark.parametrize("loop", LOOPS)
def test_a_blocked_popper_gives_up_at_its_timeout_and_leaves_later_items(loop):
    expected, actual = _both_worlds(loop, _popper_times_out_scenario)
    assert "b'first'" in expected["popped"] and expected["loser gave up within 4 s"]
    assert expected["the next popper"] == b"second"
    assert actual == expected
