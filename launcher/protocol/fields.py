"""The wire's fields: little-endian integers and length-prefixed strings, read from a buffer that
may end early (pure).

A string or byte value is ``u64 length`` + bytes. The readers take ``(buffer, position)`` and
return ``(value, next position)``; one that runs past the bytes received raises
:class:`_Incomplete`, which the request and reply decoders turn into "not yet" (None). The
server's limits are checked as soon as a length is read, as the stock server does.
"""

from __future__ import annotations

import struct
from typing import Optional, Tuple, Union

# Server-side limits of the libuv backend; a request beyond them makes the
# stock server drop the connection, so the proxy rejects it the same way.
MAX_KEY_LEN = 8 * 1024
MAX_PAYLOAD_LEN = 8 * 1024 * 1024
MAX_KEY_COUNT = 128 * 1024


class ProtocolError(ValueError):
    """Bytes that no stock client would send (unknown opcode, bad magic, oversize field)."""


_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


def _string(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


class _Incomplete(Exception):
    """More bytes are needed; the caller keeps its buffer and retries later."""


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


def _skip_strings(buf: Union[bytes, bytearray, memoryview], pos: int, count: int) -> Optional[int]:
    """Where ``count`` length-prefixed strings starting at ``pos`` end; None if they are not all
    in ``buf`` yet. Reads only the lengths: checking a reply that arrives in many reads costs
    O(strings) per read, never a copy of the values already there."""
    for _ in range(count):
        if pos + 8 > len(buf):
            return None
        pos += 8 + _U64.unpack_from(buf, pos)[0]
    return pos if pos <= len(buf) else None
