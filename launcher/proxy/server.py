"""The store proxy's server on one event loop: local clients in, coalesced requests to the root out.

It owns the proxy's life (start, warm-up, close, the counters), the main connection to the root
(opening it, replaying what a dropped one never delivered, closing the clients whose writes went
with it, probing a root that may be gone), and what each client request turns into: PING answered
here, joins and writes on the main connection, ADD group commit. The local side, one protocol
object per worker connection, is :mod:`.client`; the blocking requests (the WAIT pool, BARRIER)
are :mod:`.waits`', a half this server inherits. The rules it applies are pure code in
:mod:`.coalescing`, its connections to the root are :mod:`.upstream`'s; the contract, the rules and
the faults are told in :mod:`npu_job.launcher.proxy`, and :mod:`.storeproxy` runs this server on
a thread.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import logging
import socket
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from ..protocol import (
    NEWEST,
    NO_REPLY_OPS,
    Dialect,
    LargeBuffers,
    Op,
    Request,
    WaitReply,
    encode_reply,
)
from .client import Client
from .coalescing import (
    Joins,
    WaitGroup,
    add_batch,
    add_results,
)
from .upstream import (
    Counters,
    Upstream,
    UpstreamLost,
    forward,
    resolve,
)
from .waits import STOP_WAITING_REPLY, Waits

logger = logging.getLogger(__name__)

LISTEN_BACKLOG = 65535  # the kernel caps it at net.core.somaxconn
READ_CHUNK = 1 << 16  # the most one read from a client takes
# Buffers of large reply strings kept for reuse once relayed (protocol.LargeBuffers): what the
# proxy's memory may stay above its idle size after relaying large values.
LARGE_BUFFERS_KEPT = 64 << 20
DEFAULT_WAIT_CONNECTIONS = 2
_PROBE_TIMEOUT = 2.0
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
    waits_queued: int  # distinct waits whose wait connection is still opening
    received_by_op: Mapping[str, int] = field(default_factory=dict)
    upstream_by_op: Mapping[str, int] = field(default_factory=dict)


class AsyncStoreProxy(Waits):
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
        self._clients: Dict[int, Client] = {}
        self._main: Optional[Upstream] = None
        self._main_opening: Optional[asyncio.Future] = None
        self._idle_wait: List[Upstream] = []
        self._wait_pool: Set[Upstream] = set()
        self._wait_opening = 0
        self._extra_opening = 0
        self.root_queues: Optional[bool] = None  # learnt from a QUEUE_LEN (waits)
        self._queue_probe: Optional[Upstream] = None
        self._queued: collections.deque[WaitGroup[Client]] = collections.deque()
        self._joins: Joins[asyncio.Future] = Joins()
        self._add_busy: Set[bytes] = set()
        self._add_next: Dict[bytes, List[Tuple[int, asyncio.Future]]] = {}
        self._tasks: Set[asyncio.Task] = set()
        self._spare_barrier_conns: List[Upstream] = []
        self._replay: List[Tuple[Request, Optional[asyncio.Future]]] = []
        self.scratch = memoryview(bytearray(READ_CHUNK))  # every client's reads (see Client)
        self.large_buffers = LargeBuffers(LARGE_BUFFERS_KEPT)
        self.main_full = False  # the main connection's transport holds its high-water mark
        self._closing = False

    # ------------------------------------------------------------ lifecycle

    async def start(self, sock: socket.socket) -> None:
        """Serve local clients on an already listening socket."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Client(self), sock=sock, backlog=LISTEN_BACKLOG
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

    def upstream_full(self, conn: Upstream, full: bool) -> None:
        """The main connection's transport went above its high-water mark (the root reads
        slower than the clients write): no client request is taken until it drains, so what
        waits for a slow root waits in the clients' socket buffers, not in the proxy."""
        if conn is not self._main or full == self.main_full:
            return
        self.main_full = full
        if not full:
            for client in list(self._clients.values()):
                client.serve_more()

    def on_upstream_lost(self, conn: Upstream) -> None:
        self.upstream_full(conn, False)  # a lost main connection holds nobody back
        if self._closing:
            return
        # dropped for the QUEUE_LEN the proxy asked (a root without queues): expected, once
        expected = conn is self._queue_probe and conn.writes_kept
        logger.log(
            logging.DEBUG if expected else logging.WARNING,
            "store proxy: lost %s connection to the root store %s",
            conn.kind,
            self.upstream_text,
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

    # ------------------------------------------------------------ clients

    def add_client(self, client: Client) -> None:
        if self._closing:
            client.abort()
            return
        self._clients[client.id] = client
        self.counters.client_connections += 1

    def drop_client(self, client: Client) -> None:
        self._clients.pop(client.id, None)
        if client.lead_of is not None:
            held, client.lead_of = client.lead_of, None
            self._ask_held_again(held)
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

    def handle(self, client: Client, request: Request) -> Optional[asyncio.Future[object]]:
        """Act on one client request; returns an awaitable to retry after if it cannot go yet."""
        op = request.op
        if op not in _LOCAL_OPS:
            main = self._main
            if main is None or main.closed:
                return self.spawn(self._get_main())
            if op in NO_REPLY_OPS:
                client.unconfirmed = (main, main.applied_mark())
            try:
                future = None
                if client.lead_of is not None:
                    future = self.lead_decides(client, request)
                if future is None:
                    future = self._submit(main, request)
            except UpstreamLost as exc:
                logger.warning("store proxy: closing client %d: %s", client.id, exc)
                client.abort()
                return None
            if future is not None:
                client.reply(op, future)
            return None
        if client.lead_of is not None:
            self.lead_decides(client, request)
        if op == Op.WAIT:
            self._client_wait(client, request.keys)
        elif op == Op.PING:
            client.reply(op, encode_reply(op, request.number))
        elif op == Op.CANCEL_WAIT:
            self._leave_wait(client)
            self._leave_barrier(client)
            if client.stop_held is not None:  # woken already: the answer goes first, as at the root
                client.stop_held = None
                client.write(STOP_WAITING_REPLY)
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
                self._send_adds_on_main(key, waiting)

        upstream.add_done_callback(done)

    def _send_adds_on_main(self, key: bytes, batch: List[Tuple[int, asyncio.Future]]) -> None:
        """Send ADDs that waited for the one in flight on the main connection open now: that one
        may have been answered on a new connection (sent again after the root dropped the old one
        for another client's request), and these were never sent, so they must not fail with it."""
        main = self._main
        if main is not None and not main.closed:
            self._send_adds(main, key, batch)
            return
        self._add_busy.add(key)  # later ADDs keep accumulating behind these
        self._add_next[key] = batch + self._add_next.get(key, [])

        async def when_open() -> None:
            try:
                main = await self._get_main()
            except UpstreamLost as exc:
                main = None
                error = exc
            waiting = self._add_next.pop(key, [])
            self._add_busy.discard(key)
            if main is None:
                for _, future in waiting:
                    if not future.done():
                        future.set_exception(error)
            elif waiting:
                self._send_adds(main, key, waiting)

        self.spawn(when_open())


def format_address(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"
