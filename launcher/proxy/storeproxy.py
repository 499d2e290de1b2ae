"""The store proxy on a thread of its own (:class:`StoreProxy`), on uvloop where it is installed.

What the proxy does, its contract and its faults: :mod:`npu_job.launcher.proxy`. The server it
runs is :class:`~.server.AsyncStoreProxy`; ``python -m npu_job.launcher.proxy`` runs one alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import os
import socket
import threading
from typing import List, Optional

from ..protocol import NEWEST, Dialect
from .server import (
    DEFAULT_WAIT_CONNECTIONS,
    LISTEN_BACKLOG,
    AsyncStoreProxy,
    ProxyStats,
    format_address,
)

logger = logging.getLogger(__name__)


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A fresh loop for a proxy: uvloop when ``kind`` is "uvloop", or "auto" and uvloop is
    importable.

    uvloop is an optional accelerator (not a dependency): it roughly halves the proxy's CPU per
    relayed request (``benchmarks/bench_rendezvous.py --loop``). ``NPU_JOB_PROXY_LOOP=asyncio``
    forces the standard loop.
    """
    if kind == "auto":
        kind = os.environ.get("NPU_JOB_PROXY_LOOP", "auto")
    if kind not in ("auto", "asyncio", "uvloop"):
        raise ValueError(f"event loop must be auto, asyncio or uvloop, got {kind!r}")
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _finish_remaining_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel and await what still runs on the proxy's own loop before it closes.

    An upstream connection still opening when the proxy stops is not among those ``aclose``
    closes; left pending, its reader would run its cleanup at garbage collection, without a loop.
    """
    remaining = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in remaining:
        task.cancel()
    if remaining:
        loop.run_until_complete(asyncio.gather(*remaining, return_exceptions=True))


class StoreProxy:
    """A :class:`AsyncStoreProxy` on its own event loop in a background thread.

    >>> with StoreProxy("10.0.0.1", 29500) as proxy:   # doctest: +SKIP
    ...     os.environ["MASTER_PORT"] = str(proxy.port)
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        timeout: float = 300.0,
        wait_connections: int = DEFAULT_WAIT_CONNECTIONS,
        dialect: Dialect = NEWEST,
    ) -> None:
        try:
            ipaddress.ip_address(listen_host)
        except ValueError:
            raise ValueError(
                f"listen_host must be a literal IP address, got {listen_host!r}"
            ) from None
        self._listen = (listen_host, int(listen_port))
        self._proxy = AsyncStoreProxy(
            upstream_host,
            upstream_port,
            timeout=timeout,
            wait_connections=wait_connections,
            dialect=dialect,
        )
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._port: Optional[int] = None
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("StoreProxy.start() has not been called")
        return self._port

    @property
    def host(self) -> str:
        return self._listen[0]

    @property
    def alive(self) -> bool:
        """The proxy's loop thread runs (False before start, after stop, or after it crashed)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def stats(self) -> ProxyStats:
        """A consistent snapshot, taken on the proxy's loop while it runs."""
        loop, thread = self._loop, self._thread
        if (
            loop is None
            or thread is None
            or not thread.is_alive()
            or threading.current_thread() is thread
        ):
            return self._proxy.snapshot()
        result: concurrent.futures.Future[ProxyStats] = concurrent.futures.Future()

        def take() -> None:
            try:
                result.set_result(self._proxy.snapshot())
            except BaseException as exc:  # noqa: BLE001 - reported to the caller's thread
                result.set_exception(exc)

        loop.call_soon_threadsafe(take)
        return result.result(timeout=10)

    def start(self) -> int:
        """Bind, start serving on a background thread, and return the listening port."""
        with self._lock:
            if self._thread is not None:
                return self.port
            if self._stopped:
                raise RuntimeError("a stopped StoreProxy cannot be restarted")
            host, port = self._listen
            family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(LISTEN_BACKLOG)
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
            self._port = sock.getsockname()[1]
            loop = new_event_loop()
            started = threading.Event()
            failure: List[BaseException] = []

            def run() -> None:
                asyncio.set_event_loop(loop)
                try:
                    loop.run_until_complete(self._proxy.start(sock))
                except BaseException as exc:  # noqa: BLE001 - surfaced to start()'s caller
                    failure.append(exc)
                    sock.close()
                    started.set()
                    loop.close()
                    return
                started.set()
                try:
                    loop.run_forever()
                finally:
                    loop.run_until_complete(self._proxy.aclose())
                    _finish_remaining_tasks(loop)
                    loop.run_until_complete(loop.shutdown_asyncgens())
                    loop.close()

            self._loop = loop
            self._thread = threading.Thread(
                target=run, name=f"npu-store-proxy-{self._port}", daemon=True
            )
            self._thread.start()
            started.wait()
            if failure:
                self._thread.join()
                self._thread = None
                raise failure[0]
            logger.info(
                "store proxy listening on %s, upstream %s",
                format_address(host, self._port),
                self._proxy.upstream_text,
            )
            return self._port

    def stop(self) -> None:
        """Close the listener, client and upstream connections, and join the thread (idempotent)."""
        with self._lock:
            self._stopped = True
            thread, loop = self._thread, self._loop
            self._thread = None
            if thread is None or loop is None:
                return
            if thread.is_alive():
                loop.call_soon_threadsafe(loop.stop)
                thread.join()

    def __enter__(self) -> StoreProxy:  # noqa: PYI034 - typing.Self needs 3.11 or typing_extensions
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
