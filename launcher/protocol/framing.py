"""Framing replies for a relay: each reply's exact wire bytes, without decoding its values.

A relay that forwards replies unchanged (the store proxy) cuts the root's byte stream into
replies with :class:`ReplyFramer` and gets each as a :class:`RawReply`, large values in buffers
of their own that the socket reads into (:class:`LargeBuffers` reuses them).
"""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

from .fields import _I64, _U8, _U32, _U64, ProtocolError
from .requests import Op, Request

#: Strings at least this long get a buffer of their own, filled straight from the socket.
DIRECT_STRING = 1 << 16
_FRAMER_BUFFER = 1 << 16
_MAX_STRING = 1 << 40  # a length beyond any store's memory: the peer is not a store
_FIXED_REPLIES = {
    **{op: _I64 for op in (Op.ADD, Op.GETNUMKEYS, Op.DELETE_KEY, Op.QUEUE_LEN)},
    **{op: _U8 for op in (Op.CHECK, Op.WAIT, Op.BARRIER, Op.CANCEL_WAIT)},
    Op.PING: _U32,
}


class RawReply:
    """A reply that carries strings, as the server sent it: ``parts`` joined are its wire bytes.

    What a relay writes unchanged when both sides speak one dialect (small replies are one
    ``bytes``; a long string is a read-only view of its own buffer). ``count`` is the leading
    number of a LIST_KEYS reply (how many keys) or of a QUEUE_POP reply (the queue's length
    before the pop), else 0. The parts are never written to: replies shared by several callers
    are handed to several transports.
    """

    __slots__ = ("count", "op", "parts")

    def __init__(self, op: Op, parts: Tuple[Union[bytes, memoryview], ...], count: int = 0) -> None:
        self.op = op
        self.parts = parts
        self.count = count

    def __repr__(self) -> str:
        size, parts = self.size, len(self.parts)
        return f"RawReply({self.op.name}, {size} bytes in {parts} parts, count={self.count})"

    @property
    def size(self) -> int:
        return sum(len(part) for part in self.parts)


class LargeBuffers:
    """Buffers for large reply strings, reused once nothing refers to them any more.

    A fresh ``bytearray`` of a few MiB costs a memset, a page fault per 4 KiB page and an unmap
    when it is freed (a fifth of the store proxy's CPU per GiB relayed, measured with perf). A
    buffer is handed out again only when no view of it is alive: not the reply that holds its
    string, nor a transport still writing it (uvloop's, and asyncio's from Python 3.12, keep the
    view they were given until it is sent). A ``bytearray`` tells that itself: while a view of it
    exists it refuses to change size (:func:`_unviewed`). At most ``keep`` bytes are kept; a
    buffer is reused for a string between half its size and its size.
    """

    __slots__ = ("_keep", "_kept")

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._kept: List[bytearray] = []

    @property
    def kept(self) -> int:
        return sum(len(buffer) for buffer in self._kept)

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes (their content is whatever the buffer last held)."""
        kept = self._kept
        for buffer in kept:
            if size <= len(buffer) < 2 * size and _unviewed(buffer):
                return memoryview(buffer)[:size]
        buffer = bytearray(size)
        room = self._keep - self.kept
        for index in range(len(kept) - 1, -1, -1):
            if room >= size:
                break
            if _unviewed(kept[index]):
                room += len(kept.pop(index))
        if room >= size:
            kept.append(buffer)
        return memoryview(buffer)


def _unviewed(buffer: bytearray) -> bool:
    """No view of ``buffer`` is alive: a bytearray with one cannot be resized (BufferError)."""
    try:
        buffer.append(0)  # the first time, the allocation grows a little; later, it has room
    except BufferError:
        return False
    del buffer[-1]
    return True


class ReplyFramer:
    """Cuts one connection's byte stream into replies, in request order, without decoding values.

    For a relay (the store proxy): the socket reads into :meth:`buffer`, :meth:`received` counts
    what landed, and :meth:`next` returns the reply to the request in front once it is complete
    (None until then; call it again after the next read with the same request). Fixed-size
    replies come back decoded (an int, as :func:`.replies.decode_reply` gives them); replies that
    carry strings come back as a :class:`RawReply`. A string of ``DIRECT_STRING`` bytes or more
    gets a buffer of its own that :meth:`buffer` hands to the socket, so a large value is copied
    once, from the kernel
    into the buffer it is written from; shorter strings go through one small reusable buffer.
    """

    def __init__(self, direct: int = DIRECT_STRING, buffers: Optional[LargeBuffers] = None) -> None:
        self._direct = max(1, direct)
        self._buffers = buffers  # where large strings' buffers come from (None: fresh ones)
        self._rx = bytearray(_FRAMER_BUFFER)
        self._view = memoryview(self._rx)
        self._start = 0  # the first byte not framed yet
        self._end = 0  # the end of the bytes received
        self._into_large = False  # what the latest buffer() handed out
        # the reply being framed
        self._parts: List[Union[bytes, memoryview]] = []
        self._head = bytearray()  # its bytes since the latest large string
        self._strings = -1  # strings still to frame; -1: its leading fields are not read yet
        self._count = 0
        self._left = -1  # bytes of the current short string still to copy; -1: a length is next
        self._large: Optional[memoryview] = None
        self._filled = 0

    @property
    def pending(self) -> bool:
        """Bytes were received that no complete reply took yet."""
        return self._end > self._start or self._strings >= 0

    def peek(self, size: int) -> bytes:
        return bytes(self._view[self._start : min(self._end, self._start + size)])

    def buffer(self) -> memoryview:
        """Where the socket's next bytes go."""
        large = self._large
        if large is not None and self._filled < len(large):
            self._into_large = True
            return large[self._filled :]
        self._into_large = False
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._rx) - self._end < len(self._rx) // 4:
            # only a field cut short is left here (framing takes every complete one): a few bytes
            rest = bytes(self._view[self._start : self._end])
            self._rx[: len(rest)] = rest
            self._start, self._end = 0, len(rest)
        return self._view[self._end :]

    def received(self, nbytes: int) -> None:
        """``nbytes`` landed at the start of the latest :meth:`buffer`."""
        if self._into_large:
            self._filled += nbytes
        else:
            self._end += nbytes

    def next(self, request: Request) -> Optional[Union[int, RawReply]]:
        """The reply to ``request`` (the oldest unanswered one), or None while incomplete."""
        op = request.op
        fixed = _FIXED_REPLIES.get(op)
        if fixed is not None:
            if self._end - self._start < fixed.size:
                return None
            (value,) = fixed.unpack_from(self._rx, self._start)
            self._start += fixed.size
            return value
        if self._strings < 0 and not self._lead(request):
            return None
        while self._strings > 0:
            if not self._frame_string():
                return None
            self._strings -= 1
            self._left = -1
        head, parts = self._head, self._parts
        if head:
            parts.append(bytes(head))
        reply = RawReply(op, tuple(parts), self._count)
        self._parts, self._head = [], bytearray()
        self._strings, self._count = -1, 0
        return reply

    def _lead(self, request: Request) -> bool:
        """Read the fields before the reply's strings: how many strings follow."""
        op = request.op
        if op in (Op.GET, Op.COMPARE_SET):
            self._strings = 1
        elif op == Op.MULTI_GET:
            self._strings = len(request.keys)
        elif op in (Op.LIST_KEYS, Op.QUEUE_POP):
            if self._end - self._start < 8:
                return False
            (count,) = _I64.unpack_from(self._rx, self._start)
            self._take(8)
            self._count = count
            self._strings = max(count, 0) if op == Op.LIST_KEYS else int(count > 0)
        else:
            raise ProtocolError(f"no reply shape for opcode {op}")
        return True

    def _frame_string(self) -> bool:
        """Frame (the rest of) one string of the current reply; False until it is complete."""
        large = self._large
        if large is not None:
            if self._filled < len(large):
                return False
            self._parts.append(large.toreadonly())
            self._large = None
            return True
        if self._left < 0:  # its length
            if self._end - self._start < 8:
                return False
            (size,) = _U64.unpack_from(self._rx, self._start)
            if size > _MAX_STRING:
                raise ProtocolError(f"a reply string of {size} bytes: the peer is not a store")
            self._take(8)
            if size >= self._direct:
                if self._head:
                    self._parts.append(bytes(self._head))
                    self._head = bytearray()
                buffers = self._buffers
                large = self._large = (
                    memoryview(bytearray(size)) if buffers is None else buffers.take(size)
                )
                now = min(size, self._end - self._start)
                large[:now] = self._view[self._start : self._start + now]
                self._start += now
                self._filled = now
                return self._frame_string()
            self._left = size
        now = min(self._left, self._end - self._start)
        self._take(now)
        self._left -= now
        return self._left == 0

    def _take(self, size: int) -> None:
        self._head += self._view[self._start : self._start + size]
        self._start += size
