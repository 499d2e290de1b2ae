"""Where ``npu-run --node_rank=auto`` takes this node's rank from (torch-free).

The bootstrap (pod step 1) computes the routing-affine node order and leaves this node's new rank
in two places, which the platform's pod command forwards (README, "How a job runs"; a Volcano
Job's, and each job kind's with its own index variable)::

    export RANK_AFTER_ACC=${VC_TASK_INDEX}
    rank_acc=$(cat /tmp/RANK_AFTER_ACC 2>/dev/null)
    [ -n "${rank_acc}" ] && export RANK_AFTER_ACC=...

``auto`` reads them in that spirit, first match wins:

1. the ``RANK_AFTER_ACC`` environment variable,
2. the file ``RANK_AFTER_ACC`` in the bootstrap's output directory (``$NPU_JOB_OUTPUT_DIR``,
   default ``/tmp``),
3. the scheduler-order index of this pod, in the variable its job kind's controller sets
   (:attr:`~npu_job.kinds.base.JobKind.index_env`: a Volcano Job's ``VC_TASK_INDEX``; the kind is
   ``$NPU_JOB_KIND``, which render sets on a pod of any kind but the default, ``volcano``),
4. 0 (a single node, or a launcher started by hand).

Empty values are skipped, like the pod command's ``[ -n ... ]``; a value that is present but not a
non-negative integer is an error, never silently replaced by the next source. The resolution is a
pure function over an environment mapping and a file reader, so tests need no real ``/tmp``.

:func:`node_order` names the order those ranks belong to (the bootstrap's planned mapping, or the
scheduler's), and :func:`node_report` is what the node tells the rendezvous root about itself (the
bootstrap's ``npu_job_node.json``): the root plans each round's ranks from the reports, and names
the pods whose bootstrap decided otherwise than its plan. Once a round is planned,
:func:`write_round_plan` leaves this node's rank in it beside the bootstrap's files
(``npu_job_round.json``), for the workers to hold their ranks to.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from npu_job.bootstrap.nodereport import NodeReport, decode_report, encode_report
from npu_job.kinds import DEFAULT, KIND_ENV, kind_named

from npu_job.errors import InputError, LaunchError
from npu_job.fileio import write_atomic
from npu_job.parsing import is_count
from npu_job.podfacts import (
    NODE_REPORT_FILE,
    OUTPUT_DIR,
    OUTPUT_DIR_ENV,
    RANK_ENV,
    RANK_FILE,
    ROUND_PLAN_FILE,
    ROUTE_PLAN_FILE,
)

AUTO = "auto"
ROUND_PLAN_VERSION = 1
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeRankChoice:
    """The node rank ``auto`` resolved to and where it came from (for the log line)."""

    rank: int
    source: str


def output_path(env: Mapping[str, str], name: str) -> str:
    """The file ``name`` in the bootstrap's output directory (``$NPU_JOB_OUTPUT_DIR``, else
    ``/tmp``) for this environment."""
    return os.path.join(env.get(OUTPUT_DIR_ENV) or OUTPUT_DIR, name)


def rank_file_path(env: Mapping[str, str]) -> str:
    """The bootstrap's ``RANK_AFTER_ACC`` file for this environment."""
    return output_path(env, RANK_FILE)


def read_text_if_exists(path: str) -> Optional[str]:
    """The file's text, or None when it does not exist (the edge reader ``auto`` uses)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise LaunchError(f"{path}: cannot read the node rank: {error.strerror}") from None


def parse_node_rank(text: str, source: str) -> int:
    """``text`` as a node rank; ``source`` names where it came from in the error."""
    value = text.strip()
    if not is_count(value):
        raise LaunchError(
            f"{source}: node rank: expected a non-negative integer, got {text.strip()!r}"
        )
    return int(value)


def resolve_node_rank(
    env: Mapping[str, str], read_text: Callable[[str], Optional[str]] = read_text_if_exists
) -> NodeRankChoice:
    """This node's rank for ``--node_rank=auto`` (see the module docstring for the order)."""
    from_env = env.get(RANK_ENV, "").strip()
    if from_env:
        return NodeRankChoice(
            parse_node_rank(from_env, f"environment {RANK_ENV}"), f"environment {RANK_ENV}"
        )
    path = rank_file_path(env)
    from_file = (read_text(path) or "").strip()
    if from_file:
        return NodeRankChoice(parse_node_rank(from_file, path), f"bootstrap file {path}")
    index_env = scheduler_index_env(env)
    from_scheduler = env.get(index_env, "").strip()
    if from_scheduler:
        return NodeRankChoice(
            parse_node_rank(from_scheduler, f"environment {index_env}"),
            f"environment {index_env} (scheduler order)",
        )
    return NodeRankChoice(0, f"default (no {RANK_ENV}, bootstrap file or {index_env})")


def scheduler_index_env(env: Mapping[str, str]) -> str:
    """The variable of this pod's scheduler-order index: its job kind's (``$NPU_JOB_KIND``,
    default ``volcano``); a kind npu-job does not know is a :class:`LaunchError` listing those it
    knows."""
    try:
        return kind_named(
            env.get(KIND_ENV, "").strip() or DEFAULT, "environment", KIND_ENV
        ).index_env
    except InputError as error:
        raise LaunchError(error.message) from None


SCHEDULER_ORDER = "scheduler order"
PLANNED_ORDER = "planned order "  # followed by the bootstrap's mapping sha256


def node_order(
    env: Mapping[str, str],
    read_text: Callable[[str], Optional[str]] = read_text_if_exists,
    node_rank: Optional[int] = None,
) -> Optional[str]:
    """The node order this pod's rank belongs to, as text every pod of the job can compare.

    ``"planned order <mapping sha256>"`` when the bootstrap's ``route_plan.json`` says it planned
    and the rank follows that plan; :data:`SCHEDULER_ORDER` when it fell back, or when the rank is
    this pod's scheduler index instead of its planned rank. ``node_rank`` is the rank given on the
    command line (None for ``--node_rank=auto``, which takes the bootstrap's rank itself). Without
    a route plan, ``auto`` ranks are in scheduler order, and a given rank is not checked (None):
    no bootstrap ran, so there is no order to hold it to. None too when the route plan cannot be
    read or makes no sense: the check is a diagnosis and never stops a launch by itself.
    """
    path = output_path(env, ROUTE_PLAN_FILE)
    try:
        text = read_text(path)
        if text is None:
            return SCHEDULER_ORDER if node_rank is None else None
        plan = json.loads(text)
    except (LaunchError, ValueError):
        return None
    if not isinstance(plan, dict):
        return None
    if plan.get("status") != "success":
        return SCHEDULER_ORDER
    digest = plan.get("mapping_digest")
    if not isinstance(digest, str) or not digest:
        return None
    planned = f"{PLANNED_ORDER}{digest}"
    if node_rank is None or node_rank == plan.get("node_rank"):
        return planned
    if node_rank == plan.get("pod_index"):
        return SCHEDULER_ORDER
    return (
        f"order of no plan (--node_rank={node_rank} is neither this pod's planned rank "
        f"{plan.get('node_rank')} nor its pod index {plan.get('pod_index')})"
    )


@dataclass(frozen=True)
class NodeReportChoice:
    """The report bytes this node joins the rendezvous with, its pod index when the report names
    one (None: unknown; the rendezvous takes ``--node_rank`` for it), and where it came from."""

    data: bytes
    pod_index: Optional[int]
    source: str


def read_bytes_if_exists(path: str) -> Optional[bytes]:
    """The file's bytes, or None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise LaunchError(f"{path}: cannot read the node report: {error.strerror}") from None


def node_report(
    env: Mapping[str, str],
    node_rank: int,
    nproc_per_node: int,
    read_bytes: Callable[[str], Optional[bytes]] = read_bytes_if_exists,
) -> NodeReportChoice:
    """The bootstrap's report of this pod (``$NPU_JOB_OUTPUT_DIR/npu_job_node.json``), else an
    unknown one: pod index ``node_rank`` (so the root's plan keeps the ranks the pods came with),
    ``nproc_per_node`` devices, nothing else known.

    The pod index that decides who hosts the root is the report's, else the scheduler's index
    variable of the pod's kind (``VC_TASK_INDEX``), else unknown (the rendezvous takes
    ``--node_rank``). A report that does not decode is sent as it is (the root names it and
    plans the node with nothing known).
    """
    path = output_path(env, NODE_REPORT_FILE)
    data = read_bytes(path)
    index_env = scheduler_index_env(env)
    scheduler_index = env.get(index_env, "").strip()
    from_scheduler = int(scheduler_index) if is_count(scheduler_index) else None
    if data is None:
        unknown = NodeReport(pod_index=node_rank, device_count=nproc_per_node)
        where = "--node_rank" if from_scheduler is None else f"{index_env}={from_scheduler}"
        return NodeReportChoice(
            encode_report(unknown), from_scheduler, f"none at {path}; pod index from {where}"
        )
    try:
        report = decode_report(data, path)
    except InputError as error:
        return NodeReportChoice(data, from_scheduler, f"{error.message} (sent as it is)")
    if report.pod_index >= 0:
        return NodeReportChoice(data, report.pod_index, f"{path}: pod index {report.pod_index}")
    return NodeReportChoice(data, from_scheduler, f"{path}: no pod index")


def round_plan_document(
    backend: str, number: int, mapping_digest: str, node_rank: int, nnodes: int
) -> str:
    """What :data:`~npu_job.podfacts.ROUND_PLAN_FILE` says of one rendezvous round: this node's
    rank in the round's plan (JSON, one line)."""
    document = {
        "version": ROUND_PLAN_VERSION,
        "rendezvous": backend,
        "round": number,
        "mapping_digest": mapping_digest,
        "node_rank": node_rank,
        "nnodes": nnodes,
    }
    return json.dumps(document, separators=(",", ":")) + "\n"


def write_round_plan(env: Mapping[str, str], document: str) -> Optional[str]:
    """Leave this round's plan beside the bootstrap's files, for the workers; only where a
    bootstrap ran (its report or route plan is there), so npu-run started by hand writes no file
    into ``/tmp``. Returns the path written, or None. A file that cannot be written is logged and
    never stops the round: the workers' ranks do not depend on it."""
    if not any(
        os.path.exists(output_path(env, name)) for name in (NODE_REPORT_FILE, ROUTE_PLAN_FILE)
    ):
        return None
    path = output_path(env, ROUND_PLAN_FILE)
    try:
        write_atomic(path, document, durable=False)
    except OSError as error:
        logger.warning("cannot write %s (%s); the round goes on", path, error)
        return None
    return path
