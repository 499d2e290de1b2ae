"""The requests of the TCPStore wire protocol: opcodes, each torch release's dialect, and a
request's encoding and decoding (pure).

A request is ``u8 opcode`` then its fields (:mod:`.fields`); there are no request ids. torch
releases differ only in which opcodes they know and, before 2.2, in their numbering
(:class:`Dialect`).
"""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple, Union

from .fields import (
    _I64,
    _U8,
    _U32,
    _U64,
    MAX_KEY_COUNT,
    MAX_KEY_LEN,
    MAX_PAYLOAD_LEN,
    ProtocolError,
    _Incomplete,
    _key,
    _keys,
    _number,
    _payload,
    _skip_strings,
    _string,
)

VALIDATION_MAGIC = 0x3C85F7CE


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
