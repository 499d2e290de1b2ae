"""The store proxy's connections to the root: writes batched per loop turn, replies matched FIFO.

An :class:`Upstream` is one TCP connection from a proxy (:mod:`npu_job.launcher.proxy`) to the
root store: it opens with backoff and jitter and proves the peer is a store (PING, or a key count
where the root has no PING), queues requests into the current outgoing :class:`Batch` and writes
each batch once per loop turn, matches replies to requests in order, tells when the no-reply
requests queued so far are applied (``applied_mark``, ``when_applied``), and when the root drops
it for one request (:func:`~.coalescing.dropped_for`) hands the requests the root
never read back to its owner to send again. Its owner (the proxy) is reached through
:class:`UpstreamOwner`.

Replies are framed, not decoded (:class:`~npu_job.launcher.protocol.ReplyFramer`): a reply that
carries strings resolves its future to a :class:`~npu_job.launcher.protocol.RawReply`, the root's
own bytes, which the client is sent unchanged (both sides speak one dialect), large values read
from the socket straight into the buffers they are written from; fixed-size replies (ADD totals,
WAIT and CHECK answers, PING echoes) resolve to their numbers, which the proxy uses.
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket
from typing import Callable, Dict, List, Optional, Protocol, Set, Tuple, Union

from ..protocol import (
    BLOCKING_OPS,
    NO_REPLY_OPS,
    VALIDATION_MAGIC,
    Dialect,
    LargeBuffers,
    Op,
    ProtocolError,
    RawReply,
    ReplyFramer,
    Request,
    WaitReply,
    encode_request,
)
from .coalescing import AppliedMarks, Batch, dropped_for

#: What a reply future resolves to: a fixed-size reply's number, or a reply's own bytes.
Reply = Union[int, RawReply]


class UpstreamLost(ConnectionError):
    """The root store connection broke or could not be opened."""


class Counters:
    """The proxy's counters (see ``ProxyStats``), kept on its loop."""

    __slots__ = (
        "client_connections",
        "coalesced",
        "received_by_op",
        "requests_received",
        "requests_upstream",
        "upstream_by_op",
        "upstream_connections",
    )

    def __init__(self) -> None:
        self.client_connections = 0
        self.requests_received = 0
        self.requests_upstream = 0
        self.upstream_connections = 0
        self.coalesced = 0
        # keyed by Op, named in snapshots: Enum.name is a property lookup on the per-request path
        self.received_by_op: Dict[Op, int] = collections.Counter()
        self.upstream_by_op: Dict[Op, int] = collections.Counter()


class UpstreamOwner(Protocol):
    """What a connection needs of the proxy that owns it."""

    upstream: Tuple[str, int]
    upstream_text: str
    dialect: Dialect
    counters: Counters
    upstream_open: Set[Upstream]
    large_buffers: LargeBuffers  # shared by its connections' framers

    @property
    def closing(self) -> bool: ...

    def on_sent(self, conn: Upstream) -> None: ...

    def replay_later(self, requests: List[Tuple[Request, Optional[asyncio.Future]]]) -> None: ...

    def on_upstream_lost(self, conn: Upstream) -> None: ...

    def upstream_full(self, conn: Upstream, full: bool) -> None: ...


def set_nodelay(sock: Optional[socket.socket]) -> None:
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _RootSide(asyncio.BufferedProtocol):
    """The socket of one :class:`Upstream`: reads land in its framer's buffers.

    One per connection attempt; events reach the Upstream only once the attempt is its
    connection (an attempt given up after connecting is closed by asyncio and stays silent).
    """

    def __init__(self, conn: Upstream) -> None:
        self.conn = conn
        self.attached = False
        self.ended: Optional[Tuple[Optional[BaseException]]] = None  # lost before attached

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.framer.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self.attached:
            self.conn._received(nbytes)

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost follows

    def pause_writing(self) -> None:
        if self.attached:
            self.conn._proxy.upstream_full(self.conn, True)

    def resume_writing(self) -> None:
        if self.attached:
            self.conn._proxy.upstream_full(self.conn, False)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.attached:
            self.conn._ended(exc)
        else:
            self.ended = (exc,)


class Upstream:
    """One connection to the root: writes batched per loop iteration, replies matched FIFO."""

    def __init__(self, proxy: UpstreamOwner, kind: str) -> None:
        self._proxy = proxy
        self.kind = kind
        self._transport: Optional[asyncio.Transport] = None
        self.framer = ReplyFramer(buffers=proxy.large_buffers)
        # Requests sent and not yet known to be applied, in order: those with a reply (a future)
        # and, behind the first of those, the no-reply ones (None): if the root drops the
        # connection, what follows the request it failed on was never applied (see replayable).
        self._pending: collections.deque[Tuple[Request, Optional[asyncio.Future]]] = (
            collections.deque()
        )
        self._awaiting = 0  # entries of _pending with a future
        self.marks: AppliedMarks[Callable[[], None]] = AppliedMarks()
        self._out: List[bytes] = []
        self._flush_scheduled = False
        self.closed = False
        self._finished = False  # what was in flight has been failed or handed back
        # lost after the root dropped it for one request, the rest sent again (_replayable): every
        # no-reply write sent on it is applied or on its way again
        self.writes_kept = False
        self.batch = Batch()  # what send queues now: unsent until _flush (the proxy's contract)

    async def open(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        host, port = self._proxy.upstream
        delay = 0.05
        while True:
            try:
                transport, side = await asyncio.wait_for(
                    loop.create_connection(lambda: _RootSide(self), host, port),
                    timeout=max(0.1, min(10.0, deadline - loop.time())),
                )
                break
            except (OSError, asyncio.TimeoutError) as exc:
                # A stopping proxy gives up here, not only when cancelled: before Python 3.12,
                # asyncio.wait_for loses a cancellation that lands as the connect fails, and
                # the retries would run on to the deadline (the store timeout) inside stop().
                if self._proxy.closing:
                    raise UpstreamLost("proxy stopping") from exc
                if loop.time() + delay > deadline:
                    raise UpstreamLost(
                        f"cannot connect to the root store at {host}:{port}: {exc}"
                    ) from exc
                await asyncio.sleep(
                    delay * random.uniform(0.5, 1.0)
                )  # full jitter keeps nodes apart
                delay = min(delay * 2, 2.0)
        if self._proxy.closing:  # connected as the proxy stopped (a cancellation lost, as above)
            transport.close()
            raise UpstreamLost("proxy stopping")
        set_nodelay(transport.get_extra_info("socket"))
        self._transport = transport
        self._proxy.counters.upstream_connections += 1
        self._proxy.upstream_open.add(self)
        side.attached = True
        if side.ended is not None:  # it broke before it was ours
            self._ended(side.ended[0])
        dialect = self._proxy.dialect
        if dialect.validates:
            self.send(Request(Op.VALIDATE, number=VALIDATION_MAGIC))
        # Prove the peer is a store: PING where the root knows it (torch 2.5+), else a key count
        # (an i64 reply; a root sent an opcode it does not know would drop the connection).
        nonce = random.getrandbits(32)
        probe = Request(Op.PING, number=nonce) if Op.PING in dialect else Request(Op.GETNUMKEYS)
        answer = self.send(probe)
        assert answer is not None
        try:
            echoed = await asyncio.wait_for(
                asyncio.shield(answer), timeout=max(0.1, deadline - loop.time())
            )
        except asyncio.TimeoutError:
            self.close()
            raise UpstreamLost(
                f"the root store at {host}:{port} did not answer {probe.op.name}"
            ) from None
        except UpstreamLost:
            self.close()
            raise
        if probe.op == Op.PING and echoed != nonce:
            self.close()
            raise UpstreamLost(
                f"{host}:{port} is not a TCPStore (PING answered {echoed}, sent {nonce})"
            )

    @property
    def busy(self) -> bool:
        return self._awaiting > 0

    def send(self, request: Request) -> Optional[asyncio.Future]:
        """Queue ``request``; returns the future of its reply (None for no-reply ops)."""
        if self.closed:
            raise UpstreamLost(
                f"connection to the root store {self._proxy.upstream_text} is closed"
            )
        self._out.append(encode_request(request, self._proxy.dialect))
        counters = self._proxy.counters
        counters.requests_upstream += 1
        counters.upstream_by_op[request.op] += 1
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        if request.op in NO_REPLY_OPS:
            if self._awaiting:
                self._pending.append((request, None))
            return None
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._awaiting += 1
        self.marks.asked += 1
        return future

    def applied_mark(self) -> int:
        """After a no-reply request was queued: the mark at which it is applied."""
        return self.marks.mark()

    def when_applied(self, mark: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once ``mark`` is applied (at once if so; on loss, at the loss)."""
        if self.marks.applied(mark) or self.closed:
            callback()
            return
        if self.marks.needs_probe(mark):  # nothing with a reply follows: ask something cheap
            probe = (
                Request(Op.PING, number=0)
                if Op.PING in self._proxy.dialect
                else Request(Op.GETNUMKEYS)
            )
            self.send(probe)
        self.marks.wait(mark, callback)

    def _answered_one(self) -> None:
        for callback in self.marks.answer():
            callback()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None and not self.closed:
            data = b"".join(self._out)
            self._out.clear()
            self.batch.sent = True
            self.batch = Batch()
            self._proxy.on_sent(self)
            self._transport.write(data)

    def _received(self, nbytes: int) -> None:
        """Bytes from the root landed in the framer: answer the requests they complete."""
        framer = self.framer
        framer.received(nbytes)
        pending = self._pending
        try:
            while pending:
                request, future = pending[0]
                if future is None:  # applied: a request with a reply went before it
                    pending.popleft()
                    continue
                value = framer.next(request)
                if value is None:
                    break
                pending.popleft()
                self._awaiting -= 1
                self._answered_one()
                # A wait the root cancelled without waking it: its single byte is the
                # reply to the CANCEL_WAIT queued right behind it.
                if (
                    request.op in BLOCKING_OPS
                    and value == WaitReply.WAIT_CANCELED
                    and pending
                    and pending[0][0].op == Op.CANCEL_WAIT
                ):
                    cancel = pending.popleft()[1]
                    self._awaiting -= 1
                    self._answered_one()
                    assert cancel is not None
                    resolve(cancel, value)
                resolve(future, value)
            if framer.pending and not self._awaiting:
                raise ProtocolError(
                    f"unexpected bytes from the root store: {framer.peek(16).hex()}"
                )
        except ProtocolError as exc:
            self._ended(exc)

    def _ended(self, error: Optional[BaseException]) -> None:
        """The connection ended (the root hung up, a socket error, bytes no store sends) or was
        closed: fail what was in flight, or hand back what the root never read (once)."""
        if self._finished:
            return
        self._finished = True
        was_open = not self.closed
        self.close()
        lost = UpstreamLost(
            f"lost the connection to the root store {self._proxy.upstream_text}"
            + (f": {error}" if error else "")
        )
        replay = self._replayable(error)
        if replay is not None:
            self.writes_kept = True
            self._proxy.replay_later(replay)
        while self._pending:
            _, future = self._pending.popleft()
            if future is not None and not future.done():
                future.set_exception(lost)
                future.exception()  # mark retrieved; joiners still see it
        self._awaiting = 0
        if was_open:  # before the held WAIT answers go: it closes clients whose writes it lost
            self._proxy.on_upstream_lost(self)
        for callback in self.marks.drain():
            callback()

    def _replayable(
        self, error: Optional[BaseException]
    ) -> Optional[List[Tuple[Request, Optional[asyncio.Future]]]]:
        """The requests the root never read, when it dropped the main connection for one request.

        The root serves a connection's requests one at a time, in order, and drops the connection
        when one fails; the only requests a well-formed client can make fail are an ADD to a key
        that does not hold a number and, on the classic server, a GET or MULTI_GET of a missing
        key and the queue requests with a reply (``coalescing.CULPRIT_OPS``; the proxy refuses
        malformed requests itself). So when the first unanswered request
        is one of those and the peer hung up, it failed, everything before it was applied and
        answered, and nothing after it was read: those are sent again on a new connection (taken
        out of ``_pending``) and only its callers fail, as at the root. None (fail everything in
        flight) in every other case: a root gone, a protocol error.
        """
        if self.kind != "main" or self._proxy.closing or isinstance(error, ProtocolError):
            return None
        if isinstance(error, UpstreamLost):  # closed by the proxy
            return None
        index = dropped_for(self._pending)
        if index is None:
            return None
        pending = list(self._pending)
        self._pending.clear()
        self._pending.append(pending[index])  # failed below, with whatever else is in flight
        return pending[index + 1 :]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._proxy.upstream_open.discard(self)
        if self._transport is not None:
            self._transport.close()
            if not self._finished:  # closed by the proxy: what is in flight fails next turn
                asyncio.get_running_loop().call_soon(self._ended, UpstreamLost("proxy stopping"))


def resolve(future: asyncio.Future, value: Reply) -> None:
    if not future.done():
        future.set_result(value)


def forward(future: asyncio.Future, answer: asyncio.Future) -> None:
    """Settle ``future`` as ``answer`` settled (a request sent again on a new connection)."""
    if future.done():
        return
    if answer.cancelled():
        future.cancel()
    elif answer.exception() is not None:
        future.set_exception(answer.exception())  # type: ignore[arg-type]
    else:
        future.set_result(answer.result())
