"""The TCPStore wire protocol: opcodes, request and reply framing, encode/decode (pure).

Checked against torch 2.13's C++ client (``TCPStore.cpp``) and libuv server
(``TCPStoreLibUvBackend.cpp``) and by sniffing a real client talking to a real
server: little-endian; a request is ``u8 opcode`` then its fields; strings and
byte values are ``u64 length`` + bytes. There are no request ids: replies come
back in request order on each connection, except that a blocking WAIT/BARRIER
reply arrives whenever the key is ready.

Nothing here touches sockets: callers hand in bytes and get values back, so the
proxy, the raw benchmark client and the tests share one implementation. A relay that
forwards replies unchanged frames them with :class:`ReplyFramer` instead of decoding
them: it gets each reply's exact wire bytes (:class:`RawReply`), large values in
buffers of their own that the socket reads into.
"""

from __future__ import annotations

import enum
import struct
import types
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple, Union

VALIDATION_MAGIC = 0x3C85F7CE

# Server-side limits of the libuv backend; a request beyond them makes the
# stock server drop the connection, so the proxy rejects it the same way.
MAX_KEY_LEN = 8 * 1024
MAX_PAYLOAD_LEN = 8 * 1024 * 1024
MAX_KEY_COUNT = 128 * 1024


class Op(enum.IntEnum):
    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


class WaitReply(enum.IntEnum):
    STOP_WAITING = 0
    WAIT_CANCELED = 1


class CheckReply(enum.IntEnum):
    READY = 0
    NOT_READY = 1


NO_REPLY_OPS = frozenset({Op.VALIDATE, Op.SET, Op.APPEND, Op.MULTI_SET, Op.QUEUE_PUSH})
BLOCKING_OPS = frozenset({Op.WAIT, Op.BARRIER})
# Ops after which the stored value of each named key may differ.
WRITE_OPS = frozenset(
    {
        Op.SET,
        Op.COMPARE_SET,
        Op.ADD,
        Op.DELETE_KEY,
        Op.APPEND,
        Op.MULTI_SET,
        Op.QUEUE_PUSH,
        Op.QUEUE_POP,
        Op.BARRIER,
    }
)
QUEUE_OPS = frozenset({Op.QUEUE_PUSH, Op.QUEUE_POP, Op.QUEUE_LEN})


@dataclass(frozen=True)
class Dialect:
    """The requests one torch release's store understands, and the byte that names each.

    ``Op`` holds every request of the newest protocol under its 2.2+ number. torch 2.1 had no
    VALIDATE and numbered SET as 0 (every byte one lower); later releases only appended opcodes.
    ``opcodes[op]`` is the wire byte of ``op``; ``ops_by_byte[b]`` the op of byte ``b`` (None for
    a byte this release does not know). Build one with :func:`make_dialect`.
    """

    name: str
    opcodes: Mapping[Op, int]
    ops_by_byte: Tuple[Optional[Op], ...]

    def __contains__(self, op: object) -> bool:
        return op in self.opcodes

    @property
    def validates(self) -> bool:
        """Clients open every connection with VALIDATE (torch 2.2+)."""
        return Op.VALIDATE in self.opcodes


_LEGACY_OPS = tuple(op for op in Op if Op.SET <= op <= Op.CANCEL_WAIT)


def make_dialect(
    *,
    validate: bool = True,
    ping: bool = True,
    queues: bool = True,
    list_keys: bool = True,
    barrier: bool = True,
) -> Dialect:
    """The dialect with the given optional requests (all of them: the newest torch's)."""
    ops = list(_LEGACY_OPS)
    extras = (
        (validate, (Op.VALIDATE,)),
        (ping, (Op.PING,)),
        (queues, (Op.QUEUE_PUSH, Op.QUEUE_POP, Op.QUEUE_LEN)),
        (list_keys, (Op.LIST_KEYS,)),
        (barrier, (Op.BARRIER,)),
    )
    for present, extra in extras:
        if present:
            ops += extra
    if not validate and len(ops) != len(_LEGACY_OPS):
        raise ValueError("a store without VALIDATE (torch 2.1) knows no later request either")
    shift = 0 if validate else 1
    opcodes = {op: int(op) - shift for op in sorted(ops)}
    by_byte: List[Optional[Op]] = [None] * 256
    for op, byte in opcodes.items():
        by_byte[byte] = op
    missing = [op.name for op in Op if op not in opcodes]
    name = "torch 2.1 numbering" if shift else "torch 2.2+ numbering"
    name += f", without {', '.join(missing)}" if missing else ", every request"
    return Dialect(name, types.MappingProxyType(opcodes), tuple(by_byte))


#: The newest protocol (torch 2.12+): what the proxy and the tests speak unless told otherwise.
NEWEST = make_dialect()


class ProtocolError(ValueError):
    """Bytes that no stock client would send (unknown opcode, bad magic, oversize field)."""


@dataclass(frozen=True)
class Request:
    """One decoded request.

    ``keys``/``values`` hold the strings in wire order (MULTI_SET: keys[i] gets
    values[i]; COMPARE_SET: values = (expected, desired)). ``number`` carries the
    single integer field: VALIDATE magic, PING nonce, ADD delta, BARRIER world size.
    """

    op: Op
    keys: Tuple[bytes, ...] = ()
    values: Tuple[bytes, ...] = ()
    number: int = 0


@dataclass(frozen=True)
class QueuePopReply:
    """QUEUE_POP answers the queue length before the pop, then the value if it was > 0."""

    length: int
    value: Optional[bytes] = None


ReplyValue = Union[None, int, bytes, Tuple[bytes, ...], QueuePopReply]

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


# ---------------------------------------------------------------- encoding


def _string(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def encode_request(request: Request, dialect: Dialect = NEWEST) -> bytes:
    op = request.op
    try:
        head = _U8.pack(dialect.opcodes[op])
    except KeyError:
        raise ProtocolError(f"{op.name} is not in this store's protocol ({dialect.name})") from None
    if op in (Op.VALIDATE, Op.PING):
        return head + _U32.pack(request.number)
    if op in (Op.GETNUMKEYS, Op.CANCEL_WAIT, Op.LIST_KEYS):
        return head
    if op in (Op.GET, Op.DELETE_KEY, Op.QUEUE_POP, Op.QUEUE_LEN):
        return head + _string(request.keys[0])
    if op in (Op.SET, Op.APPEND, Op.QUEUE_PUSH):
        return head + _string(request.keys[0]) + _string(request.values[0])
    if op == Op.COMPARE_SET:
        expected, desired = request.values
        return head + _string(request.keys[0]) + _string(expected) + _string(desired)
    if op in (Op.ADD, Op.BARRIER):
        return head + _string(request.keys[0]) + _I64.pack(request.number)
    if op in (Op.CHECK, Op.WAIT, Op.MULTI_GET):
        return head + _U64.pack(len(request.keys)) + b"".join(_string(k) for k in request.keys)
    if op == Op.MULTI_SET:
        parts = [head, _U64.pack(len(request.keys))]
        for key, value in zip(request.keys, request.values):
            parts += [_string(key), _string(value)]
        return b"".join(parts)
    raise ProtocolError(f"cannot encode opcode {op}")


def encode_reply(op: Op, value: ReplyValue) -> bytes:
    """Bytes the server sends for ``op`` with result ``value`` (b"" for no-reply ops)."""
    if op in NO_REPLY_OPS:
        return b""
    if op in (Op.GET, Op.COMPARE_SET):
        return _string(value)  # type: ignore[arg-type]
    if op in (Op.ADD, Op.GETNUMKEYS, Op.DELETE_KEY, Op.QUEUE_LEN):
        return _I64.pack(value)  # type: ignore[arg-type]
    if op in (Op.CHECK, Op.WAIT, Op.BARRIER, Op.CANCEL_WAIT):
        return _U8.pack(value)  # type: ignore[arg-type]
    if op == Op.PING:
        return _U32.pack(value)  # type: ignore[arg-type]
    if op == Op.MULTI_GET:
        return b"".join(_string(v) for v in value)  # type: ignore[union-attr]
    if op == Op.LIST_KEYS:
        keys = value  # type: ignore[assignment]
        return _I64.pack(len(keys)) + b"".join(_string(k) for k in keys)  # type: ignore[arg-type]
    if op == Op.QUEUE_POP:
        assert isinstance(value, QueuePopReply)
        out = _I64.pack(value.length)
        return out + _string(value.value or b"") if value.length > 0 else out
    raise ProtocolError(f"cannot encode reply for opcode {op}")


# ---------------------------------------------------------------- decoding


class _Incomplete(Exception):
    """More bytes are needed; the caller keeps its buffer and retries later."""


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: Union[bytes, bytearray, memoryview], pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _Incomplete
        with memoryview(self.buf) as view:  # one copy (slicing a bytearray would make two)
            out = bytes(view[self.pos : end])
        self.pos = end
        return out

    def unpack(self, fmt: struct.Struct) -> int:
        end = self.pos + fmt.size
        if end > len(self.buf):
            raise _Incomplete
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos = end
        return value

    def string(self, limit: int, what: str) -> bytes:
        size = self.unpack(_U64)
        if size > limit:
            raise ProtocolError(f"{what} of {size} bytes exceeds the server limit of {limit}")
        return self.take(size)

    def count(self) -> int:
        count = self.unpack(_U64)
        if count > MAX_KEY_COUNT:
            raise ProtocolError(f"{count} keys exceed the server limit of {MAX_KEY_COUNT}")
        return count


def _key(
    buf: Union[bytes, bytearray, memoryview], pos: int, limit: int = MAX_KEY_LEN, what: str = "key"
) -> Tuple[bytes, int]:
    if pos + 8 > len(buf):
        raise _Incomplete
    (size,) = _U64.unpack_from(buf, pos)
    if size > limit:
        raise ProtocolError(f"{what} of {size} bytes exceeds the server limit of {limit}")
    start, end = pos + 8, pos + 8 + size
    if end > len(buf):
        raise _Incomplete
    with memoryview(buf) as view:  # one copy (slicing a bytearray would make two)
        return bytes(view[start:end]), end


def _payload(buf: Union[bytes, bytearray, memoryview], pos: int) -> Tuple[bytes, int]:
    return _key(buf, pos, MAX_PAYLOAD_LEN, "value")


def _number(
    buf: Union[bytes, bytearray, memoryview], pos: int, fmt: struct.Struct
) -> Tuple[int, int]:
    end = pos + fmt.size
    if end > len(buf):
        raise _Incomplete
    return fmt.unpack_from(buf, pos)[0], end


def _keys(buf: Union[bytes, bytearray, memoryview], pos: int) -> Tuple[Tuple[bytes, ...], int]:
    count, pos = _number(buf, pos, _U64)
    if count > MAX_KEY_COUNT:
        raise ProtocolError(f"{count} keys exceed the server limit of {MAX_KEY_COUNT}")
    keys = []
    for _ in range(count):
        key, pos = _key(buf, pos)
        keys.append(key)
    return tuple(keys), pos


_KEY_ONLY = frozenset({Op.GET, Op.DELETE_KEY, Op.QUEUE_POP, Op.QUEUE_LEN})
_KEY_VALUE = frozenset({Op.SET, Op.APPEND, Op.QUEUE_PUSH})
_KEY_LIST = frozenset({Op.CHECK, Op.WAIT, Op.MULTI_GET})
_BARE = frozenset({Op.GETNUMKEYS, Op.CANCEL_WAIT, Op.LIST_KEYS})


def decode_request(
    buf: Union[bytes, bytearray, memoryview], pos: int = 0, dialect: Dialect = NEWEST
) -> Optional[Tuple[Request, int]]:
    """Decode one request at ``buf[pos:]``; None if incomplete, else (request, next pos)."""
    if pos >= len(buf):
        return None
    op = dialect.ops_by_byte[buf[pos]]
    if op is None:
        raise ProtocolError(f"unknown opcode {buf[pos]} ({dialect.name})")
    pos += 1
    try:
        if op in _KEY_ONLY:
            key, pos = _key(buf, pos)
            request = Request(op, (key,))
        elif op in _KEY_LIST:
            keys, pos = _keys(buf, pos)
            request = Request(op, keys)
        elif op in _KEY_VALUE:
            key, pos = _key(buf, pos)
            value, pos = _payload(buf, pos)
            request = Request(op, (key,), (value,))
        elif op in (Op.ADD, Op.BARRIER):
            key, pos = _key(buf, pos)
            number, pos = _number(buf, pos, _I64)
            request = Request(op, (key,), number=number)
        elif op in (Op.VALIDATE, Op.PING):
            number, pos = _number(buf, pos, _U32)
            if op == Op.VALIDATE and number != VALIDATION_MAGIC:
                raise ProtocolError(f"bad validation magic {number:#x}")
            request = Request(op, number=number)
        elif op in _BARE:
            request = Request(op)
        elif op == Op.COMPARE_SET:
            key, pos = _key(buf, pos)
            expected, pos = _payload(buf, pos)
            desired, pos = _payload(buf, pos)
            request = Request(op, (key,), (expected, desired))
        else:  # MULTI_SET
            count, pos = _number(buf, pos, _U64)
            if count > MAX_KEY_COUNT:
                raise ProtocolError(f"{count} keys exceed the server limit of {MAX_KEY_COUNT}")
            if _skip_strings(buf, pos, 2 * count) is None:  # copy the values once, when all came
                _check_multi_set_prefix(buf, pos, count)
                raise _Incomplete
            keys, values = [], []
            for _ in range(count):
                key, pos = _key(buf, pos)
                value, pos = _payload(buf, pos)
                keys.append(key)
                values.append(value)
            request = Request(op, tuple(keys), tuple(values))
    except _Incomplete:
        return None
    return request, pos


def complete_multi_set_prefix(
    buf: Union[bytes, bytearray, memoryview], dialect: Dialect = NEWEST
) -> Optional[Request]:
    """The complete key/value pairs at the start of a MULTI_SET cut short (its client died).

    The stock server stores each pair of a MULTI_SET as it parses it, so a client that vanishes
    mid-request leaves the complete pairs behind; a relay must forward those. None when ``buf``
    holds no MULTI_SET or no complete pair (or the bytes are not a valid request).
    """
    if not buf or dialect.ops_by_byte[buf[0]] != Op.MULTI_SET:
        return None
    keys: List[bytes] = []
    values: List[bytes] = []
    try:
        count, pos = _number(buf, 1, _U64)
        for _ in range(min(count, MAX_KEY_COUNT)):
            key, pos = _key(buf, pos)
            value, pos = _payload(buf, pos)
            keys.append(key)
            values.append(value)
    except (_Incomplete, ProtocolError):
        pass
    return Request(Op.MULTI_SET, tuple(keys), tuple(values)) if keys else None


def _skip_strings(buf: Union[bytes, bytearray, memoryview], pos: int, count: int) -> Optional[int]:
    """Where ``count`` length-prefixed strings starting at ``pos`` end; None if they are not all
    in ``buf`` yet. Reads only the lengths: checking a reply that arrives in many reads costs
    O(strings) per read, never a copy of the values already there."""
    for _ in range(count):
        if pos + 8 > len(buf):
            return None
        pos += 8 + _U64.unpack_from(buf, pos)[0]
    return pos if pos <= len(buf) else None


def reply_complete(
    request: Request, buf: Union[bytes, bytearray, memoryview], pos: int = 0
) -> bool:
    """Whether the whole reply to ``request`` is in ``buf[pos:]`` (cheap; no value is copied)."""
    op = request.op
    if op in (Op.GET, Op.COMPARE_SET):
        return _skip_strings(buf, pos, 1) is not None
    if op == Op.MULTI_GET:
        return _skip_strings(buf, pos, len(request.keys)) is not None
    if op == Op.LIST_KEYS:
        if pos + 8 > len(buf):
            return False
        return _skip_strings(buf, pos + 8, _I64.unpack_from(buf, pos)[0]) is not None
    if op == Op.QUEUE_POP:
        if pos + 8 > len(buf):
            return False
        length = _I64.unpack_from(buf, pos)[0]
        return length <= 0 or _skip_strings(buf, pos + 8, 1) is not None
    return True  # fixed-size replies: decode_reply checks them at no cost


def _check_multi_set_prefix(buf: Union[bytes, bytearray, memoryview], pos: int, count: int) -> None:
    """Refuse an oversize key or value of an incomplete MULTI_SET as soon as its length is in."""
    for index in range(2 * count):
        if pos + 8 > len(buf):
            return
        size = _U64.unpack_from(buf, pos)[0]
        limit, what = (MAX_KEY_LEN, "key") if index % 2 == 0 else (MAX_PAYLOAD_LEN, "value")
        if size > limit:
            raise ProtocolError(f"{what} of {size} bytes exceeds the server limit of {limit}")
        pos += 8 + size


def decode_reply(
    request: Request, buf: Union[bytes, bytearray, memoryview], pos: int = 0
) -> Optional[Tuple[ReplyValue, int]]:
    """Decode the reply to ``request`` at ``buf[pos:]``; None if incomplete."""
    op = request.op
    if not reply_complete(request, buf, pos):
        return None
    cur = _Cursor(buf, pos)
    try:
        if op in NO_REPLY_OPS:
            value: ReplyValue = None
        elif op in (Op.GET, Op.COMPARE_SET):
            value = cur.string(1 << 62, "value")
        elif op in (Op.ADD, Op.GETNUMKEYS, Op.DELETE_KEY, Op.QUEUE_LEN):
            value = cur.unpack(_I64)
        elif op in (Op.CHECK, Op.WAIT, Op.BARRIER, Op.CANCEL_WAIT):
            value = cur.unpack(_U8)
        elif op == Op.PING:
            value = cur.unpack(_U32)
        elif op == Op.MULTI_GET:
            value = tuple(cur.string(1 << 62, "value") for _ in request.keys)
        elif op == Op.LIST_KEYS:
            n = cur.unpack(_I64)
            value = tuple(cur.string(1 << 62, "key") for _ in range(n))
        elif op == Op.QUEUE_POP:
            length = cur.unpack(_I64)
            value = QueuePopReply(length, cur.string(1 << 62, "value") if length > 0 else None)
        else:
            raise ProtocolError(f"no reply shape for opcode {op}")
    except _Incomplete:
        return None
    return value, cur.pos


def decode_wait_byte(
    buf: Union[bytes, bytearray, memoryview], pos: int = 0
) -> Optional[Tuple[int, int]]:
    """A WAIT/BARRIER/CANCEL_WAIT connection answers single bytes: (byte, next pos) or None."""
    if pos >= len(buf):
        return None
    return buf[pos], pos + 1


# ---------------------------------------------------------------- framing replies for a relay

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
    (None until then; call it again after the next read with the same request). Fixed-size replies
    come back decoded (an int, as :func:`decode_reply` gives them); replies that carry strings come
    back as a :class:`RawReply`. A string of ``DIRECT_STRING`` bytes or more gets a buffer of its
    own that :meth:`buffer` hands to the socket, so a large value is copied once, from the kernel
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
