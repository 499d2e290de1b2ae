"""What the demo runs and what it must see: the pure half of ``npu-job demo``.

The demo (``npu-job demo`` and the pod-level end-to-end tests) runs the whole npu-job chain on one
machine. The chain is the real one; only the cluster is simulated. Values in, values out here:

1. **cluster** (:func:`simulated_cluster`): a CCE-format rank table and ``ranktable_tor.json``
   from the planner's synthetic generator, with the scheduler's pod order scattered over the ToRs
   and every ``server_id`` set to the address the pod will have here (what ``status.hostIP``
   gives, matched by the bootstrap against ``MA_CURRENT_HOST_IP``);
2. **render** (:func:`demo_spec_values`, :func:`render_job`): the job spec through ``npu-job
   render``'s own API, exactly as a user would apply it. By default a ``device: cpu`` job with
   routing on (gloo workers: this machine has no NPU). CCE's ``configmap1980`` plugin delivers
   rank tables to NPU jobs only, so the CPU job brings its own, as a user on a CPU cluster would:
   a ConfigMap ``demo-ranktable`` (what ``kubectl create configmap --from-file`` makes of the two
   files) that the job mounts at ``/user/config``, with ``RANK_TABLE_FILE`` naming the rank table
   in it. ``device="npu"`` renders the NPU job instead; then, as on CCE, the plugin's files
   appear at ``/user/config``;
3. **pods**: ``podspec`` (pure) turns the rendered manifest into one pod spec per pod, ``runner``
   stages and starts them through ``podsim`` (namespaces, mounts, processes) and supervises them;
   what a line of a pod's log says is read here (:func:`read_pod_line`);
4. **checks** (:func:`check_outcome`): every pod's bootstrap wrote the plan the demo expects
   (:func:`expected_plan`; or fell back when it should), every worker's global rank follows it,
   all ranks ended with the same parameters, and the loss went down. :class:`DemoResult` holds
   what a run found and its ``--json`` summary; :class:`Phases` the time each phase took.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from npu_job.demo.podspec import SETUP_FAILED

from npu_job.podfacts import MIN_NODES, RANK_TABLE_ENV, RANK_TABLE_NAME, RANKTABLE_TOR_NAME

SUMMARY_VERSION = 1
JOB_NAME = "demo"
TASK_NAME = "worker"
SHARED_MOUNT = (
    "/job"  # the shared volume every pod mounts (code in, reports out), like the seed's /job
)
EXAMPLE_SCRIPT = "train_ddp.py"
RANK_TABLE_CONFIGMAP = (
    f"{JOB_NAME}-ranktable"  # the CPU job's own rank table (see the module docstring)
)
RANK_TABLE_DIR = "/user/config"  # where the job mounts it: where CCE puts it for NPU jobs
DEVICES = ("cpu", "npu")
ROUTING_SOURCES = ("rank-table", "api")  # the job's own rank table (CCE's on npu), or the pods
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the kubelet mounts it
LOOPBACK_BASE = "127.0.0."  # pod k gets 127.0.0.(10+k): all of 127/8 is local on Linux


@dataclass(frozen=True)
class DemoOptions:
    """What to simulate and run."""

    nodes: int = 6
    nproc_per_node: int = 2
    tors: int = 3
    seed: int = 0
    steps: int = 20
    routing: bool = True
    deliver_rank_table: bool = True  # False: the job gets no rank table (bootstrap falls back)
    device: str = "cpu"  # "npu": render the NPU job (CCE's configmap1980 delivers the rank table)
    checkpoint_every: int = 0  # >0: train_ddp checkpoints to the shared volume (resume after kill)
    step_delay: float = 0.0
    timeout: float = 240.0  # the whole run, seconds; past it every pod is killed
    max_restarts: int = 2  # OnFailure container restarts per pod before the run counts as failed
    # "api": no rank table; each pod's bootstrap lists the job's pods, the cluster's Nodes and its
    # HyperNodes from a Kubernetes API the caller serves (run(..., api=ClusterAPI(...)))
    routing_source: str = "rank-table"

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.nproc_per_node < 1 or self.steps < 1:
            raise ValueError("nodes, nproc_per_node and steps must be >= 1")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.routing_source not in ROUTING_SOURCES:
            raise ValueError(
                f"routing_source must be one of {', '.join(ROUTING_SOURCES)}, "
                f"got {self.routing_source!r}"
            )
        if self.routing and self.deliver_rank_table and not 1 <= self.tors <= self.nodes:
            raise ValueError(f"tors must be within 1..nodes ({self.nodes}), got {self.tors}")


@dataclass(frozen=True)
class ClusterAPI:
    """A Kubernetes API the caller serves for a run with ``routing_source="api"``: where the pods
    reach it (the kubelet's ``KUBERNETES_SERVICE_HOST/PORT``) and the service account the kubelet
    mounts into every pod (its token, the CA of the API's certificate, the namespace)."""

    host: str
    port: int
    token: str
    ca_pem: str
    namespace: str = "default"

    def pod_env(self) -> Dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": self.host, "KUBERNETES_SERVICE_PORT": str(self.port)}

    def pod_files(self) -> Dict[str, str]:
        return {
            f"{SERVICE_ACCOUNT_DIR}/token": self.token,
            f"{SERVICE_ACCOUNT_DIR}/ca.crt": self.ca_pem,
            f"{SERVICE_ACCOUNT_DIR}/namespace": self.namespace,
        }


@dataclass(frozen=True)
class SimulatedCluster:
    """The cluster the scheduler gave the job: rank table, topology, and what CCE mounts."""

    table: Any  # npu_job.bootstrap.model.RankTable, as the pods will read it
    topology: (
        Any  # npu_job.bootstrap.model.Topology, as the pods will read it (no slots in CCE's format)
    )
    rank_table_json: str
    ranktable_tor_b64: str


INPUT_FILES = (RANK_TABLE_NAME, RANKTABLE_TOR_NAME)  # what CCE mounts at /user/config


def loopback_ips(count: int) -> Tuple[str, ...]:
    if count > 240:
        raise ValueError("at most 240 loopback pods")
    return tuple(f"{LOOPBACK_BASE}{10 + index}" for index in range(count))


def simulated_cluster(options: DemoOptions, host_ips: Sequence[str]) -> SimulatedCluster:
    """A CCE cluster for ``options`` whose server ids are the pods' host addresses (pure)."""
    from npu_job.bootstrap.synthetic import synthetic_cluster

    tors = min(max(1, options.tors), options.nodes)
    table, topology = synthetic_cluster(
        options.nodes,
        tors,
        npus_per_node=options.nproc_per_node,
        seed=options.seed,
        job_name=JOB_NAME,
        scatter=True,
    )
    return cce_cluster(table, topology, host_ips)


def cce_cluster(table: Any, topology: Any, host_ips: Sequence[str]) -> SimulatedCluster:
    """A generated ``(table, topology)`` as CCE delivers it to pods at ``host_ips`` (pure): every
    ``server_id`` becomes its pod's address, then the rank table and ``ranktable_tor.json`` are
    encoded and read back with the bootstrap's own readers."""
    from npu_job.bootstrap.model import Placement, Topology
    from npu_job.bootstrap.ranktable import parse_rank_table, rank_table_document
    from npu_job.bootstrap.topology import encode_ranktable_tor, parse_topology

    renamed: Dict[str, str] = {
        server.server_id: host_ips[server.pod_index] for server in table.servers
    }
    servers = tuple(
        replace(
            server,
            server_id=renamed[server.server_id],
            host_ip=renamed[server.server_id],
            pod_name=f"{JOB_NAME}-{TASK_NAME}-{server.pod_index}",
        )
        for server in table.servers
    )
    table = replace(table, servers=servers)
    placements: Dict[str, Placement] = {
        renamed[sid]: placement for sid, placement in topology.placements.items()
    }
    topology = Topology(placements, source=topology.source)
    rank_table = json.dumps(rank_table_document(table), indent=1, sort_keys=True) + "\n"
    tor = encode_ranktable_tor(table, topology, lambda index: f"{JOB_NAME}-{TASK_NAME}-{index}")
    # What the pods see is what these files say, not what the generator knew (e.g. slots): the
    # expected plan comes from the bootstrap's own readers applied to the same bytes.
    seen_table = parse_rank_table(rank_table.encode(), RANK_TABLE_NAME)
    seen_topology = parse_topology(tor, RANKTABLE_TOR_NAME)
    return SimulatedCluster(seen_table, seen_topology, rank_table, tor.decode("ascii"))


def demo_spec_values(options: DemoOptions, master_port: int, shared_dir: str) -> Dict[str, Any]:
    """The job spec a user would write for this run (``npu-job render`` input)."""
    args = [
        "--steps",
        str(options.steps),
        "--report-dir",
        f"{SHARED_MOUNT}/output/reports",
        "--seed",
        str(options.seed + 1),
        "--timeout",
        "60",
        # the NPU job runs hccl where torch_npu works and falls back to gloo here
        "--device",
        "cpu" if options.device == "cpu" else "auto",
    ]
    if options.checkpoint_every:
        args += [
            "--checkpoint-dir",
            f"{SHARED_MOUNT}/output/checkpoint",
            "--checkpoint-every",
            str(options.checkpoint_every),
        ]
    if options.step_delay:
        args += ["--step-delay", str(options.step_delay)]
    env = {"NPU_JOB_WAIT_TIMEOUT": "20", "PYTHONUNBUFFERED": "1"}
    volumes: List[Dict[str, Any]] = [
        {"name": "demo-shared", "hostPath": {"path": shared_dir, "type": "Directory"}}
    ]
    mounts: List[Dict[str, Any]] = [{"name": "demo-shared", "mountPath": SHARED_MOUNT}]
    values: Dict[str, Any] = {
        "name": JOB_NAME,
        "image": "npu-job-demo:local",
        "script": f"{SHARED_MOUNT}/code/{EXAMPLE_SCRIPT}",
        "args": args,
        "nodes": options.nodes,
        "npus_per_node": options.nproc_per_node,
        "device": options.device,
        "task_name": TASK_NAME,
        "routing": options.routing,
        "master_port": master_port,
        "env": env,
        "volumes": volumes,
        "mounts": mounts,
    }
    if options.routing_source == "api":
        values["routing_source"] = "api"  # no rank table: the job's pods from the API
        values["anti_affinity"] = True  # one pod per node, as routing needs
    if options.device == "npu":
        values["full_node_npus"] = options.nproc_per_node  # the simulated nodes are this small
    elif options.routing and options.deliver_rank_table and options.routing_source != "api":
        env[RANK_TABLE_ENV] = f"{RANK_TABLE_DIR}/{RANK_TABLE_NAME}"
        volumes.append({"name": "ranktable", "configMap": {"name": RANK_TABLE_CONFIGMAP}})
        mounts.append({"name": "ranktable", "mountPath": RANK_TABLE_DIR, "readOnly": True})
    return values


def rank_table_configmap(cluster: SimulatedCluster) -> Dict[str, Any]:
    """The ConfigMap a CPU job's user creates beside the job (``kubectl create configmap
    demo-ranktable --from-file=jobstart_hccl.json --from-file=ranktable_tor.json``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": RANK_TABLE_CONFIGMAP, "namespace": "default"},
        "data": {
            RANK_TABLE_NAME: cluster.rank_table_json,
            RANKTABLE_TOR_NAME: cluster.ranktable_tor_b64,
        },
    }


def render_job(values: Mapping[str, Any]) -> Any:
    """``values`` through npu-job render's validation and templates -> ``RenderedJob``."""
    from npu_job.render.render import render
    from npu_job.render.spec import validate
    from npu_job.render.values import SpecInput, merge_values

    return render(validate(merge_values([SpecInput(source="demo spec", values=dict(values))])))


def manifest_documents(rendered: Any) -> List[Any]:
    import yaml

    return [doc for doc in yaml.safe_load_all(rendered.stream()) if doc]


def node_name(host_ip: str) -> str:
    """The node a pod on ``host_ip`` runs on (``spec.nodeName``, as podspec resolves it)."""
    return f"node-{host_ip}"


def cluster_objects(
    cluster: SimulatedCluster, host_ips: Sequence[str], namespace: str = "default"
) -> Dict[str, List[Dict[str, Any]]]:
    """What the Kubernetes API holds once the scheduler placed the job (pure): its pods (Volcano's
    labels, node, host IP), the Nodes, and the HyperNodes of the simulated fabric: one per ToR
    (tier 1) holding its nodes by ``exactMatch``, all under one spine (tier 2), as Volcano's
    label discovery writes them."""
    pods, nodes = [], []
    for index, ip in enumerate(host_ips):
        name = f"{JOB_NAME}-{TASK_NAME}-{index}"
        pods.append(
            {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {
                        "volcano.sh/job-name": JOB_NAME,
                        "volcano.sh/task-spec": TASK_NAME,
                        "volcano.sh/task-index": str(index),
                    },
                },
                "spec": {
                    "nodeName": node_name(ip),
                    "containers": [{"name": "train", "resources": {}}],
                },
                "status": {"phase": "Running", "hostIP": ip, "podIP": ip},
            }
        )
        nodes.append(
            {
                "metadata": {
                    "name": node_name(ip),
                    "labels": {"kubernetes.io/hostname": node_name(ip)},
                },
                "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
            }
        )
    members: Dict[str, List[str]] = {}
    for server in cluster.table.servers:
        placement = cluster.topology.placement_of(server.server_id)
        for tor in placement.tors if placement else ():
            members.setdefault(f"tor-{tor}", []).append(node_name(host_ips[server.pod_index]))
    hypernodes = [
        {
            "metadata": {"name": tor},
            "spec": {
                "tier": 1,
                "members": [
                    {"type": "Node", "selector": {"exactMatch": {"name": node}}}
                    for node in sorted(nodes_of)
                ],
            },
        }
        for tor, nodes_of in sorted(members.items())
    ]
    hypernodes.append(
        {
            "metadata": {"name": "spine"},
            "spec": {
                "tier": 2,
                "members": [
                    {"type": "HyperNode", "selector": {"exactMatch": {"name": tor}}}
                    for tor in sorted(members)
                ],
            },
        }
    )
    return {"pods": pods, "nodes": nodes, "hypernodes": hypernodes}


def api_plan(objects: Mapping[str, List[Dict[str, Any]]]) -> Any:
    """The plan the bootstrap makes of ``objects`` (:func:`cluster_objects`), read with its own
    readers."""
    from npu_job.bootstrap import jobpods
    from npu_job.bootstrap.kubefacts import read_pods
    from npu_job.bootstrap.kubeobjects import read_objects
    from npu_job.bootstrap.kubetopology import KubeContext, topology_from_objects
    from npu_job.bootstrap.model import Collective
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
        read_pods(listed.pods, "api"), jobpods.JobSelector(job=JOB_NAME), "api"
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
    from npu_job.bootstrap.model import Collective, Plan, PlanStatus
    from npu_job.bootstrap.planner import plan

    if options.routing and options.routing_source == "api" and objects is not None:
        return api_plan(objects)
    if options.routing and options.deliver_rank_table:
        return plan(cluster.table, cluster.topology, Collective.RING)
    return Plan(
        PlanStatus.FAILED,
        tuple(range(options.nodes)),
        Collective.RING,
        ("routing off" if not options.routing else "no rank table delivered",),
    )


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


def check_outcome(
    plan: Any,
    options: DemoOptions,
    pods: Sequence[PodOutcome],
    reports: Sequence[Dict[str, Any]],
    *,
    expect_routing: bool,
) -> List[str]:
    """Every inconsistency in the chain, one sentence each (empty: the run proved its point)."""
    problems: List[str] = []
    world = options.nodes * options.nproc_per_node
    for pod in pods:
        where = f"pod {pod.index}"
        if pod.exit_code != 0:
            problems.append(f"{where}: exited with {pod.exit_code} after {pod.restarts} restart(s)")
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


_STEP = re.compile(r"train_ddp: step (\d+)/(\d+) loss ([0-9.]+)")
_JOINED = re.compile(r"npu-run: node rank \d+ joined round")
_ROUND_COMPLETE = re.compile(r"npu-run: round \d+ complete")
# A line that says what went wrong in a pod: "npu-job: error: ...", "RuntimeError: ...", a shell's
# "npu-run: not found", a worker's "FAILED", podsim's "cannot run" (not torch's "Failed to ..."
# warnings).
_ERROR_LINE = re.compile(r"(?i:error:)|not found|FAILED|cannot run")
_NODE_RANK = re.compile(r"npu-job: node rank (\d+) of (\d+), master (\S+)")


@dataclass(frozen=True)
class PodLine:
    """What one line of a pod's log says (:func:`read_pod_line`): two flags, at most one event."""

    setup_failed: Optional[str] = None  # podsim could not set the pod up: why
    error: bool = False  # the line says what went wrong (not a warning)
    node_rank: Optional[Tuple[str, str, str]] = None  # train.sh: (node rank, nodes, master)
    joined: bool = False  # npu-run joined the rendezvous
    round_complete: bool = False  # npu-run's rendezvous round completed
    step: Optional[Tuple[int, int, float]] = None  # train_ddp: (step, steps, loss)
    done: bool = False  # train_ddp's closing line
    failed: bool = False  # a worker's FAILED line


def read_pod_line(line: str) -> PodLine:
    """What ``line`` of a pod's log says, for the supervisor's progress and first error."""
    flags: Dict[str, Any] = {
        "setup_failed": line[len(SETUP_FAILED) :].strip()
        if line.startswith(SETUP_FAILED)
        else None,
        "error": bool(_ERROR_LINE.search(line)),
    }
    match = _NODE_RANK.search(line)
    if match:
        return PodLine(**flags, node_rank=(match.group(1), match.group(2), match.group(3)))
    if _JOINED.search(line):
        return PodLine(**flags, joined=True)
    if _ROUND_COMPLETE.search(line):
        return PodLine(**flags, round_complete=True)
    match = _STEP.search(line)
    if match:
        step = (int(match.group(1)), int(match.group(2)), float(match.group(3)))
        return PodLine(**flags, step=step)
    done = "train_ddp: done" in line
    return PodLine(
        **flags, done=done, failed=not done and "train_ddp:" in line and "FAILED" in line
    )


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
    delivered = options.deliver_rank_table or options.routing_source == "api"
    return options.routing and delivered and options.nodes >= MIN_NODES


def describe_plan(prepared: Prepared, progress: Callable[[str], None]) -> None:
    plan = prepared.plan
    options = prepared.options
    if not options.routing or not (options.deliver_rank_table or options.routing_source == "api"):
        why = "off (routing disabled)" if not options.routing else "none (no rank table delivered)"
        progress(
            f"route plan: {why}: every pod keeps the scheduler's order (node rank = VC_TASK_INDEX)"
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
