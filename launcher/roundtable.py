"""The rank table HCCL reads, in each rendezvous round's order (the edge): read, reorder, write.

On an NPU job the rank table's server order is the collective's rank order (HCCL ranks a
server's devices by ``rank_id``): when a round's plan moves the node ranks, the table must move
with them. After each round's plan npu-run writes the job's rank table with its servers in that
round's node-rank order (:func:`npu_job.bootstrap.nodereport.rank_table_in_round_order`) and
points ``RANK_TABLE_FILE`` at it, in its own environment, which the round's workers inherit.

The table it starts from is the one the pod's bootstrap read (``rank_table`` in
``route_plan.json``), else ``$RANK_TABLE_FILE`` where that is not already one of npu-job's own
reordered copies; a job without one (GPU and CPU jobs) gets nothing. The round's order is its
members' node ids (their reports' ``node_id``, the rank table's ``server_id``). A table that
cannot be read or does not list exactly the round's nodes is one warning line naming the file,
and ``RANK_TABLE_FILE`` is left as it was: the rendezvous never stops for it (HCCL then names
the mismatch).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Mapping, MutableMapping, Optional, Sequence

from npu_job.bootstrap.nodereport import RoundPlan, rank_table_in_round_order

from npu_job.errors import InputError, LaunchError
from npu_job.fileio import write_atomic
from npu_job.podfacts import RANK_TABLE_COPY, RANK_TABLE_ENV, ROUTE_PLAN_FILE

from .noderank import output_path, read_text_if_exists, round_plan_document, write_round_plan

logger = logging.getLogger(__name__)

#: the round's copy, beside the bootstrap's outputs
ROUND_RANK_TABLE = "jobstart_hccl.round.json"


def original_rank_table(env: Mapping[str, str]) -> Optional[str]:
    """The rank table this pod's bootstrap read, else ``$RANK_TABLE_FILE`` unless it names one of
    npu-job's reordered copies; None for a job without one."""
    try:
        route_plan = json.loads(read_text_if_exists(output_path(env, ROUTE_PLAN_FILE)) or "{}")
    except (LaunchError, ValueError):
        route_plan = {}
    named = route_plan.get("rank_table") if isinstance(route_plan, dict) else None
    if isinstance(named, str) and named:
        return named
    given = env.get(RANK_TABLE_ENV, "").strip()
    if given and os.path.basename(given) not in (RANK_TABLE_COPY, ROUND_RANK_TABLE):
        return given
    return None


def write_round_rank_table(original: str, server_ids: Sequence[str], path: str) -> str:
    """``original`` with its servers in the order of ``server_ids`` (node rank 0 first) and rank
    ids rewritten, written atomically to ``path``; an ``InputError`` naming ``original`` when it
    cannot be read as a rank table or does not list exactly those servers (nothing written)."""
    try:
        with open(original, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise InputError(original, "file", f"a readable rank table ({error.strerror})") from None
    write_atomic(path, rank_table_in_round_order(data, original, server_ids), durable=False)
    return path


def follow_round(env: MutableMapping[str, str], number: int, server_ids: Sequence[str]) -> None:
    """Give this round's workers the rank table in the round's order (``server_ids``, node rank
    0 first): written beside the bootstrap's files and named by ``env[RANK_TABLE_FILE]``."""
    original = original_rank_table(env)
    if original is None:
        return
    if not server_ids or not all(server_ids):
        logger.warning(
            "round %d: some nodes reported no rank table server id; %s=%s is left as it was",
            number,
            RANK_TABLE_ENV,
            env.get(RANK_TABLE_ENV, ""),
        )
        return
    try:
        path = write_round_rank_table(original, server_ids, output_path(env, ROUND_RANK_TABLE))
    except (InputError, LaunchError) as error:
        logger.warning(
            "round %d: %s; %s=%s is left as it was",
            number,
            error,
            RANK_TABLE_ENV,
            env.get(RANK_TABLE_ENV, ""),
        )
        return
    except OSError as error:
        logger.warning("round %d: cannot write the round's rank table (%s)", number, error)
        return
    env[RANK_TABLE_ENV] = path
    logger.info("round %d: rank table in the round's order: %s (from %s)", number, path, original)


def follow_plan(
    env: MutableMapping[str, str], backend: str, number: int, plan: RoundPlan, node_rank: int
) -> None:
    """What every backend does once a round is planned, before its workers start: leave the
    round's plan beside the bootstrap's files and hand the workers the rank table in its order."""
    document = round_plan_document(
        backend, number, plan.mapping_digest, node_rank, len(plan.node_rank)
    )
    write_round_plan(env, document)
    follow_round(env, number, plan.node_ids_in_rank_order)
