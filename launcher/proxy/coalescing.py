"""The store proxy's coalescing rules, pure: values in, values out, no sockets and no event loop.

The proxy (:mod:`npu_job.launcher.proxy`) answers a client request only from an upstream request
that it sent after that request arrived (its contract). What follows from that rule lives here:

* which requests a new one may share (:class:`Joins`): a GET or CHECK joins an identical one only
  while that one is still in the main connection's outgoing batch, and not once a local write to
  its keys was queued after it; identical WAITs share a :class:`WaitGroup` until a DELETE_KEY or
  QUEUE_POP of one of its keys, and never on keys used as queues;
* which waiters an upstream answer covers (:class:`WaitGroup`): those that arrived before its
  latest upstream request went out; *late* ones ask again when that answer is "ready";
* ADD group commit (:func:`add_batch`, :func:`add_results`): one upstream ADD for the deltas of
  concurrent callers, each caller getting the result it would have had alone, in arrival order;
* the culprit rule (:func:`dropped_for`): which request the root dropped the main connection for,
  so that only its callers fail and the requests behind it are sent again;
* when a connection's no-reply writes are applied (:class:`AppliedMarks`), which a WAIT answer
  waits for.

The proxy keeps the futures and the connections; the objects here hold them as opaque values.
"""

from __future__ import annotations

from typing import Dict, Generic, List, Optional, Protocol, Sequence, Set, Tuple, TypeVar

from ..protocol import QUEUE_OPS, WRITE_OPS, Op, Request

T = TypeVar("T")
Keys = Tuple[bytes, ...]

# Requests a stock root may drop their connection for: an ADD to a key that holds no number
# (either server), a GET or MULTI_GET of a missing key (torch's classic server looks it up with
# ``at``; the libuv one answers), a QUEUE_LEN or QUEUE_POP (the classic server has no queues).
CULPRIT_OPS = frozenset({Op.ADD, Op.GET, Op.MULTI_GET, Op.QUEUE_LEN, Op.QUEUE_POP})
_I64_MIN, _I64_END = -(1 << 63), 1 << 63


class Batch:
    """One outgoing batch of an upstream connection: what is queued in it is unsent until the
    connection hands the batch to its transport and marks it ``sent``."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


class Waiter(Protocol):
    """A local client, as a wait group knows it: by its id."""

    id: int


W = TypeVar("W", bound=Waiter)


class WaitGroup(Generic[W]):
    """Local waiters of one key list, served by one upstream WAIT."""

    __slots__ = ("asked", "conn", "joinable", "keys", "late", "shared", "state", "waiters")

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        # by client id. ``waiters`` arrived before the group's latest upstream WAIT was
        # sent, so its answer is theirs; ``late`` ones arrived after, and are asked again (a new
        # group) when that answer is "ready".
        self.waiters: Dict[int, W] = {}
        self.late: Dict[int, W] = {}
        # (checking ->) queued -> active -> done | cancelling; checking: a CHECK asks whether the
        # key is there (waits' _check_first); held: the rest of a shared wake-up (waits'
        # _finish_group), then done or queued again
        self.state = "queued"
        self.conn: object = None  # the wait connection serving it, once active
        self.asked: Optional[Batch] = None  # the batch holding its latest upstream request
        self.joinable = True
        self.shared = False  # more than one client has waited in it (or in the group it follows)

    def asking(self, batch: Batch) -> None:
        """An upstream request for it is queued in ``batch``: everyone waiting is covered."""
        self.asked = batch
        self.waiters.update(self.late)
        self.late.clear()

    def add(self, client: W) -> None:
        if self.waiters or self.late:
            self.shared = True
        if self.asked is None or not self.asked.sent:  # nothing asked yet, or not yet sent
            self.waiters[client.id] = client
        else:
            self.late[client.id] = client

    def remove(self, client: W) -> None:
        self.waiters.pop(client.id, None)
        self.late.pop(client.id, None)

    @property
    def empty(self) -> bool:
        return not self.waiters and not self.late

    def finish(self, failed: bool) -> Tuple[Dict[int, W], Dict[int, W]]:
        """The group's upstream answer came: (the clients it answers, the late ones to ask again).

        A failure answers everyone; "ready" answers those that arrived before the request went.
        """
        self.state = "done"
        waiters, self.waiters = self.waiters, {}
        late, self.late = self.late, {}
        if failed:
            waiters.update(late)
            late = {}
        return waiters, late


# The states of a wait group still waiting for its upstream answer (see WaitGroup.state).
_OPEN_STATES = frozenset({"queued", "checking", "active", "held"})

# The keys known to be plain a proxy remembers (the oldest are forgotten first).
PLAIN_KEYS_KEPT = 1 << 16
_PLAIN_WRITES = frozenset({Op.SET, Op.ADD, Op.APPEND, Op.COMPARE_SET, Op.MULTI_SET})


class Joins(Generic[T]):
    """What a new request may share: GETs by key, CHECKs by key list (the upstream request's reply
    future, ``T``, as an opaque value) and wait groups by key list; and which keys are queues, or
    known to be plain keys (written by a local client, or found no queue after a wake-up), which
    a wake-up of several waiters need not ask about (waits' ``_finish_group``)."""

    def __init__(self) -> None:
        self.gets: Dict[bytes, T] = {}
        self.checks: Dict[Keys, T] = {}
        self.waits: Dict[Keys, WaitGroup] = {}
        self.queue_keys: Set[bytes] = set()
        self._plain_keys: Dict[bytes, None] = {}  # insertion-ordered: the oldest go first

    def known_plain(self, key: bytes) -> bool:
        return key in self._plain_keys

    def mark_plain(self, key: bytes) -> None:
        if key in self.queue_keys or key in self._plain_keys:
            return
        if len(self._plain_keys) >= PLAIN_KEYS_KEPT:
            del self._plain_keys[next(iter(self._plain_keys))]
        self._plain_keys[key] = None

    # GET and CHECK
    def _table(self, op: Op) -> Dict:
        return self.gets if op == Op.GET else self.checks

    @staticmethod
    def _key(op: Op, keys: Keys) -> object:
        return keys[0] if op == Op.GET else keys

    def read(self, op: Op, keys: Keys) -> Optional[T]:
        """The unsent upstream GET or CHECK that a new one (``op``, ``keys``) may share."""
        if op == Op.GET:  # spelled out: every relayed read asks
            return self.gets.get(keys[0])
        return self.checks.get(keys)

    def reading(self, op: Op, keys: Keys, reply: T) -> None:
        """An upstream GET or CHECK was queued: later identical ones may share ``reply``."""
        self._table(op)[self._key(op, keys)] = reply

    def answered(self, op: Op, keys: Keys, reply: T) -> None:
        table, key = self._table(op), self._key(op, keys)
        if table.get(key) is reply:
            del table[key]

    def sent(self) -> None:
        """The main connection's batch went out: the root may answer it at any moment now."""
        self.gets.clear()
        self.checks.clear()

    def noted(self, request: Request) -> None:
        """``request`` goes upstream: later reads of the keys it writes must not share requests
        queued before it (the client that wrote must read its write); a DELETE_KEY or QUEUE_POP
        also ends the sharing of waits on its keys; queue keys are never waited on together."""
        if request.op in QUEUE_OPS:
            self.queue_keys.update(request.keys)
            for key in request.keys:
                self._plain_keys.pop(key, None)
        elif request.op in _PLAIN_WRITES:
            for key in request.keys:
                self.mark_plain(key)
        if request.op not in WRITE_OPS:
            return
        keys = set(request.keys)
        for key in keys:
            self.gets.pop(key, None)
        for check_keys in [ks for ks in self.checks if keys.intersection(ks)]:
            del self.checks[check_keys]
        if request.op in (Op.DELETE_KEY, Op.QUEUE_POP):
            for wait_keys in [ks for ks in self.waits if keys.intersection(ks)]:
                self.waits.pop(wait_keys).joinable = False

    # WAIT
    def wait_group(self, keys: Keys) -> Optional[WaitGroup]:
        """The group a new WAIT on ``keys`` may join, if any."""
        group = self.waits.get(keys)
        if group is not None and group.joinable and group.state in _OPEN_STATES:
            return group
        return None

    def new_wait_group(self, keys: Keys, follows: Optional[WaitGroup] = None) -> WaitGroup:
        """A group for ``keys`` (or for the late waiters of ``follows``), joinable if it may be."""
        group: WaitGroup = WaitGroup(keys)
        if follows is not None:
            group.joinable = follows.joinable
            group.shared = True
        elif self.queue_keys.intersection(keys):
            group.joinable = False
        if group.joinable:
            self.waits[keys] = group
        return group

    def forget_wait(self, group: WaitGroup) -> None:
        if self.waits.get(group.keys) is group:
            del self.waits[group.keys]


class AppliedMarks(Generic[T]):
    """When a connection's no-reply requests (SET, APPEND, ...) are applied at the root.

    The root answers a connection's requests in order, so the n-th answer proves that every
    request sent before the n-th reply-bearing one was applied. A no-reply request queued now is
    applied once ``answered`` reaches ``mark()``; what waits for that (``T``, opaque) is handed
    back by :meth:`answer` when it does. A WAIT answer through the proxy, which comes on a
    connection of its own, is held this way until the client's earlier writes are applied.
    """

    __slots__ = ("answered", "asked", "_waiting")

    def __init__(self) -> None:
        self.asked = 0  # reply-bearing requests sent since the connection opened
        self.answered = 0
        self._waiting: Dict[int, List[T]] = {}

    def mark(self) -> int:
        """The mark of a no-reply request queued now (after every request sent so far)."""
        return self.asked + 1

    def applied(self, mark: int) -> bool:
        return self.answered >= mark

    def needs_probe(self, mark: int) -> bool:
        """No reply-bearing request follows the one marked: the connection must send one."""
        return self.asked < mark

    def wait(self, mark: int, item: T) -> None:
        self._waiting.setdefault(mark, []).append(item)

    def answer(self) -> List[T]:
        """One more reply came: what waited for the mark it reaches."""
        self.answered += 1
        return self._waiting.pop(self.answered, [])

    def drain(self) -> List[T]:
        """The connection is lost: everything still waiting, released at once."""
        waiting, self._waiting = self._waiting, {}
        return [item for items in waiting.values() for item in items]


def add_batch(deltas: Sequence[int]) -> int:
    """How many of the waiting ``deltas`` (arrival order) one upstream ADD carries: all of them
    when their sum fits the wire's i64, else the first alone."""
    return len(deltas) if _I64_MIN <= sum(deltas) < _I64_END else 1


def add_results(total: int, deltas: Sequence[int]) -> List[int]:
    """The root answered ``total`` to one ADD of ``sum(deltas)``: each caller's result, as if the
    ADDs had run alone in arrival order (``total - sum(deltas) + d1 + ... + di``)."""
    results = []
    running = total - sum(deltas)
    for delta in deltas:
        running += delta
        results.append(running)
    return results


def dropped_for(pending: Sequence[Tuple[Request, object]]) -> Optional[int]:
    """Which request the root dropped the main connection for, given the requests sent and not
    known to be applied, in order, each with its reply (None for a no-reply request); None when
    no single request can be blamed.

    The root serves a connection's requests one at a time, in order, and drops the connection
    when one fails; the only requests a well-formed client can make fail are in ``CULPRIT_OPS``.
    So when the first request still owed a reply is one of those, it failed, everything before
    it was applied and answered, and nothing after it was read.
    """
    for index, (request, reply) in enumerate(pending):
        if reply is None:
            continue  # a no-reply request behind an answered one: applied
        return index if request.op in CULPRIT_OPS else None
    return None
