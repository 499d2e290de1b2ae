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
scheduler's), so that the rendezvous can prove every node follows the same one: pods whose
bootstraps disagreed (one fell back, or read other inputs) would otherwise clash on ranks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from npu_job.kinds import DEFAULT, KIND_ENV, kind_named

from npu_job.errors import InputError, LaunchError
from npu_job.parsing import is_count
from npu_job.podfacts import (
    OUTPUT_DIR,
    OUTPUT_DIR_ENV,
    RANK_ENV,
    RANK_FILE,
    ROUTE_PLAN_FILE,
)

AUTO = "auto"


@dataclass(frozen=True)
class NodeRankChoice:
    """The node rank ``auto`` resolved to and where it came from (for the log line)."""

    rank: int
    source: str


def rank_file_path(env: Mapping[str, str]) -> str:
    """The bootstrap's ``RANK_AFTER_ACC`` file for this environment."""
    return os.path.join(env.get(OUTPUT_DIR_ENV) or OUTPUT_DIR, RANK_FILE)


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
    path = os.path.join(env.get(OUTPUT_DIR_ENV) or OUTPUT_DIR, ROUTE_PLAN_FILE)
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
    planned = f"planned order {digest}"
    if node_rank is None or node_rank == plan.get("node_rank"):
        return planned
    if node_rank == plan.get("pod_index"):
        return SCHEDULER_ORDER
    return (
        f"order of no plan (--node_rank={node_rank} is neither this pod's planned rank "
        f"{plan.get('node_rank')} nor its pod index {plan.get('pod_index')})"
    )
