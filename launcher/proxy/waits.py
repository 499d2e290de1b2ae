"""The proxy's blocking requests: the WAIT pool and queue, BARRIER, and pops after a shared wake-up.

:class:`Waits` is the half of :class:`~.server.AsyncStoreProxy` that serves them (the server
inherits it; the state is the server's, set in its ``__init__``): the pool of ``wait_connections``
wait connections to the root and the extra ones a wait beyond the pool or a BARRIER opens, one
upstream WAIT per group of local waiters on the same keys (:class:`~.coalescing.WaitGroup`), late
waiters asked again, the STOP_WAITING held until the client's earlier writes are applied, and
cancellation when a client leaves. The contract these keep is told in :mod:`npu_job.launcher.proxy`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from ..protocol import CheckReply, Dialect, Op, Request, WaitReply, encode_reply
from .coalescing import Batch, Joins, WaitGroup
from .upstream import Counters, Upstream, UpstreamLost

if TYPE_CHECKING:
    from .client import Client

logger = logging.getLogger(__name__)

# The rest of a wake-up by a queue push ask again this long after it if their lead neither pops
# nor speaks (a plain WAIT on a queue's key).
HELD_AT_MOST = 1.0
# How many times a CHECK's waiters are held while the ones that came after it are asked for
# (workers one or two loop turns behind the rest come back in step; beyond, they go on their own).
LATE_ROUNDS_AT_MOST = 3
_SENT = Batch()
_SENT.sent = True  # what a held group was answered by: whoever joins it now is late
STOP_WAITING_REPLY = encode_reply(Op.WAIT, WaitReply.STOP_WAITING)


class Waits:
    """WAIT, BARRIER and the pops a shared wake-up woke, for :class:`~.server.AsyncStoreProxy`."""

    # the server's state these methods share (AsyncStoreProxy.__init__ sets it); of its methods
    # they call spawn, _get_main and _submit
    timeout: float
    _clients: Dict[int, Client]
    wait_connections: int
    counters: Counters
    _joins: Joins[asyncio.Future]
    _idle_wait: List[Upstream]
    _wait_pool: Set[Upstream]
    _wait_opening: int
    _extra_opening: int
    _queued: collections.deque[WaitGroup[Client]]
    _spare_barrier_conns: List[Upstream]
    _main: Optional[Upstream]
    dialect: Dialect
    root_queues: Optional[bool]  # whether the root has queues (torch's classic server has none)
    _queue_probe: Optional[Upstream]  # the main connection a QUEUE_LEN of ours is on

    async def _open_wait_conn(self, extra: bool = False) -> None:
        """Open a wait connection: one of the pool, or (``extra``) one for a queued group beyond
        it (see ``_release_wait_conn`` for what becomes of it then)."""
        conn = Upstream(self, "wait")
        error: Optional[UpstreamLost] = None
        try:
            await conn.open(asyncio.get_running_loop().time() + self.timeout)
        except UpstreamLost as exc:
            logger.warning("store proxy: %s", exc)
            error = exc
        if extra:  # counted down before _fail_queued, which asks what is still opening
            self._extra_opening -= 1
        else:
            self._wait_opening -= 1
        if error is not None:
            self._fail_queued(error)
            return
        if not extra:
            self._wait_pool.add(conn)
        self._release_wait_conn(conn)

    def _release_wait_conn(self, conn: Upstream) -> None:
        """``conn`` is free: it serves the oldest queued group, else idles (pool) or closes (an
        extra one: a wait's beyond the pool or a BARRIER's), so the root's connections from this
        node come back to the pool's once the distinct waits are answered."""
        if conn.closed:
            return
        group = self._next_queued()
        if group is not None:
            self._activate(group, conn)
            return
        if conn not in self._wait_pool:
            conn.close()
            return
        self._idle_wait.append(conn)

    # ------------------------------------------------------------ WAIT

    def _client_wait(self, client: Client, keys: Tuple[bytes, ...]) -> None:
        self._leave_wait(client)  # the root keeps one wait per connection, the latest
        group = self._joins.wait_group(keys)
        if group is not None:
            self.counters.coalesced += 1
        else:
            group = self._joins.new_wait_group(keys)
            self._ask(group)
        group.add(client)
        client.wait = group

    def _ask(self, group: WaitGroup[Client]) -> None:
        """Send a new group's question upstream: a WAIT, or first a CHECK when the key may be a
        queue's and other local clients could share the wake-up (:meth:`_check_first`)."""
        if self._may_wake_by_push(group.keys) and len(self._clients) > 1:
            main = self._main
            if main is not None and not main.closed and self._check_first(group, main):
                return
        self._queued.append(group)
        self._pump_waits()

    def _may_wake_by_push(self, keys: Tuple[bytes, ...]) -> bool:
        """Whether a wake-up of a WAIT on ``keys`` may have been a queue push, which wakes one
        waiter: a single key, not known plain, on a root that may have queues."""
        return (
            len(keys) == 1
            and Op.QUEUE_LEN in self.dialect
            and self.root_queues is not False
            and not self._joins.known_plain(keys[0])
        )

    def _check_first(self, group: WaitGroup[Client], main: Upstream, late_rounds: int = 0) -> bool:
        """Ask the root with a CHECK on the main connection whether the key is there now.

        A WAIT on a key that is there (a value, or a queue with items) is answered at once at the
        root, so a CHECK that says "ready" answers every waiter that arrived before it was sent,
        however many: each one's own WAIT would have returned then. Only "not ready" leads to
        an upstream WAIT, whose wake-up several waiters share, and which then needs the QUEUE_LEN
        that tells a push from a write (:meth:`_held_by`). Keys mostly set before they are read
        (gloo's address exchange) so cost CHECK + GET per node where WAIT + QUEUE_LEN + GET was.

        Waiters that arrived after the CHECK went (late) are asked for with another CHECK, the
        others held, and then all answered together (up to ``LATE_ROUNDS_AT_MOST`` rounds,
        ``late_rounds`` so far; then the late ones ask on their own): workers a moment behind the
        rest come back in step, and their next requests share the others' again, where answering
        the early ones first would keep the two apart for every key after.
        """
        try:
            reply = self._submit(main, Request(Op.CHECK, keys=group.keys))
        except UpstreamLost:
            return False
        assert reply is not None
        group.state = "checking"
        group.asking(main.batch)

        def checked(answer: asyncio.Future) -> None:
            if group.state != "checking":
                return  # every waiter left
            if not answer.cancelled() and answer.exception() is None:
                if answer.result() == CheckReply.READY:
                    current = self._main
                    asked_again = (
                        group.late
                        and late_rounds < LATE_ROUNDS_AT_MOST
                        and current is not None
                        and self._check_first(group, current, late_rounds + 1)
                    )
                    if not asked_again:
                        self._finish_group(group, None, wakes_all=True)
                    return
            group.state = "queued"  # not there (or the main connection broke: a WAIT tells)
            group.asked = None
            self._queued.append(group)
            self._pump_waits()

        reply.add_done_callback(checked)
        return True

    def _next_queued(self) -> Optional[WaitGroup[Client]]:
        """The oldest group still waiting for a connection, taken off the queue."""
        while self._queued:
            group = self._queued.popleft()
            if group.state == "queued":
                return group
        return None

    def _pump_waits(self) -> None:
        """Give idle wait connections to queued groups, oldest first, and open what the rest need.

        A group beyond the pool gets an extra connection of its own rather than polling: only a
        WAIT registered at the root sees a key that is set and deleted at once (a CHECK between
        the two misses it), so distinct waits are forwarded unmerged, one connection each.
        """
        while self._queued:
            conn = _pop_open(self._idle_wait)
            if conn is None:
                break
            group = self._next_queued()
            if group is None:
                self._idle_wait.append(conn)
                break
            self._activate(group, conn)
        needed = sum(1 for group in self._queued if group.state == "queued")
        while needed > self._wait_opening + self._extra_opening:
            if len(self._wait_pool) + self._wait_opening < self.wait_connections:
                self._wait_opening += 1
                self.spawn(self._open_wait_conn())
            else:
                self._extra_opening += 1
                self.spawn(self._open_wait_conn(extra=True))

    def _activate(self, group: WaitGroup[Client], conn: Upstream) -> None:
        group.state = "active"
        group.conn = conn
        try:
            group.asking(conn.batch)
            upstream = conn.send(Request(Op.WAIT, keys=group.keys))
        except UpstreamLost as exc:
            self._finish_group(group, exc)
            return
        assert upstream is not None

        def done(reply: asyncio.Future) -> None:
            if reply.cancelled() or reply.exception() is not None:
                self._finish_group(group, reply.exception() or UpstreamLost("cancelled"))
                return
            if reply.result() == WaitReply.STOP_WAITING and group.state == "active":
                self._finish_group(group, None)
                self._release_wait_conn(conn)
            # WAIT_CANCELED or a wake-up racing our CANCEL_WAIT: the cancel reply frees the conn

        upstream.add_done_callback(done)

    def _finish_group(
        self, group: WaitGroup[Client], error: Optional[BaseException], wakes_all: bool = False
    ) -> None:
        """Answer a group: its upstream WAIT failed (``error``) or said "ready".

        A "ready" that several local waiters share (or that one shares with late ones, whose own
        WAITs the root would hold too) may have been one queue push, which wakes one waiter at
        the root, and not a write, which wakes them all: a torch client's blocking ``queue_pop``
        is a WAIT on the queue's key, so the proxy cannot tell them apart by the request. Unless
        the answer is known to wake them all (``wakes_all``: a write, or the key there when a
        CHECK asked), the key is known to be no queue, or the root has none, they are all held
        while a QUEUE_LEN of the key, sent after the wake-up, tells (:meth:`_held_by`).
        Answering them together keeps workers that move in step in step, so their next requests
        still share one upstream request.
        """
        self._joins.forget_wait(group)
        waiters, late = group.finish(error is not None)
        if (
            error is None
            and not wakes_all
            and waiters
            and (len(waiters) > 1 or late)
            and self._may_wake_by_push(group.keys)
        ):
            held: WaitGroup[Client] = self._joins.new_wait_group(group.keys, follows=group)
            held.state = "held"
            held.asked = _SENT
            held.waiters.update(waiters)
            held.late.update(late)
            for client in (*held.waiters.values(), *held.late.values()):
                client.wait = held
            self.spawn(self._held_by(held))
            return
        if late:  # their answer must come from a request sent after they arrived: ask again
            again: WaitGroup[Client] = self._joins.new_wait_group(group.keys, follows=group)
            for client in late.values():
                again.waiters[client.id] = client
                client.wait = again
            self._ask(again)
        for client in waiters.values():  # a client that left (CANCEL_WAIT, gone) is no longer here
            if client.wait is group:
                client.wait = None
            if error is not None:
                client.abort()
        if error is None:
            self._answer_waits(list(waiters.values()))

    async def _held_by(self, held: WaitGroup[Client]) -> None:
        """What woke a held group: QUEUE_LEN of its key is 0 after a write (all wake), at least 1
        after a push (one wakes: the lead, the first to arrive; the rest wait on, see
        :meth:`lead_decides`). A root without queues (torch's classic server) drops the main
        connection for it, and the proxy remembers not to ask again."""
        main: Optional[Upstream] = None
        try:
            main = await self._get_main()
            self._queue_probe = main
            reply = main.send(Request(Op.QUEUE_LEN, keys=held.keys))
            assert reply is not None
            length = await asyncio.shield(reply)
        except UpstreamLost:
            if main is not None and main.writes_kept:  # dropped for this one request
                self.root_queues = False
            length = 0
        else:
            self.root_queues = True
        finally:
            self._queue_probe = None
        if length == 0:
            self._joins.mark_plain(held.keys[0])
        if held.state != "held":
            return
        if length == 0 or not held.waiters:
            self._finish_group(held, None, wakes_all=True)
            return
        lead = held.waiters.pop(next(iter(held.waiters)))
        lead.wait = None
        lead.lead_of = held
        asyncio.get_running_loop().call_later(HELD_AT_MOST, self._ask_held_again, held)
        self._answer_waits([lead])

    def lead_decides(self, lead: Client, request: Request) -> Optional[asyncio.Future]:
        """The lead of a wake-up by a push sent ``request``. The rest wait on, as at the root,
        with an upstream WAIT sent after the lead's pop of that key (returned: the pop's reply,
        for the client to answer), or at once if the request is anything else."""
        held, lead.lead_of = lead.lead_of, None
        assert held is not None
        if request.op != Op.QUEUE_POP or request.keys != held.keys:
            self._ask_held_again(held)
            return None
        main = self._main
        assert main is not None  # the caller checked it is open
        future = self._submit(main, request)
        assert future is not None
        future.add_done_callback(lambda _: self._ask_held_again(held))
        return future

    def _ask_held_again(self, held: WaitGroup[Client]) -> None:
        """The held rest of a wake-up wait on with an upstream WAIT of their own, sent now."""
        if held.state != "held":
            return
        held.state = "queued"
        held.asked = None
        self._queued.append(held)
        self._pump_waits()

    def _answer_waits(self, clients: List[Client]) -> None:
        """STOP_WAITING to ``clients``, one upstream answer's waiters, once their earlier writes
        are applied at the root, and to all of them together.

        Straight to the root, a WAIT's answer proves that the writes the client sent before it
        were applied (one connection, served in order). Through the proxy the WAIT is answered on
        a connection of its own, or by a CHECK that may have gone before a waiter's last write, so
        its answer is held until the main connection has answered a request sent after the
        client's latest no-reply write (a PING if none follows). Holding the rest of the group
        for that too keeps workers that move in step in step: one of eight answered a round trip
        after the others stays that far behind, and its requests share nothing any more.
        """
        unapplied: Dict[Upstream, int] = {}
        for client in clients:
            unconfirmed = client.unconfirmed
            if unconfirmed is None or unconfirmed[0].marks.applied(unconfirmed[1]):
                client.unconfirmed = None
                continue
            conn, mark = unconfirmed
            unapplied[conn] = max(unapplied.get(conn, 0), mark)
        if not unapplied:
            for client in clients:
                client.write(STOP_WAITING_REPLY)
            return
        held = object()
        for client in clients:
            client.stop_held = held
        remaining = len(unapplied)

        def release() -> None:
            nonlocal remaining
            remaining -= 1
            if remaining:
                return
            for client in clients:
                if client.stop_held is held:  # not answered by a CANCEL_WAIT since
                    client.stop_held = None
                    client.write(STOP_WAITING_REPLY)

        for conn, mark in unapplied.items():
            conn.when_applied(mark, release)

    def _fail_queued(self, error: BaseException) -> None:
        if self._wait_pool or self._wait_opening or self._extra_opening:
            return  # another connection will serve the queue
        while self._queued:
            self._finish_group(self._queued.popleft(), error)

    def _leave_wait(self, client: Client) -> None:
        if client.wait is None:
            return
        group = client.wait
        client.wait = None
        group.remove(client)
        if not group.empty or group.state not in ("queued", "checking", "active", "held"):
            return
        self._joins.forget_wait(group)
        if group.state in ("queued", "checking", "held"):
            group.state = "done"
            return
        group.state = "cancelling"
        conn = group.conn
        assert isinstance(conn, Upstream)
        self._cancel_upstream(conn)

    def _cancel_upstream(self, conn: Upstream) -> None:
        try:
            cancelled = conn.send(Request(Op.CANCEL_WAIT))
        except UpstreamLost:
            return
        assert cancelled is not None
        cancelled.add_done_callback(
            lambda f: (
                self._release_wait_conn(conn)
                if not f.cancelled() and f.exception() is None
                else None
            )
        )

    # ------------------------------------------------------------ BARRIER

    def _client_barrier(self, client: Client, request: Request) -> Optional[asyncio.Future[object]]:
        # An extra connection first: one is open only because a BARRIER asked for it, and taking
        # an idle wait connection instead (the pool came up meanwhile) would leave it open for
        # good, one more root connection per barrier that found the pool still opening.
        conn = _pop_open(self._spare_barrier_conns) or _pop_open(self._idle_wait)
        if conn is None:  # no idle connection: open a short-lived one, then retry
            return self.spawn(self._open_spare_barrier_conn())
        self._leave_barrier(client)
        self._joins.noted(request)
        upstream = conn.send(request)
        assert upstream is not None
        client.barrier = (conn, upstream)

        def done(reply: asyncio.Future) -> None:
            if client.barrier is not None and client.barrier[1] is reply:
                client.barrier = None
            else:
                return  # cancelled by the client: the CANCEL_WAIT reply frees the conn
            if reply.cancelled() or reply.exception() is not None:
                client.abort()
                return
            client.write(encode_reply(Op.BARRIER, reply.result()))
            self._release_wait_conn(conn)

        upstream.add_done_callback(done)
        return None

    async def _open_spare_barrier_conn(self) -> None:
        conn = Upstream(self, "barrier")
        await conn.open(asyncio.get_running_loop().time() + self.timeout)
        self._spare_barrier_conns.append(conn)

    def _leave_barrier(self, client: Client) -> None:
        if client.barrier is None:
            return
        conn, _ = client.barrier
        client.barrier = None
        self._cancel_upstream(conn)


def _pop_open(conns: List[Upstream]) -> Optional[Upstream]:
    """The last of ``conns`` still open, popped with the closed ones after it; None if none is."""
    while conns:
        conn = conns.pop()
        if not conn.closed:
            return conn
    return None
