"""torch's ``c10d`` rendezvous with the routing-affine node ranks: a thin wrapper, c10d untouched.

torch's c10d backend ranks the nodes of a round by their sorted node descriptors (host name or
``--local_addr``, then pid) and ignores ``--node_rank``. :class:`RankedC10dHandler` wraps the
handler torch builds for ``npu-run --rdzv_backend=c10d``: after the wrapped ``next_rendezvous()``
returns (membership, round store, c10d's rank), every node publishes its node report under the
round's store prefix, waits for all ``world_size`` of them, runs the same pure
:func:`~npu_job.bootstrap.nodereport.plan_round` over them, proves through the store that every
node planned the same (one line and exit 8 otherwise), and hands torch's agent the planned rank.
No node is a root: the plan is a function of the reports alone.

Where the workers' store is, after re-ranking (torch's agent decides, the handler keeps it right):

* **torch before 2.4** (a ``(store, rank, world_size)`` tuple): the agent whose rank is 0 writes
  its own address (``--local_addr`` or its host name) and a free port as ``MASTER_ADDR``/``PORT``,
  and global rank 0 hosts the workers' store there. Both follow the planned rank, so nothing moves.
* **2.4**, and **2.5 and later with** ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: global rank 0
  hosts the store, and c10d's info would name c10d's rank 0; the planned rank 0 publishes its own
  address and a free port instead.
* **2.5 and later, agent store shared** (the default): c10d's rank 0 agent hosts the workers' store
  (``TORCHELASTIC_USE_AGENT_STORE=True``, workers are its clients) and ``bootstrap_store_info``
  names it; that node is where it is whatever rank it runs with, so the info is passed on as is.

A single-node round is passed through. Nodes whose reports tell them apart neither by node id nor
by pod index (no ``npu_job_node.json`` and the same ``--node_rank``) keep c10d's order among
themselves, and every node says so in one warning line: never a silent host-name order.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import time
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Sequence,
    Tuple,
)

from npu_job.bootstrap.nodereport import (
    UNKNOWN_POD_INDEX,
    RoundPlan,
    decode_report,
    member_name,
    plan_round,
)
from torch.distributed import Store
from torch.distributed.elastic.rendezvous import (
    RendezvousError,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousTimeoutError,
)

from npu_job.errors import InputError, LaunchError
from npu_job.polling import Backoff, Every, poll_until

from .. import torchcompat
from ..roundtable import follow_plan
from .config import NODE_REPORT_OPTION  # the node's report, as for the parallel backend
from .rootstore import PROGRESS_INTERVAL, free_port_near
from .rounds import format_ranks

logger = logging.getLogger(__name__)

BACKEND = "c10d"

DEFAULT_JOIN_TIMEOUT = 600.0  # seconds: torch's dynamic rendezvous's join_timeout
KEY_PREFIX = "npu_job/c10d"  # under the round's own prefix (torch.rendezvous.<run_id>.<round>)
KEY_POLL = Backoff.exponential(0.005, 0.25)  # a count the other agents raise: 5 ms up to 0.25 s


class PlanMismatchError(RendezvousError):
    """The nodes of a round planned different orders from the same reports."""


def member_key(c10d_rank: int, world_size: int) -> str:
    """The member key of c10d's rank in a round of ``world_size`` (zero-padded: sorts as ranks)."""
    return f"c10d-{c10d_rank:0{len(str(world_size - 1))}d}"


def c10d_ordered(reports: Mapping[str, bytes]) -> List[str]:
    """The members whose place c10d's order decides: those that share (pod index, node id) with
    another member, neither known (``plan_round`` then orders them by member key, c10d's rank).

    A report that does not decode counts as knowing nothing, as ``plan_round`` plans it.
    """
    seen: Dict[Tuple[int, str], List[str]] = {}
    for key in sorted(reports):
        try:
            report = decode_report(reports[key], member_name(key))
            identity = (report.pod_index, report.node_id)
        except InputError:
            identity = (UNKNOWN_POD_INDEX, "")
        if identity[1]:
            continue  # a node id orders it (two members with one id are plan_round's problem)
        seen.setdefault(identity, []).append(key)
    return sorted(key for keys in seen.values() if len(keys) > 1 for key in keys)


def plan_digest(plan: RoundPlan) -> str:
    """What the nodes compare: the sha256 of the whole encoded plan (members, ranks, problems)."""
    return hashlib.sha256(plan.encode()).hexdigest()


class RoundKeys:
    """The keys of one round's exchange, under the round store's prefix."""

    reports = f"{KEY_PREFIX}/reports"  # a count: reports published
    planned = f"{KEY_PREFIX}/planned"  # c10d rank 0 published its plan's digest
    checked = f"{KEY_PREFIX}/checked"  # a count: nodes that compared their plan with rank 0's
    mismatches = f"{KEY_PREFIX}/mismatches"  # a count: nodes whose plan differs from rank 0's
    digest = f"{KEY_PREFIX}/digest"  # c10d rank 0's plan digest
    workers_store = f"{KEY_PREFIX}/workers_store"  # "port host" of the planned rank 0

    @staticmethod
    def report(c10d_rank: int) -> str:
        return f"{KEY_PREFIX}/report/{c10d_rank}"

    @staticmethod
    def present(c10d_rank: int) -> str:
        return f"{KEY_PREFIX}/present/{c10d_rank}"


class RoundExchange:
    """One round's reports and plans, through the round's store (the edge of this module)."""

    def __init__(
        self, store: Store, c10d_rank: int, world_size: int, number: int, timeout: float
    ) -> None:
        self._store = store
        self._rank = c10d_rank
        self._world_size = world_size
        self._number = number
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout

    def reports(self, mine: bytes) -> Dict[str, bytes]:
        """Publish this node's report; every member's, once all ``world_size`` are there."""
        store, keys = self._store, RoundKeys
        store.set(keys.report(self._rank), mine)  # type: ignore[arg-type]  # bytes as they are
        store.add(keys.present(self._rank), 1)
        store.add(keys.reports, 1)
        self._await_count(keys.reports, self._world_size, "node reports", self._missing_reports)
        values = torchcompat.get_values(
            store, [keys.report(rank) for rank in range(self._world_size)]
        )
        return {member_key(rank, self._world_size): value for rank, value in enumerate(values)}

    def agree(self, digest: str) -> None:
        """Compare ``digest`` with c10d rank 0's on every node; :class:`PlanMismatchError` on every
        node when one of them differs."""
        store, keys = self._store, RoundKeys
        if self._rank == 0:
            store.set(keys.digest, digest)
            store.add(keys.planned, 1)
            theirs = digest
        else:
            self._await_count(keys.planned, 1, "c10d rank 0's plan", lambda: [0])
            theirs = store.get(keys.digest).decode("ascii", "replace")
        if theirs != digest:
            store.add(keys.mismatches, 1)
        store.add(keys.checked, 1)
        self._await_count(keys.checked, self._world_size, "plan checks", None)
        differing = int(store.add(keys.mismatches, 0))
        if differing:
            raise PlanMismatchError(
                f"c10d round {self._number}: {differing} of {self._world_size} node(s) planned "
                f"another node order than torch's c10d rank 0 from the same reports (this node: "
                f"plan {digest[:12]}, rank 0: {theirs[:12]}); every node must run the same npu-job"
            )

    def publish_workers_store(self, host: str) -> Tuple[str, int]:
        """The planned rank 0: where its global rank 0 will host the workers' store."""
        port = free_port_near(host)
        self._store.set(RoundKeys.workers_store, f"{port} {host}")
        return host, port

    def workers_store(self) -> Tuple[str, int]:
        """Where the planned rank 0 said (set before its plan check, so there now)."""
        port, host = self._store.get(RoundKeys.workers_store).decode().split(" ", 1)
        return host, int(port)

    def _await_count(
        self, key: str, target: int, what: str, missing: Optional[Callable[[], List[int]]]
    ) -> None:
        def count() -> int:
            return int(self._store.add(key, 0))

        started = time.monotonic()

        def progress(elapsed: float) -> None:
            logger.info(
                "c10d round %d: %s from %d of %d node(s) after %.0fs",
                self._number,
                what,
                count(),
                target,
                time.monotonic() - started,
            )

        left = max(0.0, self._deadline - time.monotonic())
        if poll_until(
            lambda: count() >= target, left, KEY_POLL, tick=Every(PROGRESS_INTERVAL, progress)
        ):
            return
        absent = f": missing torch's c10d ranks {format_ranks(missing())}" if missing else ""
        raise RendezvousTimeoutError(
            f"c10d round {self._number}: {what} from {count()} of {target} node(s) within "
            f"join_timeout ({self._timeout:g}s){absent}"
        )

    def _missing_reports(self) -> List[int]:
        return [
            rank
            for rank in range(self._world_size)
            if not int(self._store.add(RoundKeys.present(rank), 0))
        ]


SHARE_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # torch's own opt-out of the shared store


class RankedC10dHandler(RendezvousHandler):
    """torch's c10d handler, each round's rank replaced by the plan over the nodes' reports."""

    def __init__(self, inner: RendezvousHandler, params: RendezvousParameters) -> None:
        self._inner = inner
        report = params.get(NODE_REPORT_OPTION) or ""
        self._report = report.encode() if isinstance(report, str) else bytes(report)
        self._timeout = float(params.get_as_int("join_timeout", int(DEFAULT_JOIN_TIMEOUT)) or 0)
        self._local_addr: Optional[str] = getattr(params, "local_addr", None)
        self._rounds = 0
        self.last_plan: Optional[RoundPlan] = None

    # -- RendezvousHandler: what changes -------------------------------------------------------

    def next_rendezvous(self) -> Any:
        result = self._inner.next_rendezvous()
        store, c10d_rank, world_size, store_info = torchcompat.rendezvous_parts(result)
        self._rounds += 1
        if world_size <= 1:
            return result  # one node: no order to choose
        number = self._round_number()
        exchange = RoundExchange(store, c10d_rank, world_size, number, self._timeout)
        reports = exchange.reports(self._report)
        plan = plan_round(reports)
        exchange_digest = plan_digest(plan)
        rank = plan.node_rank[member_key(c10d_rank, world_size)]
        shares_store = bool(getattr(self._inner, "use_agent_store", False))
        if store_info is not None and not shares_store and rank == 0:
            # the address c10d gives this node (torch's _NodeDescGenerator); looked up only here,
            # as a slow resolver makes getfqdn cost seconds
            exchange.publish_workers_store(self._local_addr or socket.getfqdn())
        exchange.agree(exchange_digest)
        self._log(plan, reports, number, rank, c10d_rank, world_size)
        follow_plan(os.environ, "c10d", number, plan, rank)
        if store_info is not None and not shares_store:
            store_info = torchcompat.store_info(*exchange.workers_store())
        self.last_plan = plan
        return torchcompat.rendezvous_with_rank(store, rank, world_size, store_info)

    def _round_number(self) -> int:
        # c10d's own round number (its store prefix's); the calls of this agent where torch
        # keeps it elsewhere (the number is only logged: the store prefix separates the rounds)
        state = getattr(getattr(self._inner, "_state_holder", None), "state", None)
        number = getattr(state, "round", None)
        return number if isinstance(number, int) else self._rounds - 1

    @staticmethod
    def _log(
        plan: RoundPlan,
        reports: Mapping[str, bytes],
        number: int,
        rank: int,
        c10d_rank: int,
        world_size: int,
    ) -> None:
        for problem in plan.problems:
            logger.warning("c10d round %d: %s", number, problem)
        if str(plan.plan.status) != "success":
            logger.info(
                "c10d round %d: no routing-affine order, the nodes keep their pod index order: %s",
                number,
                "; ".join(plan.plan.reasons),
            )
        by_c10d = c10d_ordered(reports)
        if by_c10d:
            ranks = [int(key.split("-", 1)[1]) for key in by_c10d]
            logger.warning(
                "c10d round %d: %d of %d node(s) have no node report telling them apart (no "
                "npu_job_node.json from the bootstrap, and the same --node_rank): among themselves "
                "they keep torch's c10d order (host name, then pid), c10d ranks %s",
                number,
                len(ranks),
                world_size,
                format_ranks(ranks),
            )
        logger.info(
            "c10d round %d plan %s: node rank %d of %d (torch's c10d gave %d)",
            number,
            plan.mapping_digest,
            rank,
            world_size,
            c10d_rank,
        )

    # -- RendezvousHandler: torch's own ----------------------------------------------------------

    def get_backend(self) -> str:
        return self._inner.get_backend()

    @property
    def use_agent_store(self) -> bool:
        return bool(getattr(self._inner, "use_agent_store", False))

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def set_closed(self) -> None:
        self._inner.set_closed()

    def num_nodes_waiting(self) -> int:
        return self._inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self._inner.get_run_id()

    def shutdown(self) -> bool:
        return bool(self._inner.shutdown())

    def __getattr__(self, name: str) -> Any:
        # what torch's agent or tools ask a c10d handler beyond the interface (settings, ...)
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


class _RankingRegistry:
    """torch's rendezvous registry module as torch's launcher sees it, ``c10d`` handlers wrapped."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry

    def get_rendezvous_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        if params.backend == BACKEND and params.min_nodes < params.max_nodes:
            unshare_store_for_late_nodes(os.environ)
        handler = self._registry.get_rendezvous_handler(params)
        if params.backend == BACKEND:
            return RankedC10dHandler(handler, params)
        return handler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._registry, name)


def unshare_store_for_late_nodes(environ: MutableMapping[str, str]) -> None:
    """An elastic c10d job's workers get a store of their own each round (global rank 0 hosts it).

    torch's agent store, shared with the workers from 2.5, cannot take a node that joins a running
    job: the newcomer waits for ``MASTER_ADDR`` under its round's prefix, which c10d's rank 0
    publishes only in the first round its handler runs (stock torchrun 2.13, ``--nnodes=2:3``,
    a third node after the first round: ``DistStoreError: wait timeout``). A user's own
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` is left as it is.
    """
    if SHARE_STORE_OFF in environ:
        return
    environ[SHARE_STORE_OFF] = "1"
    logger.info(
        "c10d with --nnodes=MIN:MAX: the workers' store is not the agents' (%s=1), so that a "
        "node joining a running job gets in",
        SHARE_STORE_OFF,
    )


def _launcher_api() -> Any:
    from torch.distributed.launcher import api

    return api


def refusal() -> Optional[str]:
    """Why ``--rdzv_backend=c10d`` cannot be re-ranked on this torch (None: it can)."""
    api = _launcher_api()
    registry = getattr(api, "rdzv_registry", None)
    if registry is None or not callable(getattr(registry, "get_rendezvous_handler", None)):
        return (
            "--rdzv_backend=c10d: this torch's launcher (torch.distributed.launcher.api) does not "
            "build its rendezvous handler through rdzv_registry, so npu-run cannot give the nodes "
            "their planned ranks and they would run in torch's c10d order (host names); use "
            "--rdzv_backend=parallel"
        )
    return None


@contextlib.contextmanager
def ranked_c10d() -> Iterator[None]:
    """While it lasts, torch's launcher builds ``c10d`` handlers as :class:`RankedC10dHandler`;
    a :class:`LaunchError` (one line, exit 8) where this torch's launcher cannot be hooked."""
    why = refusal()
    if why is not None:
        raise LaunchError(why, tip="--rdzv_backend=parallel plans the ranks on every torch")
    api = _launcher_api()
    original = api.rdzv_registry
    api.rdzv_registry = _RankingRegistry(original)
    try:
        yield
    finally:
        api.rdzv_registry = original


def report_options(report: bytes) -> Dict[str, str]:
    """The rendezvous options that carry ``report`` (text: torch logs its rdzv_configs)."""
    return {NODE_REPORT_OPTION: report.decode("utf-8", "replace")}


__all__: Sequence[str] = (
    "RankedC10dHandler",
    "PlanMismatchError",
    "c10d_ordered",
    "member_key",
    "plan_digest",
    "ranked_c10d",
    "refusal",
    "report_options",
)
