"""The proxy's local side: one :class:`Client` per worker connection to the proxy.

It owns what happens on that connection: reading into the server's shared buffer and decoding in
place, VALIDATE first, handing each request to the server (:meth:`.server.AsyncStoreProxy.handle`)
and pausing the connection while a request waits for an upstream connection, writing replies in
request order, and refusing a client that sent what its root would not take. What a request turns
into is the server's (:mod:`.server`) and, for the blocking ones, :mod:`.waits`'.

It also owns the bound on what one client costs in replies (back-pressure): it takes the client's
next request only while fewer than ``MAX_REPLIES_OWED`` of its replies are owed and what the
proxy has not yet sent it is under ``WRITE_HIGH_WATER``; otherwise it stops reading that
connection, and the client's further requests wait in the kernel's socket buffers.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from typing import TYPE_CHECKING, Optional, Tuple, Union

from ..protocol import (
    Op,
    ProtocolError,
    RawReply,
    complete_multi_set_prefix,
    decode_request,
    encode_reply,
)
from .coalescing import WaitGroup
from .upstream import Upstream, UpstreamLost, set_nodelay

if TYPE_CHECKING:
    from .server import AsyncStoreProxy

logger = logging.getLogger(__name__)

_REFUSED_LINGER = 10.0  # seconds a refused client may keep its connection open after our FIN
# Back-pressure per client: replies to its non-blocking requests not yet handed to its socket
# (torch's client has one in flight, the pipelining benchmarks three), and bytes handed to the
# transport that its socket did not take yet (asyncio's pause_writing/resume_writing).
MAX_REPLIES_OWED = 4
WRITE_HIGH_WATER = 1 << 16
# On asyncio's own transports, longer writes go a piece at a time as the transport drains: they
# copy what the socket does not take at once into one buffer, which costs a copy of each large
# reply and more as it shrinks (measured: 2x the CPU per GiB). uvloop's keep a reference.
_WRITE_PIECE = 1 << 20


class Client(asyncio.BufferedProtocol):
    """One local worker connection, callback-driven (no task per client: the proxy's CPU per
    request is what a single machine running many proxies pays twice over).

    Reads land in the proxy's shared scratch buffer (``recv_into``, no bytes object per read) and
    are decoded in place; only the tail of a request split across reads is copied to the client's
    own buffer.

    Requests are handled in arrival order; replies to non-blocking requests are written in the
    same order (a joined GET may finish before an earlier request of the same client). WAIT and
    BARRIER replies are written when they happen, as the root does.

    Memory per client is bounded: the next request is decoded only while fewer than
    ``MAX_REPLIES_OWED`` (4) replies are owed to the client and less than ``WRITE_HIGH_WATER``
    (64 KiB) waits in its transport; otherwise reading pauses until replies are written and the
    client has read enough. A client that does not read its replies thus holds at most 64 KiB
    plus four replies (plus one read, 64 KiB, of requests not yet decoded), and only its own
    connection slows down: the root connections and every other client go on.
    """

    _ids = itertools.count()

    def __init__(self, proxy: AsyncStoreProxy) -> None:
        self.id = next(self._ids)
        self.proxy = proxy
        self.transport: Optional[asyncio.Transport] = None
        self.wait: Optional[WaitGroup[Client]] = None
        self.barrier: Optional[Tuple[Upstream, asyncio.Future]] = None
        # the rest of a shared wake-up by a queue push, which answered this client alone: they
        # wait on once its next request (its pop) is answered (waits' lead_decides)
        self.lead_of: Optional[WaitGroup[Client]] = None
        # its latest no-reply write on the main connection: (connection, applied mark)
        self.unconfirmed: Optional[Tuple[Upstream, int]] = None
        self.stop_held: Optional[object] = None  # a WAIT answer held until that write is applied
        self._buf = bytearray()
        self._validated = not proxy.dialect.validates  # torch 2.1 clients send no VALIDATE
        self._blocked = False
        self._refused = False
        self._write_paused = False  # its transport holds WRITE_HIGH_WATER or more (asyncio's)
        self._reading_paused = False
        self._consuming = False
        self._replies: collections.deque[Tuple[Op, object]] = collections.deque()
        # reply bytes written but not yet handed to the transport (a large value, in pieces)
        self._unsent: collections.deque[memoryview] = collections.deque()
        self._piece = 0  # the most handed to the transport at once (0: everything)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: no isinstance
        # check
        self.transport = transport  # type: ignore[assignment]
        set_nodelay(transport.get_extra_info("socket"))
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        if type(transport).__module__.startswith("asyncio."):
            self._piece = _WRITE_PIECE
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

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._unsent:
            self._hand_over()
        if self._reading_paused:
            self.serve_more()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._unsent.clear()
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
        """Handle the whole requests at the start of ``buf``; returns where the rest begins.

        Stops early, leaving the rest for :meth:`serve_more`, while the client owes
        ``MAX_REPLIES_OWED`` replies, its transport is above ``WRITE_HIGH_WATER``, or the main
        connection's is above its own (the root reads slower than the clients write).
        """
        pos = 0
        proxy = self.proxy
        self._consuming = True
        try:
            while not self._held_back():
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
        finally:
            self._consuming = False
        self._pause_or_resume_reading()
        return pos

    def _held_back(self) -> bool:
        return (
            self._blocked
            or self._write_paused
            or len(self._replies) >= MAX_REPLIES_OWED
            or self.proxy.main_full
        )

    def _pause_or_resume_reading(self) -> None:
        """Read from the socket only when the next request could be taken (or to drop bytes)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        paused = not self._refused and self._held_back()
        if paused != self._reading_paused:
            self._reading_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def serve_more(self) -> None:
        """Take the requests held back, now that what held them back may have cleared."""
        if self._consuming or self._refused or self._held_back():
            return
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._buf:
            self._process()  # resumes reading unless held back again
        else:
            self._pause_or_resume_reading()

    def _block(self, awaitable: asyncio.Future[object]) -> None:
        self._blocked = True
        self._pause_or_resume_reading()

        async def resume() -> None:
            try:
                await awaitable
            except UpstreamLost as exc:
                logger.warning("store proxy: closing client %d: %s", self.id, exc)
                self.abort()
                return
            self._blocked = False
            self.serve_more()

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
                result = item.result()
                replies.popleft()
                if isinstance(result, RawReply):  # the root's bytes, as the root sent them
                    for part in result.parts:
                        self.write(part)
                else:
                    self.write(encode_reply(op, result))
                continue
            replies.popleft()
            self.write(item)  # type: ignore[arg-type]
        if self._refused:
            self._end_after_replies()
        elif self._reading_paused:
            self.serve_more()

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
        self._pause_or_resume_reading()
        self._flush_replies()

    def _end_after_replies(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or self._replies or self._unsent:
            return
        if transport.can_write_eof():
            transport.write_eof()
            # the client hangs up on the FIN; if it never does, do not keep it forever
            asyncio.get_running_loop().call_later(_REFUSED_LINGER, self.abort)
        else:
            transport.close()

    def write(self, data: Union[bytes, memoryview]) -> None:
        """Send ``data`` after everything written before it."""
        transport = self.transport
        if not data or transport is None or transport.is_closing():
            return
        if not self._unsent and (not self._piece or len(data) <= self._piece):
            transport.write(data)
            return
        self._unsent.append(memoryview(data))
        if not self._write_paused:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give the transport the unsent bytes a piece at a time until it has enough."""
        transport = self.transport
        unsent = self._unsent
        while unsent and not self._write_paused:
            if transport is None or transport.is_closing():
                unsent.clear()
                return
            data, piece = unsent[0], self._piece
            if len(data) > piece:
                unsent[0] = data[piece:]
                data = data[:piece]
            else:
                unsent.popleft()
            transport.write(data)  # calls pause_writing once it holds WRITE_HIGH_WATER
        if not unsent and self._refused:
            self._end_after_replies()

    def abort(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.abort()
