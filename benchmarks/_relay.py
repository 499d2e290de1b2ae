"""A minimal TCP relay, the floor a store proxy is measured against: it copies bytes both ways and
does nothing else (no framing, no coalescing). Runs as a child process, like the proxy, on the
same event loop kind (uvloop when installed, ``NPU_JOB_PROXY_LOOP`` as for the proxy).

    python benchmarks/_relay.py HOST:PORT   # prints {"port": N}; "stop" or EOF on stdin stops it
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Optional

from npu_job.launcher.proxy.storeproxy import new_event_loop


class Pipe(asyncio.Protocol):
    """One side of a relayed connection: what it reads, its peer writes (with flow control)."""

    def __init__(self, peer: Optional[Pipe] = None) -> None:
        self.peer = peer
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.peer.transport.write(data)  # type: ignore[union-attr]

    def pause_writing(self) -> None:
        self.peer.transport.pause_reading()  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        self.peer.transport.resume_reading()  # type: ignore[union-attr]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class Near(Pipe):
    """A client's side: what it sends before its root side is up waits here."""

    early: Optional[bytearray] = None

    def data_received(self, data: bytes) -> None:
        if self.peer is None:  # uvloop may deliver a read already under way when paused
            self.early = (self.early or bytearray()) + data
        else:
            super().data_received(data)


class Far(Pipe):
    """The root side: the client's side reads once it is up."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        near = self.peer
        assert isinstance(near, Near)
        near.peer = self
        if near.early:
            transport.write(near.early)  # type: ignore[attr-defined]
        near.transport.resume_reading()  # type: ignore[union-attr]


async def relay(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()

    class Accepted(Near):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            transport.pause_reading()  # type: ignore[attr-defined]
            loop.create_task(loop.create_connection(lambda: Far(self), host, port))

    server = await loop.create_server(Accepted, "127.0.0.1", 0)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    server.close()


if __name__ == "__main__":
    host, _, port = sys.argv[1].rpartition(":")
    new_event_loop().run_until_complete(relay(host, int(port)))
