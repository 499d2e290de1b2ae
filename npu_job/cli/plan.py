"""``npu-job plan``: show the routing-affine order for a rank table or pods, and how it scores.

Reads a rank table, or a Volcano job's pods (``kubectl get pods -o json``, or one
``kubectl get hypernodes,nodes,pods -o json`` that holds the topology too), and (optionally) a
switch topology with the bootstrap's own readers, runs the planner exactly as every pod would,
and compares three orders on the scorer's fabric model: the scheduler's pod order, a seeded random
order and ours. Text by default, ``--json`` for machines.
A plan that cannot be made (fewer than 3 nodes, partial nodes, no topology...) is a result, not an
error: it is shown with its reasons and the exit status is 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._args import int_at_least, picture_file

HELP = "show the routing-affine order for a rank table or a job's pods, and how it scores"
JSON_VERSION = 1
ORDER_NAMES = ("scheduler", "random", "ours")
SERVER_FLAGS = ("rank_table", "pods")  # exactly one of them names the servers

_EPILOG = """\
The fabric model (see npu_job.bootstrap.scorer): each ToR has U uplinks, each as fast as one
node's link; ECMP hashes every cross-ToR flow onto one spine uniformly at random; a phase of the
collective runs at the pace of its most loaded link. "busbw fraction" is the predicted bus
bandwidth (nccl-tests: algbw * 2(n-1)/n) relative to a fabric without contention.

Examples:
  npu-job plan --rank-table jobstart_hccl.json --topology ranktable_tor.json
  npu-job plan --rank-table hccl.json --topology topology.yaml --collective rhd --uplinks 16 --json
  npu-job plan --rank-table jobstart_hccl.json --picture plan.svg   # needs npu-job[picture]
  kubectl get hypernodes,nodes,pods -o json > cluster.json; npu-job plan --pods cluster.json
  npu-job plan --pods pods.json --job llama --topology hypernodes.yaml --nodes nodes.json
"""


def configure(parser: argparse.ArgumentParser) -> None:
    from npu_job.bootstrap.command import add_flag
    from npu_job.bootstrap.options import OPTIONS
    from npu_job.bootstrap.scorer import DEFAULT_SAMPLES, DEFAULT_UPLINKS

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    # the settings a pod has too, from the bootstrap's option table
    servers = parser.add_mutually_exclusive_group(required=True)
    for option in OPTIONS:
        if option.plan is not None:
            container = servers if option.name in SERVER_FLAGS else parser
            add_flag(container, option, option.plan.help, option.plan.metavar)
    parser.add_argument(
        "--uplinks",
        type=int_at_least(1),
        default=DEFAULT_UPLINKS,
        metavar="U",
        help="uplinks per ToR in the fabric model (default: %(default)s)",
    )
    parser.add_argument(
        "--samples",
        type=int_at_least(0),
        default=DEFAULT_SAMPLES,
        metavar="N",
        help="Monte-Carlo ECMP draws per order; 0 skips the simulation (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="seed of the random order and of the ECMP draws (default: %(default)s)",
    )
    parser.add_argument(
        "--json", action="store_true", help=f'print JSON (with "version": {JSON_VERSION})'
    )
    parser.add_argument(
        "--picture",
        metavar="FILE",
        type=picture_file,
        help="also draw the plan to FILE (.png or .svg): the switches as boxes, every node with"
        " its pod index and new rank, the ring's cross-switch edges, the scheduler's order and"
        " ours side by side (needs the extra: pip install 'npu-job[picture]')",
    )


def run(args: argparse.Namespace) -> int:
    from npu_job.bootstrap import planner, scorer
    from npu_job.bootstrap.options import resolve_one
    from npu_job.bootstrap.run import choose_collective

    if args.picture:
        from .picture import require_matplotlib

        require_matplotlib()  # before any work: a missing extra is one line, exit 9
    table, table_source, topology, topology_source, nodes = _load(args)
    collective = choose_collective(resolve_one("collective", vars(args), os.environ))
    plan = planner.plan(table, topology, collective)
    if args.picture:
        from ._args import write_picture

        write_picture(
            args.picture,
            table,
            topology,
            plan,
            f"npu-job plan: {table.node_count} nodes, {os.path.basename(table_source)}",
        )
    keys = scorer.switch_keys(table, topology)
    shuffled = list(range(table.node_count))
    random.Random(args.seed).shuffle(shuffled)
    orders = {
        "scheduler": tuple(range(table.node_count)),
        "random": tuple(shuffled),
        "ours": plan.pod_of_node_rank,
    }
    scores = {
        name: scorer.score_order(
            order, keys, collective, uplinks=args.uplinks, samples=args.samples, seed=args.seed
        )
        for name, order in orders.items()
    }
    report = _report(table, topology, plan, scores, args, table_source, topology_source, nodes)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(_text(report)) + "\n")
    return 0


MISSING_FILE_TIP = (
    "no cluster's files at hand? npu-job demo --write-inputs DIR writes a simulated cluster's "
    "jobstart_hccl.json and ranktable_tor.json to plan for"
)


def _load(args: argparse.Namespace):
    """Read the servers and topology with the bootstrap's loader (errors: one line, exit 3).
    Only the flags name the inputs: a pod's variables mean nothing where plan runs."""
    from npu_job.bootstrap import inputs
    from npu_job.bootstrap.options import INPUTS, OPTIONS, resolve
    from npu_job.errors import InputError

    flags = {o.name: getattr(args, o.name) for o in OPTIONS if o.plan and o.group == INPUTS}
    try:
        read = inputs.load_inputs(resolve(flags, {}))
    except InputError as error:
        if error.field == "file" and error.tip is None and not os.path.exists(error.source):
            error.tip = MISSING_FILE_TIP
        raise
    topology_source = None if read.topology_source == "none" else read.topology_source
    return read.table, read.table_source, read.topology, topology_source, read.node_names


def _score_fields(score) -> Dict[str, Any]:
    fields = dataclasses.asdict(score)
    fields.pop("phases")
    fields["collective"] = score.collective.value
    fields["ring_cross_edges_by_tier"] = list(score.ring_cross_edges_by_tier)
    fields["ring_lower_bound_by_tier"] = list(score.ring_lower_bound_by_tier)
    return fields


def _report(
    table,
    topology,
    plan,
    scores,
    args,
    table_source: str,
    topology_source: Optional[str],
    nodes: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    from npu_job.bootstrap.canonical import switch_path

    order: List[Dict[str, Any]] = []
    for rank, pod in enumerate(plan.pod_of_node_rank):
        server = table.servers[pod]
        tiers, tors, slot = switch_path(server, topology)
        order.append(
            {
                "node_rank": rank,
                "pod_index": pod,
                "server_id": server.server_id,
                "tiers": list(tiers),
                "tors": list(tors),
                "slot": slot,
                **({"node": nodes[pod]} if nodes is not None else {}),
            }
        )
    return {
        "version": JSON_VERSION,
        "rank_table": None if args.pods else table_source,
        "pods": args.pods,
        "topology": topology_source,
        "status": plan.status.value,
        "collective": plan.collective.value,
        "reasons": list(plan.reasons),
        "node_count": table.node_count,
        "master_index": plan.master_index,
        "rank_mapping": plan.rank_mapping,
        "input_digest": plan.input_digest,
        "mapping_digest": plan.mapping_digest,
        "order": order,
        "model": {"uplinks": args.uplinks, "samples": args.samples, "seed": args.seed},
        "scores": {name: _score_fields(score) for name, score in scores.items()},
    }


def _path_text(entry: Dict[str, Any]) -> str:
    from npu_job.bootstrap.base.payload import verbatim_or_shown

    parts = list(map(verbatim_or_shown, entry["tiers"]))
    if entry["tors"]:
        parts.append("+".join(map(verbatim_or_shown, entry["tors"])))
    text = " > ".join(parts) if parts else "- (no topology)"
    return text + (f" (slot {entry['slot']})" if entry["slot"] is not None else "")


def _number(value: Optional[float], digits: int = 2) -> str:
    if value is None:
        return "-"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.{digits}f}"


def _fraction(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def _text(report: Dict[str, Any]) -> List[str]:
    """The report as lines for a terminal; ids that are not short printable text are quoted
    (:func:`~npu_job.bootstrap.base.payload.verbatim_or_shown`), ``--json`` has them as written."""
    from npu_job.bootstrap.base.payload import verbatim_or_shown

    ours = report["scores"]["ours"]
    lines = [
        f"plan: {report['status']} ({report['collective']}), {report['node_count']} nodes on"
        f" {ours['switches']} switch group(s);"
        f" master index {report['master_index']} (pod of new rank 0)",
        f"input sha256 {report['input_digest']}",
        f"mapping sha256 {report['mapping_digest']}",
    ]
    lines.extend(
        f"{'reason' if report['status'] == 'failed' else 'note'}: {reason}"
        for reason in report["reasons"]
    )
    rows: List[Tuple[str, str, str, str]] = [("new rank", "pod index", "server", "switch path")]
    rows.extend(
        (
            str(e["node_rank"]),
            str(e["pod_index"]),
            verbatim_or_shown(e["server_id"])
            + (f" ({verbatim_or_shown(e['node'])})" if "node" in e else ""),
            _path_text(e),
        )
        for e in report["order"]
    )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines.append("")
    for row in rows:
        lines.append(
            f"{row[0]:>{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}"
        )

    model = report["model"]
    scores = [report["scores"][name] for name in ORDER_NAMES]
    weighted = report["collective"] != "ring"
    suffix = " (data-weighted)" if weighted else ""
    metrics: List[Tuple[str, Sequence[str]]] = [
        (
            f"cross-ToR edges of a ring r->r+1 (lower bound {ours['ring_lower_bound']})",
            [str(s["ring_cross_edges"]) for s in scores],
        ),
        ("cross-ToR data (buffer units)", [_number(s["cross_volume"]) for s in scores]),
        (
            f"max flows out of one ToR{suffix}",
            [_number(s["weighted_max_flows_out"]) for s in scores],
        ),
        (
            f"expected colliding flow pairs{suffix}",
            [_number(s["weighted_collisions"]) for s in scores],
        ),
        (
            "busbw fraction, perfect path control",
            [_fraction(s["best_busbw_fraction"]) for s in scores],
        ),
        ("busbw fraction, ECMP Monte-Carlo", [_fraction(s["busbw_fraction"]) for s in scores]),
    ]
    if len(ours["ring_cross_edges_by_tier"]) > 1:
        metrics.insert(
            1,
            (
                "ring edges crossing each tier, outermost first (bounds "
                + " ".join(str(x) for x in ours["ring_lower_bound_by_tier"])
                + ")",
                [" ".join(str(x) for x in s["ring_cross_edges_by_tier"]) for s in scores],
            ),
        )
    label_width = max(len(label) for label, _ in metrics)
    cell = max(10, *(len(v) for _, values in metrics for v in values))
    lines.append("")
    lines.append(
        f"comparison for {report['collective']}: U={model['uplinks']} uplinks per ToR,"
        f" {model['samples']} ECMP samples, seed {model['seed']}"
    )
    lines.append(f"{'':<{label_width}}  " + "  ".join(f"{name:>{cell}}" for name in ORDER_NAMES))
    for label, values in metrics:
        lines.append(
            f"{label:<{label_width}}  " + "  ".join(f"{value:>{cell}}" for value in values)
        )
    return lines
