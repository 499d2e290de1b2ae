"""The bootstrap's output files, written atomically and identically on every re-run.

In the output directory (``/tmp`` by default, ``$NPU_JOB_OUTPUT_DIR`` or ``--output-dir``):

=================================  ================================================================
``RANK_AFTER_ACC``                 this pod's new node rank (digits, no newline); written last
``MASTER_INDEX``                   pod index of the new node rank 0
``jobstart_hccl.reordered.json``   the rank table in the new order (``rank_id`` rewritten)
``npu_job_env.sh``                 ``export NODE_RANK=... MASTER_INDEX=... NPU_JOB_MASTER_ADDR=...
                                   RANK_TABLE_FILE=...``
``route_plan.json``                what was decided and why (always written)
``npu_job_node.json``              this pod's node report (:mod:`.nodereport`; always written)
=================================  ================================================================

``NPU_JOB_MASTER_ADDR`` (``master_addr`` in the route plan) is the address of the pod holding the
new rank 0, for a kind whose pods have no DNS name: its pod IP when the servers are the job's
pods, its server's pod address (``container_ip``), else its host's, from a rank table (absent
where it is not known yet).

On success all five are written (``RANK_AFTER_ACC`` last, so its presence means "done"). When no
plan can be used, only the route plan is written (status ``failed`` with the reason) and the other
four are *removed* if a previous run left them (the node report is written either way, with what
the pod knows, before the route plan): the pod command then falls back to the job kind's
index variable (a Volcano Job's ``VC_TASK_INDEX``) / master index 0, i.e. the scheduler order. One
rule, no half states.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional

from npu_job import __version__
from npu_job.fileio import write_atomic
from npu_job.podfacts import (
    ENV_FILE,
    MASTER_ADDR_ENV,
    MASTER_FILE,
    NODE_REPORT_FILE,
    RANK_FILE,
    RANK_TABLE_COPY,
    RANK_TABLE_ENV,
    ROUTE_PLAN_FILE,
)

from .base.jsondecode import encode_compact
from .base.model import Plan

ROUTE_PLAN_VERSION = 1
PLAN_FILES = (RANK_TABLE_COPY, ENV_FILE, MASTER_FILE, RANK_FILE)


def route_plan_document(
    plan: Optional[Plan],
    *,
    node_count: Optional[int] = None,
    pod_index: Optional[int] = None,
    rank_table: Optional[str] = None,
    topology: Optional[str] = None,
    error: Optional[str] = None,
    pods: Optional[str] = None,
    master_addr: Optional[str] = None,
) -> Dict[str, Any]:
    """The route-plan JSON: status, the platform's ``rank_mapping``, reasons and both digests;
    ``pods`` names where the job's pods came from when there was no rank table, ``master_addr``
    the address of the new rank 0's pod (a usable plan's, where known)."""
    usable = plan is not None and error is None and plan.status.value == "success"
    reasons: List[str] = list(plan.reasons) if plan is not None else []
    if error is not None:
        reasons.append(error)
    node_rank = plan.node_rank_of_pod[pod_index] if usable and pod_index is not None else None
    return {
        "version": ROUTE_PLAN_VERSION,
        "npu_job_version": __version__,
        "status": "success" if usable else "failed",
        "rank_mapping": plan.rank_mapping if plan is not None else None,
        "reason": "; ".join(reasons),
        "reasons": reasons,
        "collective": plan.collective.value if plan is not None else None,
        "node_count": node_count,
        "pod_index": pod_index,
        "node_rank": node_rank,
        "master_index": plan.master_index if usable else None,
        **({"master_addr": master_addr} if usable and master_addr is not None else {}),
        "input_digest": plan.input_digest if plan is not None else None,
        "mapping_digest": plan.mapping_digest if plan is not None else None,
        "rank_table": rank_table,
        **({"pods": pods} if pods is not None else {}),
        "topology": topology,
    }


def env_file_text(
    node_rank: int,
    master_index: int,
    rank_table_file: Optional[str],
    master_addr: Optional[str] = None,
) -> str:
    """Shell lines for ``source``; every value shell-quoted (no RANK_TABLE_FILE or
    NPU_JOB_MASTER_ADDR without one)."""
    lines = [
        "# written by npu-job bootstrap; source it: . ./npu_job_env.sh",
        f"export NODE_RANK={shlex.quote(str(node_rank))}",
        f"export MASTER_INDEX={shlex.quote(str(master_index))}",
    ]
    if master_addr is not None:
        lines.append(f"export {MASTER_ADDR_ENV}={shlex.quote(master_addr)}")
    if rank_table_file is not None:
        lines.append(f"export {RANK_TABLE_ENV}={shlex.quote(rank_table_file)}")
    return "\n".join(lines) + "\n"


def write_plan_outputs(
    output_dir: str,
    *,
    node_rank: int,
    master_index: int,
    reordered_table: Optional[Dict[str, Any]],
    route_plan: Dict[str, Any],
    original_rank_table: Optional[str] = None,
    master_addr: Optional[str] = None,
    node_report: Optional[bytes] = None,
) -> List[Path]:
    """Write the files of a usable plan (all five; without a rank table, no reordered copy, and a
    stale one is removed), and ``node_report`` if given, before the route plan; returns their
    paths in write order."""
    out = Path(output_dir)
    copy = out / RANK_TABLE_COPY
    if original_rank_table is not None and _same_file(copy, original_rank_table):
        raise ValueError(f"refusing to overwrite the input rank table {original_rank_table}")
    # Not durable: these files live in the pod's /tmp and die with it, and every restart of the
    # pod recomputes them; the rename alone keeps readers from seeing partial data. Five fsyncs
    # cost ~40 ms of the pod's start-up.
    written = []
    if reordered_table is not None:
        table_text = encode_compact(reordered_table) + b"\n"
        written.append(write_atomic(copy, table_text, durable=False))
    else:
        try:
            copy.unlink()
        except FileNotFoundError:
            pass
    written.append(
        write_atomic(
            out / ENV_FILE,
            env_file_text(
                node_rank,
                master_index,
                str(copy.absolute()) if reordered_table is not None else None,
                master_addr,
            ),
            durable=False,
        )
    )
    written += _node_report(out, node_report)
    written += [
        write_atomic(out / ROUTE_PLAN_FILE, _json_text(route_plan), durable=False),
        write_atomic(out / MASTER_FILE, str(master_index), durable=False),
        write_atomic(out / RANK_FILE, str(node_rank), durable=False),
    ]
    return written


def write_fallback_outputs(
    output_dir: str, route_plan: Dict[str, Any], *, node_report: Optional[bytes] = None
) -> List[Path]:
    """Remove stale rank files (so the pod falls back to scheduler order); write ``node_report``
    if given, then the route plan."""
    out = Path(output_dir)
    for name in reversed(PLAN_FILES):  # RANK_AFTER_ACC first: never a rank without its master
        try:
            (out / name).unlink()
        except FileNotFoundError:
            pass
    written = _node_report(out, node_report)
    written.append(write_atomic(out / ROUTE_PLAN_FILE, _json_text(route_plan), durable=False))
    return written


def _node_report(out: Path, data: Optional[bytes]) -> List[Path]:
    return [] if data is None else [write_atomic(out / NODE_REPORT_FILE, data, durable=False)]


def _json_text(document: Dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _same_file(path: Path, other: str) -> bool:
    try:
        if path.resolve() == Path(other).resolve():
            return True
        return path.exists() and os.path.samefile(path, other)
    except OSError:
        return False
