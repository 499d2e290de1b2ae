"""The rounds of the ``parallel`` rendezvous, as the root store's keys see them.

Membership is static: a round completes when all ``--nnodes`` node ranks have joined it
(:func:`join`, :func:`await_round`; on timeout the error names the node ranks that never came).
A node that restarts its workers joins the next round, and the other agents, seeing it waiting,
restart theirs. A freshly started agent (a replaced pod) joins the first round that is not yet
complete (:func:`first_open_round`). Every node of a job must follow the same node order
(:func:`other_node_order`; the handler refuses a node that follows another).

Before the workers of a new round start, their store must hold nothing of the previous workers'
(a gloo rank would read a dead peer's address): with ``list_keys`` node rank 0 deletes those keys
from the root (:func:`clear_previous_workers`); without it global rank 0 hosts a fresh workers'
store each round (:func:`workers_store`). At the end node rank 0 keeps the root up until the
other agents signed off (:func:`linger_for_departures`).

Each function takes the root store, the run's keys and settings: the handler
(:mod:`.handler`) holds them and calls these in order.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence, Tuple

from torch.distributed import Store
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError

from npu_job.polling import Backoff, Every, poll_until

from .. import torchcompat
from .config import KEY_ROOT, ParallelSettings, RunKeys
from .rootstore import PROGRESS_INTERVAL, free_port_near

logger = logging.getLogger(__name__)

MAX_LISTED_NODES = 16
KEY_POLL = Backoff.exponential(0.005, 0.25)  # a key another agent sets: from 5 ms up to 0.25 s


def first_open_round(store: Store, keys: RunKeys, node_rank: int) -> int:
    """The round a freshly started agent joins: 0, or the first one not yet complete.

    A node whose pod was replaced while the job runs comes back as a fresh agent; joining
    round 0 again would look like a duplicate node rank. It joins the next round instead,
    and the running agents see it waiting and restart their workers around it.
    """
    number = 0
    while torchcompat.key_exists(store, keys.complete(number)):
        number += 1
    if number > 0:
        logger.info("node rank %d rejoins a running job at round %d", node_rank, number)
    return number


def other_node_order(store: Store, keys: RunKeys, settings: ParallelSettings) -> Optional[str]:
    """The node order the nodes that joined before this one follow, when it is not this node's
    (None: the same one, or this node has no order to hold it to)."""
    mine = settings.node_order
    if not mine:
        return None
    # The first node to get here records its order; every other node (and every later round)
    # compares with it. ADD picks the first: COMPARE_SET would take one call, but torch 2.1
    # and 2.2 build its Python result without the GIL, which crashes a process whose other
    # threads run (this agent's proxy loop). GET waits the moment until the first has set it.
    if int(store.add(keys.node_order_claims, 1)) == 1:
        store.set(keys.node_order, mine)
        return None
    theirs = store.get(keys.node_order).decode("utf-8", "replace")
    return None if theirs == mine else theirs


def join(store: Store, keys: RunKeys, settings: ParallelSettings, number: int) -> bool:
    """Count this node into round ``number``; the last node to join marks the round complete.
    False: another node holds this node rank in the round already (this one is not counted)."""
    if store.add(keys.node(number, settings.node_rank), 1) > 1:
        return False
    if store.add(keys.joined(number), 1) == settings.nnodes:
        store.set(keys.complete(number), str(settings.node_rank))
    logger.info(
        "node rank %d joined round %d of %r; waiting for %d node(s) at the root store %s",
        settings.node_rank,
        number,
        settings.run_id,
        settings.nnodes,
        settings.root,
    )
    return True


def await_round(
    store: Store,
    keys: RunKeys,
    settings: ParallelSettings,
    number: int,
    check_closed: Callable[[], None],
    check_stopped: Callable[[], None],
) -> None:
    """Poll until the round's ``complete`` key exists; name the missing nodes on timeout.

    Between polls ``check_stopped`` (every time) and ``check_closed`` (every second) may raise:
    the job ended elsewhere, or the rendezvous was closed.
    """
    complete = keys.complete(number)

    def progress(elapsed: float) -> None:
        joined = int(store.add(keys.joined(number), 0))
        logger.info(
            "round %d: %d of %d nodes joined after %.0fs",
            number,
            joined,
            settings.nnodes,
            elapsed,
        )

    closed_check = Every(1.0, lambda _elapsed: check_closed(), always=check_stopped)
    progress_line = Every(PROGRESS_INTERVAL, progress)
    if not poll_until(
        lambda: torchcompat.key_exists(store, complete),
        settings.join_timeout,
        KEY_POLL,
        tick=lambda elapsed: (closed_check(elapsed), progress_line(elapsed)),
    ):
        missing = missing_nodes(store, keys, settings.nnodes, number)
        raise RendezvousTimeoutError(
            f"node rank {settings.node_rank} timed out after {settings.join_timeout:g}s in "
            f"round {number} at the root store {settings.root}: missing node ranks "
            f"{format_ranks(missing)} of --nnodes={settings.nnodes}"
        )


def missing_nodes(store: Store, keys: RunKeys, nnodes: int, number: int) -> List[int]:
    return [
        rank for rank in range(nnodes) if not torchcompat.key_exists(store, keys.node(number, rank))
    ]


def clear_previous_workers(
    store: Store, keys: RunKeys, settings: ParallelSettings, number: int
) -> None:
    """Node rank 0 deletes what the previous round's workers left; the others wait for it.

    All agents have joined this round, so every old worker is stopped: nobody reads or
    writes those keys any more, and the new workers must not see them (a gloo rank would
    read a dead peer's address).
    """
    ready = keys.ready(number)
    if settings.node_rank != 0:
        if not poll_until(
            lambda: torchcompat.key_exists(store, ready), settings.join_timeout, KEY_POLL
        ):
            raise RendezvousTimeoutError(
                f"node rank 0 did not clear the root store {settings.root} for round "
                f"{number} within {settings.join_timeout:g}s"
            )
        return
    stale = [key for key in store.list_keys() if not key.startswith(f"{KEY_ROOT}/")]
    for key in stale:
        store.delete_key(key)
    logger.info("round %d: cleared %d key(s) left by the previous workers", number, len(stale))
    store.set(ready, "1")


def workers_store(
    store: Store, keys: RunKeys, settings: ParallelSettings, number: int
) -> Tuple[str, int]:
    """Where global rank 0 hosts this round's workers' store (torch without ``list_keys``).

    Without ``list_keys`` node rank 0 cannot find the keys the previous workers left in the
    root, and a restarted gloo rank would read a dead peer's address; torch before 2.6 also
    prefixes an agent-store client with its node's restart count, which differs between a
    node that failed and one pulled into the restart. So, as torch's own c10d backend does on
    those releases, global rank 0 hosts a fresh store each round on a free port of node rank
    0's host, which node rank 0's agent picks and publishes in the root.
    """
    key = keys.worker_store(number)
    if settings.node_rank == 0:
        port = free_port_near(settings.master_addr)
        store.set(key, str(port))
        logger.info(
            "round %d: global rank 0 hosts the workers' store on %s:%d",
            number,
            settings.master_addr,
            port,
        )
        return settings.master_addr, port
    if not poll_until(lambda: torchcompat.key_exists(store, key), settings.join_timeout, KEY_POLL):
        raise RendezvousTimeoutError(
            f"node rank 0 did not name the workers' store of round {number} within "
            f"{settings.join_timeout:g}s (root store {settings.root})"
        )
    return settings.master_addr, int(store.get(key))


def linger_for_departures(
    store: Store, keys: RunKeys, settings: ParallelSettings, number: int, one_dead: bool
) -> None:
    """Keep the root up until the agents of our last round signed off (``close_timeout``).

    They may still be in torch's exit barrier or about to sign off; closing under them would
    turn a clean finish into "lost the root store". Nodes that never joined are not awaited.
    """
    expected = int(store.add(keys.joined(number), 0))
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
