"""The proxy is linearizable with respect to the root: recorded histories, checked against a model.

One stock torch ``TCPStore`` root, two proxies in front of it (child processes, as npu-run runs
them), several raw-protocol clients per proxy issuing random operations over a few keys: sets,
gets, appends, compare-and-sets, deletes, checks, counters, waits that time out (CANCEL_WAIT),
and MiB-scale values whose replies fill the first proxy's shared upstream connection; and, on a
root with queues, pushes, pops, blocking pops that time out and queue lengths. Every call is recorded
with the time its request was sent and its reply read; :func:`linearizability.check` must find an
order of the calls that a single store, answering one request at a time, would have produced.

The clients are :mod:`npu_job.launcher.protocol` codecs on asyncio sockets (one loop, no thread
per client) rather than torch's: a torch ``get`` is WAIT then GET and could not issue the bare
GET whose merging the check is about.
"""

from __future__ import annotations

import asyncio
import math
import random
import time

import pytest
from npu_job.launcher import torchcompat
from npu_job.launcher.protocol import (
    NO_REPLY_OPS,
    VALIDATION_MAGIC,
    Op,
    QueuePopReply,
    Request,
    WaitReply,
    decode_reply,
    encode_request,
)

from tests.launcher.proxy import linearizability
from tests.launcher.proxy.linearizability import Call, Inconsistent
from tests.launcher.proxy_support import LOOPBACK, LOOPS, ProxyProcess, tcp_store

pytest.importorskip("torch.distributed")
DIALECT = torchcompat.store_dialect()

SMALL = (b"/a", b"/b")
COUNTER = b"/n"
BIG = b"/big"
BIG_SIZE = 8 << 20
CLIENTS = (6, 3)  # per proxy: random calls, one at a time
# on the first proxy only (the second one's writes must be answered quickly), loaders keep
# PIPELINE large replies each queued on its upstream connection
LOADERS = 2
PIPELINE = 4
DURATION = 3.0  # seconds each history's clients keep calling
PACE = (0.0, 0.03)  # per role: the most a client sleeps between calls (writers spread out)


# ---------------------------------------------------------------- the checker itself


def _call(client, op, keys, args, result, invoked, returned=math.inf):
    return Call(client, op, tuple(keys), tuple(args), result, invoked, returned)


def test_the_checker_accepts_concurrent_calls_in_either_order():
    history = [
        _call(0, "set", [b"k"], [b"new"], None, 0.0, 2.0),
        _call(0, "get", [b"k"], [], b"new", 1.5, 2.0),
        _call(1, "get", [b"k"], [], b"", 0.5, 3.0),  # overlaps the set: may come first
        _call(2, "get", [b"k"], [], b"new", 0.6, 3.0),
    ]
    order = linearizability.check(history)
    assert [c.client for c in order].index(1) < [c.op for c in order].index("set")


def test_the_checker_rejects_a_read_older_than_a_completed_write():
    """A stale read in miniature: the set was answered (fenced) before the get began."""
    history = [
        _call(0, "set", [b"k"], [b"new"], None, 0.0, 1.0),
        _call(0, "check", [b"k"], [], True, 0.5, 1.0),
        _call(1, "get", [b"k"], [], b"", 2.0, 3.0),
    ]
    with pytest.raises(Inconsistent, match="no linearization"):
        linearizability.check(history)


def test_the_checker_keeps_each_clients_program_order():
    history = [  # a client's set is applied before its own next request, reply or not
        _call(0, "set", [b"k"], [b"1"], None, 0.0, 0.2),
        _call(0, "get", [b"k"], [], b"", 0.1, 0.2),
    ]
    with pytest.raises(Inconsistent):
        linearizability.check(history)


def test_a_compare_set_on_a_missing_key_wakes_the_waits_sent_before_it():
    """torch's libuv root wakes a key's waiters on every compare-and-set, also one that finds the
    key missing and leaves it so: such a WAIT returns "ready" for a key that does not exist,
    straight to the root as through a proxy."""
    woken = [
        _call(0, "delete", [b"k"], [], 0, 0.0, 0.1),
        _call(1, "wait", [b"k"], [], "ready", 0.2, 0.6),
        _call(2, "compare_set", [b"k"], [b"x", b"y"], b"x", 0.3, 0.4),
        _call(1, "check", [b"k"], [], False, 0.7, 0.8),
    ]
    assert len(linearizability.check(woken)) == len(woken)
    # a compare-and-set that returned before the WAIT was sent cannot have woken it
    too_early = [
        _call(2, "compare_set", [b"k"], [b"x", b"y"], b"x", 0.0, 0.1),
        _call(1, "wait", [b"k"], [], "ready", 0.2, 0.6),
    ]
    with pytest.raises(Inconsistent):
        linearizability.check(too_early)


def test_the_checker_models_counters_compare_set_delete_and_waits():
    history = [
        _call(0, "add", [b"n"], [5], 5, 0.0, 0.1),
        _call(1, "add", [b"n"], [2], 7, 0.05, 0.2),
        _call(0, "compare_set", [b"k"], [b"", b"x"], b"x", 0.3, 0.4),
        _call(1, "compare_set", [b"k"], [b"y", b"z"], b"x", 0.5, 0.6),
        _call(0, "wait", [b"k"], [], "ready", 0.7, 0.8),
        _call(0, "delete", [b"k"], [], 1, 0.9, 1.0),
        _call(1, "wait", [b"k"], [], "timeout", 1.1, 1.3),
        _call(1, "check", [b"k", b"n"], [], False, 1.4, 1.5),
    ]
    assert len(linearizability.check(history)) == len(history)
    wrong = history[:-1] + [_call(1, "check", [b"k", b"n"], [], True, 1.4, 1.5)]
    with pytest.raises(Inconsistent):
        linearizability.check(wrong)


def test_the_checker_models_queues_first_in_first_out_each_item_once():
    history = [
        _call(0, "queue_push", [b"q"], [b"1"], None, 0.0, 0.2),
        _call(0, "queue_push", [b"q"], [b"2"], None, 0.1, 0.2),
        _call(0, "queue_len", [b"q"], [], 2, 0.15, 0.2),
        _call(1, "blocking_pop", [b"q"], [0.1], "timeout", 0.0, 0.5),  # constrains nothing
        _call(1, "blocking_pop", [b"q"], [1.0], b"1", 0.6, 0.7),
        _call(2, "queue_pop", [b"q"], [], b"2", 0.8, 0.9),
        _call(2, "blocking_pop", [b"q"], [1.0], "empty", 1.0, 1.1),  # woken, another took it
    ]
    assert len(linearizability.check(history)) == len(history)
    out_of_order = history[:4] + [_call(1, "blocking_pop", [b"q"], [1.0], b"2", 0.6, 0.7)]
    with pytest.raises(Inconsistent):
        linearizability.check(out_of_order)
    twice = history[:5] + [_call(2, "queue_pop", [b"q"], [], b"1", 0.8, 0.9)]
    with pytest.raises(Inconsistent):
        linearizability.check(twice)


# ---------------------------------------------------------------- recording real histories


def _token(value: bytes) -> bytes:
    """Large values compared by their unique head and length (the model stores the same)."""
    return value if len(value) <= 64 else b"big:" + value[:32] + b":%d" % len(value)


class _Client:
    """One connection, one request at a time, every call recorded."""

    def __init__(self, index: int, history: list[Call]) -> None:
        self.index = index
        self.history = history
        self.unfenced: list[int] = []  # history positions of no-reply calls awaiting an answer
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self.buf = bytearray()

    async def connect(self, port: int) -> None:
        self.reader, self.writer = await asyncio.open_connection(LOOPBACK, port)
        if DIALECT.validates:
            self.writer.write(
                encode_request(Request(Op.VALIDATE, number=VALIDATION_MAGIC), DIALECT)
            )

    async def _reply(self, request: Request, timeout: float | None = None) -> object:
        while True:
            decoded = decode_reply(request, self.buf)
            if decoded is not None:
                value, pos = decoded
                del self.buf[:pos]
                return value
            chunk = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
            if not chunk:
                raise ConnectionError("store closed the connection")
            self.buf += chunk

    def _send(self, request: Request) -> None:
        self.writer.write(encode_request(request, DIALECT))

    def _record(self, op: str, keys, args, result, invoked: float, returned: float) -> None:
        # An answer proves the root applied this client's earlier sets: at the root, whatever the
        # request; through the proxy, a request relayed on the main upstream connection after
        # them (a WAIT waits on a connection of its own: see the proxy's docstring).
        if returned == math.inf:
            self.unfenced.append(len(self.history))
        elif op != "wait" and result != "timeout":  # a WAIT, or a pop's, waits on its own
            for pos in self.unfenced:
                self.history[pos] = _replace_returned(self.history[pos], returned)
            self.unfenced.clear()
        self.history.append(
            Call(self.index, op, tuple(keys), tuple(args), result, invoked, returned)
        )

    async def call(self, op: str, request: Request, args=()) -> None:
        invoked = time.monotonic()
        self._send(request)
        if request.op in NO_REPLY_OPS:
            self._record(op, request.keys, args, None, invoked, math.inf)
            return
        value = await self._reply(request)
        returned = time.monotonic()
        if isinstance(value, bytes):
            value = _token(value)
        elif isinstance(value, tuple):
            value = tuple(_token(v) for v in value)
        if op == "check":
            value = value == 0
        self._record(op, request.keys, args, value, invoked, returned)

    async def _timed_wait(self, key: bytes, timeout: float) -> str:
        """torch's timed wait: WAIT, and after ``timeout`` CANCEL_WAIT (the wake-up may race it)."""
        request = Request(Op.WAIT, keys=(key,))
        self._send(request)
        try:
            await self._reply(request, timeout)
            return "ready"
        except asyncio.TimeoutError:
            self._send(Request(Op.CANCEL_WAIT))
            first = await self._reply(request)
            if first == WaitReply.STOP_WAITING:  # woken before the cancel: then the cancel's byte
                await self._reply(request)
                return "ready"
            return "timeout"

    async def wait(self, key: bytes, timeout: float) -> None:
        invoked = time.monotonic()
        result = await self._timed_wait(key, timeout)
        self._record("wait", (key,), (), result, invoked, time.monotonic())

    async def pop(self, key: bytes, timeout: float | None = None) -> None:
        """QUEUE_POP; with a ``timeout``, torch's blocking pop: a timed WAIT, then QUEUE_POP."""
        invoked = time.monotonic()
        args = () if timeout is None else (timeout,)
        if timeout is not None and await self._timed_wait(key, timeout) == "timeout":
            self._record("blocking_pop", (key,), args, "timeout", invoked, time.monotonic())
            return
        request = Request(Op.QUEUE_POP, keys=(key,))
        self._send(request)
        reply = await self._reply(request)
        assert isinstance(reply, QueuePopReply)
        result = reply.value if reply.length > 0 else "empty"
        op = "queue_pop" if timeout is None else "blocking_pop"
        self._record(op, (key,), args, result, invoked, time.monotonic())

    async def pipeline(self, requests: list[Request]) -> None:
        """Several reads in one write, each recorded with its own reply time."""
        invoked = time.monotonic()
        self.writer.write(b"".join(encode_request(r, DIALECT) for r in requests))
        for request in requests:
            value = await self._reply(request)
            assert isinstance(value, tuple)
            result = tuple(_token(v) for v in value)
            self._record("multi_get", request.keys, (), result, invoked, time.monotonic())

    def close(self) -> None:
        self.writer.close()


def _replace_returned(call: Call, returned: float) -> Call:
    return Call(call.client, call.op, call.keys, call.args, call.result, call.invoked, returned)


# What the clients of each proxy do most: the first proxy's (behind large replies) read, the
# second's write, so that a write is answered while a read of the same key is still queued.
KINDS = ("big_read", "big_set", "get", "set", "append", "cas", "delete", "check", "add", "wait",
         "multi_get")  # fmt: skip
WEIGHTS = (
    (4, 0, 14, 0, 0, 0, 0, 4, 1, 2, 2),
    (2, 2, 4, 8, 2, 3, 3, 2, 2, 1, 1),
)


async def _run_client(
    client: _Client, rng: random.Random, until: float, role: int, weights: tuple
) -> None:
    seen: list[bytes] = [b""]
    seq = 0
    while time.monotonic() < until:
        seq += 1
        await asyncio.sleep(rng.uniform(0, PACE[role]))
        key = rng.choice(SMALL)
        fresh = b"c%d-%d" % (client.index, seq)
        kind = rng.choices(KINDS, weights=weights)[0]
        if kind == "big_read":
            if rng.random() < 0.5:
                await client.call("get", Request(Op.GET, keys=(BIG,)))
            else:
                await client.call("multi_get", Request(Op.MULTI_GET, keys=(BIG, key)))
        elif kind == "big_set":
            value = fresh.ljust(BIG_SIZE, b".")
            await client.call(
                "set", Request(Op.SET, keys=(BIG,), values=(value,)), (_token(value),)
            )
        elif kind == "get":
            await client.call("get", Request(Op.GET, keys=(key,)))
            seen.append(client.history[-1].result)  # type: ignore[arg-type]
        elif kind == "set":
            await client.call("set", Request(Op.SET, keys=(key,), values=(fresh,)), (fresh,))
        elif kind == "append":
            await client.call("append", Request(Op.APPEND, keys=(key,), values=(fresh,)), (fresh,))
        elif kind == "cas":
            expected = rng.choice(seen)
            await client.call(
                "compare_set",
                Request(Op.COMPARE_SET, keys=(key,), values=(expected, fresh)),
                (expected, fresh),
            )
        elif kind == "delete":
            await client.call("delete", Request(Op.DELETE_KEY, keys=(key,)))
        elif kind == "check":
            await client.call("check", Request(Op.CHECK, keys=tuple(rng.sample(SMALL, 2))))
        elif kind == "add":
            delta = rng.randrange(1, 5)
            await client.call("add", Request(Op.ADD, keys=(COUNTER,), number=delta), (delta,))
        elif kind == "wait":
            await client.wait(key, rng.choice([0.05, 0.2]))
        else:
            await client.call("multi_get", Request(Op.MULTI_GET, keys=SMALL))
    # a last answered request fences this client's trailing sets
    await client.call("check", Request(Op.CHECK, keys=(COUNTER,)))


async def _run_loader(client: _Client, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await client.pipeline(
            [Request(Op.MULTI_GET, keys=(BIG, SMALL[i % 2])) for i in range(PIPELINE)]
        )


async def _record_history(
    proxy_ports: list[int], seed: int, weights: tuple = WEIGHTS
) -> list[Call]:
    history: list[Call] = []
    ports = [port for port, n in zip(proxy_ports, CLIENTS) for _ in range(n)]
    roles = [role for role, n in enumerate(CLIENTS) for _ in range(n)]
    loader_ports = [proxy_ports[0]] * LOADERS
    clients = [_Client(i, history) for i in range(len(ports))]
    loaders = [_Client(len(ports) + i, history) for i in range(len(loader_ports))]
    await asyncio.gather(
        *(c.connect(port) for c, port in zip(clients + loaders, ports + loader_ports))
    )
    try:
        first = clients[0]
        big = b"seed%d" % seed
        await first.call("set", Request(Op.SET, keys=(BIG,), values=(big.ljust(BIG_SIZE, b"."),)),
                         (_token(big.ljust(BIG_SIZE, b".")),))  # fmt: skip
        stop = asyncio.Event()
        loading = [asyncio.ensure_future(_run_loader(c, stop)) for c in loaders]
        rng = random.Random(seed)
        until = time.monotonic() + DURATION
        await asyncio.gather(
            *(
                _run_client(c, random.Random(rng.random()), until, role, weights[role])
                for c, role in zip(clients, roles)
            )
        )
        stop.set()
        await asyncio.gather(*loading)
    finally:
        for client in clients + loaders:
            client.close()
    return history


QUEUES = (b"/q0", b"/q1")


async def _run_queue_client(client: _Client, rng: random.Random, until: float) -> None:
    seq = 0
    while time.monotonic() < until:
        seq += 1
        await asyncio.sleep(rng.uniform(0, 0.02))
        queue = rng.choice(QUEUES)
        kind = rng.choices(("push", "pop", "blocking_pop", "len"), weights=(4, 2, 4, 1))[0]
        if kind == "push":
            item = b"c%d-%d" % (client.index, seq)
            await client.call("queue_push", Request(Op.QUEUE_PUSH, (queue,), (item,)), (item,))
        elif kind == "pop":
            await client.pop(queue)
        elif kind == "blocking_pop":
            await client.pop(queue, rng.choice([0.05, 0.3]))
        else:
            await client.call("queue_len", Request(Op.QUEUE_LEN, keys=(queue,)))
    await client.call("queue_len", Request(Op.QUEUE_LEN, keys=(QUEUES[0],)))  # fences its pushes


async def _record_queue_history(proxy_ports: list[int], seed: int) -> list[Call]:
    history: list[Call] = []
    ports = [port for port, n in zip(proxy_ports, CLIENTS) for _ in range(n)]
    clients = [_Client(i, history) for i in range(len(ports) + 1)]
    await asyncio.gather(*(c.connect(port) for c, port in zip(clients, ports + [proxy_ports[0]])))
    try:
        rng = random.Random(seed)
        until = time.monotonic() + DURATION
        await asyncio.gather(
            *(_run_queue_client(c, random.Random(rng.random()), until) for c in clients[:-1])
        )
        last = clients[-1]  # what is left: every item pushed is popped once, or still here
        for queue in QUEUES:
            await last.call("queue_len", Request(Op.QUEUE_LEN, keys=(queue,)))
            while True:
                await last.pop(queue)
                if last.history[-1].result == "empty":
                    break
    finally:
        for client in clients:
            client.close()
    return history


@pytest.mark.skipif(not torchcompat.HAS_QUEUES, reason="this torch's store has no queues")
@pytest.mark.parametrize("loop", LOOPS)
def test_concurrent_queue_histories_through_two_proxies_are_linearizable(loop):
    """Blocking pops of one queue from several workers of one proxy share a CHECK or a WAIT at
    first (the proxy cannot know the key is a queue before its first QUEUE_* request): the items
    still go each to one popper, in order, and none is lost."""
    root = tcp_store(0, master=True)
    if not getattr(root, "libuvBackend", False):
        pytest.skip("torch's classic store server has no queues")
    proxies = [ProxyProcess(root.port, loop=loop) for _ in CLIENTS]
    try:
        ports = [p.port for p in proxies]
        for seed in range(2):
            history = asyncio.run(_record_queue_history(ports, seed))
            assert sum(c.op == "blocking_pop" and c.result not in ("timeout", "empty")
                       for c in history) > 0  # fmt: skip
            try:
                linearizability.check(history)
            except Inconsistent as exc:
                raise Inconsistent(f"seed {seed} on {loop} ({len(history)} calls): {exc}") from None
            # and in time: at the root a blocking pop's WAIT ends by its timeout, then one round
            # trip pops (a history check lets a pop wait for ever; the root does not)
            overdue = [str(c) for c in history
                       if c.op == "blocking_pop" and c.returned - c.invoked > c.args[0] + 1.0]  # type: ignore[operator]  # fmt: skip
            assert not overdue, overdue
    finally:
        for proxy in proxies:
            proxy.stop()


@pytest.mark.parametrize("loop", LOOPS)
def test_concurrent_histories_through_two_proxies_are_linearizable(loop):
    root = tcp_store(0, master=True)
    # torch's classic store server (before 2.2, and the one a listen fd gets on 2.4-2.7) drops the
    # connection of a GET of a missing key, where the libuv one answers it: there the small keys
    # (and the large one) exist from the start and nobody deletes them, so every GET finds its key
    classic = not getattr(root, "libuvBackend", False)
    preset = {**{key: b"preset" for key in SMALL}, BIG: b"preset".ljust(BIG_SIZE, b".")}
    preset = preset if classic else {}
    no_delete = KINDS.index("delete")
    weights = (
        tuple(tuple(0 if i == no_delete else w for i, w in enumerate(ws)) for ws in WEIGHTS)
        if classic
        else WEIGHTS
    )
    proxies = [ProxyProcess(root.port, loop=loop) for _ in CLIENTS]
    try:
        ports = [p.port for p in proxies]
        for seed in range(2):
            if preset:
                setter = tcp_store(root.port)
                for key, value in preset.items():
                    setter.set(key.decode().lstrip("/"), value)
                setter.get(key.decode().lstrip("/"))  # answered: every preset key is applied
            start = time.monotonic()
            history = asyncio.run(_record_history(ports, seed, weights))
            recorded = time.monotonic() - start
            initial = {key: _token(value) for key, value in preset.items()}
            try:
                linearizability.check(history, initial)
            except Inconsistent as exc:
                raise Inconsistent(
                    f"seed {seed} on {loop} ({len(history)} calls, {recorded:.1f} s): {exc}"
                ) from None
            # the next history starts from an empty store
            cleaner = tcp_store(root.port)
            for key in (*SMALL, COUNTER, BIG):
                cleaner.delete_key(key.decode().lstrip("/"))
    finally:
        for proxy in proxies:
            proxy.stop()
