"""A small raw-protocol TCPStore client (blocking and asyncio).

torch's own client is the real thing and npu-run and its tests use it wherever they can. This
one exists for what it cannot do: pipeline several requests or send them from many simulated ranks
in one process without a thread (and a GIL-holding C++ call) per rank, hand-craft bytes, and ask
what torch 2.1's bindings cannot ask safely (:func:`npu_job.launcher.torchcompat.key_exists`). It
speaks
exactly :mod:`npu_job.launcher.protocol` in a given dialect (default the newest), connecting as
that torch's client does (VALIDATE, then PING, where the dialect has them).
"""

from __future__ import annotations

import asyncio
import random
import socket
from typing import List, Optional, Tuple

from npu_job.polling import Backoff

from .protocol import (
    NEWEST,
    NO_REPLY_OPS,
    VALIDATION_MAGIC,
    Dialect,
    Op,
    ProtocolError,
    ReplyValue,
    Request,
    decode_reply,
    encode_request,
)

# connect() to a store that is not listening yet: pauses from 10 ms doubling to 1 s, each 50-100 %
CONNECT_RETRY = Backoff(0.01, factor=2.0, cap=1.0, jitter=(0.5, 1.0))


class _ReplyBuffer:
    """Bytes received from the store but not yet decoded (one per connection, both clients)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def take(self, request: Request) -> Tuple[bool, ReplyValue]:
        """``(True, reply)`` once the reply to ``request`` is complete, else ``(False, None)``."""
        decoded = decode_reply(request, self._buf)
        if decoded is None:
            return False, None
        value, pos = decoded
        del self._buf[:pos]
        return True, value

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            raise ConnectionError("store closed the connection")
        self._buf += chunk


class RawStoreClient:
    """Blocking client: ``send`` requests (pipelining allowed), ``receive`` replies in order."""

    def __init__(
        self, host: str, port: int, timeout: float = 30.0, dialect: Dialect = NEWEST
    ) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.dialect = dialect
        self._replies = _ReplyBuffer()
        if dialect.validates:
            self.send(Request(Op.VALIDATE, number=VALIDATION_MAGIC))
        if Op.PING in dialect:
            nonce = random.getrandbits(32)
            if self.call(Request(Op.PING, number=nonce)) != nonce:
                raise ProtocolError("PING was not echoed")

    def send(self, *requests: Request) -> None:
        self.sock.sendall(b"".join(encode_request(r, self.dialect) for r in requests))

    def receive(self, request: Request) -> ReplyValue:
        if request.op in NO_REPLY_OPS:
            return None
        while True:
            done, value = self._replies.take(request)
            if done:
                return value
            self._replies.feed(self.sock.recv(1 << 16))

    def call(self, request: Request) -> ReplyValue:
        self.send(request)
        return self.receive(request)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawStoreClient:  # noqa: PYI034 - typing.Self needs 3.11 or typing_extensions
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncRawStoreClient:
    """asyncio client, one request at a time (like torch's client)."""

    def __init__(self, dialect: Dialect = NEWEST) -> None:
        self.dialect = dialect
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._replies = _ReplyBuffer()
        self.requests_sent = 0

    @classmethod
    async def connect(
        cls, host: str, port: int, retry_until: float = 0.0, dialect: Dialect = NEWEST
    ) -> AsyncRawStoreClient:
        self = cls(dialect)
        loop = asyncio.get_running_loop()
        pauses = CONNECT_RETRY.pauses()
        while True:
            try:
                self._reader, self._writer = await asyncio.open_connection(host, port)
                break
            except OSError:
                if loop.time() > retry_until:
                    raise
                await asyncio.sleep(next(pauses))
        if dialect.validates:
            await self.call(Request(Op.VALIDATE, number=VALIDATION_MAGIC))
        if Op.PING in dialect:
            await self.call(Request(Op.PING, number=1))
        return self

    async def call(self, request: Request) -> ReplyValue:
        return (await self.pipeline(request))[0]

    async def pipeline(self, *requests: Request) -> List[ReplyValue]:
        """Send ``requests`` in one write and return their replies in order (one round trip)."""
        assert self._writer is not None and self._reader is not None
        self._writer.write(b"".join(encode_request(request, self.dialect) for request in requests))
        self.requests_sent += len(requests)
        replies: List[ReplyValue] = []
        for request in requests:
            while request.op not in NO_REPLY_OPS:
                done, value = self._replies.take(request)
                if done:
                    replies.append(value)
                    break
                self._replies.feed(await self._reader.read(1 << 16))
            else:
                replies.append(None)
        return replies

    async def get(self, key: bytes) -> bytes:
        """torch's ``get``: WAIT for the key, then GET it."""
        await self.call(Request(Op.WAIT, keys=(key,)))
        value = await self.call(Request(Op.GET, keys=(key,)))
        assert isinstance(value, bytes)
        return value

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
