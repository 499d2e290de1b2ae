"""Why a job ended, said the same way on every node (pure: values in, values and text out).

When one node ends a job (its workers failed for good, it stopped answering, it was signalled,
its store proxy could not be brought back), the first agent that knows writes one
:class:`Verdict` into the root store and every agent prints its text as its last line. The
builders here word each cause; :func:`first_failure` picks the root cause among the failures
that several nodes report at about the same time (the earliest: a worker that failed because a
peer died did so after that peer; on a tie, the lowest node rank).

Node ranks move between rounds (the root plans each one), so a verdict names the node by the rank
it held in the last round, and carries its *member* number (one per agent of the run, see
:mod:`.rounds`) for the agents that must know whether it is their own.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Iterable, Optional

MESSAGE_LIMIT = 300  # characters of a worker's error message carried into the verdict

DEAD = "dead"
WORKERS_FAILED = "workers_failed"
SIGNALLED = "signalled"
PROXY = "proxy"
ROOT_LOST = "root_lost"
STALLED = "stalled"
LEFT = "left"
ROUND_FULL = "round_full"


@dataclass(frozen=True)
class Identity:
    """Where a node runs: its pod (host name) and its host's address."""

    pod: str
    host: str

    def describe(self, node_rank: int) -> str:
        return f"node rank {node_rank} (pod {self.pod}, host {self.host})"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Identity:
        data = json.loads(text)
        return cls(pod=str(data.get("pod", "?")), host=str(data.get("host", "?")))


UNKNOWN = Identity("?", "?")


@dataclass(frozen=True)
class Verdict:
    """The cause of the end: the node that caused it, what kind of cause, and the line to print."""

    node_rank: int
    kind: str
    text: str
    member: int = -1  # the agent at fault (-1: the root's own, or not one agent's)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        data = json.loads(text)
        return cls(
            node_rank=int(data["node_rank"]),
            kind=str(data["kind"]),
            text=str(data["text"]),
            member=int(data.get("member", -1)),
        )


@dataclass(frozen=True)
class FailureReport:
    """A node whose workers failed for good, as its agent reports it to the judge (node rank 0)."""

    node_rank: int
    seen_at: float  # wall clock when the worker failed (its @record error file, else its agent)
    worker_rank: int
    local_rank: int
    pid: int
    exit_code: int
    message: str
    member: int = -1  # the reporting agent's member number

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FailureReport:
        data = json.loads(text)
        fields = cls.__dataclass_fields__
        return cls(**{name: data[name] for name in fields if name in data or name != "member"})


def parse_reports(blob: bytes) -> list:
    """The reports appended (one JSON line each) to the failures key; bad lines are skipped."""
    reports = []
    for line in blob.decode("utf-8", "replace").splitlines():
        try:
            reports.append(FailureReport.from_json(line))
        except (ValueError, KeyError, TypeError):
            continue
    return reports


def first_failure(reports: Iterable[FailureReport]) -> Optional[FailureReport]:
    """The root cause among reports: the earliest seen, then the lowest node rank."""
    return min(reports, key=lambda r: (r.seen_at, r.node_rank), default=None)


def short(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """One line of at most ``limit`` characters (a traceback's last line is its message)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    text = lines[-1] if lines else "no error message"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clock(wall: float) -> str:
    """A wall-clock time as the logs show it (local time, to the millisecond)."""
    return time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall % 1 * 1000):03d}"


def dead_node(
    node_rank: int,
    who: Identity,
    silent_for: float,
    last_seen: float,
    poll_interval: float,
    *,
    member: int = -1,
    root_rank: int = 0,
) -> Verdict:
    """A node silent for ``silent_for`` s. ``last_seen`` is the root host's (node rank
    ``root_rank``'s) wall clock when its poll (every ``poll_interval`` s) found the node's counter
    moved, not when the node beat: that was up to one poll earlier, on a clock of its own."""
    return Verdict(
        node_rank,
        DEAD,
        (
            f"{who.describe(node_rank)} stopped: no heartbeat for {silent_for:.1f}s "
            f"(its heartbeat counter last seen moving at {clock(last_seen)} by node rank "
            f"{root_rank}'s poll, every {poll_interval:g}s)"
        ),
        member,
    )


def workers_failed(report: FailureReport, who: Identity) -> Verdict:
    how = (
        f"was killed by signal {-report.exit_code}"
        if report.exit_code < 0
        else f"failed with exit code {report.exit_code}"
    )
    return Verdict(
        report.node_rank,
        WORKERS_FAILED,
        (
            f"{who.describe(report.node_rank)}: worker rank {report.worker_rank} (local rank "
            f"{report.local_rank}, pid {report.pid}) {how}: {short(report.message)}"
        ),
        report.member,
    )


def signalled(node_rank: int, who: Identity, signal_name: str, *, member: int = -1) -> Verdict:
    return Verdict(
        node_rank, SIGNALLED, f"{who.describe(node_rank)} was stopped by {signal_name}", member
    )


def proxy_lost(
    node_rank: int, who: Identity, address: str, error: str, *, member: int = -1
) -> Verdict:
    return Verdict(
        node_rank,
        PROXY,
        (
            f"{who.describe(node_rank)}: its store proxy {address} died and could not be "
            f"restarted on the same port: {error}"
        ),
        member,
    )


def root_lost(root: str, who: Identity, error: str, *, root_rank: int = 0) -> Verdict:
    """The root store at ``root``, hosted by node rank ``root_rank`` (``who``), is gone."""
    return Verdict(
        root_rank, ROOT_LOST, f"lost the root store {root} of {who.describe(root_rank)}: {error}"
    )


def stalled(
    node_rank: int, who: Identity, stalled_for: float, window: float, *, member: int = -1
) -> Verdict:
    return Verdict(
        node_rank,
        STALLED,
        (
            f"{who.describe(node_rank)} was stalled for {stalled_for:.1f}s (a frozen host?), "
            f"longer than the liveness window of {window:g}s: the other nodes have given up on it"
        ),
        member,
    )


def left(node_rank: int, who: Identity, reason: str, *, member: int = -1) -> Verdict:
    return Verdict(
        node_rank, LEFT, f"{who.describe(node_rank)} left the job: {short(reason)}", member
    )


def round_full(node_rank: int, who: Identity, number: int, run_id: str, nnodes: int) -> Verdict:
    """One agent more than ``--nnodes`` came to a round (two pods of one index, or a second
    launcher on one pod): the round was complete without it."""
    return Verdict(
        node_rank,
        ROUND_FULL,
        (
            f"{who.describe(node_rank)} came to round {number} of {run_id!r} after its "
            f"--nnodes={nnodes} nodes had joined: one node too many (two pods started as one, "
            "or a second npu-run on one pod)"
        ),
    )


def line(verdict: Verdict) -> str:
    """The last line every node prints (after ``npu-run: error: ``)."""
    return f"the job stopped: {verdict.text}"
