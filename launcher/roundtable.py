"""The rank table HCCL reads, in each rendezvous round's order (the edge): read, reorder, write.

On an NPU job the rank table's server order is the collective's rank order (HCCL ranks a
server's devices by ``rank_id``): when a round's plan moves the node ranks, npu-run writes the
job's rank table in that round's order and hands its workers that file as ``RANK_TABLE_FILE``.
The table it starts from is the one the pod's bootstrap read (``rank_table`` in
``route_plan.json``), else ``$RANK_TABLE_FILE`` where that is not already one of npu-job's own
reordered copies; the round's order is its members' node ids (their reports' ``node_id``, the
rank table's ``server_id``). The file is rewritten atomically each round, before that round's
workers start (the previous round's have stopped by then).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence

from npu_job.fileio import write_atomic
from npu_job.podfacts import (
    OUTPUT_DIR,
    OUTPUT_DIR_ENV,
    RANK_TABLE_COPY,
    RANK_TABLE_ENV,
    ROUTE_PLAN_FILE,
)

log = logging.getLogger(__name__)

#: the round's copy, beside the bootstrap's outputs
ROUND_RANK_TABLE = "jobstart_hccl.round.json"


def original_rank_table(env: Mapping[str, str]) -> Optional[str]:
    """The rank table this pod's bootstrap read, else ``$RANK_TABLE_FILE`` unless it names one of
    npu-job's reordered copies; None for a job without one (GPU and CPU jobs)."""
    output = env.get(OUTPUT_DIR_ENV) or OUTPUT_DIR
    try:
        route_plan = json.loads((Path(output) / ROUTE_PLAN_FILE).read_text())
    except (OSError, ValueError):
        route_plan = {}
    named = route_plan.get("rank_table") if isinstance(route_plan, dict) else None
    if isinstance(named, str) and named:
        return named
    given = env.get(RANK_TABLE_ENV)
    if given and os.path.basename(given) not in (RANK_TABLE_COPY, ROUND_RANK_TABLE):
        return given
    return None


def write_round_rank_table(original: str, server_ids: Sequence[str], output_dir: str) -> Path:
    """``original`` with its servers in the order of ``server_ids`` (node rank 0 first) and rank
    ids rewritten, written atomically to ``output_dir``; an ``InputError`` naming ``original``
    when it cannot be read as a rank table or does not list exactly those servers."""
    from npu_job.bootstrap.base.jsondecode import encode_compact
    from npu_job.bootstrap.base.payload import decode_document
    from npu_job.bootstrap.ranktable import (
        in_server_order,
        rank_table_from_document,
        reordered_document,
    )
    from npu_job.bootstrap.sources import read_bytes

    document = decode_document(read_bytes(original), original)
    table = rank_table_from_document(document, original)
    plan = in_server_order(table, server_ids, original)
    reordered = reordered_document(document, table, plan, in_place=True)
    path = write_atomic(Path(output_dir) / ROUND_RANK_TABLE, encode_compact(reordered) + b"\n")
    log.info("rank table for this round: %s (from %s)", path, original)
    return path
