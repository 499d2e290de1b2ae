"""The replies of the TCPStore wire protocol: their values, encoding and decoding (pure).

Replies come back in request order on each connection, except that a blocking WAIT/BARRIER
reply arrives whenever the key is ready; a reply's shape is its request's opcode.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from .fields import _I64, _U8, _U32, _U64, ProtocolError, _Incomplete, _skip_strings, _string
from .requests import NO_REPLY_OPS, Op, Request


class WaitReply(enum.IntEnum):
    STOP_WAITING = 0
    WAIT_CANCELED = 1


class CheckReply(enum.IntEnum):
    READY = 0
    NOT_READY = 1


@dataclass(frozen=True)
class QueuePopReply:
    """QUEUE_POP answers the queue length before the pop, then the value if it was > 0."""

    length: int
    value: Optional[bytes] = None


ReplyValue = Union[None, int, bytes, Tuple[bytes, ...], QueuePopReply]


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
