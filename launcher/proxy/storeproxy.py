"""The per-node store proxy: local TCPStore clients in, a few coalesced connections to the root out.

Local workers connect to ``127.0.0.1:<port>`` with unmodified torch clients (``TCPStore(...,
is_master=False)`` and the C++ client that ``init_process_group`` creates) and speak the native
wire protocol (:mod:`npu_job.launcher.protocol`). The proxy talks to the root store (a stock torch
``TCPStore`` server) over a small, bounded set of upstream connections, whatever the number of
local workers:

* one **main** connection carries every non-blocking request, pipelined. Replies come back in
  request order, so futures are matched FIFO, and a worker's own SET-then-GET is ordered by the
  single stream (read-your-writes);
* a pool of ``wait_connections`` (default 2) **wait** connections each carries one blocking WAIT
  (the root holds a connection while it waits, so WAITs cannot share the main stream). Distinct
  waits beyond the pool are queued, polled with CHECK on the main connection (backoff) so a full
  pool never deadlocks, and promoted when a wait connection frees up.

So the root sees 1 + ``wait_connections`` connections per node (3 by default; 4 with the agent's
own). BARRIER, which no torch code path uses and which cannot be merged (every arrival must count
once at the root), takes an idle wait connection or, if none is idle, a short-lived extra one
(closed after its answer; an extra that comes up after the pool did is still the one taken).

Coalescing (what a one-for-one forwarder cannot do; its rules are pure code in
:mod:`npu_job.launcher.coalescing`, the server that applies them on an event loop is
:mod:`npu_job.launcher.proxyserver`, its connections to the root
:mod:`npu_job.launcher.proxyupstream`; this module runs the server on a thread and as a command):

* identical GETs and CHECKs share one upstream request, and identical WAITs (same key list) one
  upstream WAIT, under one rule (the contract): **a client request is answered from an upstream
  request that the proxy sent after that client request arrived**. So the root computed the answer
  at an instant between the client's request and its reply, the answer is one the root could have
  given that client, and the proxy is linearizable with respect to the root, key by key and across
  keys. Concretely: a GET or CHECK joins only a request still in the proxy's outgoing batch of
  the main connection (its ``Batch`` is not yet ``sent``; the tables of
  joinable requests are emptied when the batch is written, ``on_sent``), and not one that a local
  write to any of its keys was queued after (DELETE_KEY/QUEUE_POP for WAITs): the client that
  wrote must read its write. A WAIT may join a group whose upstream WAIT (or, while queued, CHECK)
  has already been sent, but then only as a *late* waiter: when that answer is "ready", the late
  waiters form a new group whose own upstream WAIT is sent after they arrived (a key deleted at the
  root in between keeps them waiting, as it would at the root). Bursts that arrive in one loop
  turn (every worker asking for the same key at once) still share one request. Per client, order
  is the root's: its requests go upstream in arrival order on the main connection, and a WAIT
  answer (served on a wait connection) is held until the main connection has answered a request
  sent after the client's latest no-reply write (``proxyserver``'s ``_answer_wait``). Before
  issue 15 a GET could join one sent long before, still queued behind large replies on the main
  connection, and return a value older than a write another node had completed;
* concurrent ADDs to one key are summed into one upstream ADD (group commit: while one ADD to a
  key is in flight, later ones accumulate); with root reply ``total`` for a batch of deltas
  ``d1..dn`` the i-th caller gets ``total - sum(d) + d1 + ... + di`` - distinct values, as if the
  ADDs ran alone in arrival order;
* PING is answered locally. Nothing is cached across time.

Keys used with QUEUE_* ops are never coalesced for WAIT (a queue push wakes one waiter only).
A key first used as a queue by several workers' simultaneous blocking ``queue_pop`` (WAIT is the
first thing the proxy sees of it) can still be merged once; a pop that follows such a shared
wake-up and finds the queue empty is not answered but tried again until it gets an item (the root
would have kept that worker waiting), see ``proxyserver``'s ``_pop_as_waiter``. If the worker
gives up (its wait timeout) while such a retry is on its way, that one item is popped for nobody.

Threading: ``StoreProxy`` runs the asyncio loop on a background thread. Some torch client calls
(``list_keys``, ``queue_len``, ``queue_pop``) hold the GIL while blocked on their socket: made in
the same process against this proxy they deadlock it, and against any store they pause it for
that round trip. Clients are ``asyncio.BufferedProtocol`` callbacks, not tasks, and the loop is
uvloop when it is importable (``new_event_loop``): the proxy's CPU per relayed request is the
price of tiering when many proxies share a machine (about 18 us on uvloop, 35 us on asyncio in
``benchmarks/bench_rendezvous.py`` at 128x16).

Faults: a request that makes the root drop the connection it came on fails only its own client,
as straight to the root. A well-formed client can send three such requests (malformed ones are
refused by the proxy itself, per client): an ADD to a key that holds no number (either server),
and a GET or MULTI_GET of a missing key (torch's classic server, the only one on 2.1 and the one
a listen fd gets on 2.4-2.7, looks the key up with ``at`` and drops the connection; the libuv one
answers). When the main connection ends with one of them as its first unanswered request, its
callers fail (each, straight to the root, would have lost its own connection: coalesced callers
all arrived before it was sent) and the requests queued behind it, which the root never read,
are sent again first on a new main connection (``proxyupstream.Upstream._replayable``). Partial
requests behave as at the root: the complete pairs of a MULTI_SET whose client died mid-request
are stored. Any other upstream connection that breaks fails the requests in flight on it (their
clients' connections are closed, so torch raises naming the proxy's address), and a main one also
closes the clients whose no-reply writes (SET, APPEND, ...) went on it unconfirmed: the root may
never have read them, and straight to the root such a client's own connection broke (kept open,
its next read would miss its own write on the new connection); if the root cannot
be reached again at once, every client connection is closed. New requests reconnect with backoff
and jitter until ``timeout``. A client that disconnects has its waits dropped (and cancelled
upstream with CANCEL_WAIT when no other local worker shares them), so the proxy survives worker
restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping
from typing import List, Optional

from npu_job.launcher.protocol import NEWEST, Dialect
from npu_job.launcher.proxyserver import (
    DEFAULT_WAIT_CONNECTIONS,
    LISTEN_BACKLOG,
    AsyncStoreProxy,
    ProxyStats,
    format_address,
)
from npu_job.launcher.proxyupstream import UpstreamLost

__all__ = [
    "DEFAULT_WAIT_CONNECTIONS",
    "LISTEN_BACKLOG",
    "AsyncStoreProxy",
    "ProxyStats",
    "StoreProxy",
    "UpstreamLost",
    "main",
    "new_event_loop",
]

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


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m npu_job.launcher.proxy HOST:PORT``: serve one proxy (tests, debugging).

    Prints ``{"version": 1, "port": N}`` once listening; then each ``stats`` line on stdin
    prints the counters as JSON; EOF or ``stop`` stops it.
    """
    parser = argparse.ArgumentParser(
        prog="python -m npu_job.launcher.proxy", description=main.__doc__
    )
    parser.add_argument("upstream", help="root store address, HOST:PORT (literal IP preferred)")
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to keep retrying the root"
    )
    parser.add_argument("--wait-connections", type=int, default=DEFAULT_WAIT_CONNECTIONS)
    parser.add_argument(
        "--dialect",
        choices=("newest", "torch"),
        default="newest",
        help="store protocol to speak: the newest, or the installed torch's (probed)",
    )
    args = parser.parse_args(argv)
    host, sep, port = args.upstream.rpartition(":")
    if not sep or not port.isdigit():
        parser.error(f"upstream: expected HOST:PORT, got {args.upstream!r}")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    dialect = NEWEST
    if args.dialect == "torch":
        from npu_job.launcher.torchcompat import store_dialect

        dialect = store_dialect()
    with StoreProxy(
        host.strip("[]"),
        int(port),
        listen_host=args.listen_host,
        listen_port=args.listen_port,
        timeout=args.timeout,
        wait_connections=args.wait_connections,
        dialect=dialect,
    ) as proxy:
        print(json.dumps({"version": 1, "port": proxy.port}), flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "stop":
                break
            if command == "stats":
                stats = proxy.stats
                payload = {name: getattr(stats, name) for name in stats.__dataclass_fields__}
                payload = {k: dict(v) if isinstance(v, Mapping) else v for k, v in payload.items()}
                print(json.dumps({"version": 1, **payload}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
