"""A total deadline on an HTTP answer (the I/O edge): a socket whose every read ends by it.

A socket's timeout bounds one read, not an answer: a server that sends its headers or its body a
byte every few seconds never trips it and holds the pod forever. :class:`DeadlineSocket` wraps a
connected socket (plain or TLS) so that each read waits at most the time left before
its connection's ``deadline`` (and at most ``per_read``), and a read after it raises
:class:`DeadlinePassed`; ``http.client`` reads status line, headers and body through
:meth:`~DeadlineSocket.makefile`, so the whole answer is bounded. The TLS handshake needs nothing
more: CPython bounds each TLS operation as a whole by the socket's timeout, which
:func:`bounded_connection` sets to the time left before connecting.

Standard library only; ``http.client`` is imported by the caller.
"""

from __future__ import annotations

import io
import socket
import time
from typing import Any, Optional

_clock = time.monotonic
_FOREVER = float("inf")


class DeadlinePassed(Exception):
    """The answer did not end by its deadline. Deliberately no ``OSError``: the HTTP libraries
    retry those (``urllib3`` a timeout as a read error), and asking again cannot end sooner."""


class DeadlineSocket:
    """``sock`` with every read bounded by ``owner.deadline`` (a :func:`time.monotonic` time,
    read at each read: the owner sets it per answer); everything else is ``sock``'s own."""

    def __init__(self, sock: Any, per_read: Optional[float], owner: Any) -> None:
        self._sock = sock
        self.per_read = _FOREVER if per_read is None else per_read
        self._owner = owner
        self._readers = 0  # open makefile() readers: closing waits for them, as a socket's does
        self._closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def settimeout(self, value: Optional[float]) -> None:
        """A read's own timeout (``urllib3`` sets the read timeout once connected)."""
        self.per_read = _FOREVER if value is None else value
        self._sock.settimeout(value)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        left = self._owner.deadline - _clock()
        if left <= 0:
            raise DeadlinePassed("the answer did not end by its deadline")
        self._sock.settimeout(min(self.per_read, left))
        try:
            return self._sock.recv_into(buffer, nbytes)
        except socket.timeout:
            if left < self.per_read:  # the deadline, not the read's own timeout, ran out
                raise DeadlinePassed("the answer did not end by its deadline") from None
            raise

    def makefile(self, mode: str = "r", buffering: Optional[int] = None, **kwargs: Any) -> Any:
        """A buffered reader over :meth:`recv_into` (``"rb"``, as ``http.client`` asks)."""
        if mode != "rb":
            return self._sock.makefile(mode, buffering, **kwargs)
        size = buffering if buffering and buffering > 0 else io.DEFAULT_BUFFER_SIZE
        self._readers += 1
        return io.BufferedReader(_Reader(self), size)

    def close(self) -> None:
        """Close the socket once no reader needs it: ``http.client`` closes its connection
        before the body of a last answer (``Connection: close``) is read from the reader."""
        self._closing = True
        if not self._readers:
            self._sock.close()

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closing and not self._readers:
            self._sock.close()


class _Reader(io.RawIOBase):
    """The raw stream of a :class:`DeadlineSocket` (closing it leaves the socket open, as
    ``socket.makefile``'s does: the connection owns the socket)."""

    def __init__(self, sock: DeadlineSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.reader_closed()
        super().close()


def bounded_connection(base: Any) -> Any:
    """A subclass of ``base`` (``http.client.HTTPSConnection``, ``urllib3``'s connections) whose
    answers end by its ``deadline`` (set on the instance before each request, or on the class for
    all its connections): connecting waits at most the time left, and the socket is a
    :class:`DeadlineSocket`."""

    class BoundedConnection(base):  # type: ignore[misc, valid-type]
        deadline = float("inf")

        def connect(self) -> None:
            per_read = self.timeout
            left = self.deadline - _clock()
            if left <= 0:
                raise DeadlinePassed("the answer did not end by its deadline")
            self.timeout = left if per_read is None else min(per_read, left)
            try:
                super().connect()
            finally:
                self.timeout = per_read
            self.sock = DeadlineSocket(self.sock, per_read, self)

    return BoundedConnection
