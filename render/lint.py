"""What a valid job spec does that will disappoint: the renderer's warnings, one sentence each.

:func:`spec_warnings` is asked by ``spec.validate`` for every spec it accepts: routing with fewer
than 3 nodes, or (told to use one) without a rank table source, part of a node, a launcher
option that assigns ranks by arrival, keys a device ignores. Each warning says what will happen.
"""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING, Iterable, List, Sequence, Tuple

from npu_job.podfacts import DEFAULT_RANK_TABLES, FULL_NODE_ENV, MIN_NODES, RANK_TABLE_ENV

if TYPE_CHECKING:  # spec imports this module; the type is only named here
    from .spec import JobSpec


def spec_warnings(spec: JobSpec, explicit_keys: Iterable[str] = ()) -> Tuple[str, ...]:
    """What is valid but will disappoint, one sentence each (the renderer logs them)."""
    warnings: List[str] = []
    explicit = set(explicit_keys)
    full = spec.full_node_npus
    if (
        spec.routing
        and spec.routing_source == "rank-table"
        and not spec.delivered_rank_table
        and not brings_a_rank_table(spec)
    ):
        what, served = (
            (f"device {spec.device}", "NPU jobs")
            if spec.device != "npu"
            else (f"kind {spec.kind}", "the NPU pods of Volcano Jobs")
        )
        warnings.append(
            f"routing is on for {what}, but no rank table source is configured "
            f"(CCE's configmap1980 plugin serves {served} only): set env RANK_TABLE_FILE (a file "
            "in one of volumes, or an http(s) URL) or mount one at "
            f"{_default_rank_table_dirs()[0]}; without it each pod's bootstrap finds no rank table "
            "and keeps the scheduler's order"
        )
    if spec.routing and spec.nodes < MIN_NODES:
        warnings.append(
            f"routing is on with {spec.nodes} node(s): the bootstrap needs at least {MIN_NODES} "
            f"and will keep the scheduler's order"
        )
    if full is not None and spec.npus_per_node < full:
        tail = (
            f"; each pod's bootstrap ({FULL_NODE_ENV}={full}) will find partial nodes in the rank "
            "table, write a failed route_plan.json and keep the scheduler's order (NODE_RANK = "
            "VC_TASK_INDEX, master index 0): routing acceleration needs full nodes"
            if spec.routing
            else ""
        )
        warnings.append(
            f"npus_per_node is {spec.npus_per_node}, below a full node (full_node_npus "
            f"{full}){tail}"
        )
    arrival = _arrival_order_flags(spec.launcher_args, spec.launcher)
    if spec.routing and arrival:
        warnings.append(
            f"launcher_args {' '.join(arrival)} assigns node ranks by arrival, so the launcher "
            f"cannot apply the bootstrap's new ranks (use the default static/parallel rendezvous)"
        )
    if spec.full_node_npus is None and "full_node_npus" in explicit:
        warnings.append(f"full_node_npus is ignored for device {spec.device}: it has no full node")
    if spec.device != "npu" and "hccl" in explicit:
        warnings.append(f"hccl settings are ignored for device {spec.device}")
    if spec.bootstrap_url and not spec.uses_bundle:
        warnings.append(
            "bootstrap.url is ignored: no bundle is used (bundle is false, or neither routing nor "
            "npu-run is on)"
        )
    if spec.routes_by_api and RANK_TABLE_ENV in dict(spec.env):
        warnings.append(
            f"routing_source is api, but env {RANK_TABLE_ENV} names a rank table: the "
            "bootstrap reads that rank table and not the job's pods"
        )
    if spec.routes_by_api and not spec.anti_affinity:
        warnings.append(
            "routing by the Kubernetes API with anti_affinity off: pods of the job "
            "that share a node make every pod's bootstrap keep the scheduler's order "
            "(routing orders nodes)"
        )
    if "routing_source" in explicit and not spec.routing:
        warnings.append("routing_source is ignored: routing is off")
    topology = spec.network_topology
    if topology.mode == "soft" and topology.highest_tier_allowed is not None:
        warnings.append(
            "network_topology.highest_tier_allowed is ignored in soft mode (Volcano "
            "reads it in hard mode only)"
        )
    return tuple(warnings)


def _default_rank_table_dirs() -> Tuple[str, ...]:
    """Where the bootstrap looks for a rank table when ``RANK_TABLE_FILE`` is not set."""
    return tuple(posixpath.dirname(path) for path in DEFAULT_RANK_TABLES)


def brings_a_rank_table(spec: JobSpec) -> bool:
    """Whether the pods get a rank table without CCE: ``RANK_TABLE_FILE`` or a default location."""
    if RANK_TABLE_ENV in dict(spec.env):
        return True
    for mount in spec.mounts:
        path = str(mount.get("mountPath", "")).rstrip("/")
        if any(
            place == path or place.startswith(path + "/") or path.startswith(place + "/")
            for place in _default_rank_table_dirs()
        ):
            return True
    return False


def _arrival_order_flags(args: Sequence[str], launcher: str) -> List[str]:
    """Launcher flags under which ranks follow arrival order, not ``--node_rank``: npu-run ranks
    a c10d round by the nodes' reports (docs/launcher.md, "Under c10d"), torchrun does not."""
    kept = ("static", "parallel", "c10d") if launcher == "npu-run" else ("static", "parallel")
    flags = []
    for index, arg in enumerate(args):
        match = re.match(r"--rdzv[-_]backend(?:=(.*))?\Z", arg)
        if match:
            inline = match.group(1)
            backend = (
                inline if inline is not None else (args[index + 1] if index + 1 < len(args) else "")
            )
            if backend not in kept:
                flags.append(arg if inline is not None else f"{arg} {backend}")
        elif arg == "--standalone":
            flags.append(arg)
    return flags
