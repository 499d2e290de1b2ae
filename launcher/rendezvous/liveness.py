"""Liveness rules (pure): heartbeat settings, the root host's view of each node, the judge's choice.

Every agent adds 1 to its own counter in the root store every ``keep_alive_interval`` seconds
(the knobs are torch's c10d names, ``--rdzv_conf keep_alive_interval=5,keep_alive_max_attempt=3``).
The root's host reads all counters in one MULTI_GET per interval and keeps, on its own clock, when
each one last moved (:class:`BeatTracker`): a node whose counter has not moved for the
*liveness window* (interval x max attempts, 15 s by default) has stopped. A node that signs off
adds :data:`DEPARTED`, so it is never taken for dead. Clocks of other hosts are never compared.

When workers fail, their agents report to the root's host before anyone blames them
(:func:`settled`): a failure can be the echo of another node's death (its peers' collectives
break first), so the root's host waits until every node has either reported too, beaten again since
the first report, or been silent for the window; a silent node is the cause, else the earliest
report is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

DEFAULT_INTERVAL = 5.0  # torch's c10d keep_alive_interval
DEFAULT_MAX_ATTEMPT = 3  # torch's c10d keep_alive_max_attempt
DEPARTED = 1 << 40  # added to a node's counter when it signs off


@dataclass(frozen=True)
class LivenessSettings:
    """``interval``: seconds between heartbeats; a node silent ``max_attempt`` intervals is dead."""

    interval: float = DEFAULT_INTERVAL
    max_attempt: int = DEFAULT_MAX_ATTEMPT

    @property
    def window(self) -> float:
        return self.interval * self.max_attempt


@dataclass(frozen=True)
class Seen:
    """What the root's host last saw of a node: its counter, and when (monotonic) it last moved."""

    count: int
    moved_at: float
    moved_at_wall: float

    @property
    def departed(self) -> bool:
        return self.count >= DEPARTED


class BeatTracker:
    """The root host's record of every other node's heartbeat counter (fed by :meth:`observe`).

    Nodes are keyed by the agents' member numbers (stable while ranks move between rounds)."""

    def __init__(self, ranks: Iterable[int], now: float, now_wall: float) -> None:
        self._seen: Dict[int, Seen] = {rank: Seen(-1, now, now_wall) for rank in ranks}

    @property
    def ranks(self) -> List[int]:
        return sorted(self._seen)

    def observe(self, counts: Mapping[int, int], now: float, now_wall: float) -> None:
        for rank, count in counts.items():
            before = self._seen.get(rank)
            if before is None or count != before.count:
                self._seen[rank] = Seen(count, now, now_wall)

    def keep_only(self, ranks: Iterable[int], now: float, now_wall: float) -> None:
        """Track exactly ``ranks`` from now on: those still there keep what was seen of them,
        new ones start fresh, the others are dropped (they left the job with their round)."""
        self._seen = {
            rank: self._seen.get(rank, Seen(-1, now, now_wall)) for rank in sorted(set(ranks))
        }

    def restart_clock(self, now: float, now_wall: float) -> None:
        """Forget how long nodes were quiet (after this node itself was stalled)."""
        self._seen = {rank: Seen(seen.count, now, now_wall) for rank, seen in self._seen.items()}

    def seen(self, rank: int) -> Seen:
        return self._seen[rank]

    def silent(self, now: float, window: float) -> List[Tuple[int, Seen]]:
        """Nodes (not departed) whose counter has not moved for ``window`` s, longest first."""
        quiet = [
            (rank, seen)
            for rank, seen in self._seen.items()
            if not seen.departed and now - seen.moved_at >= window
        ]
        return sorted(quiet, key=lambda item: (item[1].moved_at, item[0]))

    def counts(self) -> Dict[int, int]:
        return {rank: seen.count for rank, seen in self._seen.items()}


@dataclass(frozen=True)
class Pending:
    """Failure reports are in; the root's host waits for the other nodes' next heartbeat."""

    since: float
    counts_then: Mapping[int, int]


def settled(
    pending: Pending, tracker: BeatTracker, reported: Iterable[int], now: float, window: float
) -> Tuple[bool, Optional[int]]:
    """``(decided, silent node or None)``: whether every node is accounted for since the first
    report (reported, beat again, departed, or silent for the window), and the silent one."""
    done = set(reported)
    silent = [rank for rank, _ in tracker.silent(now, window) if rank not in done]
    if silent:
        return True, silent[0]
    for rank in tracker.ranks:
        if rank in done:
            continue
        seen = tracker.seen(rank)
        if seen.departed or seen.count != pending.counts_then.get(rank, seen.count):
            continue
        return False, None
    return True, None
