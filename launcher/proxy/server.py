"""The store proxy's server on one event loop: local clients in, coalesced requests to the root out.

It owns the local side (``_Client``: one callback-driven protocol object per worker connection,
replies in request order, refusals), what each request turns into (joins and writes on the main
connection, ADD group commit, wait groups on the wait connections or polled with CHECK, BARRIER
on a connection of its own, the held WAIT answer), reconnecting and the failure of clients when
the root is gone. The rules it applies are pure code in :mod:`.coalescing`, its connections to
the root are :mod:`.upstream`'s; the contract, the rules and the faults are told in
:mod:`npu_job.launcher.proxy`, and :mod:`.storeproxy` runs this server on a thread.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import itertools
import logging
import socket
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple, Union

from npu_job.polling import Backoff

from ..protocol import (
    NEWEST,
    NO_REPLY_OPS,
    CheckReply,
    Dialect,
    Op,
    ProtocolError,
    QueuePopReply,
    Request,
    WaitReply,
    complete_multi_set_prefix,
    decode_request,
    encode_reply,
)
from .coalescing import (
    Joins,
    WaitGroup,
    add_batch,
    add_results,
)
from .upstream import (
    READ_CHUNK,
    Counters,
    Upstream,
    UpstreamLost,
    forward,
    resolve,
    set_nodelay,
)

logger = logging.getLogger(__name__)

LISTEN_BACKLOG = 65535  # the kernel caps it at net.core.somaxconn
DEFAULT_WAIT_CONNECTIONS = 2
_POLL = Backoff(0.005, 2.0, 0.25)  # a queued wait's CHECKs and a shared pop's retries
_PROBE_TIMEOUT = 2.0
_REFUSED_LINGER = 10.0  # seconds a refused client may keep its connection open after our FIN
_STOP_WAITING_REPLY = encode_reply(Op.WAIT, WaitReply.STOP_WAITING)
# Answered by the proxy itself or served by wait connections; everything else goes on the main one.
_LOCAL_OPS = frozenset({Op.WAIT, Op.PING, Op.CANCEL_WAIT, Op.BARRIER})


@dataclass(frozen=True)
class ProxyStats:
    """A snapshot of the proxy's counters."""

    client_connections: int  # accepted since start
    clients_open: int
    requests_received: int  # decoded from local clients (VALIDATE included)
    requests_upstream: int  # written to the root (handshakes included)
    upstream_connections: int  # opened to the root since start
    upstream_open: int
    coalesced: int  # client requests answered by joining another request or batch
    waits_active: int  # upstream WAITs in flight (at most wait_connections)
    waits_queued: int  # distinct waits queued behind a full pool (polled with CHECK)
    received_by_op: Mapping[str, int] = field(default_factory=dict)
    upstream_by_op: Mapping[str, int] = field(default_factory=dict)


class _Client(asyncio.BufferedProtocol):
    """One local worker connection, callback-driven (no task per client: the proxy's CPU per
    request is what a single machine running many proxies pays twice over).

    Reads land in the proxy's shared scratch buffer (``recv_into``, no bytes object per read) and
    are decoded in place; only the tail of a request split across reads is copied to the client's
    own buffer.

    Requests are handled in arrival order; replies to non-blocking requests are written in the
    same order (a joined GET may finish before an earlier request of the same client). WAIT and
    BARRIER replies are written when they happen, as the root does.
    """

    _ids = itertools.count()

    def __init__(self, proxy: AsyncStoreProxy) -> None:
        self.id = next(self._ids)
        self.proxy = proxy
        self.transport: Optional[asyncio.Transport] = None
        self.wait: Optional[WaitGroup[_Client]] = None
        self.barrier: Optional[Tuple[Upstream, asyncio.Future]] = None
        # keys of the WAIT just answered, when one upstream answer woke several local waiters
        self.woken_with_others: Optional[Tuple[bytes, ...]] = None
        # its latest no-reply write on the main connection: (connection, applied mark)
        self.unconfirmed: Optional[Tuple[Upstream, int]] = None
        self.stop_held: Optional[object] = None  # a WAIT answer held until that write is applied
        self._buf = bytearray()
        self._validated = not proxy.dialect.validates  # torch 2.1 clients send no VALIDATE
        self._blocked = False
        self._refused = False
        self._replies: collections.deque[Tuple[Op, object]] = collections.deque()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: no isinstance
        # check
        self.transport = transport  # type: ignore[assignment]
        set_nodelay(transport.get_extra_info("socket"))
        self.proxy.add_client(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.proxy.scratch  # one loop thread: each read is consumed before the next starts

    def buffer_updated(self, nbytes: int) -> None:
        if self._refused:  # read and drop what follows a refused request (see refuse)
            return
        data = self.proxy.scratch[:nbytes]
        if self._buf or self._blocked:
            self._buf += data
            if not self._blocked:
                self._process()
            return
        pos = self._consume(data)
        if pos < nbytes:
            self._buf += data[pos:]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._buf and self._validated and not self._refused and not self._blocked:
            # as the root does: the complete pairs of a MULTI_SET cut short are stored
            partial = complete_multi_set_prefix(self._buf, self.proxy.dialect)
            if partial is not None:
                self.proxy.relay_orphan(partial)
        self.proxy.drop_client(self)

    # requests
    def _process(self) -> None:
        pos = self._consume(self._buf)
        if pos:
            del self._buf[:pos]

    def _consume(self, buf: Union[bytearray, memoryview]) -> int:
        """Handle the whole requests at the start of ``buf``; returns where the rest begins."""
        pos = 0
        proxy = self.proxy
        try:
            while not self._blocked:
                decoded = decode_request(buf, pos, proxy.dialect)
                if decoded is None:
                    break
                request, end = decoded
                if request.op == Op.VALIDATE:
                    if self._validated:
                        raise ProtocolError("VALIDATE sent twice")
                    self._validated = True
                elif not self._validated:
                    raise ProtocolError(f"{request.op.name} before VALIDATE")
                else:
                    waiting_for = proxy.handle(self, request)
                    if waiting_for is not None:  # retried once the connection it needs is open
                        self._block(waiting_for)
                        break
                proxy.counters.requests_received += 1
                proxy.counters.received_by_op[request.op] += 1
                pos = end
        except ProtocolError as exc:
            self.refuse(str(exc))
            return len(buf)
        return pos

    def _block(self, awaitable: asyncio.Future[object]) -> None:
        self._blocked = True
        assert self.transport is not None
        self.transport.pause_reading()

        async def resume() -> None:
            try:
                await awaitable
            except UpstreamLost as exc:
                logger.warning("store proxy: closing client %d: %s", self.id, exc)
                self.abort()
                return
            self._blocked = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
                self._process()

        self.proxy.spawn(resume())

    # replies
    def reply(self, op: Op, value: object) -> None:
        """Queue the reply to a non-blocking request: bytes, or a future of the reply value."""
        if not self._replies and not isinstance(value, asyncio.Future):
            self.write(value)  # type: ignore[arg-type]
            return
        self._replies.append((op, value))
        if isinstance(value, asyncio.Future):
            value.add_done_callback(self._flush_replies)
        else:
            self._flush_replies()

    def _flush_replies(self, _: object = None) -> None:
        replies = self._replies
        while replies:
            op, item = replies[0]
            if isinstance(item, asyncio.Future):
                if not item.done():
                    return
                if item.cancelled() or item.exception() is not None:
                    replies.clear()
                    self.abort()
                    return
                data = encode_reply(op, item.result())
            else:
                data = item  # type: ignore[assignment]
            replies.popleft()
            self.write(data)
        if self._refused:
            self._end_after_replies()

    def refuse(self, reason: str) -> None:
        """Stop serving a client that sent what its root would not take, as the root would.

        The stock server drops such a connection. The proxy does it cleanly: the replies it
        already owes are sent, then a FIN (the client's next call fails at once with "connection
        closed"), and its later bytes are read and dropped so that closing never sends a reset.
        Other clients are not affected.
        """
        logger.warning("store proxy: closing client %d: %s", self.id, reason)
        self._refused = True
        self._buf.clear()
        if self._blocked and self.transport is not None:
            self.transport.resume_reading()
        self._flush_replies()

    def _end_after_replies(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or self._replies:
            return
        if transport.can_write_eof():
            transport.write_eof()
            # the client hangs up on the FIN; if it never does, do not keep it forever
            asyncio.get_running_loop().call_later(_REFUSED_LINGER, self.abort)
        else:
            transport.close()

    def write(self, data: bytes) -> None:
        transport = self.transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)

    def abort(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.abort()


class AsyncStoreProxy:
    """The proxy on an asyncio loop (the benchmark runs many of these on one loop)."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        timeout: float = 300.0,
        wait_connections: int = DEFAULT_WAIT_CONNECTIONS,
        dialect: Dialect = NEWEST,
    ) -> None:
        if wait_connections < 1:
            raise ValueError(f"wait_connections must be >= 1, got {wait_connections}")
        self.upstream = (upstream_host, int(upstream_port))
        self.upstream_text = format_address(upstream_host, upstream_port)
        self.timeout = float(timeout)
        self.wait_connections = wait_connections
        self.dialect = dialect
        self.counters = Counters()
        self.upstream_open: Set[Upstream] = set()
        self._server: Optional[asyncio.AbstractServer] = None
        self._clients: Dict[int, _Client] = {}
        self._main: Optional[Upstream] = None
        self._main_opening: Optional[asyncio.Future] = None
        self._idle_wait: List[Upstream] = []
        self._wait_pool: Set[Upstream] = set()
        self._wait_opening = 0
        self._queued: collections.deque[WaitGroup[_Client]] = collections.deque()
        self._joins: Joins[asyncio.Future] = Joins()
        self._add_busy: Set[bytes] = set()
        self._add_next: Dict[bytes, List[Tuple[int, asyncio.Future]]] = {}
        self._tasks: Set[asyncio.Task] = set()
        self._spare_barrier_conns: List[Upstream] = []
        self._replay: List[Tuple[Request, Optional[asyncio.Future]]] = []
        self.scratch = memoryview(bytearray(READ_CHUNK))  # every client's reads (see _Client)
        self._closing = False

    # ------------------------------------------------------------ lifecycle

    async def start(self, sock: socket.socket) -> None:
        """Serve local clients on an already listening socket."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Client(self), sock=sock, backlog=LISTEN_BACKLOG
        )
        self.spawn(self._warm_up())

    async def _warm_up(self) -> None:
        """Open the main and wait connections before the workers need them."""
        try:
            await self._get_main()
        except UpstreamLost as exc:
            logger.warning("store proxy: %s (will retry on the first request)", exc)
            return
        while len(self._wait_pool) + self._wait_opening < self.wait_connections:
            self._wait_opening += 1
            self.spawn(self._open_wait_conn())

    async def aclose(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for client in list(self._clients.values()):
            client.abort()
        for conn in list(self.upstream_open):
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def snapshot(self) -> ProxyStats:
        c = self.counters
        return ProxyStats(
            client_connections=c.client_connections,
            clients_open=len(self._clients),
            requests_received=c.requests_received,
            requests_upstream=c.requests_upstream,
            upstream_connections=c.upstream_connections,
            upstream_open=len(self.upstream_open),
            coalesced=c.coalesced,
            waits_active=sum(1 for conn in self.upstream_open if conn.kind != "main" and conn.busy),
            waits_queued=sum(1 for group in self._queued if group.state == "queued"),
            received_by_op=types.MappingProxyType(
                {op.name: n for op, n in c.received_by_op.items()}
            ),
            upstream_by_op=types.MappingProxyType(
                {op.name: n for op, n in c.upstream_by_op.items()}
            ),
        )

    def spawn(self, coro) -> asyncio.Task:  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------ upstream

    async def _get_main(self) -> Upstream:
        main = self._main
        if main is not None and not main.closed:
            return main
        if self._main_opening is None:
            self._main_opening = self.spawn(self._open_main())
        return await asyncio.shield(self._main_opening)

    async def _open_main(self) -> Upstream:
        try:
            conn = Upstream(self, "main")
            await conn.open(asyncio.get_running_loop().time() + self.timeout)
            current = self._main
            if current is not None and not current.closed:  # the root probe got there first
                conn.close()
                return current
            self._install_main(conn)
            return conn
        finally:
            self._main_opening = None

    @property
    def closing(self) -> bool:
        return self._closing

    def replay_later(self, requests: List[Tuple[Request, Optional[asyncio.Future]]]) -> None:
        """Requests a dropped main connection never delivered: first on the next main one."""
        self._replay.extend(requests)

    def _install_main(self, conn: Upstream) -> None:
        replay, self._replay = self._replay, []
        for request, future in replay:
            try:
                answer = conn.send(request)
            except UpstreamLost as exc:
                if future is not None and not future.done():
                    future.set_exception(exc)
                continue
            if future is not None and answer is not None:
                answer.add_done_callback(functools.partial(forward, future))
        self._main = conn

    def on_sent(self, conn: Upstream) -> None:
        """``conn`` handed its queued requests to the transport: from now on the root may answer
        them at any moment, so no request arriving later may share them (GET, CHECK)."""
        if conn is self._main:
            self._joins.sent()

    def on_upstream_lost(self, conn: Upstream) -> None:
        if self._closing:
            return
        logger.warning(
            "store proxy: lost %s connection to the root store %s", conn.kind, self.upstream_text
        )
        if conn is self._main:
            self._main = None
        if conn.kind == "main" and not conn.writes_kept:
            self._close_writers_in_doubt(conn)
        if conn in self._wait_pool:
            self._wait_pool.discard(conn)
            if conn in self._idle_wait:
                self._idle_wait.remove(conn)
        self.spawn(self._probe_root())

    def _close_writers_in_doubt(self, conn: Upstream) -> None:
        """Close the clients whose no-reply writes (SET, APPEND, ...) went on ``conn`` and are not
        known to be applied: the root may never have read them. Straight to the root, such a
        client's own connection broke, and torch raises on its next call; kept open, its next
        read would go on a new connection and could miss its own write."""
        for client in list(self._clients.values()):
            unconfirmed = client.unconfirmed
            if unconfirmed is None or unconfirmed[0] is not conn:
                continue
            client.unconfirmed = None
            if not conn.marks.applied(unconfirmed[1]):
                logger.warning(
                    "store proxy: closing client %d: its writes went with the lost connection",
                    client.id,
                )
                client.abort()

    async def _probe_root(self) -> None:
        """After a broken connection: if the root is gone, close every client so none hangs."""
        try:
            probe = Upstream(self, "main")
            await probe.open(asyncio.get_running_loop().time() + _PROBE_TIMEOUT)
        except UpstreamLost as exc:
            logger.error(
                "store proxy: root store unreachable (%s); closing %d local client(s)",
                exc,
                len(self._clients),
            )
            for client in list(self._clients.values()):
                client.abort()
            for conn in list(self.upstream_open):
                conn.close()
            replay, self._replay = self._replay, []
            for _, future in replay:
                if future is not None and not future.done():
                    future.set_exception(exc)
                    future.exception()
            return
        if self._main is None or self._main.closed:
            self._install_main(probe)
        else:
            probe.close()
        self._pump_waits()

    async def _open_wait_conn(self) -> None:
        try:
            conn = Upstream(self, "wait")
            await conn.open(asyncio.get_running_loop().time() + self.timeout)
        except UpstreamLost as exc:
            logger.warning("store proxy: %s", exc)
            self._fail_queued(exc)
            return
        finally:
            self._wait_opening -= 1
        self._wait_pool.add(conn)
        self._release_wait_conn(conn)

    def _release_wait_conn(self, conn: Upstream) -> None:
        if conn.closed:
            return
        if conn not in self._wait_pool:  # an extra connection a BARRIER borrowed
            conn.close()
            return
        self._idle_wait.append(conn)
        self._pump_waits()

    # ------------------------------------------------------------ clients

    def add_client(self, client: _Client) -> None:
        if self._closing:
            client.abort()
            return
        self._clients[client.id] = client
        self.counters.client_connections += 1

    def drop_client(self, client: _Client) -> None:
        self._clients.pop(client.id, None)
        self._leave_wait(client)
        self._leave_barrier(client)
        client.abort()

    def relay_orphan(self, request: Request) -> None:
        """Send a no-reply write whose client is gone (once the main connection is open)."""

        async def send() -> None:
            try:
                self._submit(await self._get_main(), request)
            except UpstreamLost as exc:
                logger.warning(
                    "store proxy: dropped %s of a departed client: %s", request.op.name, exc
                )

        main = self._main
        if main is not None and not main.closed:
            try:
                self._submit(main, request)
                return
            except UpstreamLost:
                pass
        self.spawn(send())

    def handle(self, client: _Client, request: Request) -> Optional[asyncio.Future[object]]:
        """Act on one client request; returns an awaitable to retry after if it cannot go yet."""
        op = request.op
        woken_with_others, client.woken_with_others = client.woken_with_others, None
        if op not in _LOCAL_OPS:
            main = self._main
            if main is None or main.closed:
                client.woken_with_others = woken_with_others  # the retry still follows that WAIT
                return self.spawn(self._get_main())
            if op in NO_REPLY_OPS:
                client.unconfirmed = (main, main.applied_mark())
            try:
                if op == Op.QUEUE_POP and woken_with_others == request.keys:
                    future: Optional[asyncio.Future] = self.spawn(
                        self._pop_as_waiter(client, request)
                    )
                else:
                    future = self._submit(main, request)
            except UpstreamLost as exc:
                logger.warning("store proxy: closing client %d: %s", client.id, exc)
                client.abort()
                return None
            if future is not None:
                client.reply(op, future)
        elif op == Op.WAIT:
            self._client_wait(client, request.keys)
        elif op == Op.PING:
            client.reply(op, encode_reply(op, request.number))
        elif op == Op.CANCEL_WAIT:
            self._leave_wait(client)
            self._leave_barrier(client)
            if client.stop_held is not None:  # woken already: the answer goes first, as at the root
                client.stop_held = None
                client.write(_STOP_WAITING_REPLY)
            client.reply(op, encode_reply(op, WaitReply.WAIT_CANCELED))
        else:  # BARRIER
            return self._client_barrier(client, request)
        return None

    # ------------------------------------------------------------ non-blocking requests

    def _submit(self, main: Upstream, request: Request) -> Optional[asyncio.Future]:
        """Send (or join) ``request`` on the main connection; the reply's future, None if no reply.

        Synchronous on purpose: the write invalidation and the send are one atomic step.
        """
        op = request.op
        self._joins.noted(request)
        if op in (Op.GET, Op.CHECK):
            return self._join_or_send(main, request)
        if op == Op.ADD:
            return self._add(main, request.keys[0], request.number)
        return main.send(request)

    def _join_or_send(self, main: Upstream, request: Request) -> asyncio.Future:
        op, keys, joins = request.op, request.keys, self._joins
        future = joins.read(op, keys)
        if future is not None:
            self.counters.coalesced += 1
            return future
        future = main.send(request)
        assert future is not None
        joins.reading(op, keys, future)
        future.add_done_callback(lambda f: joins.answered(op, keys, f))
        return future

    def _add(self, main: Upstream, key: bytes, delta: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if key in self._add_busy:
            self._add_next.setdefault(key, []).append((delta, future))
            self.counters.coalesced += 1
        else:
            self._send_adds(main, key, [(delta, future)])
        return future

    def _send_adds(
        self, main: Upstream, key: bytes, batch: List[Tuple[int, asyncio.Future]]
    ) -> None:
        carried = add_batch([delta for delta, _ in batch])
        if carried < len(batch):  # the merged delta must fit the wire's i64
            for delta, future in batch[carried:]:
                self._add_next.setdefault(key, []).insert(0, (delta, future))
            batch = batch[:carried]
        total = sum(delta for delta, _ in batch)
        self._add_busy.add(key)
        try:
            upstream = main.send(Request(Op.ADD, keys=(key,), number=total))
        except UpstreamLost as exc:
            self._add_busy.discard(key)
            for _, future in batch + self._add_next.pop(key, []):
                if not future.done():
                    future.set_exception(exc)
            return
        assert upstream is not None

        def done(reply: asyncio.Future) -> None:
            if reply.cancelled() or reply.exception() is not None:
                exc = reply.exception() if not reply.cancelled() else UpstreamLost("cancelled")
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
            else:
                results = add_results(reply.result(), [delta for delta, _ in batch])
                for (_, future), result in zip(batch, results):
                    resolve(future, result)
            waiting = self._add_next.pop(key, [])
            self._add_busy.discard(key)
            if waiting:
                self._send_adds(main, key, waiting)

        upstream.add_done_callback(done)

    async def _pop_as_waiter(self, client: _Client, request: Request) -> object:
        """A blocking ``queue_pop`` (WAIT, then QUEUE_POP) on a key the proxy did not know was a
        queue, whose WAIT was answered together with other local waiters' WAITs.

        At the root a push wakes one waiter of a queue; the merged WAIT woke them all. So a pop
        that finds the queue empty is not answered: it is tried again (backoff, as queued waits
        poll) until it gets an item, which is what the root's waiter would have got after its
        wake-up, or until the client leaves (its own wait timeout closes it).
        """
        pauses = _POLL.pauses()
        while True:
            main = await self._get_main()
            reply = await self._submit(main, request)  # type: ignore[misc]
            if not isinstance(reply, QueuePopReply) or reply.length > 0:
                return reply
            transport = client.transport
            if transport is None or transport.is_closing():
                return reply
            await asyncio.sleep(next(pauses))

    # ------------------------------------------------------------ WAIT

    def _client_wait(self, client: _Client, keys: Tuple[bytes, ...]) -> None:
        self._leave_wait(client)  # the root keeps one wait per connection, the latest
        group = self._joins.wait_group(keys)
        if group is not None:
            self.counters.coalesced += 1
        else:
            group = self._joins.new_wait_group(keys)
            self._queued.append(group)
            self._pump_waits()
            if group.state == "queued":
                self.spawn(self._poll_group(group))
        group.add(client)
        client.wait = group

    def _pump_waits(self) -> None:
        """Give idle (or newly opened) wait connections to queued groups, oldest first."""
        while self._queued:
            group = self._queued[0]
            if group.state != "queued":
                self._queued.popleft()
                continue
            conn = _pop_open(self._idle_wait)
            if conn is not None:
                self._queued.popleft()
                self._activate(group, conn)
                continue
            if len(self._wait_pool) + self._wait_opening < self.wait_connections:
                self._wait_opening += 1
                self.spawn(self._open_wait_conn())
            break

    def _activate(self, group: WaitGroup[_Client], conn: Upstream) -> None:
        group.state = "active"
        group.conn = conn
        try:
            group.asking(conn.batch)
            upstream = conn.send(Request(Op.WAIT, keys=group.keys))
        except UpstreamLost as exc:
            self._finish_group(group, exc)
            return
        assert upstream is not None

        def done(reply: asyncio.Future) -> None:
            if reply.cancelled() or reply.exception() is not None:
                self._finish_group(group, reply.exception() or UpstreamLost("cancelled"))
                return
            if reply.result() == WaitReply.STOP_WAITING and group.state == "active":
                self._finish_group(group, None)
                self._release_wait_conn(conn)
            # WAIT_CANCELED or a wake-up racing our CANCEL_WAIT: the cancel reply frees the conn

        upstream.add_done_callback(done)

    async def _poll_group(self, group: WaitGroup[_Client]) -> None:
        """A queued group asks CHECK (coalesced, on the main stream) until ready or promoted."""
        pauses = _POLL.pauses()
        try:
            while group.state == "queued":
                main = await self._get_main()
                group.asking(main.batch)
                ready = await asyncio.shield(
                    self._join_or_send(main, Request(Op.CHECK, keys=group.keys))
                )
                if group.state != "queued":
                    return
                if ready == CheckReply.READY:
                    self._finish_group(group, None)
                    return
                await asyncio.sleep(next(pauses))
        except UpstreamLost as exc:
            if group.state == "queued":
                self._finish_group(group, exc)

    def _finish_group(self, group: WaitGroup[_Client], error: Optional[BaseException]) -> None:
        self._joins.forget_wait(group)
        waiters, late = group.finish(error is not None)
        if late:  # their answer must come from a request sent after they arrived: ask again
            again: WaitGroup[_Client] = self._joins.new_wait_group(group.keys, follows=group)
            for client in late.values():
                again.waiters[client.id] = client
                client.wait = again
            self._queued.append(again)
            self._pump_waits()
            if again.state == "queued":
                self.spawn(self._poll_group(again))
        shared = group.shared
        for client in waiters.values():  # a client that left (CANCEL_WAIT, gone) is no longer here
            if client.wait is group:
                client.wait = None
            if error is None:
                client.woken_with_others = group.keys if shared else None
                self._answer_wait(client)
            else:
                client.abort()

    def _answer_wait(self, client: _Client) -> None:
        """STOP_WAITING, once the client's earlier writes are applied at the root.

        Straight to the root, a WAIT's answer proves that the writes the client sent before it
        were applied (one connection, served in order). Through the proxy the WAIT waits on a
        connection of its own, so its answer is held until the main connection has answered a
        request sent after the client's latest no-reply write (a PING if none follows).
        """
        unconfirmed = client.unconfirmed
        if unconfirmed is None or unconfirmed[0].marks.applied(unconfirmed[1]):
            client.unconfirmed = None
            client.write(_STOP_WAITING_REPLY)
            return
        held = client.stop_held = object()

        def release() -> None:
            if client.stop_held is held:  # not answered by a CANCEL_WAIT since, nor a later WAIT
                client.stop_held = None
                client.write(_STOP_WAITING_REPLY)

        conn, mark = unconfirmed
        conn.when_applied(mark, release)

    def _fail_queued(self, error: BaseException) -> None:
        if self._wait_pool or self._wait_opening:
            return  # another connection will serve the queue
        while self._queued:
            self._finish_group(self._queued.popleft(), error)

    def _leave_wait(self, client: _Client) -> None:
        if client.wait is None:
            return
        group = client.wait
        client.wait = None
        group.remove(client)
        if not group.empty or group.state not in ("queued", "active"):
            return
        self._joins.forget_wait(group)
        if group.state == "queued":
            group.state = "done"
            return
        group.state = "cancelling"
        conn = group.conn
        assert isinstance(conn, Upstream)
        self._cancel_upstream(conn)

    def _cancel_upstream(self, conn: Upstream) -> None:
        try:
            cancelled = conn.send(Request(Op.CANCEL_WAIT))
        except UpstreamLost:
            return
        assert cancelled is not None
        cancelled.add_done_callback(
            lambda f: (
                self._release_wait_conn(conn)
                if not f.cancelled() and f.exception() is None
                else None
            )
        )

    # ------------------------------------------------------------ BARRIER

    def _client_barrier(
        self, client: _Client, request: Request
    ) -> Optional[asyncio.Future[object]]:
        # An extra connection first: one is open only because a BARRIER asked for it, and taking
        # an idle wait connection instead (the pool came up meanwhile) would leave it open for
        # good, one more root connection per barrier that found the pool still opening.
        conn = _pop_open(self._spare_barrier_conns) or _pop_open(self._idle_wait)
        if conn is None:  # no idle connection: open a short-lived one, then retry
            return self.spawn(self._open_spare_barrier_conn())
        self._leave_barrier(client)
        self._joins.noted(request)
        upstream = conn.send(request)
        assert upstream is not None
        client.barrier = (conn, upstream)

        def done(reply: asyncio.Future) -> None:
            if client.barrier is not None and client.barrier[1] is reply:
                client.barrier = None
            else:
                return  # cancelled by the client: the CANCEL_WAIT reply frees the conn
            if reply.cancelled() or reply.exception() is not None:
                client.abort()
                return
            client.write(encode_reply(Op.BARRIER, reply.result()))
            self._release_wait_conn(conn)

        upstream.add_done_callback(done)
        return None

    async def _open_spare_barrier_conn(self) -> None:
        conn = Upstream(self, "barrier")
        await conn.open(asyncio.get_running_loop().time() + self.timeout)
        self._spare_barrier_conns.append(conn)

    def _leave_barrier(self, client: _Client) -> None:
        if client.barrier is None:
            return
        conn, _ = client.barrier
        client.barrier = None
        self._cancel_upstream(conn)


def format_address(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def _pop_open(conns: List[Upstream]) -> Optional[Upstream]:
    """The last of ``conns`` still open, popped with the closed ones after it; None if none is."""
    while conns:
        conn = conns.pop()
        if not conn.closed:
            return conn
    return None
