"""The ``parallel`` rendezvous backend: one plan per round, static or elastic, optional proxy.

torch's dynamic backends (``c10d``, ``etcd``) give node ranks in arrival order, which throws away
the routing-affine order the bootstrap computed; torch's ``static`` backend keeps ``--node_rank``
but never notices when another node restarts its workers, so a one-node failure leaves the other
nodes hanging in collectives. ``parallel`` keeps both properties that matter:

* **Static membership, ranks from the root's plan.** The agent of pod index 0 hosts the root
  store (a stock torch ``TCPStore`` server on ``master_addr:master_port``, multi-tenant, no worker
  barrier), at an address that stays when other pods are replaced; every agent joins it with its
  node report (the bootstrap's ``npu_job_node.json``, else one made from ``--node_rank``). A
  round completes when ``--nnodes`` agents have joined; the root's host plans it once over their
  reports (:func:`~npu_job.bootstrap.nodereport.plan_round`, the bootstrap's own planner) and
  every agent takes its node rank from that plan. Pods that agree with their bootstraps get the
  bootstraps' ranks; a pod whose bootstrap decided otherwise is re-ranked, and the root says so.
  On timeout the error names the node ranks that never came. Elastic (``--nnodes=MIN:MAX``):
  the root's host closes each round as torch's c10d would, and later agents join the next one
  (:mod:`.rounds`).
* **Group restarts like ``c10d``.** A node that restarts its workers joins the next round; the other
  agents see it in :meth:`num_nodes_waiting` and restart theirs (that does not use up their
  ``--max_restarts``, as in torch). Before the workers of a new round start, the root's host
  deletes the keys the previous workers left in the root store, so no worker reads a dead
  peer's address.
* **Pod restarts.** A replacement agent (fresh process) joins the first round that is not
  complete, so the running agents restart around it, with ranks planned over the new set of
  nodes; one that reaches the previous run's root while it lingers with the run closed waits for
  the new root instead of failing again.
* **Tiering** (``--enable_tiered_parallel_tcpstore=true``): each agent runs a
  :class:`~npu_job.launcher.proxy.storeproxy.StoreProxy` on ``127.0.0.1:<free port>`` and hands
  it to its workers as ``MASTER_ADDR``/``MASTER_PORT``, so the root sees a few connections per
  node instead of one per worker. Without tiering the workers connect to the root, as under
  torchrun.

* **Faults** (:mod:`.watch`): agents talk to the root through a deadline-bound client
  (:mod:`.rootclient`), heartbeat to it, and stop on one verdict that names the node at fault;
  a joining node checks the root's identity first; a dead proxy is restarted on its port.

Agents' own keys live under ``npu_run/<run_id>/`` (per round, like torch's
``torch.rendezvous.<run_id>.<round>`` prefix); everything else in the root belongs to workers.
Store failures surface as torch ``RendezvousError`` subclasses whose message names the store
address; ``npu-run`` turns them into one ``LaunchError`` line.

This module is the handler that ties the parts together, in the order a round runs; each part
is a module of its own:

* :mod:`.config`: the settings (checked once) and the run's keys in the root;
* :mod:`.rootstore`: hosting the root (bind, listen fd, identity), and finding and verifying it;
* :mod:`.rounds`: join, await, plan, clear the previous workers' keys, the workers' store;
* :mod:`.faults`: the watch, the verdict, the proxy and its restart, signals (a
  :class:`~.faults.NodeFaults` the handler owns and hands the root connection to).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from typing import Any, Callable, List, Optional, Set, Tuple

from npu_job.bootstrap.nodereport import NodeReport, RoundPlan, decode_report, encode_report
from torch.distributed import PrefixStore, Store, TCPStore
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)

from npu_job.errors import InputError
from npu_job.polling import Backoff, poll

from .. import torchcompat
from ..roundtable import follow_plan
from ..torchcompat import StoreError
from . import rootstore, rounds, verdict
from .config import (
    NODE_ORDER_OPTION,
    NODE_REPORT_OPTION,
    POD_INDEX_OPTION,
    PROBE_OPTION,
    TIERED_OPTION,
    ParallelSettings,
    RunKeys,
    settings_from_params,
)
from .faults import (
    NodeFaults,
    NodeStoreProxy,
    ProxyFactory,
    forget_verdicts,
    last_verdict,
    start_store_proxy,
)
from .rootclient import RootClient
from .verdict import FailureReport, Verdict
from .watch import JobStopped  # noqa: F401  (npu-run and the tests import it from here)

# what npu-run, torch's entry point and the tests use of the backend, wherever it lives
__all__ = [
    "BACKEND",
    "NODE_ORDER_OPTION",
    "NODE_REPORT_OPTION",
    "POD_INDEX_OPTION",
    "PROBE_OPTION",
    "TIERED_OPTION",
    "ParallelRendezvousHandler",
    "ParallelSettings",
    "close_all",
    "create_handler",
    "forget_verdicts",
    "last_verdict",
    "register",
    "settings_from_params",
    "start_store_proxy",
    "stop_all_for_signal",
]

logger = logging.getLogger(__name__)

BACKEND = "parallel"


def node_report(settings: ParallelSettings) -> Tuple[bytes, str]:
    """The report this node joins with, and the pod name it gives (empty: none): the settings'
    (npu-run reads the bootstrap's file), else an unknown one at its ``--node_rank``."""
    if not settings.report:
        return encode_report(NodeReport(pod_index=settings.node_rank)), ""
    try:
        return settings.report, decode_report(settings.report, "this node's report").pod_name
    except InputError:  # the root names it when it plans; this node joins all the same
        return settings.report, ""


class ParallelRendezvousHandler(RendezvousHandler):
    """The ``parallel`` rendezvous over a root ``TCPStore`` hosted by pod index 0's agent."""

    def __init__(self, settings: ParallelSettings, proxy_factory: ProxyFactory = start_store_proxy):
        self._settings = settings
        self._keys = RunKeys(settings.run_id)
        self._faults = NodeFaults(settings, self._keys, proxy_factory)
        self._store: Optional[RootClient] = None
        self._server: Optional[TCPStore] = None  # the root's host: the root store itself
        self._rounds_done = 0
        self._next_watch = 0.0
        self._round_entered: Optional[int] = None  # the last round this node entered
        self._checked: Set[int] = set()  # the root's host: members whose claims it looked at
        self._lost_seen = 0  # elastic: the members gone, as the last round saw them
        self._report, self._pod_name = node_report(settings)

    # -- RendezvousHandler -------------------------------------------------------------------

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        # True: workers' env:// opens a TCPStore *client* to MASTER_ADDR:MASTER_PORT (the root or
        # this node's proxy). Without list_keys, global rank 0 hosts each round's workers' store
        # itself, as torch's c10d backend does (see _workers_store). torch < 2.4 does not ask: it
        # answers False for every backend but "static", which is what that mode needs.
        return torchcompat.HAS_LIST_KEYS

    @property
    def settings(self) -> ParallelSettings:
        return self._settings

    @property
    def proxy(self) -> Optional[NodeStoreProxy]:
        """This node's store proxy (tiered mode, after the first round), else None."""
        return self._faults.proxy

    @property
    def verdict(self) -> Optional[Verdict]:
        """The verdict this handler reached, if any."""
        return self._faults.verdict

    def next_rendezvous(self) -> Any:
        """Join the next round; ``RendezvousInfo`` (or torch < 2.4's tuple, see torchcompat)."""
        settings = self._settings
        faults = self._faults
        number = self._rounds_done
        if number > 0 and not torchcompat.HAS_LIST_KEYS:
            faults.stop_proxy()  # its upstream, the last round's workers' store, is gone
        store = (
            self._connect_to_open_run()
            if number == 0 and not settings.hosts_root
            else self._connect()
        )
        with faults.root_errors(f"joining round {number}"):
            self._raise_if_closed(store)
            if number == 0:
                if faults.member < 0:
                    faults.member = int(store.add(self._keys.members, 1))
                number = rounds.first_open_round(store, self._keys, settings.node_rank)
                faults.start_watch(store)
                if number > 0 and settings.elastic:  # a fresh agent at a running elastic job
                    number = rounds.next_round_with_room(
                        store, self._keys, settings, number - 1, self._while_waiting(store)
                    )
            number = self._enter(store, number)
            if settings.hosts_root:
                plan = rounds.plan_at_root(store, self._keys, settings, number, self._checked)
                self._checked.update(int(member) for member in plan.order)
            else:
                plan = rounds.await_plan(
                    store, self._keys, settings, number, check_stopped=faults.raise_if_stopped
                )
            rounds.say_problems(plan, number)
            if settings.probe is not None:  # npu-run --probe: the workers follow its decision
                from ..probe import launch as probe_launch

                # the root's host judges this round's members during the probe too, so that a
                # node dying in it is named within the liveness window, not at the budget
                self._adopt(plan, rounds.rank_in(plan, faults.member, number))
                plan = probe_launch.follow(
                    store,
                    settings.probe,
                    prefix=self._keys.probe(number),
                    plan=plan,
                    member=faults.member,
                    root=(settings.master_addr, settings.master_port),
                    number=number,
                    check_stopped=faults.raise_if_stopped,
                )
            node_rank = rounds.rank_in(plan, faults.member, number)
            nnodes = len(plan.node_rank)  # --nnodes, or this round's count when elastic
            self._adopt(plan, node_rank)
            logger.info(
                "round %d plan %s: node rank %d of %d",
                number,
                plan.mapping_digest,
                node_rank,
                nnodes,
            )
            follow_plan(os.environ, "parallel", number, plan, node_rank)
            if torchcompat.HAS_LIST_KEYS:
                if number > 0:
                    rounds.clear_previous_workers(store, self._keys, settings, number)
                workers_store = (settings.master_addr, settings.master_port)
            else:
                workers_store = rounds.workers_store(
                    store,
                    self._keys,
                    settings,
                    number,
                    node_rank,
                    store.local_address or settings.master_addr,
                )
            if settings.elastic:
                self._lost_seen = int(store.add(self._keys.lost, 0))
        address, port = faults.workers_store_address(workers_store)
        self._rounds_done = number + 1
        logger.info(
            "round %d complete: node rank %d of %d; workers use the store at %s:%d%s",
            number,
            node_rank,
            nnodes,
            address,
            port,
            " (this node's proxy)" if settings.tiered else "",
        )
        return torchcompat.rendezvous_result(
            PrefixStore(self._keys.agent_prefix(number), store),
            node_rank,
            nnodes,
            address,
            port,
        )

    def _enter(self, store: RootClient, number: int) -> int:
        """Join round ``number`` and wait until it is complete; the round this node is in.

        Static: one agent too many stops the job (two pods of one index). Elastic: an agent the
        round closed without moves on to the next round (:func:`.rounds.next_round_with_room`).
        """
        settings, faults = self._settings, self._faults
        while True:
            self._round_entered = number
            position = rounds.join(
                store, self._keys, settings, number, faults.member, self._report, self._claim()
            )
            if not position and not settings.elastic:
                faults.stop_job(
                    verdict.round_full(
                        faults.node_rank, faults.me, number, settings.run_id, settings.nnodes
                    )
                )
            if position:
                last_call = None
                if settings.elastic and settings.hosts_root:
                    last_call = rounds.LastCall(store, self._keys, settings, number, position)
                rounds.await_round(
                    store,
                    self._keys,
                    settings,
                    number,
                    check_closed=lambda: self._raise_if_closed(store),
                    check_stopped=faults.raise_if_stopped,
                    last_call=last_call,
                )
                if position in rounds.round_positions(store, self._keys, settings, number):
                    faults.joined_round = number
                    return number
            number = rounds.next_round_with_room(
                store, self._keys, settings, number, self._while_waiting(store)
            )

    def _while_waiting(self, store: RootClient) -> Callable[[], None]:
        """What a waiting agent checks between polls: the job stopped, or the run closed."""

        def check() -> None:
            self._faults.raise_if_stopped()
            self._raise_if_closed(store)

        return check

    @property
    def node_rank(self) -> int:
        """This node's rank in the last round's plan (before the first: its ``--node_rank``)."""
        return self._faults.node_rank

    @property
    def member(self) -> int:
        """This agent's member number in the run (-1 before it first joined)."""
        return self._faults.member

    def _claim(self) -> rounds.Claim:
        settings = self._settings
        pod = self._pod_name or self._faults.me.pod
        return rounds.Claim(settings.node_rank, settings.node_order, pod)

    def _adopt(self, plan: RoundPlan, node_rank: int) -> None:
        """Take this round's ranks: this node's, and every member's for the watch's lines; the
        root's host watches the heartbeats of exactly this round's members."""
        faults = self._faults
        faults.node_rank = node_rank
        watch = faults.watch
        if watch is None:
            return
        ranks = {int(member): rank for member, rank in plan.node_rank.items()}
        watch.set_ranks(ranks)
        if self._settings.hosts_root:  # every member's counter exists now
            watch.judge([member for member in ranks if member != faults.member])

    def is_closed(self) -> bool:
        if self._store is None:
            return False
        with self._faults.root_errors("reading the closed flag"):
            return torchcompat.key_exists(self._store, self._keys.closed)

    def set_closed(self) -> None:
        store = self._connect()
        with self._faults.root_errors("closing the rendezvous"):
            store.set(self._keys.closed, str(self.node_rank))
            # SET has no reply: a round trip on the same connection makes sure the root has
            # applied it before we return (another agent may look at once).
            store.get(self._keys.closed)

    def num_nodes_waiting(self) -> int:
        """Nodes already in the next round (they restarted their workers); throttled.

        torch's agent asks this every ``--monitor_interval`` while its workers are healthy: this
        is where an agent learns that the job ended elsewhere (:class:`~.watch.JobStopped`).
        """
        self._faults.raise_if_stopped()
        if self._store is None or time.monotonic() < self._next_watch:
            return 0
        self._next_watch = time.monotonic() + self._settings.watch_interval
        joined = self._keys.joined(self._rounds_done)
        with self._faults.root_errors("watching for restarting nodes"):
            if self._settings.elastic and self._members_lost():
                return 1  # not waiting, but the round must be made again without them
            if not torchcompat.key_exists(self._store, joined):
                return 0
            return rounds.joined_count(self._store, self._keys, self._rounds_done)

    def _members_lost(self) -> bool:
        """Elastic: did the root's host let a silent member go since this node's last round?"""
        assert self._store is not None
        return int(self._store.add(self._keys.lost, 0)) > self._lost_seen

    def get_run_id(self) -> str:
        return self._settings.run_id

    # -- what npu-run's agent tells the faults side ----------------------------------------------

    def report_outcome(self, outcome: str) -> None:
        """npu-run's agent: "running" when its run starts, "succeeded" when its workers did."""
        self._faults.outcome = outcome

    def settle_failure(self, report: FailureReport) -> Optional[Verdict]:
        """This node's workers failed for good: see :meth:`.faults.NodeFaults.settle_failure`."""
        return self._faults.settle_failure(self._store, report)

    def stop_for_signal(self, signal_name: str) -> None:
        """The agent got a signal: tell the other nodes why this one stops, then close.

        The root's host keeps the root up for the others to read it and sign off
        (``close_timeout``).
        """
        self._faults.tell_signal(self._store, signal_name, self._round_entered)
        self.close()

    def shutdown(self) -> bool:
        """Close the rendezvous and sign off; the root's host keeps the root up for the others.

        torch calls this at the end of every run except one ended by a signal; torch 2.4–2.6
        call it on a signal too (from the agent's shutdown): that is said as the signal it is.
        """
        leaving = sys.exc_info()[1]
        if isinstance(leaving, SignalException):
            self.stop_for_signal(leaving.sigval.name)
            return True
        faults = self._faults
        watch = faults.watch
        if watch is not None:
            faults.announce_leaving(watch, self._store)
            watch.stop()
            if watch.verdict is not None and watch.verdict.kind == verdict.ROOT_LOST:
                faults.root_lost = True
        if self._store is None or faults.root_lost:
            self.close()
            return not faults.root_lost
        try:
            store = self._store
            store.set(self._keys.closed, str(self.node_rank))
            faults.sign_off(store, self._round_entered)
            return True
        except StoreError as error:
            logger.warning(
                "could not sign off at the root store %s: %s", self._settings.root, error
            )
            return False
        finally:
            self.close()

    # -- resources ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the watch and the proxy, and drop the root store connection (and server)."""
        self._faults.stop()
        store, self._store = self._store, None
        if store is not None:
            store.close()
        self._server = None
        _OPEN_HANDLERS.discard(self)

    # -- the root store ----------------------------------------------------------------------

    def _connect(self) -> RootClient:
        if self._store is not None:
            return self._store
        settings = self._settings
        faults = self._faults
        if settings.hosts_root:
            self._server = rootstore.host_root(settings)
            client = rootstore.open_client(settings)
            root_who = rootstore.this_node(
                None
                if os.environ.get("MA_CURRENT_HOST_IP")
                else rootstore.own_address(settings.master_addr)
            )
            faults.root_who = root_who
            with faults.root_errors("saying which root it is"):
                # the host's member number first: the others join only once the identity is there
                faults.member = faults.root_member = int(client.add(self._keys.members, 1))
                identity = rootstore.root_identity(root_who, faults.member)
                client.set(self._keys.root_identity, identity)
            client.expect_identity(self._keys.root_identity, identity)
        else:
            rootstore.await_root_listening(settings)
            client = rootstore.open_client(settings)
            faults.root_who, faults.root_member = rootstore.verify_root(
                settings, client, self._keys.root_identity
            )
        self._store = client
        return client

    def _connect_to_open_run(self) -> RootClient:
        """Connect for a fresh agent; if the root belongs to a finished run, wait for a new root.

        When pods restart, a replacement agent can reach the previous root host's agent while it
        still lingers with its run closed. That root is not this run's: drop it and wait (up to
        ``join_timeout``) for pod index 0's new one instead of failing the pod again.
        """
        settings = self._settings
        announced: List[bool] = []

        def open_run() -> Optional[RootClient]:
            store = self._connect()
            try:
                closed = torchcompat.key_exists(store, self._keys.closed)
            except StoreError:
                closed = True  # that root went away while we connected: also not ours
            if not closed:
                return store
            self._store = None
            store.close()
            if not announced:
                logger.info(
                    "the root store %s belongs to a finished run; waiting for pod index 0 to "
                    "start a new one",
                    settings.root,
                )
                announced.append(True)
            return None

        store = poll(open_run, settings.join_timeout, Backoff.fixed(0.5))
        if store is None:
            raise RendezvousClosedError(
                f"node rank {settings.node_rank}: the root store {settings.root} only served a "
                f"finished run for {settings.join_timeout:g}s"
            )
        return store

    def _raise_if_closed(self, store: Store) -> None:
        faults = self._faults
        faults.raise_if_stopped()
        if torchcompat.key_exists(store, self._keys.closed):
            if faults.watch is not None and faults.watch.read_verdict() is not None:
                faults.raise_if_stopped()  # the cause, rather than "closed"
            closer = store.get(self._keys.closed).decode(errors="replace")
            raise RendezvousClosedError(
                f"the rendezvous {self._settings.run_id!r} was closed by node rank {closer} "
                "(it finished or gave up); not starting new workers"
            )


# Handlers this process created and not yet closed. torch skips ``shutdown()`` when the agent
# dies of a signal (to keep elastic rendezvous open), so the launcher closes them by this list.
_OPEN_HANDLERS: weakref.WeakSet[ParallelRendezvousHandler] = weakref.WeakSet()


def create_handler(params: RendezvousParameters) -> ParallelRendezvousHandler:
    """The factory torch's rendezvous registry calls for ``--rdzv_backend=parallel``."""
    handler = ParallelRendezvousHandler(settings_from_params(params))
    _OPEN_HANDLERS.add(handler)
    return handler


def stop_all_for_signal(signal_name: str) -> None:
    """Tell the other nodes this one stops on a signal, then close (see ``stop_for_signal``)."""
    for handler in list(_OPEN_HANDLERS):
        handler.stop_for_signal(signal_name)


def close_all() -> None:
    """Stop every proxy and root store this process still holds (signal and error paths)."""
    for handler in list(_OPEN_HANDLERS):
        handler.close()


def register() -> None:
    """Register ``parallel`` with torch elastic (idempotent).

    The factory is the entry point's (:mod:`.torchrun_plugin`), so registering again after torch
    loaded the entry point is a no-op rather than a clash of two factories.
    """
    from .torchrun_plugin import create_handler as entry_point_factory

    try:
        rendezvous_handler_registry.register(BACKEND, entry_point_factory)
    except ValueError:  # another factory holds the name: an older npu-job's entry point
        logger.debug("the %r rendezvous backend was already registered", BACKEND)
