"""The probe in a rendezvous round (the edge): what ``npu-run --probe`` hands the ``parallel``
backend, and the one call its handler makes once a round's plan is known.

npu-run resolves ``--probe[=SECONDS]`` into a :class:`ProbeRequest` (the budget and margin, this
node's probe processes, their backend and devices, where ``probe.json`` goes) and passes it as
text in the backend's options (``rendezvous.config.PROBE_OPTION``). Once the root's plan of a
round is known, every agent calls :func:`follow`: it runs :func:`.session.probe_round` with this
node's rank in the plan's order and in the scheduler's (the members by position, i.e. by pod
index) and the root's predicted busbw ratio of the two (:attr:`RoundPlan.predicted`), writes
``probe.json`` beside the bootstrap's ``route_plan.json``, logs the verdict line every node logs
alike, and returns the plan the workers start in: the root's, or, where node
rank 0 decided for the scheduler's order, that order as a plan of its own (its ranks, its
mapping digest), so the workers' ranks and whatever follows node rank 0 (the workers' store on
torch without ``list_keys``) follow it on every node.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Tuple

from npu_job.bootstrap.nodereport import RoundPlan

from npu_job.fileio import write_atomic

from . import stats
from .session import NodeProbe, ProbeSettings, probe_round

log = logging.getLogger(__name__)

PROBE_FILE = "probe.json"


@dataclass(frozen=True)
class ProbeRequest:
    """``--probe`` as the backend takes it."""

    settings: ProbeSettings
    nproc: int
    backend: str  # gloo, nccl or hccl
    devices: Tuple[str, ...]  # one per local rank
    output_dir: str  # where probe.json goes: route_plan.json's directory

    def to_text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> ProbeRequest:
        """The request :meth:`to_text` wrote; ValueError naming the field otherwise."""
        try:
            data = json.loads(text)
            fields = dict(data["settings"])
            fields["sizes"] = tuple(int(size) for size in fields.get("sizes", ()))
            settings = ProbeSettings(**fields)
            request = cls(
                settings,
                int(data["nproc"]),
                str(data["backend"]),
                tuple(str(device) for device in data["devices"]),
                str(data["output_dir"]),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"expected the probe's settings as npu-run writes them ({error})"
            ) from None
        if not settings.budget > 0:
            raise ValueError(
                f"budget: expected a positive number of seconds, got {settings.budget}"
            )
        if not -1 < settings.margin < 1:
            raise ValueError(f"margin: expected a fraction within (-1, 1), got {settings.margin}")
        return request


def follow(
    store: Any,
    request: ProbeRequest,
    *,
    prefix: str,
    plan: RoundPlan,
    member: int,
    root: Tuple[str, int],
    number: int,
    check_stopped: Callable[[], None],
) -> RoundPlan:
    """Probe this round with every other node; the plan the workers start in (see module).
    ``check_stopped`` is the agent's look at its watch: a verdict ends the probe at once."""
    scheduler = plan.in_position_order()
    key = str(member)
    node = NodeProbe(
        node_ranks={
            stats.PLANNED: int(plan.node_rank[key]),
            stats.SCHEDULER: int(scheduler.node_rank[key]),
        },
        nnodes=len(plan.members),
        nproc=request.nproc,
        backend=request.backend,
        devices=request.devices,
        store_host=root[0],
        store_port=root[1],
        prefix=prefix,
    )
    digests = {stats.PLANNED: plan.mapping_digest, stats.SCHEDULER: scheduler.mapping_digest}
    started = time.monotonic()
    decision = probe_round(
        store,
        node,
        request.settings,
        predicted=plan.predicted,
        digests=digests,
        check_stopped=check_stopped,
    )
    seconds = time.monotonic() - started
    collective = request.settings.collective
    ranks = node.nnodes * node.nproc
    log.info("round %d %s", number, stats.verdict_line(decision, collective))
    document = stats.probe_document(decision, collective, ranks, request.backend, seconds)
    document["round"] = number
    if not document["mapping_digests"]:  # a failed probe's decision carries none
        document["mapping_digests"] = digests
    path = os.path.join(request.output_dir, PROBE_FILE)
    try:
        write_atomic(path, json.dumps(document, indent=2, sort_keys=True) + "\n")
    except OSError as error:  # the decision stands; only its record is missing
        log.warning("could not write %s: %s", path, error)
    return plan if decision.keeps_plan else scheduler
