"""The rounds of the ``parallel`` rendezvous, as the root store's keys see them.

Static membership: a round completes when ``--nnodes`` agents have joined it (:func:`join`,
:func:`await_round`; on timeout the error names the node ranks that never came, by the
``--node_rank`` each agent came with). Elastic (``--nnodes=MIN:MAX``): the root's host closes
each round, as torch's c10d would, once MAX agents joined or at least MIN did and none came for
``last_call`` seconds (:class:`LastCall`); it picks the members (itself and the first others to
come, up to MAX) and writes them as the round's ``complete`` key. An agent that came too late
joins the next round, and the members, seeing it wait, restart around it; one that finds the job
at MAX waits until a member opens a round (:func:`next_round_with_room`).

Agents join by their *member* number (one per agent of the run, from the root's counter), not by
node rank: each publishes its node report and what its bootstrap said (:class:`Claim`). Once the
round is complete, the root's host plans it once over the reports (:func:`plan_at_root`,
:func:`~npu_job.bootstrap.nodereport.plan_round`) and publishes the plan; every agent takes its
node rank from it (:func:`await_plan`). So ranks move between rounds, the root stays where it is
(pod index 0), and a node whose bootstrap planned another order is re-ranked, named in one line of
the root's log (:func:`disagreements`).

A node that restarts its workers joins the next round, and the other agents, seeing it waiting,
restart theirs. A freshly started agent (a replaced pod) joins the first round that is not yet
complete (:func:`first_open_round`): the next round is planned over the new set of nodes.

Before the workers of a new round start, their store must hold nothing of the previous workers'
(a gloo rank would read a dead peer's address): with ``list_keys`` the root's host deletes those
keys from the root (:func:`clear_previous_workers`); without it global rank 0 hosts a fresh
workers' store each round (:func:`workers_store`). At the end the root's host keeps the root up
until the other agents signed off (:func:`linger_for_departures`).

Each function takes the root store, the run's keys and settings: the handler
(:mod:`.handler`) holds them and calls these in order.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import AbstractSet, Callable, List, Mapping, Optional, Sequence, Tuple

from npu_job.bootstrap.nodereport import RoundPlan, plan_round
from torch.distributed import Store
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousTimeoutError

from npu_job.polling import Backoff, Every, poll_until

from .. import torchcompat
from ..noderank import PLANNED_ORDER, SCHEDULER_ORDER
from .config import KEY_ROOT, ParallelSettings, RunKeys
from .rootstore import PROGRESS_INTERVAL, free_port_near

logger = logging.getLogger(__name__)

MAX_LISTED_NODES = 16
KEY_POLL = Backoff.exponential(0.005, 0.25)  # a key another agent sets: from 5 ms up to 0.25 s
SHOWN_DIGEST = 12  # hex digits of a mapping digest in the root's line about re-ranked pods
# What the root's host adds to an elastic round's counter as it closes it: every agent that
# counts itself in afterwards gets a position above it and knows it came too late (one atomic
# ADD decides, so no agent is half in).
CLOSED = 1 << 40


@dataclass(frozen=True)
class Claim:
    """What an agent says of itself when it joins a round: the ``--node_rank`` it came with
    (``hint``), the order its bootstrap decided (:func:`~..noderank.node_order`; None: no
    bootstrap to say), and its pod's name for the root's log."""

    hint: int
    order: Optional[str]
    pod: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Claim:
        data = json.loads(text)
        order = data.get("order")
        return cls(int(data["hint"]), None if order is None else str(order), str(data["pod"]))


def first_open_round(store: Store, keys: RunKeys, node_rank: int) -> int:
    """The round a freshly started agent joins: 0, or the first one not yet complete.

    A node whose pod was replaced while the job runs comes back as a fresh agent. It joins the
    next round, and the running agents see it waiting and restart their workers around it; the
    root plans that round over the new set of nodes.
    """
    number = 0
    while torchcompat.key_exists(store, keys.complete(number)):
        number += 1
    if number > 0:
        logger.info("node rank %d rejoins a running job at round %d", node_rank, number)
    return number


def join(
    store: Store,
    keys: RunKeys,
    settings: ParallelSettings,
    number: int,
    member: int,
    report: bytes,
    claim: Claim,
) -> int:
    """Count member ``member`` into round ``number`` with its report: its position (from 1), or
    0 when the round had all its nodes already (static) or was closed (elastic). Static: the
    last agent to join marks the round complete; elastic: the root's host does
    (:class:`LastCall`), and a position is a place in the round only if the root picked it."""
    store.set(keys.report(number, member), report)
    store.set(keys.claim(number, member), claim.to_json())
    store.add(keys.node(number, settings.node_rank), 1)
    position = int(store.add(keys.joined(number), 1))
    if position > (CLOSED if settings.elastic else settings.nnodes):
        return 0
    store.set(keys.slot(number, position), str(member))
    if position == settings.nnodes and not settings.elastic:
        store.set(keys.complete(number), str(member))
    logger.info(
        "node rank %d joined round %d of %r; waiting for %s node(s) at the root store %s",
        settings.node_rank,
        number,
        settings.run_id,
        node_count(settings),
        settings.root,
    )
    return position


def node_count(settings: ParallelSettings) -> str:
    """``4``, or ``3 to 6`` when elastic."""
    if settings.elastic:
        return f"{settings.fewest_nodes} to {settings.nnodes}"
    return str(settings.nnodes)


def joined_count(store: Store, keys: RunKeys, number: int) -> int:
    """How many agents counted themselves into round ``number`` (late ones of a closed elastic
    round too)."""
    raw = int(store.add(keys.joined(number), 0))
    return raw - CLOSED if raw >= CLOSED else raw


class LastCall:
    """The root's host, elastic, while it awaits round ``number``: closes the round once
    ``--nnodes`` MAX agents joined, or once MIN or more did and ``last_call`` seconds passed since
    the last of them (torch's c10d rule). It picks the members, itself (at ``own_position``) and
    the first others by position up to MAX, and writes their positions as ``complete``."""

    def __init__(
        self,
        store: Store,
        keys: RunKeys,
        settings: ParallelSettings,
        number: int,
        own_position: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._store, self._keys, self._settings = store, keys, settings
        self._number, self._own = number, own_position
        self._clock = clock
        self._seen, self._since = -1, clock()
        self.closed = False

    def __call__(self, _elapsed: float = 0.0) -> None:
        if self.closed:
            return
        settings = self._settings
        count = int(self._store.add(self._keys.joined(self._number), 0))
        now = self._clock()
        if count != self._seen:
            self._seen, self._since = count, now
        full = count >= settings.nnodes
        if full or (count >= settings.fewest_nodes and now - self._since >= settings.last_call):
            self._close()

    def _close(self) -> None:
        store, keys, number = self._store, self._keys, self._number
        came = int(store.add(keys.joined(number), CLOSED)) - CLOSED
        slots = [keys.slot(number, position) for position in range(1, came + 1)]
        if not poll_until(  # each agent writes its slot right after counting itself in
            lambda: all(torchcompat.key_exists(store, slot) for slot in slots),
            self._settings.join_timeout,
            KEY_POLL,
        ):
            raise RendezvousTimeoutError(
                f"round {number}: not every agent that joined named its slot within "
                f"{self._settings.join_timeout:g}s (root store {self._settings.root})"
            )
        others = [position for position in range(1, came + 1) if position != self._own]
        chosen = sorted([self._own, *others[: self._settings.nnodes - 1]])
        store.set(keys.complete(number), ",".join(str(position) for position in chosen))
        self.closed = True
        left_out = came - len(chosen)
        logger.info(
            "round %d closed with %d node(s)%s",
            number,
            len(chosen),
            f"; {left_out} over --nnodes={self._settings.nnodes} wait" if left_out else "",
        )


def round_positions(
    store: Store, keys: RunKeys, settings: ParallelSettings, number: int
) -> List[int]:
    """The positions of the members of complete round ``number``: the first ``--nnodes``
    (static), or those the root's host picked (elastic)."""
    if not settings.elastic:
        return list(range(1, settings.nnodes + 1))
    text = bytes(store.get(keys.complete(number))).decode()
    return [int(position) for position in text.split(",")]


def next_round_with_room(
    store: Store,
    keys: RunKeys,
    settings: ParallelSettings,
    number: int,
    check: Callable[[], None],
) -> int:
    """Elastic: the round an agent left out of round ``number`` (or one that arrives after it,
    a fresh agent) joins: the next. After a round below MAX it joins at once, and the members,
    seeing it wait (:meth:`~.handler.ParallelRendezvousHandler.num_nodes_waiting`), restart
    around it. After one at MAX it waits, uncounted, until a member opens the next round (its
    workers restarted), so that a spare node never restarts a full job; ``check`` raises between
    polls when the job stopped or the rendezvous closed."""
    complete = keys.complete(number)
    if not poll_until(
        lambda: torchcompat.key_exists(store, complete), settings.join_timeout, KEY_POLL
    ):
        raise RendezvousTimeoutError(
            f"round {number} did not close within {settings.join_timeout:g}s "
            f"(root store {settings.root})"
        )
    following = number + 1
    if len(round_positions(store, keys, settings, number)) < settings.nnodes:
        return following
    logger.info(
        "node rank %d waits: round %d runs with the maximum of --nnodes=%s; it joins the next "
        "round a member opens",
        settings.node_rank,
        number,
        node_count(settings).replace(" to ", ":"),
    )
    if not poll_until(
        lambda: joined_count(store, keys, following) > 0,
        settings.join_timeout,
        KEY_POLL,
        tick=lambda _elapsed: check(),
    ):
        raise RendezvousTimeoutError(
            f"node rank {settings.node_rank} waited {settings.join_timeout:g}s for a round with "
            f"room: the job runs with its maximum of --nnodes={settings.nnodes} nodes"
        )
    return following


def await_round(
    store: Store,
    keys: RunKeys,
    settings: ParallelSettings,
    number: int,
    check_closed: Callable[[], None],
    check_stopped: Callable[[], None],
    last_call: Optional[LastCall] = None,
) -> None:
    """Poll until the round's ``complete`` key exists; name the missing nodes on timeout.

    Between polls ``check_stopped`` (every time) and ``check_closed`` (every second) may raise:
    the job ended elsewhere, or the rendezvous was closed. The root's host of an elastic job
    passes its ``last_call``, which closes the round when it is due.
    """
    complete = keys.complete(number)

    def progress(elapsed: float) -> None:
        logger.info(
            "round %d: %d of %s nodes joined after %.0fs",
            number,
            joined_count(store, keys, number),
            node_count(settings),
            elapsed,
        )

    closed_check = Every(1.0, lambda _elapsed: check_closed(), always=check_stopped)
    progress_line = Every(PROGRESS_INTERVAL, progress)

    def tick(elapsed: float) -> None:
        closed_check(elapsed)
        progress_line(elapsed)
        if last_call is not None:
            last_call(elapsed)

    if not poll_until(
        lambda: torchcompat.key_exists(store, complete), settings.join_timeout, KEY_POLL, tick=tick
    ):
        if settings.elastic:
            raise RendezvousTimeoutError(
                f"node rank {settings.node_rank} timed out after {settings.join_timeout:g}s in "
                f"round {number} at the root store {settings.root}: "
                f"{joined_count(store, keys, number)} node(s) joined, fewer than the "
                f"{settings.fewest_nodes} of --nnodes={node_count(settings).replace(' to ', ':')}"
            )
        missing = missing_nodes(store, keys, settings.nnodes, number)
        raise RendezvousTimeoutError(
            f"node rank {settings.node_rank} timed out after {settings.join_timeout:g}s in "
            f"round {number} at the root store {settings.root}: missing node ranks "
            f"{format_ranks(missing)} of --nnodes={settings.nnodes}"
        )


def plan_at_root(
    store: Store,
    keys: RunKeys,
    settings: ParallelSettings,
    number: int,
    checked: AbstractSet[int] = frozenset(),
) -> RoundPlan:
    """The root's host, once round ``number`` is complete: plan it over its members' reports,
    say which pods the plan re-ranked against their bootstraps (members not in ``checked``, the
    ones whose claims an earlier round looked at already), and publish the plan."""
    positions = round_positions(store, keys, settings, number)
    slots = [keys.slot(number, position) for position in positions]
    members = [int(value) for value in store.multi_get(slots)]
    reports = store.multi_get([keys.report(number, member) for member in members])
    claims = {
        member: Claim.from_json(bytes(text).decode("utf-8", "replace"))
        for member, text in zip(members, store.multi_get([keys.claim(number, m) for m in members]))
    }
    plan = plan_round(
        {str(member): bytes(report) for member, report in zip(members, reports)},
        predict=settings.probe is not None,  # the probe's verdict names the prediction
        pods={str(member): claim.pod for member, claim in claims.items()},
    )
    unchecked = {member: claim for member, claim in claims.items() if member not in checked}
    line = disagreements(number, plan, unchecked)
    if line is not None:
        logger.warning("%s", line)
    store.set(keys.plan(number), plan.encode())
    return plan


def disagreements(number: int, plan: RoundPlan, claims: Mapping[int, Claim]) -> Optional[str]:
    """One line naming the pods whose bootstrap decided otherwise than the round's plan (pure).

    A bootstrap that planned disagrees when its mapping digest or its rank is not the plan's;
    one that fell back to the scheduler order always does (it did not plan: the root placed it
    by its report). A node without a bootstrap (no order) disagrees only by its rank.
    """
    named: List[str] = []
    for member in sorted(claims, key=lambda m: plan.node_rank[str(m)]):
        claim = claims[member]
        rank = plan.node_rank[str(member)]
        order = claim.order
        if order is not None and order.startswith(PLANNED_ORDER):
            digest = order[len(PLANNED_ORDER) :]
            if digest == plan.mapping_digest and claim.hint == rank:
                continue
            said = f"its bootstrap planned {digest[:SHOWN_DIGEST]}"
        elif order == SCHEDULER_ORDER:
            said = f"its bootstrap did not plan: {order}"
        elif claim.hint == rank:
            continue
        else:
            said = order or "no bootstrap"
        named.append(f"pod {claim.pod} ({said}; came as node rank {claim.hint}, now {rank})")
    if not named:
        return None
    shown = "; ".join(named[:MAX_LISTED_NODES])
    more = f"; ... ({len(named)} in all)" if len(named) > MAX_LISTED_NODES else ""
    return (
        f"round {number}: the root's plan {plan.mapping_digest[:SHOWN_DIGEST]} re-ranked "
        f"{len(named)} node(s) whose bootstrap decided otherwise: {shown}{more}"
    )


def await_plan(
    store: Store,
    keys: RunKeys,
    settings: ParallelSettings,
    number: int,
    check_stopped: Callable[[], None],
) -> RoundPlan:
    """The plan of round ``number``, once the root's host has published it."""
    key = keys.plan(number)
    if not poll_until(
        lambda: torchcompat.key_exists(store, key),
        settings.join_timeout,
        KEY_POLL,
        tick=lambda _elapsed: check_stopped(),
    ):
        raise RendezvousTimeoutError(
            f"the root's host did not publish the plan of round {number} within "
            f"{settings.join_timeout:g}s (root store {settings.root})"
        )
    return RoundPlan.decode(bytes(store.get(key)), f"the plan of round {number}")


def say_problems(plan: RoundPlan, number: int) -> None:
    """Every node, once it holds the round's plan: one warning line per report the root could
    not use as given (a malformed report, two nodes in one slot), each naming the member."""
    for problem in plan.problems:
        logger.warning("round %d: %s", number, problem)


def rank_in(plan: RoundPlan, member: int, number: int) -> int:
    """This member's node rank in ``plan`` (a plan without it is the root's error)."""
    try:
        return int(plan.node_rank[str(member)])
    except KeyError:
        raise RendezvousError(
            f"the root's plan of round {number} has no place for this node (member {member})"
        ) from None


def missing_nodes(store: Store, keys: RunKeys, nnodes: int, number: int) -> List[int]:
    return [
        rank for rank in range(nnodes) if not torchcompat.key_exists(store, keys.node(number, rank))
    ]


def clear_previous_workers(
    store: Store, keys: RunKeys, settings: ParallelSettings, number: int
) -> None:
    """The root's host deletes what the previous round's workers left; the others wait for it.

    All agents have joined this round, so every old worker is stopped: nobody reads or
    writes those keys any more, and the new workers must not see them (a gloo rank would
    read a dead peer's address).
    """
    ready = keys.ready(number)
    if not settings.hosts_root:
        if not poll_until(
            lambda: torchcompat.key_exists(store, ready), settings.join_timeout, KEY_POLL
        ):
            raise RendezvousTimeoutError(
                f"the root's host did not clear the root store {settings.root} for round "
                f"{number} within {settings.join_timeout:g}s"
            )
        return
    stale = [key for key in store.list_keys() if not key.startswith(f"{KEY_ROOT}/")]
    for key in stale:
        store.delete_key(key)
    logger.info("round %d: cleared %d key(s) left by the previous workers", number, len(stale))
    store.set(ready, "1")


def workers_store(
    store: Store,
    keys: RunKeys,
    settings: ParallelSettings,
    number: int,
    node_rank: int,
    own_address: str,
) -> Tuple[str, int]:
    """Where global rank 0 hosts this round's workers' store (torch without ``list_keys``).

    Without ``list_keys`` the root's host cannot find the keys the previous workers left in the
    root, and a restarted gloo rank would read a dead peer's address; torch before 2.6 also
    prefixes an agent-store client with its node's restart count, which differs between a
    node that failed and one pulled into the restart. So, as torch's own c10d backend does on
    those releases, global rank 0 hosts a fresh store each round on a free port of its host,
    which the agent of this round's node rank 0 picks and publishes in the root with the address
    it reaches the root from (``own_address``).
    """
    key = keys.worker_store(number)
    if node_rank == 0:
        port = free_port_near(own_address)
        store.set(key, f"{own_address} {port}")
        logger.info(
            "round %d: global rank 0 hosts the workers' store on %s:%d", number, own_address, port
        )
        return own_address, port
    if not poll_until(lambda: torchcompat.key_exists(store, key), settings.join_timeout, KEY_POLL):
        raise RendezvousTimeoutError(
            f"node rank 0 did not name the workers' store of round {number} within "
            f"{settings.join_timeout:g}s (root store {settings.root})"
        )
    address, published_port = bytes(store.get(key)).decode().rsplit(" ", 1)
    return address, int(published_port)


def linger_for_departures(
    store: Store, keys: RunKeys, settings: ParallelSettings, number: int, one_dead: bool
) -> None:
    """Keep the root up until the agents of our last round signed off (``close_timeout``).

    They may still be in torch's exit barrier or about to sign off; closing under them would
    turn a clean finish into "lost the root store". Nodes that never joined are not awaited.
    """
    if settings.elastic and torchcompat.key_exists(store, keys.complete(number)):
        expected = len(round_positions(store, keys, settings, number))
    else:
        expected = min(joined_count(store, keys, number), settings.nnodes)
    if one_dead:
        expected -= 1  # a dead node signs off from nowhere (the verdict named it)

    def departed() -> int:
        return int(store.add(keys.departed, 0))

    signing_off = Backoff.exponential(0.01, 0.25)
    if not poll_until(lambda: departed() >= expected, settings.close_timeout, signing_off):
        logger.warning(
            "closing the root store %s although only %d of %d agents signed off",
            settings.root,
            departed(),
            expected,
        )


def format_ranks(ranks: Sequence[int]) -> str:
    """``[1, 4, 7]``, shortened to the first few for big jobs."""
    shown = ", ".join(str(rank) for rank in ranks[:MAX_LISTED_NODES])
    more = f", ... ({len(ranks)} in all)" if len(ranks) > MAX_LISTED_NODES else ""
    return f"[{shown}{more}]"
