"""Each agent's watch: heartbeats to the root, the verdict, and (on the root's host) the judge.

A thread per agent, started when the agent first joins and stopped when it signs off. Every
``keep_alive_interval`` it sends one pipelined round trip to the root: ADD 1 to this node's
counter, and CHECK whether a :class:`~.verdict.Verdict` exists. On the root's host (the agent
of pod index 0) the same round trip also reads every other node's counter (one MULTI_GET) and
the count of failure reports, and the watch judges (see :mod:`.liveness`): a node silent for
the liveness window, or the root cause of reported worker failures, becomes the verdict.

Whatever the watch learns ends the job through :class:`JobStopped`, a ``BaseException`` the agent's
main thread raises at its next look (:meth:`Watch.raise_if_stopped`, called where the rendezvous
handler polls): torch's agent catches ``Exception`` in places (its exit barrier) and must not
swallow it, and its ``finally`` blocks still stop the workers. The watch never touches the
workers itself.

A root that does not answer a heartbeat within the call deadline, or refuses connections, is
lost: that verdict is local (nobody can publish it), and every node reaches the same one.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Protocol

from ..protocol import CheckReply, Op, Request
from . import liveness, verdict
from .liveness import BeatTracker, LivenessSettings, Pending
from .rootclient import RootClient, RootError
from .verdict import FailureReport, Identity, Verdict

logger = logging.getLogger(__name__)
STOP_WAIT = 2.0
WATCH_THREAD = "npu-run-watch"
JUDGE_POLL = 1.0  # the root's host looks for failure reports this often (one request)


class JobStopped(BaseException):
    """The job ended (a verdict): unwind the agent, stop the workers, print the verdict."""

    def __init__(self, found: Verdict) -> None:
        super().__init__(verdict.line(found))
        self.verdict = found


class WatchKeys(Protocol):
    """The root store keys the watch uses (:class:`.config.RunKeys`)."""

    verdict: str
    verdict_claims: str
    failures: str
    failures_count: str
    lost: str

    def alive(self, member: int) -> str: ...

    def who(self, member: int) -> str: ...


def _wire(key: str) -> bytes:
    return b"/" + key.encode()


class Watch:
    """The heartbeat, verdict and judge thread of one agent (see the module docstring).

    Agents are known by their member numbers (the counters and identities in the root are
    theirs); :meth:`set_ranks` says which node rank each held in the last round, for the lines.
    """

    def __init__(
        self,
        client: RootClient,
        keys: WatchKeys,
        member: int,
        hosting: bool,
        settings: LivenessSettings,
        root_who: Identity,
        check_proxy: Optional[Callable[[], Optional[Verdict]]] = None,
        *,
        node_rank: int = 0,
        root_member: int = -1,
        fewest_nodes: int = 0,
    ) -> None:
        self._client = client
        self._keys = keys
        self._member = member
        self._hosting = hosting
        self._root_member = member if hosting else root_member
        self._ranks: Dict[int, int] = {member: node_rank}
        self._settings = settings
        self._root_who = root_who
        self._check_proxy = check_proxy
        self._verdict: Optional[Verdict] = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._tracker: Optional[BeatTracker] = None
        self._pending: Optional[Pending] = None
        self._reports: List[FailureReport] = []
        self._reports_seen = 0
        self._who: Dict[int, Identity] = {}
        self._fewest_nodes = fewest_nodes  # elastic: MIN, the nodes a job can go on with
        self.beats = 0

    # -- the main thread's side ----------------------------------------------------------------

    @property
    def verdict(self) -> Optional[Verdict]:
        return self._verdict

    def raise_if_stopped(self) -> None:
        found = self._verdict
        if found is not None:
            raise JobStopped(found)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=WATCH_THREAD, daemon=True)
            self._thread.start()

    def set_ranks(self, ranks: Mapping[int, int]) -> None:
        """The node rank of every member in the round that just completed (for the lines)."""
        self._ranks = dict(ranks)

    def rank_of(self, member: int) -> int:
        return self._ranks.get(member, -1)

    @property
    def root_rank(self) -> int:
        """The root's host's node rank in the last round (0 before the first plan)."""
        return self._ranks.get(self._root_member, 0)

    def judge(self, members: List[int]) -> None:
        """Watch ``members`` (the root's host, once every member's counter exists): those of
        the last round; members that left it (a replaced pod's old agent) are not watched."""
        now, wall = time.monotonic(), time.time()
        if self._tracker is None:
            self._tracker = BeatTracker(members, now, wall)
        else:
            self._tracker.keep_only(members, now, wall)
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=STOP_WAIT)  # a call on a silent root ends when the client closes

    def conclude(self, found: Verdict) -> Verdict:
        """Adopt ``found`` as this node's verdict (the first one wins) and return the one kept."""
        if self._verdict is None:
            self._verdict = found
            logger.debug("verdict: %s", found.text)
        return self._verdict

    def publish(self, found: Verdict) -> Verdict:
        """Make ``found`` the job's verdict unless another node's came first; returns the winner."""
        if int(self._client.add(self._keys.verdict_claims, 1)) == 1:
            self._client.set(self._keys.verdict, found.to_json())
            return self.conclude(found)
        return self.conclude(Verdict.from_json(self._client.get(self._keys.verdict).decode()))

    def read_verdict(self) -> Optional[Verdict]:
        """The job's verdict if one was published (one CHECK, a GET if so)."""
        if self._verdict is not None:
            return self._verdict
        if not self._client.check([self._keys.verdict]):
            return None
        return self.conclude(Verdict.from_json(self._client.get(self._keys.verdict).decode()))

    def identity(self, member: int) -> Identity:
        if member == self._root_member:
            return self._root_who
        if member not in self._who:
            try:
                if self._client.check([self._keys.who(member)]):
                    text = self._client.get(self._keys.who(member)).decode()
                    self._who[member] = Identity.from_json(text)
            except (RootError, ValueError):
                pass
        return self._who.get(member, verdict.UNKNOWN)

    def _go_on_without(self, member: int, seen: liveness.Seen, now: float, left: List[int]) -> None:
        """Elastic: a silent node leaves the job instead of ending it; every agent, seeing the
        ``lost`` counter move, restarts its workers into a round without it."""
        assert self._tracker is not None
        self._tracker.keep_only(left, now, time.time())
        self._pending = None
        self._client.add(self._keys.lost, 1)
        logger.warning(
            "%s stopped: no heartbeat for %.1fs; the elastic job goes on with the %d node(s) "
            "left, in a new round",
            self.identity(member).describe(self.rank_of(member)),
            now - seen.moved_at,
            len(left) + 1,
        )

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        interval = self._settings.interval
        last = next_round = time.monotonic()
        while not self._stopping.is_set() and self._verdict is None:
            now = time.monotonic()
            if now - last > self._settings.window:
                self._stalled(now - last)
            last = now
            try:
                if now >= next_round or self._new_reports():
                    next_round = now + interval
                    if self._check_proxy is not None:
                        found = self._check_proxy()
                        if found is not None:
                            self.publish(found)
                            break
                    self._tick()
            except RootError as error:
                if not self._stopping.is_set():
                    self.conclude(
                        verdict.root_lost(
                            self._client.address,
                            self._root_who,
                            str(error),
                            root_rank=self.root_rank,
                        )
                    )
                break
            except Exception:  # a bug in the watch must not take the agent down with it
                logger.exception("the liveness watch failed a round (it goes on)")
            until = next_round if self._tracker is None else min(next_round, now + JUDGE_POLL)
            self._wake.wait(max(0.0, until - time.monotonic()))
            self._wake.clear()

    def _new_reports(self) -> bool:
        """The judge, between rounds: did a node report failed workers? (one ADD 0, the root's
        host only, so a failure is judged within a second rather than a heartbeat interval)."""
        if self._tracker is None:
            return False
        return int(self._client.add(self._keys.failures_count, 0)) > self._reports_seen

    def _stalled(self, gap: float) -> None:
        logger.warning(
            "this agent was stalled for %.1fs (longer than the liveness window of %gs)",
            gap,
            self._settings.window,
        )
        if self._hosting and self._tracker is not None:
            self.publish(
                verdict.stalled(
                    self.rank_of(self._member),
                    self._root_who,
                    gap,
                    self._settings.window,
                    member=self._member,
                )
            )

    def _tick(self) -> None:
        keys = self._keys
        requests = []
        if not self._hosting:
            requests.append(Request(Op.ADD, keys=(_wire(keys.alive(self._member)),), number=1))
        requests.append(Request(Op.CHECK, keys=(_wire(keys.verdict),)))
        tracker = self._tracker
        if tracker is not None:
            requests.append(
                Request(Op.MULTI_GET, keys=tuple(_wire(keys.alive(r)) for r in tracker.ranks))
            )
            requests.append(Request(Op.ADD, keys=(_wire(keys.failures_count),), number=0))
        replies = self._client.call(*requests)
        self.beats += 1
        if not self._hosting:
            replies = replies[1:]
        if replies[0] == CheckReply.READY:
            self.read_verdict()
            return
        if tracker is not None:
            self._judge(tracker, replies[1], int(replies[2]))  # type: ignore[arg-type]

    def _judge(self, tracker: BeatTracker, counters: tuple, reported: int) -> None:
        now, wall = time.monotonic(), time.time()
        tracker.observe(
            {rank: int(value or 0) for rank, value in zip(tracker.ranks, counters)}, now, wall
        )
        if reported > self._reports_seen:
            self._reports = verdict.parse_reports(self._client.get(self._keys.failures))
            self._reports_seen = reported
            if self._pending is None and self._reports:
                self._pending = Pending(now, tracker.counts())
                logger.info(
                    "the root's host: %d failure report(s); waiting for every node's next "
                    "heartbeat before naming the cause",
                    len(self._reports),
                )
        window = self._settings.window
        if self._pending is None:
            silent = tracker.silent(now, window)
            if silent:
                self._dead(*silent[0], now)
            return
        decided, silent_rank = liveness.settled(
            self._pending, tracker, {r.member for r in self._reports}, now, window
        )
        if not decided:
            return
        if silent_rank is not None:
            self._dead(silent_rank, tracker.seen(silent_rank), now)
            return
        first = verdict.first_failure(self._reports)
        if first is not None:
            self.publish(verdict.workers_failed(first, self.identity(first.member)))

    def _dead(self, member: int, seen: liveness.Seen, now: float) -> None:
        tracker = self._tracker
        if tracker is not None and self._fewest_nodes:
            left = [rank for rank in tracker.ranks if rank != member]
            if len(left) + 1 >= self._fewest_nodes:  # the others and this root's host
                self._go_on_without(member, seen, now, left)
                return
        self.publish(
            verdict.dead_node(
                self.rank_of(member),
                self.identity(member),
                now - seen.moved_at,
                seen.moved_at_wall,
                self._settings.interval,  # the root's host reads the counters once a round
                member=member,
                root_rank=self.root_rank,
            )
        )
