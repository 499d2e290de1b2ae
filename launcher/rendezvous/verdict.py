"""Why a job ended, said the same way on every node (pure: values in, values and text out).

When one node ends a job (its workers failed for good, it stopped answering, it was signalled,
its store proxy could not be brought back), the first agent that knows writes one
:class:`Verdict` into the root store and every agent prints its text as its last line. The
builders here word each cause; :func:`first_failure` picks the root cause among the failures
that several nodes report at about the same time (the earliest: a worker that failed because a
peer died did so after that peer; on a tie, the lowest node rank).
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
ORDERS = "orders"
RANK_TAKEN = "rank_taken"


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        data = json.loads(text)
        return cls(node_rank=int(data["node_rank"]), kind=str(data["kind"]), text=str(data["text"]))


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FailureReport:
        data = json.loads(text)
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


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
    node_rank: int, who: Identity, silent_for: float, last_seen: float, poll_interval: float
) -> Verdict:
    """A node silent for ``silent_for`` s. ``last_seen`` is node rank 0's wall clock when its
    poll (every ``poll_interval`` s) found the node's counter moved, not when the node beat:
    that was up to one poll earlier, on a clock of its own."""
    return Verdict(
        node_rank,
        DEAD,
        (
            f"{who.describe(node_rank)} stopped: no heartbeat for {silent_for:.1f}s "
            f"(its heartbeat counter last seen moving at {clock(last_seen)} by node rank 0's "
            f"poll, every {poll_interval:g}s)"
        ),
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
    )


def signalled(node_rank: int, who: Identity, signal_name: str) -> Verdict:
    return Verdict(node_rank, SIGNALLED, f"{who.describe(node_rank)} was stopped by {signal_name}")


def proxy_lost(node_rank: int, who: Identity, address: str, error: str) -> Verdict:
    return Verdict(
        node_rank,
        PROXY,
        (
            f"{who.describe(node_rank)}: its store proxy {address} died and could not be "
            f"restarted on the same port: {error}"
        ),
    )


def root_lost(root: str, who: Identity, error: str) -> Verdict:
    return Verdict(0, ROOT_LOST, f"lost the root store {root} of {who.describe(0)}: {error}")


def stalled(node_rank: int, who: Identity, stalled_for: float, window: float) -> Verdict:
    return Verdict(
        node_rank,
        STALLED,
        (
            f"{who.describe(node_rank)} was stalled for {stalled_for:.1f}s (a frozen host?), "
            f"longer than the liveness window of {window:g}s: the other nodes have given up on it"
        ),
    )


def left(node_rank: int, who: Identity, reason: str) -> Verdict:
    return Verdict(node_rank, LEFT, f"{who.describe(node_rank)} left the job: {short(reason)}")


def orders_differ(node_rank: int, who: Identity, mine: str, theirs: str) -> Verdict:
    return Verdict(
        node_rank,
        ORDERS,
        (
            f"{who.describe(node_rank)} follows the {mine}, but the nodes that joined before it "
            f"follow the {theirs}: the pods' bootstraps decided different node orders, so their "
            "ranks would clash. Compare the 'input sha256' lines of the pods' bootstrap logs "
            "(their rank tables or topologies differed, or one bootstrap fell back), then restart "
            "the job"
        ),
    )


def rank_taken(node_rank: int, who: Identity, number: int, run_id: str) -> Verdict:
    return Verdict(
        node_rank,
        RANK_TAKEN,
        (
            f"{who.describe(node_rank)} came to round {number} of {run_id!r} as node rank "
            f"{node_rank}, which another node holds: two nodes were started with "
            f"--node_rank={node_rank}"
        ),
    )


def line(verdict: Verdict) -> str:
    """The last line every node prints (after ``npu-run: error: ``)."""
    return f"the job stopped: {verdict.text}"
