"""One node's part of a probe round (the edge): start its probe processes, and agree on one
decision with every other node through the store.

Every node calls :func:`probe_round` once its rendezvous round is complete, before its workers
start. The first node to arrive writes the probe's start time (the one that counts 1 on the store's
counter, which every store has: npu-run's root client has no ``compare_set``),
and every node's deadline is that time plus the budget, so the probe ends within the budget of
the first node's start wherever a node comes late. Each node starts one probe process per device
(:mod:`.worker`) and waits for them within the deadline, killing any left at it. Node rank 0
then reads the samples, decides (:func:`.stats.decide`) and publishes the decision, or, when
the probe failed anywhere or ran out of time, publishes that it keeps the plan and why; every
other node waits for that one key and follows it, so every node starts its workers in the same
order. The probe's keys live under the round's prefix and are deleted by node rank 0 once every
node has read the decision: the workers' store holds nothing of the probe.

Wherever a node waits (for the first node's start, its probe processes, the samples, the
decision) it also asks ``check_stopped``, the agent's look at its watch: when the job has
stopped (a node died, and the root's host named it) that raises, this node's probe processes are
killed, and the agent goes on as on any verdict, at once rather than at the probe's budget.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import torchcompat
from . import stats, worker
from .worker import ProbeConfig, rings_key, samples_key

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 60.0
#: message sizes (bytes): accelerators, and the CPU's gloo (a few MiB take it seconds)
DEVICE_SIZES = (1 << 20, 16 << 20, 64 << 20)
CPU_SIZES = (64 << 10, 256 << 10, 1 << 20)
#: how much longer than the budget a node waits for node rank 0's decision before it keeps the
#: plan alone (node rank 0 publishes one at the deadline at the latest)
DECISION_GRACE = 10.0
#: how often a node looks whether the probe failed on another node (then it stops its own)
ELSEWHERE_INTERVAL = 0.25
ELSEWHERE = "the probe failed on node rank"
OUT_OF_TIME = "did not finish within its budget"


@dataclass(frozen=True)
class ProbeSettings:
    """What ``--probe`` and its options ask for."""

    budget: float = DEFAULT_BUDGET
    collective: str = "all_reduce"
    sizes: Tuple[int, ...] = ()  # () for the device's defaults
    iterations: int = 5
    warmup: int = 2
    inner: int = 2
    margin: float = stats.DEFAULT_MARGIN


@dataclass(frozen=True)
class NodeProbe:
    """This node in the probe: its rank in each order, and its devices."""

    node_ranks: Mapping[str, int]  # this node's node rank in each order (stats.ORDERS)
    nnodes: int
    nproc: int  # probe processes (devices) on this node
    backend: str
    devices: Sequence[str]  # one per local rank: "cpu", "cuda:<i>", "npu:<i>"
    store_host: str
    store_port: int
    prefix: str  # per rendezvous round, e.g. npu_run/<run>/probe/<round>


def _keys(prefix: str) -> Dict[str, str]:
    return {
        "arrived": f"{prefix}/arrived",
        "start": f"{prefix}/start",
        "failed": f"{prefix}/failed",
        "decision": f"{prefix}/decision",
        "read": f"{prefix}/read",
    }


def _never() -> None:
    """A ``check_stopped`` for a probe outside an agent: nothing ever stops it."""


def default_sizes(device: str) -> Tuple[int, ...]:
    return CPU_SIZES if device == "cpu" else DEVICE_SIZES


def probe_round(
    store: Any,
    node: NodeProbe,
    settings: ProbeSettings,
    *,
    predicted: Optional[float] = None,
    digests: Optional[Mapping[str, str]] = None,
    check_stopped: Callable[[], None] = _never,
) -> stats.Decision:
    """Run this node's part of the probe and return the decision every node follows; whatever
    ``check_stopped`` raises ends it (see module)."""
    keys = _keys(node.prefix)
    now = time.time()
    if int(store.add(keys["arrived"], 1)) == 1:
        store.set(keys["start"], repr(now))
        started = now
    else:
        started = _await_start(store, keys["start"], now + settings.budget, check_stopped)
    deadline = min(started, now) + settings.budget
    sizes = settings.sizes or default_sizes(node.devices[0] if node.devices else "cpu")
    processes = _start(node, replace(settings, sizes=sizes), deadline)

    def elsewhere() -> str:
        check_stopped()
        return _failed_elsewhere(store, node)

    problem = _wait(processes, deadline, elsewhere)
    # the deadline is the same on every node: only a failure of this node's own is news to them
    if problem and problem != OUT_OF_TIME and not problem.startswith(ELSEWHERE):
        store.set(f"{keys['failed']}/{node.node_ranks[stats.PLANNED]}", problem)
        store.add(keys["failed"], 1)
    if node.node_ranks[stats.PLANNED] == 0:
        decision = _decide(
            store, node, settings, deadline, problem, predicted, digests, check_stopped
        )
        store.set(keys["decision"], _encode(decision))
    else:
        decision = _await_decision(
            store, keys["decision"], deadline + DECISION_GRACE, predicted, check_stopped
        )
    if store.add(keys["read"], 1) == node.nnodes:
        _delete_probe_keys(store, node.prefix, node.nnodes)
    return decision


def _await_start(
    store: Any, key: str, until: float, check_stopped: Callable[[], None] = _never
) -> float:
    """The first node's start time, which it writes right after it counted itself."""
    while time.time() < until:
        check_stopped()
        if torchcompat.key_exists(store, key):
            return float(store.get(key).decode())
        time.sleep(0.01)
    return until  # a first node that never wrote it: this one's budget stands


def _start(node: NodeProbe, settings: ProbeSettings, deadline: float) -> List[subprocess.Popen]:
    processes = []
    for local in range(node.nproc):
        config = ProbeConfig(
            store_host=node.store_host,
            store_port=node.store_port,
            prefix=node.prefix,
            ranks={order: node.node_ranks[order] * node.nproc + local for order in stats.ORDERS},
            world_size=node.nnodes * node.nproc,
            backend=node.backend,
            device=node.devices[local] if local < len(node.devices) else "cpu",
            collective=settings.collective,
            sizes=tuple(settings.sizes),
            iterations=settings.iterations,
            warmup=settings.warmup,
            inner=settings.inner,
            deadline=deadline,
        )
        processes.append(worker.start(config))
    return processes


def _failed_elsewhere(store: Any, node: NodeProbe) -> str:
    """Why the probe failed on another node ("" while it did not), naming the node."""
    keys = _keys(node.prefix)
    if not int(store.add(keys["failed"], 0)):
        return ""
    for rank in range(node.nnodes):
        key = f"{keys['failed']}/{rank}"
        if rank != node.node_ranks[stats.PLANNED] and torchcompat.key_exists(store, key):
            return f"{ELSEWHERE} {rank}: {store.get(key).decode(errors='replace')}"
    return ""


def _wait(
    processes: Sequence[subprocess.Popen],
    deadline: float,
    elsewhere: Callable[[], str] = lambda: "",
) -> str:
    """ "" when every probe process ended well by the deadline, else why not. The first failure,
    here or on another node (``elsewhere``, looked at every :data:`ELSEWHERE_INTERVAL`), ends the
    others at once (the probe cannot finish without them), and the deadline ends every one
    left; so does whatever ``elsewhere`` raises, which goes on up."""
    problem = ""
    running = dict(enumerate(processes))
    next_look = time.time() + ELSEWHERE_INTERVAL
    try:
        while running and not problem:
            if time.time() >= next_look:
                problem = elsewhere()
                next_look = time.time() + ELSEWHERE_INTERVAL
                if problem:
                    break
            for local, process in list(running.items()):
                if process.poll() is None:
                    continue
                del running[local]
                if process.returncode != 0:
                    errors = process.stderr.read() if process.stderr else ""
                    last = errors.strip().splitlines()[-1:] or [f"exit code {process.returncode}"]
                    problem = f"the probe process of local rank {local} failed: {last[0]}"
                    break
            if running and not problem:
                if time.time() >= deadline:
                    problem = OUT_OF_TIME
                else:
                    time.sleep(0.05)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            if process.stderr:
                process.stderr.close()
    return problem


def _decide(
    store: Any,
    node: NodeProbe,
    settings: ProbeSettings,
    deadline: float,
    problem: str,
    predicted: Optional[float],
    digests: Optional[Mapping[str, str]],
    check_stopped: Callable[[], None] = _never,
) -> stats.Decision:
    """Node rank 0's decision: from the samples when every node's probe finished in time."""
    if problem:
        if problem != OUT_OF_TIME and not problem.startswith(
            ELSEWHERE
        ):  # every failure names its node
            problem = f"{ELSEWHERE} {node.node_ranks[stats.PLANNED]}: {problem}"
        return stats.failed(_failed_elsewhere(store, node) or problem, predicted=predicted)
    wanted = samples_key(node.prefix)
    while time.time() < deadline:
        check_stopped()
        elsewhere = _failed_elsewhere(store, node)
        if elsewhere:
            return stats.failed(elsewhere, predicted=predicted)
        if torchcompat.key_exists(store, wanted):
            samples = [tuple(sample) for sample in json.loads(store.get(wanted))]
            results = stats.size_results(samples, settings.collective, node.nnodes * node.nproc)
            return stats.decide(results, settings.margin, predicted=predicted, digests=digests)
        time.sleep(0.05)
    return stats.failed(OUT_OF_TIME, predicted=predicted)


def _await_decision(
    store: Any,
    key: str,
    until: float,
    predicted: Optional[float],
    check_stopped: Callable[[], None] = _never,
) -> stats.Decision:
    while time.time() < until:
        check_stopped()
        if torchcompat.key_exists(store, key):
            return _decode(store.get(key))
        time.sleep(0.05)
    return stats.failed("node rank 0 published no decision", predicted=predicted)


def _encode(decision: stats.Decision) -> str:
    return json.dumps(
        {
            "order": decision.order,
            "reason": decision.reason,
            "margin": decision.margin,
            "predicted": decision.predicted,
            "digests": dict(decision.digests),
            "results": [
                {"size": r.size, "seconds": dict(r.seconds), "busbw": dict(r.busbw)}
                for r in decision.results
            ],
        },
        sort_keys=True,
    )


def _decode(data: bytes) -> stats.Decision:
    value = json.loads(data)
    results = tuple(
        stats.SizeResult(item["size"], item["seconds"], item["busbw"]) for item in value["results"]
    )
    return stats.Decision(
        value["order"],
        value["reason"],
        results,
        value["margin"],
        value["predicted"],
        value["digests"],
    )


def _delete_probe_keys(store: Any, prefix: str, nnodes: int) -> None:
    """Every key of the probe: its own, and with ``list_keys`` (torch 2.10+) the process
    groups' under the prefix too; before that release those stay under the agents' prefix,
    where no worker looks."""
    keys = set(_keys(prefix).values()) | {samples_key(prefix), rings_key(prefix)}
    keys |= {f"{_keys(prefix)['failed']}/{rank}" for rank in range(nnodes)}
    if torchcompat.HAS_LIST_KEYS:  # the agents' RootClient has the method on every torch
        keys |= {key for key in store.list_keys() if key.startswith(f"{prefix}/")}
    for key in sorted(keys):
        store.delete_key(key)
