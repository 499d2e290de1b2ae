"""What a demo run must find and what it found (pure): step 4 of :mod:`npu_job.demo.scenario`.

:func:`expected_plan` is the plan every pod's bootstrap must arrive at (computed with the
bootstrap's own readers and planner from what the pods are given; identity when it must fall
back); :func:`check_outcome` lists every inconsistency in what the pods left: each pod's bootstrap
ran from the job's bundle (:func:`bundle_identity`) and wrote that plan (or fell back when it
should), every worker's global rank follows it, all ranks ended with the same parameters, and the
loss went down. :class:`DemoResult` holds what a run found
and its ``--json`` summary; :class:`Phases` the time each phase took; :class:`RingScore` what the
plan buys on the ring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from npu_job.kinds import DEFAULT, KINDS

from npu_job.errors import shown
from npu_job.logs import PROG
from npu_job.podfacts import MIN_NODES

from .scenario import JOB_NAME, SUMMARY_VERSION, DemoOptions, SimulatedCluster


def api_plan(objects: Mapping[str, List[Dict[str, Any]]], kind: str = DEFAULT) -> Any:
    """The plan the bootstrap of a job of ``kind`` makes of ``objects``
    (:func:`.scenario.cluster_objects`), read with its own readers."""
    from npu_job.bootstrap.base.model import Collective
    from npu_job.bootstrap.kube import jobpods
    from npu_job.bootstrap.kube.facts import read_pods
    from npu_job.bootstrap.kube.objects import read_objects
    from npu_job.bootstrap.kube.topology import KubeContext, topology_from_objects
    from npu_job.bootstrap.planner import plan

    kinds = (("Pod", "pods"), ("Node", "nodes"), ("HyperNode", "hypernodes"))
    listed = read_objects(
        {
            "kind": "List",
            "items": [{"kind": kind, **item} for kind, key in kinds for item in objects[key]],
        },
        "api",
    )
    roster = jobpods.job_roster(
        read_pods(listed.pods, "api"), jobpods.JobSelector(job=JOB_NAME, kind=KINDS[kind]), "api"
    )
    table, nodes = jobpods.roster_table(roster, "api"), jobpods.node_names(roster)
    topology = topology_from_objects(listed, "api", context=KubeContext(names=nodes)).topology
    return plan(table, jobpods.by_server(topology, table, nodes), Collective.RING)


def expected_plan(
    cluster: SimulatedCluster,
    options: DemoOptions,
    objects: Optional[Mapping[str, List[Dict[str, Any]]]] = None,
) -> Any:
    """The plan every pod's bootstrap must arrive at (identity when it must fall back);
    ``objects``: what the API serves, for ``routing_source="api"``."""
    from npu_job.bootstrap.base.model import Collective, Plan, PlanStatus
    from npu_job.bootstrap.planner import plan

    if options.routing and options.routing_source == "api" and objects is not None:
        return api_plan(objects, options.kind)
    if options.routing and options.deliver_rank_table and options.unlisted_pod is None:
        return plan(cluster.table, cluster.topology, Collective.RING)
    return Plan(
        PlanStatus.FAILED,
        tuple(range(options.nodes)),
        Collective.RING,
        (_not_routed(options),),
    )


def _not_routed(options: DemoOptions) -> str:
    """Why every pod must keep the scheduler's order."""
    if not options.routing:
        return "routing off"
    if not (options.deliver_rank_table or options.routing_source == "api"):
        return "no rank table delivered"
    return f"the rank table lacks pod {options.unlisted_pod}: every pod refuses it"


@dataclass(frozen=True)
class RingScore:
    cross_before: int
    cross_after: int
    lower_bound: int


def ring_score(cluster: SimulatedCluster, plan: Any) -> RingScore:
    from npu_job.bootstrap.scorer import ring_cross_edges, ring_lower_bound, switch_keys

    keys = switch_keys(cluster.table, cluster.topology)
    pods = list(range(len(keys)))
    return RingScore(
        ring_cross_edges(pods, keys),
        ring_cross_edges(list(plan.pod_of_node_rank), keys),
        ring_lower_bound(pods, keys),
    )


def tor_of_pod(cluster: SimulatedCluster) -> Tuple[str, ...]:
    out = []
    for server in cluster.table.servers:
        placement = cluster.topology.placement_of(server.server_id)
        out.append("+".join(placement.tors) if placement and placement.tors else "-")
    return tuple(out)


@dataclass(frozen=True)
class PodOutcome:
    """What one pod left behind: its bootstrap files and its exit status."""

    index: int
    exit_code: Optional[int]
    restarts: int
    route_plan: Optional[Dict[str, Any]]
    rank_after_acc: Optional[str]
    master_index: Optional[str]
    first_line: Optional[str] = None  # the first line its container printed (last attempt)


def bundle_identity(bundle: Any) -> str:
    """How the first line of a pod whose bootstrap runs ``bundle`` (a
    :class:`~npu_job.bundle.Bundle`) starts: the identity line :mod:`npu_job.pod.bundled` logs."""
    return f"{PROG}: running {bundle.version} from bundle {bundle.short_digest} ("


def check_outcome(
    plan: Any,
    options: DemoOptions,
    pods: Sequence[PodOutcome],
    reports: Sequence[Dict[str, Any]],
    *,
    expect_routing: bool,
    identity: Optional[str] = None,
) -> List[str]:
    """Every inconsistency in the chain, one sentence each (empty: the run proved its point).

    ``identity``: how every pod's first line must start (:func:`bundle_identity`), when its
    bootstrap runs the job's bundle.
    """
    problems: List[str] = []
    world = options.nodes * options.nproc_per_node
    for pod in pods:
        where = f"pod {pod.index}"
        if pod.exit_code != 0:
            problems.append(f"{where}: exited with {pod.exit_code} after {pod.restarts} restart(s)")
        if identity is not None and not (pod.first_line or "").startswith(identity):
            problems.append(
                f"{where}: the bootstrap did not say it ran from the job's bundle: the pod's "
                f"first line is {shown(pod.first_line or '', 160)}, expected {identity!r}..."
            )
        planned = plan.node_rank_of_pod[pod.index]
        if expect_routing:
            if pod.route_plan is None:
                problems.append(f"{where}: the bootstrap wrote no route plan")
            elif pod.route_plan.get("status") != "success":
                problems.append(
                    f"{where}: the bootstrap did not plan: {pod.route_plan.get('reasons')}"
                )
            elif pod.route_plan.get("rank_mapping") != plan.rank_mapping:
                problems.append(
                    f"{where}: bootstrap mapping {pod.route_plan.get('rank_mapping')!r} != "
                    f"expected {plan.rank_mapping!r}"
                )
            if pod.rank_after_acc != str(planned):
                problems.append(
                    f"{where}: /tmp/RANK_AFTER_ACC is {pod.rank_after_acc!r}, expected {planned}"
                )
            if pod.master_index != str(plan.master_index):
                problems.append(
                    f"{where}: /tmp/MASTER_INDEX is {pod.master_index!r}, expected "
                    f"{plan.master_index}"
                )
        elif pod.rank_after_acc is not None:
            problems.append(
                f"{where}: fallback expected, but /tmp/RANK_AFTER_ACC is {pod.rank_after_acc!r}"
            )
    by_rank = {report.get("rank"): report for report in reports}
    missing = sorted(set(range(world)) - set(by_rank))
    if missing:
        problems.append(f"no report from rank(s) {missing} (of {world})")
    digests = {report.get("param_digest") for report in reports}
    if len(digests) > 1:
        problems.append(
            f"ranks disagree on the trained parameters ({len(digests)} different digests)"
        )
    for report in sorted(reports, key=lambda r: r.get("rank", -1)):
        rank, pod_index, local = (
            report.get("rank"),
            report.get("pod_index"),
            report.get("local_rank"),
        )
        if isinstance(pod_index, int) and isinstance(local, int) and 0 <= pod_index < options.nodes:
            expected = plan.node_rank_of_pod[pod_index] * options.nproc_per_node + local
            if rank != expected:
                problems.append(
                    f"rank {rank} runs on pod {pod_index} local rank {local}; the plan gives "
                    f"{expected}"
                )
        else:
            problems.append(f"rank {rank}: report lacks pod_index/local_rank")
        if report.get("world_size") != world:
            problems.append(f"rank {rank}: world size {report.get('world_size')}, expected {world}")
        for problem in report.get("problems") or []:
            problems.append(f"rank {rank}: {problem}")
        if not report.get("loss_decreased"):
            problems.append(f"rank {rank}: the loss did not go down")
    return problems


# (mark, the phase that ends at it), in order; a phase whose mark was never reached is merged
# into the next one. "finished" is marked by whoever owns the run's end (the CLI, after clean-up).
_PHASES = (
    ("prepared", "cluster+render"),
    ("pods_started", "start pods"),
    ("bootstrap_done", "bootstrap"),
    ("training_started", "launch+rendezvous"),
    ("training_done", "training"),
    ("pods_exited", "shutdown"),
    ("finished", "checks+clean-up"),
)


@dataclass
class Phases:
    """Wall-clock seconds of each phase, as seen from the pods' logs."""

    marks: Dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, when: Optional[float] = None) -> None:
        self.marks.setdefault(name, time.monotonic() if when is None else when)

    def durations(self, digits: int = 3) -> Dict[str, float]:
        """Seconds of each phase reached, then ``total``: every phase ends at its mark rounded to
        ``digits`` from the start, so the phases add up to the total exactly as printed."""
        start = self.marks.get("start")
        if start is None:
            return {}
        out: Dict[str, float] = {}
        reached = 0.0
        for mark, name in _PHASES:
            if mark in self.marks:
                offset = max(round(self.marks[mark] - start, digits), reached)
                out[name] = round(offset - reached, digits)
                reached = offset
        out["total"] = reached
        return out


@dataclass
class Prepared:
    """A job staged on disk, ready to start."""

    options: DemoOptions
    workspace: Path
    cluster: SimulatedCluster
    plan: Any
    rendered: Any
    specs: Tuple[Any, ...]  # podspec.PodSpec
    spec_files: Tuple[Path, ...]
    image: Any = None  # images.Image: what software the pods' image holds


@dataclass
class DemoResult:
    options: DemoOptions
    prepared: Prepared
    score: Optional[RingScore]
    pods: List[PodOutcome]
    reports: List[Dict[str, Any]]
    problems: List[str]
    phases: Phases
    losses: List[Tuple[int, float]]
    finished: bool

    @property
    def ok(self) -> bool:
        return self.finished and not self.problems

    def summary(self) -> Dict[str, Any]:
        """The ``--json`` document."""
        plan = self.prepared.plan
        tors = tor_of_pod(self.prepared.cluster)
        by_rank = sorted(self.reports, key=lambda r: r.get("rank", -1))
        return {
            "version": SUMMARY_VERSION,
            "ok": self.ok,
            "options": {
                k: getattr(self.options, k)
                for k in ("nodes", "nproc_per_node", "tors", "seed", "steps", "routing")
            },
            "workspace": str(self.prepared.workspace),
            "plan": {
                "status": str(plan.status),
                "rank_mapping": plan.rank_mapping,
                "master_index": plan.master_index,
                "reasons": list(plan.reasons),
                "pods": [
                    {
                        "pod_index": pod,
                        "node_rank": plan.node_rank_of_pod[pod],
                        "tor": tors[pod],
                        "host_ip": self.prepared.specs[pod].host_ip,
                    }
                    for pod in range(len(tors))
                ],
            },
            "ring": None
            if self.score is None
            else {
                "cross_tor_edges_scheduler_order": self.score.cross_before,
                "cross_tor_edges_planned": self.score.cross_after,
                "lower_bound": self.score.lower_bound,
            },
            "pods": [
                {
                    "pod_index": p.index,
                    "exit_code": p.exit_code,
                    "restarts": p.restarts,
                    "rank_after_acc": p.rank_after_acc,
                    "master_index": p.master_index,
                    "route_plan_status": (p.route_plan or {}).get("status"),
                }
                for p in self.pods
            ],
            "workers": [
                {
                    "rank": r.get("rank"),
                    "pod_index": r.get("pod_index"),
                    "local_rank": r.get("local_rank"),
                    "expected_rank": r.get("expected_rank"),
                    "host": r.get("host"),
                    "ok": r.get("ok"),
                    "start_step": r.get("start_step"),
                    "param_digest": r.get("param_digest"),
                }
                for r in by_rank
            ],
            "loss": {
                "train": [loss for _, loss in self.losses],
                "eval_initial": by_rank[0].get("eval_loss_initial") if by_rank else None,
                "eval_final": by_rank[0].get("eval_loss_final") if by_rank else None,
            },
            "phases_s": self.phases.durations(),
            "problems": self.problems,
        }


def expect_routing(options: DemoOptions) -> bool:
    """Whether every pod's bootstrap must plan (else each must keep the scheduler's order)."""
    if options.routing_source == "api":
        return options.routing and options.nodes >= MIN_NODES
    listed = options.deliver_rank_table and options.unlisted_pod is None
    return options.routing and listed and options.nodes >= MIN_NODES


def describe_plan(prepared: Prepared, progress: Callable[[str], None]) -> None:
    plan = prepared.plan
    options = prepared.options
    if not options.routing or not (options.deliver_rank_table or options.routing_source == "api"):
        why = "off (routing disabled)" if not options.routing else "none (no rank table delivered)"
        progress(
            f"route plan: {why}: every pod keeps the scheduler's order (node rank = VC_TASK_INDEX)"
        )
        return
    if options.unlisted_pod is not None and options.routing_source != "api":
        progress(
            f"route plan: none ({_not_routed(options)}): every pod keeps the scheduler's order "
            "(node rank = VC_TASK_INDEX)"
        )
        return
    tors = tor_of_pod(prepared.cluster)
    progress(
        f"route plan ({plan.status}): rank_mapping {plan.rank_mapping}; master = pod "
        f"{plan.master_index}"
    )
    for rank, pod in enumerate(plan.pod_of_node_rank):
        progress(
            f"  new rank {rank} <- pod {pod} ({prepared.specs[pod].name}, "
            f"{prepared.specs[pod].host_ip}) on ToR {tors[pod]}"
        )
    for reason in plan.reasons:
        progress(f"  reason: {reason}")
