"""The agents' client of the root store: every call has a deadline, and a dead root is named.

torch's ``TCPStore`` client blocks in C++ until the root answers: an agent whose root host froze
sat in a store call for as long as the freeze lasted, with nothing else able to run on its main
thread. :class:`RootClient` is a ``torch.distributed.Store`` (so torch's agent, through the
``PrefixStore`` the rendezvous hands it, uses it like any store) that speaks the wire protocol
itself (:mod:`..protocol` through :class:`..storeclient.RawStoreClient`) with these rules:

* **Deadline.** A call fails with :class:`RootSilent` when the root has not answered for
  ``call_timeout`` seconds (the rendezvous passes the smaller of the store timeout and the
  liveness window). Time spent waiting for another thread's call counts too.
* **Blips survive.** A connection that breaks is opened again within the same deadline, and a
  call that is safe to repeat is sent again; a slow network just delays the answer. An ADD or
  APPEND that may have been applied is never repeated: it fails instead.
* **A refused connection is final.** Nothing listens at the root's address any more: the root's
  process is gone (:class:`RootGone`), and a new root there would hold none of this run's keys.
* **Same root.** Once told the root's identity (:meth:`expect_identity`), every new connection
  checks it, so an agent never carries on against a root that replaced the one it joined
  (:class:`RootReplaced`).
* **Blocking waits poll.** ``wait`` and ``get`` ask with CHECK until the keys exist (backoff up
  to :data:`POLL_CAP` s), never holding a connection in the root, and call ``on_poll`` between
  attempts: the rendezvous uses it to stop an agent whose job has ended elsewhere.

One connection carries every call of the agent (heartbeats included), under a lock.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import torch.distributed as dist

from npu_job.polling import Backoff, poll_until

from ..protocol import CheckReply, Dialect, Op, ProtocolError, ReplyValue, Request
from ..storeclient import RawStoreClient
from ..torchcompat import StoreError, StoreTimeoutError

POLL_CAP = 1.0
POLL = Backoff.exponential(0.01, POLL_CAP)  # wait/get: CHECK again after these pauses
RECONNECT = Backoff.exponential(0.05, 1.0, factor=2.0)  # a broken connection: open it again
CLOSE_WAIT = 2.0
# Requests that may be sent again after a connection broke mid-call: repeating them changes
# nothing (SET writes the same value again; the rest only read or delete).
_REPEATABLE = frozenset(
    {
        Op.SET,
        Op.GET,
        Op.CHECK,
        Op.MULTI_GET,
        Op.MULTI_SET,
        Op.GETNUMKEYS,
        Op.DELETE_KEY,
        Op.LIST_KEYS,
        Op.PING,
    }
)


class RootError(StoreError):  # type: ignore[misc, valid-type]
    """The root store failed a call; the message names its address."""


class RootGone(RootError):  # type: ignore[misc]
    """Nothing accepts connections at the root's address any more."""


class RootSilent(RootError):  # type: ignore[misc]
    """The root did not answer within the call's deadline."""


class RootReplaced(RootError):  # type: ignore[misc]
    """The address now serves another root than the one this agent joined."""


class RootWaitTimeout(StoreTimeoutError):  # type: ignore[misc, valid-type]
    """``wait``/``get`` found the keys missing for the whole store timeout (torch's meaning)."""


Value = Union[str, bytes]


def _bytes(value: Value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _wire(key: str) -> bytes:
    # torch's TCPStore client puts "/" before every key; a key is the same key for both clients
    return b"/" + key.encode()


class RootClient(dist.Store):
    """A deadline-bound ``Store`` client of ``host:port`` (see the module docstring)."""

    answers_check = True  # torchcompat.key_exists: ask this store's own check(), on every torch

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float,
        call_timeout: float,
        dialect: Dialect,
        on_poll: Optional[Callable[[], None]] = None,
    ) -> None:
        super().__init__()
        self.set_timeout(datetime.timedelta(seconds=timeout))
        self.host = host
        self.port = int(port)
        self.call_timeout = float(call_timeout)
        self.dialect = dialect
        self.on_poll = on_poll
        self._lock = threading.Lock()
        self._client: Optional[RawStoreClient] = None
        self._identity: Optional[Tuple[bytes, bytes]] = None
        self._closed = False
        self.last_answer = time.monotonic()
        self.local_address: Optional[str] = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    # -- the wire ------------------------------------------------------------------------------

    def call(self, *requests: Request, deadline: Optional[float] = None) -> List[ReplyValue]:
        """Send ``requests`` pipelined and return their replies, within ``call_timeout``."""
        started = time.monotonic()
        limit = started + (self.call_timeout if deadline is None else deadline)
        if not self._lock.acquire(timeout=max(0.0, limit - started)):
            raise self._silent(started, "another call of this agent is still waiting for it")
        try:
            return self._call_locked(requests, started, limit)
        finally:
            self._lock.release()

    def _call_locked(
        self, requests: Sequence[Request], started: float, limit: float
    ) -> List[ReplyValue]:
        repeatable = all(request.op in _REPEATABLE for request in requests)
        pauses: Optional[Iterator[float]] = None
        while True:
            if self._closed:
                raise RootGone(f"the client of the root store {self.address} was closed")
            sent = False
            try:
                client = self._connected(limit)
                client.sock.settimeout(max(0.001, limit - time.monotonic()))
                client.send(*requests)
                sent = True
                replies = [client.receive(request) for request in requests]
                self.last_answer = time.monotonic()
                return replies
            except socket.timeout:
                self._drop()
                raise self._silent(started, "no answer") from None
            except (OSError, ProtocolError) as error:
                self._drop()
                if sent and not repeatable:
                    raise RootError(
                        f"the connection to the root store {self.address} broke during a call "
                        f"that cannot be repeated safely: {error}"
                    ) from None
                # not poll(): the attempt ends in three ways, and a pause that would cross the
                # deadline ends the call at once (the next connect would have no time left)
                pauses = RECONNECT.pauses() if pauses is None else pauses
                pause = next(pauses)
                if time.monotonic() + pause >= limit:
                    raise self._silent(started, f"connection lost ({error})") from None
                time.sleep(pause)

    def _connected(self, limit: float) -> RawStoreClient:
        """The open connection, or a new one (raising RootGone when refused)."""
        if self._client is not None:
            return self._client
        try:
            client = RawStoreClient(
                self.host,
                self.port,
                timeout=max(0.001, limit - time.monotonic()),
                dialect=self.dialect,
            )
        except ConnectionRefusedError:
            raise RootGone(
                f"the root store {self.address} refused the connection: "
                "nothing listens there any more"
            ) from None
        self.local_address = str(client.sock.getsockname()[0])
        if self._identity is not None:
            key, expected = self._identity
            try:
                found = client.call(Request(Op.CHECK, keys=(key,)))
                seen = (
                    client.call(Request(Op.GET, keys=(key,))) if found == CheckReply.READY else None
                )
            except BaseException:
                client.close()
                raise
            if seen != expected:
                client.close()
                raise RootReplaced(
                    f"the root store {self.address} is not the one this node joined (it was "
                    "restarted, or another program took its address)"
                )
        self._client = client
        return client

    def _silent(self, started: float, why: str) -> RootSilent:
        quiet = time.monotonic() - max(self.last_answer, started)
        return RootSilent(
            f"the root store {self.address} has not answered for {quiet:.1f}s "
            f"({why}; deadline {self.call_timeout:g}s)"
        )

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def expect_identity(self, key: str, value: Value) -> None:
        """From now on, a new connection must find ``key`` holding ``value`` (the root's id)."""
        self._identity = (_wire(key), _bytes(value))

    def close(self) -> None:
        """Close now, even while another thread waits in a call on a silent root (it fails)."""
        self._closed = True
        client = self._client
        if client is not None:
            try:
                client.sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked on a frozen root
            except OSError:
                pass
        if self._lock.acquire(timeout=CLOSE_WAIT):
            try:
                self._drop()
            finally:
                self._lock.release()

    def one(self, request: Request, deadline: Optional[float] = None) -> ReplyValue:
        return self.call(request, deadline=deadline)[0]

    # -- torch's Store interface ---------------------------------------------------------------

    def set(self, key: str, value: Value) -> None:
        self.one(Request(Op.SET, keys=(_wire(key),), values=(_bytes(value),)))

    def add(self, key: str, amount: int) -> int:
        return int(self.one(Request(Op.ADD, keys=(_wire(key),), number=int(amount))))  # type: ignore[arg-type]

    def append(self, key: str, value: Value) -> None:
        self.one(Request(Op.APPEND, keys=(_wire(key),), values=(_bytes(value),)))

    def check(self, keys: Sequence[str]) -> bool:
        reply = self.one(Request(Op.CHECK, keys=tuple(_wire(key) for key in keys)))
        return reply == CheckReply.READY

    def wait(self, keys: Sequence[str], timeout: Optional[datetime.timedelta] = None) -> None:
        """Poll until every key exists (``RootWaitTimeout`` after ``timeout``, or the store's)."""
        seconds = (timeout if timeout is not None else self.timeout).total_seconds()
        if not poll_until(lambda: self.check(keys), seconds, POLL, tick=self._between_polls):
            raise RootWaitTimeout(
                f"wait timeout after {seconds:g}s for keys {list(keys)} "
                f"at the root store {self.address}"
            )

    def _between_polls(self, elapsed: float) -> None:
        if self.on_poll is not None:
            self.on_poll()

    def get(self, key: str) -> bytes:
        self.wait([key])
        return bytes(self.one(Request(Op.GET, keys=(_wire(key),))))  # type: ignore[arg-type]

    def multi_get(self, keys: Sequence[str]) -> List[bytes]:
        self.wait(keys)
        values = self.one(Request(Op.MULTI_GET, keys=tuple(_wire(k) for k in keys)))
        return [bytes(value) for value in values]  # type: ignore[union-attr]

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        self.one(
            Request(
                Op.MULTI_SET,
                keys=tuple(_wire(k) for k in keys),
                values=tuple(_bytes(v) for v in values),
            )
        )

    def delete_key(self, key: str) -> bool:
        return int(self.one(Request(Op.DELETE_KEY, keys=(_wire(key),)))) > 0  # type: ignore[arg-type]

    def num_keys(self) -> int:
        return int(self.one(Request(Op.GETNUMKEYS)))  # type: ignore[arg-type]

    def list_keys(self) -> List[str]:
        keys = self.one(Request(Op.LIST_KEYS))
        return [
            key.decode(errors="replace")[1:]
            if key.startswith(b"/")
            else key.decode(errors="replace")
            for key in keys
        ]  # type: ignore[union-attr]

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        raise NotImplementedError("npu-run never calls compare_set (torch 2.1/2.2 crash in it)")
