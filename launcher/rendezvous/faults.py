"""The faults side of the ``parallel`` rendezvous: the watch, the verdict, the proxy, signals.

An agent heartbeats to the root and stops on one verdict that names the node at fault
(:mod:`.watch` runs the thread, :mod:`.verdict` says what the verdicts are). Here is what the
handler does with them:

* **The watch** starts on the first join (:meth:`NodeFaults.start_watch`); between its polls
  an agent thread unwinds through :class:`~.watch.JobStopped` once a verdict exists
  (:meth:`NodeFaults.raise_if_stopped`), and :class:`RootErrors` turns a lost root into the
  one verdict every node reaches.
* **A failing node** reports its workers' failure and waits for the root's host to name the root
  cause (:meth:`NodeFaults.settle_failure`); an agent that leaves on an error of its own, or on a
  signal, tells the others why (:meth:`NodeFaults.announce_leaving`,
  :meth:`NodeFaults.tell_signal`) and signs off.
* **This node's store proxy** (tiered mode) is started for a round's workers and, when the watch
  finds it dead, restarted on its own port; a proxy that cannot come back is a verdict.

:class:`NodeFaults` is owned by :class:`~.handler.ParallelRendezvousHandler`, one per handler,
which hands it the root connection and the round a call needs; the handler's ``shutdown``,
``close``, ``settle_failure``, ``report_outcome`` and ``stop_for_signal`` call it. torch 2.4-2.6
call ``shutdown`` inside the agent's ``_stop_workers`` and, on a signal, its ``_shutdown``: the
error leaving is read from ``sys.exc_info()``, which a call one frame deeper sees the same.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from typing import Callable, List, NoReturn, Optional, Protocol, Tuple

from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
)

from npu_job.errors import LaunchError
from npu_job.polling import Backoff, poll

from .. import torchcompat
from ..torchcompat import StoreError
from . import liveness, rounds, verdict
from .config import ParallelSettings, RunKeys
from .rootclient import RootClient, RootError
from .rootstore import literal_ip, this_node
from .verdict import FailureReport, Verdict
from .watch import WATCH_THREAD, JobStopped, Watch

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
SETTLE_MARGIN = 5.0  # beyond the judge's own bound, before a failing node names itself
SETTLE_POLL = 0.25
SIGNAL_CALL_TIMEOUT = 2.0  # a signalled agent tells the others why, if the root answers quickly
PROXY_PROBE_TIMEOUT = 2.0


class NodeStoreProxy(Protocol):
    """What the handler needs of :class:`~npu_job.launcher.proxy.storeproxy.StoreProxy`."""

    def start(self) -> int: ...

    def stop(self) -> None: ...


ProxyFactory = Callable[
    ..., NodeStoreProxy
]  # (upstream host, upstream port, timeout, listen_port=0)


def start_store_proxy(
    upstream_host: str, upstream_port: int, timeout: float, listen_port: int = 0
) -> NodeStoreProxy:
    from ..proxy.storeproxy import StoreProxy  # the store engineer's module; imported when used

    return StoreProxy(
        upstream_host,
        upstream_port,
        listen_host=LOOPBACK,
        listen_port=listen_port,
        timeout=timeout,
        dialect=torchcompat.store_dialect(),
    )


def proxy_problem(proxy: NodeStoreProxy, port: int) -> Optional[str]:
    """Why this node's proxy no longer serves on ``port`` (its thread ended, or it refuses
    connections), or None while it does."""
    if not getattr(proxy, "alive", True):
        return "its thread ended"
    try:
        socket.create_connection((LOOPBACK, port), timeout=PROXY_PROBE_TIMEOUT).close()
    except OSError as error:
        return f"connecting to it failed: {error}"
    return None


# Verdicts this process's handlers reached since the launch began, oldest first (npu-run prints
# the first). A process may launch more than once (a library caller, the tests): each launch
# starts with none (forget_verdicts), so a second launch never reports the first one's cause.
_VERDICTS: List[Verdict] = []


def last_verdict() -> Optional[Verdict]:
    """The verdict this launch's rendezvous reached, if any (npu-run's last line)."""
    return _VERDICTS[0] if _VERDICTS else None


def forget_verdicts() -> None:
    """A new launch begins: the verdicts of earlier launches in this process are not its own."""
    del _VERDICTS[:]


class NodeFaults:
    """This node's faults side (see the module docstring), owned by the handler.

    It holds the watch, the verdict, what this node and the root's node are, how the agent says
    its run went, and this node's store proxy; the handler holds the root connection and the
    rounds, and hands in what a call needs of them (the root client, the round last entered).
    """

    def __init__(self, settings: ParallelSettings, keys: RunKeys, proxy_factory: ProxyFactory):
        self._settings = settings
        self._keys = keys
        self._proxy_factory = proxy_factory
        self.watch: Optional[Watch] = None  # from the first join
        self.root_who = verdict.UNKNOWN  # the node hosting the root (the handler learns it)
        self.me = verdict.UNKNOWN  # this node
        self.root_lost = False
        self.outcome: Optional[str] = None  # npu-run's agent says how its run went
        self.verdict: Optional[Verdict] = None  # the verdict this node reached
        self.joined_round: Optional[int] = None  # the last round this node joined (the handler's)
        self.member = -1  # this agent's member number in the run (the handler's, from its join)
        self.root_member = -1  # the root host's member number (from the root's identity)
        self.node_rank = settings.node_rank  # the hint until the first plan, then the plan's
        self._proxy_lock = threading.RLock()
        self.proxy: Optional[NodeStoreProxy] = None  # this node's store proxy (tiered mode)
        self._proxy_port = 0
        self._proxy_upstream: Optional[Tuple[str, int]] = None

    def stop(self) -> None:
        """Stop the watch (keeping what it found) and the proxy (the handler's close)."""
        watch = self.watch
        if watch is not None:
            watch.stop()
            self.note_verdict(watch.verdict)
        self.stop_proxy()

    # -- the watch and the verdict ----------------------------------------------------------

    def start_watch(self, store: RootClient) -> None:
        """Say who this node is, beat once, and start the watch thread (first join only)."""
        settings = self._settings
        if self.watch is not None:
            return
        self.me = this_node(store.local_address)
        store.set(self._keys.who(self.member), self.me.to_json())
        store.add(self._keys.alive(self.member), 1)
        self.watch = Watch(
            store,
            self._keys,
            self.member,
            settings.hosts_root,
            settings.liveness,
            self.root_who,
            self._check_proxy if settings.tiered else None,
            node_rank=self.node_rank,
            root_member=self.root_member,
            fewest_nodes=settings.fewest_nodes if settings.elastic else 0,
        )
        store.on_poll = self._stop_polling
        self.watch.start()

    def _stop_polling(self) -> None:
        """Between a wait's polls: unwind an agent thread whose job ended (not the watch's own)."""
        if threading.current_thread().name != WATCH_THREAD:
            self.raise_if_stopped()

    def raise_if_stopped(self) -> None:
        watch = self.watch
        if watch is not None and watch.verdict is not None:
            self.note_verdict(watch.verdict)
            watch.raise_if_stopped()

    def note_verdict(self, found: Optional[Verdict]) -> None:
        if found is not None and self.verdict is None:
            self.verdict = found
            _VERDICTS.append(found)

    def _publish_or_keep(self, found: Verdict) -> Verdict:
        watch = self.watch
        if watch is None:
            return found
        try:
            found = watch.publish(found)
        except StoreError as error:
            logger.warning("could not publish the verdict: %s", error)
            found = watch.conclude(found)
        self.note_verdict(found)
        return found

    def stop_job(self, found: Verdict) -> NoReturn:
        """This node cannot take part (it was refused before it joined): make ``found`` the job's
        verdict, unless one came first, and unwind this agent with it; the nodes waiting at the
        root stop at their next look instead of at their join timeout."""
        raise JobStopped(self._publish_or_keep(found))

    def root_errors(self, doing: str) -> RootErrors:
        return RootErrors(self, doing)

    def settle_failure(
        self, store: Optional[RootClient], report: FailureReport
    ) -> Optional[Verdict]:
        """This node's workers failed for good: report to the judge and learn the job's verdict.

        Returns the verdict when it names this node's failure (torch then prints its summary);
        raises :class:`~.watch.JobStopped` when another node caused the end. Without a watch
        (the rendezvous never completed) there is nothing to settle: None.
        """
        watch = self.watch
        if watch is None or store is None:
            return None
        found = watch.verdict
        try:
            if found is None:
                store.append(self._keys.failures, report.to_json() + "\n")
                store.add(self._keys.failures_count, 1)
                watch.wake()
                found = self._await_verdict(watch, report)
        except RootError as error:
            found = watch.conclude(
                verdict.root_lost(
                    self._settings.root, self.root_who, str(error), root_rank=watch.root_rank
                )
            )
        self.note_verdict(found)
        if found.member == self.member and found.kind == verdict.WORKERS_FAILED:
            return found
        raise JobStopped(found)

    def _await_verdict(self, watch: Watch, report: FailureReport) -> Verdict:
        """Wait for the root's host to name the cause; past every deadline it should meet, name
        ours."""
        keep_alive = self._settings.liveness
        wait = keep_alive.window + 2 * keep_alive.interval + SETTLE_MARGIN
        deadline = time.monotonic() + wait
        found = poll(watch.read_verdict, wait, Backoff.fixed(SETTLE_POLL))
        if found is not None:
            return found
        logger.warning(
            "the root's host named no cause within %.0fs; naming this node's failure",
            deadline - time.monotonic() + keep_alive.window,
        )
        return watch.publish(verdict.workers_failed(report, self.me))

    # -- leaving: an error, a signal, the sign-off ------------------------------------------

    def announce_leaving(self, watch: Watch, store: Optional[RootClient]) -> None:
        """Leaving with no verdict while this run had not succeeded (the agent failed, or its own
        rendezvous did): the others, maybe still training, learn why instead of waiting."""
        if self.outcome != "running" or watch.verdict is not None or store is None:
            return
        error = sys.exc_info()[1]  # torch calls shutdown() in a finally: the error leaving
        if isinstance(error, RendezvousError) and not isinstance(error, RendezvousTimeoutError):
            return  # a closed rendezvous, a lost root: every node sees it alike
        # a timeout is said once, by the first node that gives up: the nodes still waiting would
        # otherwise see the rendezvous closed before their own timeout, without the reason
        reason = f"{type(error).__name__}: {error}" if error is not None else "its agent stopped"
        try:
            self.note_verdict(
                watch.publish(verdict.left(self.node_rank, self.me, reason, member=self.member))
            )
        except StoreError as store_error:
            logger.debug("could not tell the others why this node leaves: %s", store_error)

    def tell_signal(
        self, store: Optional[RootClient], signal_name: str, round_entered: Optional[int]
    ) -> None:
        """The agent got a signal: tell the other nodes why this one stops, and sign off (the
        handler closes next).

        The root's host keeps the root up for the others to read it and sign off
        (``close_timeout``).
        """
        watch = self.watch
        if watch is not None and store is not None and not self.root_lost and watch.verdict is None:
            store.call_timeout = min(store.call_timeout, SIGNAL_CALL_TIMEOUT)
            try:
                watch.stop()
                self.note_verdict(
                    watch.publish(
                        verdict.signalled(self.node_rank, self.me, signal_name, member=self.member)
                    )
                )
                self.sign_off(store, round_entered)
            except StoreError as error:
                logger.warning("could not tell the other nodes about %s: %s", signal_name, error)

    def sign_off(self, store: RootClient, round_entered: Optional[int]) -> None:
        settings = self._settings
        # a node's last call is its count among the departed: the root's host closes the root
        # as soon as that count is full, and a call after it would find the root gone
        if not settings.hosts_root:
            store.add(self._keys.alive(self.member), liveness.DEPARTED)
        # the root's host awaits the nodes that joined; one refused before it joined (one too
        # many) is not among them, and counting it would close the root under the last of them
        if round_entered is not None and round_entered == self.joined_round:
            store.add(self._keys.departed, 1)
        if settings.hosts_root and round_entered is not None:
            found = self.verdict
            rounds.linger_for_departures(
                store,
                self._keys,
                settings,
                round_entered,
                one_dead=found is not None and found.kind == verdict.DEAD,
            )

    # -- this node's store proxy ------------------------------------------------------------

    def workers_store_address(self, workers_store: Tuple[str, int]) -> Tuple[str, int]:
        """Where this node's workers find their store: it, or this node's proxy to it.

        Where global rank 0 hosts the workers' store (see :func:`.rounds.workers_store`), its node's
        workers use it directly: rank 0 binds that port itself, and they are on its host.
        """
        settings = self._settings
        hosted_by_rank_0 = not torchcompat.HAS_LIST_KEYS
        if not settings.tiered or (hosted_by_rank_0 and self.node_rank == 0):
            return workers_store
        with self._proxy_lock:
            return self._node_proxy(workers_store)

    def _node_proxy(self, workers_store: Tuple[str, int]) -> Tuple[str, int]:
        settings = self._settings
        if self.proxy is not None:  # before new workers start: is the proxy still serving?
            problem = proxy_problem(self.proxy, self._proxy_port)
            lost = None if problem is None else self._restart_proxy(problem)
            if lost is not None:
                raise JobStopped(self._publish_or_keep(lost))
        if self.proxy is None:
            host, port = workers_store
            upstream = literal_ip(host, port)
            proxy = self._proxy_factory(upstream, port, settings.store_timeout)
            try:
                self._proxy_port = int(proxy.start())
            except Exception as error:
                raise LaunchError(
                    f"node rank {self.node_rank} cannot start its store proxy: {error}"
                ) from None
            self.proxy = proxy
            self._proxy_upstream = workers_store
            logger.debug(
                "store proxy for this node's workers on %s:%d -> %s:%d",
                LOOPBACK,
                self._proxy_port,
                upstream,
                port,
            )
        return LOOPBACK, self._proxy_port

    def _check_proxy(self) -> Optional[Verdict]:
        """The watch's look at this node's proxy: a dead one is restarted on its own port.

        Returns the verdict to publish when it cannot be brought back.
        """
        with self._proxy_lock:
            proxy = self.proxy
            if proxy is None:
                return None
            problem = proxy_problem(proxy, self._proxy_port)
            return None if problem is None else self._restart_proxy(problem)

    def _restart_proxy(self, problem: str) -> Optional[Verdict]:
        settings = self._settings
        address = f"{LOOPBACK}:{self._proxy_port}"
        logger.warning(
            "node rank %d: the store proxy %s died (%s); restarting it on the same port",
            self.node_rank,
            address,
            problem,
        )
        old, self.proxy = self.proxy, None
        if old is not None:
            try:
                old.stop()
            except Exception as error:  # it is dead already; its port is what matters
                logger.debug("stopping the dead proxy: %s", error)
        assert self._proxy_upstream is not None
        host, port = self._proxy_upstream
        try:
            proxy = self._proxy_factory(
                literal_ip(host, port), port, settings.store_timeout, listen_port=self._proxy_port
            )
            proxy.start()
        except Exception as error:
            return verdict.proxy_lost(
                self.node_rank, self.me, address, str(error), member=self.member
            )
        self.proxy = proxy
        logger.warning("node rank %d: restarted the store proxy on %s", self.node_rank, address)
        return None

    def stop_proxy(self) -> None:
        with self._proxy_lock:
            proxy, self.proxy = self.proxy, None
        if proxy is not None:
            try:
                proxy.stop()
            except Exception as error:  # closing must go on whatever the proxy says
                logger.warning("stopping the store proxy failed: %s", error)


class RootErrors:
    """Turn a store failure into a rendezvous error that names the root store address."""

    def __init__(self, faults: NodeFaults, doing: str) -> None:
        self._faults = faults
        self._doing = doing

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if error is not None and isinstance(error, StoreError):
            faults = self._faults
            faults.root_lost = True
            settings = faults._settings
            if isinstance(error, RootError) and faults.watch is not None:
                # every node then ends with the same line, whether the watch or this call saw it
                faults.note_verdict(
                    faults.watch.conclude(
                        verdict.root_lost(
                            settings.root,
                            faults.root_who,
                            str(error),
                            root_rank=faults.watch.root_rank,
                        )
                    )
                )
            raise RendezvousConnectionError(
                f"node rank {faults.node_rank} lost the root store {settings.root} "
                f"while {self._doing}: {error}"
            ) from None
        return False
