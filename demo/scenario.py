"""The whole npu-job pipeline on one machine: simulated cluster -> render -> every pod -> checks.

``npu-job demo`` and the pod-level end-to-end tests share this module. The chain is the real one;
only the cluster is simulated:

1. **cluster** (pure, :func:`simulated_cluster`): a CCE-format rank table and ``ranktable_tor.json``
   from the planner's synthetic generator, with the scheduler's pod order scattered over the ToRs
   and every ``server_id`` set to the address the pod will have here (what ``status.hostIP``
   gives, matched by the bootstrap against ``MA_CURRENT_HOST_IP``);
2. **render** (pure, :func:`render_job`): the job spec through ``npu-job render``'s own API, exactly
   as a user would apply it. By default a ``device: cpu`` job with routing on (gloo workers: this
   machine has no NPU). CCE's ``configmap1980`` plugin delivers rank tables to NPU jobs only, so
   the CPU job brings its own, as a user on a CPU cluster would: a ConfigMap ``demo-ranktable``
   (what ``kubectl create configmap --from-file`` makes of the two files) that the job mounts at
   ``/user/config``, with ``RANK_TABLE_FILE`` naming the rank table in it. ``device="npu"``
   renders the NPU job instead; then, as on CCE, the plugin's files appear at ``/user/config``;
3. **pods** (edge, :mod:`npu_job.podsim`): each pod's container command exactly as rendered, with
   the env, hostnames and files a Volcano pod gets (the job's volumes, and the ``configmap1980``
   files only when the job has that plugin), each pod in its own mount and UTS namespace with its
   own host address; the job's ``restartPolicy: OnFailure`` is simulated by re-running a failed
   pod's command;
4. **checks** (pure, :func:`check_outcome`): every pod's bootstrap wrote the plan the demo expects
   (or fell back when it should), every worker's global rank follows it, all ranks ended with the
   same parameters, and the loss went down.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from npu_job.errors import InconsistentError, LaunchError, shown
from npu_job.podfacts import RANK_TABLE_ENV, RANK_TABLE_NAME

log = logging.getLogger(__name__)

SUMMARY_VERSION = 1
JOB_NAME = "demo"
TASK_NAME = "worker"
SHARED_MOUNT = "/job"  # the shared volume every pod mounts (code in, reports out), like the seed's /job
EXAMPLE_SCRIPT = "train_ddp.py"
RANK_TABLE_CONFIGMAP = f"{JOB_NAME}-ranktable"  # the CPU job's own rank table (see the module docstring)
RANK_TABLE_DIR = "/user/config"  # where the job mounts it: where CCE puts it for NPU jobs
DEVICES = ("cpu", "npu")
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

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.nproc_per_node < 1 or self.steps < 1:
            raise ValueError("nodes, nproc_per_node and steps must be >= 1")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.routing and self.deliver_rank_table and not 1 <= self.tors <= self.nodes:
            raise ValueError(f"tors must be within 1..nodes ({self.nodes}), got {self.tors}")


# ---------------------------------------------------------------------------------------------
# pure parts
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimulatedCluster:
    """The cluster the scheduler gave the job: rank table, topology, and what CCE mounts."""

    table: Any  # npu_job.bootstrap.model.RankTable, as the pods will read it
    topology: Any  # npu_job.bootstrap.model.Topology, as the pods will read it (no slots in CCE's format)
    rank_table_json: str
    ranktable_tor_b64: str


INPUT_FILES = ("jobstart_hccl.json", "ranktable_tor.json")  # what CCE mounts at /user/config


def loopback_ips(count: int) -> Tuple[str, ...]:
    if count > 240:
        raise ValueError("at most 240 loopback pods")
    return tuple(f"{LOOPBACK_BASE}{10 + index}" for index in range(count))


def simulated_cluster(options: DemoOptions, host_ips: Sequence[str]) -> SimulatedCluster:
    """A CCE cluster for ``options`` whose server ids are the pods' host addresses (pure)."""
    from npu_job.bootstrap.model import Placement, Topology
    from npu_job.bootstrap.ranktable import parse_rank_table, rank_table_document
    from npu_job.bootstrap.synthetic import synthetic_cluster
    from npu_job.bootstrap.topology import encode_ranktable_tor, parse_topology

    tors = min(max(1, options.tors), options.nodes)
    table, topology = synthetic_cluster(
        options.nodes, tors, npus_per_node=options.nproc_per_node, seed=options.seed,
        job_name=JOB_NAME, scatter=True,
    )
    renamed: Dict[str, str] = {server.server_id: host_ips[server.pod_index] for server in table.servers}
    servers = tuple(replace(server, server_id=renamed[server.server_id], host_ip=renamed[server.server_id],
                            pod_name=f"{JOB_NAME}-{TASK_NAME}-{server.pod_index}")
                    for server in table.servers)
    table = replace(table, servers=servers)
    placements: Dict[str, Placement] = {renamed[sid]: placement for sid, placement in topology.placements.items()}
    topology = Topology(placements, source=topology.source)
    rank_table = json.dumps(rank_table_document(table), indent=1, sort_keys=True) + "\n"
    tor = encode_ranktable_tor(table, topology, lambda index: f"{JOB_NAME}-{TASK_NAME}-{index}")
    # What the pods see is what these files say, not what the generator knew (e.g. slots): the
    # expected plan comes from the bootstrap's own readers applied to the same bytes.
    seen_table = parse_rank_table(rank_table.encode(), "jobstart_hccl.json")
    seen_topology = parse_topology(tor, "ranktable_tor.json")
    return SimulatedCluster(seen_table, seen_topology, rank_table, tor.decode("ascii"))


def write_cluster_inputs(cluster: SimulatedCluster, directory: Path) -> Tuple[Path, ...]:
    """The cluster's rank table and ranktable_tor.json as CCE delivers them (:data:`INPUT_FILES`),
    under ``directory``: the inputs of ``npu-job plan`` and ``npu-job bootstrap``."""
    from npu_job.fileio import write_atomic

    texts = (cluster.rank_table_json, cluster.ranktable_tor_b64)
    return tuple(write_atomic(directory / name, text, durable=False) for name, text in zip(INPUT_FILES, texts))


def demo_spec_values(options: DemoOptions, master_port: int, shared_dir: str) -> Dict[str, Any]:
    """The job spec a user would write for this run (``npu-job render`` input)."""
    args = ["--steps", str(options.steps), "--report-dir", f"{SHARED_MOUNT}/output/reports",
            "--seed", str(options.seed + 1), "--timeout", "60",
            # the NPU job runs hccl where torch_npu works and falls back to gloo here
            "--device", "cpu" if options.device == "cpu" else "auto"]
    if options.checkpoint_every:
        args += ["--checkpoint-dir", f"{SHARED_MOUNT}/output/checkpoint",
                 "--checkpoint-every", str(options.checkpoint_every)]
    if options.step_delay:
        args += ["--step-delay", str(options.step_delay)]
    env = {"NPU_JOB_WAIT_TIMEOUT": "20", "PYTHONUNBUFFERED": "1"}
    volumes: List[Dict[str, Any]] = [{"name": "demo-shared", "hostPath": {"path": shared_dir, "type": "Directory"}}]
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
    if options.device == "npu":
        values["full_node_npus"] = options.nproc_per_node  # the simulated nodes are this small
    elif options.routing and options.deliver_rank_table:
        env[RANK_TABLE_ENV] = f"{RANK_TABLE_DIR}/{RANK_TABLE_NAME}"
        volumes.append({"name": "ranktable", "configMap": {"name": RANK_TABLE_CONFIGMAP}})
        mounts.append({"name": "ranktable", "mountPath": RANK_TABLE_DIR, "readOnly": True})
    return values


def rank_table_configmap(cluster: SimulatedCluster) -> Dict[str, Any]:
    """The ConfigMap a CPU job's user creates beside the job (``kubectl create configmap
    demo-ranktable --from-file=jobstart_hccl.json --from-file=ranktable_tor.json``)."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": RANK_TABLE_CONFIGMAP, "namespace": "default"},
        "data": {"jobstart_hccl.json": cluster.rank_table_json, "ranktable_tor.json": cluster.ranktable_tor_b64},
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


def expected_plan(cluster: SimulatedCluster, options: DemoOptions) -> Any:
    """The plan every pod's bootstrap must arrive at (identity when it must fall back)."""
    from npu_job.bootstrap.model import Collective, Plan, PlanStatus
    from npu_job.bootstrap.planner import plan

    if options.routing and options.deliver_rank_table:
        return plan(cluster.table, cluster.topology, Collective.RING)
    return Plan(PlanStatus.FAILED, tuple(range(options.nodes)), Collective.RING,
                ("routing off" if not options.routing else "no rank table delivered",))


@dataclass(frozen=True)
class RingScore:
    cross_before: int
    cross_after: int
    lower_bound: int


def ring_score(cluster: SimulatedCluster, plan: Any) -> RingScore:
    from npu_job.bootstrap.scorer import ring_cross_edges, ring_lower_bound, switch_keys

    keys = switch_keys(cluster.table, cluster.topology)
    pods = list(range(len(keys)))
    return RingScore(ring_cross_edges(pods, keys), ring_cross_edges(list(plan.pod_of_node_rank), keys),
                     ring_lower_bound(pods, keys))


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
    plan: Any, options: DemoOptions, pods: Sequence[PodOutcome], reports: Sequence[Dict[str, Any]],
    *, expect_routing: bool,
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
                problems.append(f"{where}: the bootstrap did not plan: {pod.route_plan.get('reasons')}")
            elif pod.route_plan.get("rank_mapping") != plan.rank_mapping:
                problems.append(f"{where}: bootstrap mapping {pod.route_plan.get('rank_mapping')!r} != "
                                f"expected {plan.rank_mapping!r}")
            if pod.rank_after_acc != str(planned):
                problems.append(f"{where}: /tmp/RANK_AFTER_ACC is {pod.rank_after_acc!r}, expected {planned}")
            if pod.master_index != str(plan.master_index):
                problems.append(f"{where}: /tmp/MASTER_INDEX is {pod.master_index!r}, expected {plan.master_index}")
        elif pod.rank_after_acc is not None:
            problems.append(f"{where}: fallback expected, but /tmp/RANK_AFTER_ACC is {pod.rank_after_acc!r}")
    by_rank = {report.get("rank"): report for report in reports}
    missing = sorted(set(range(world)) - set(by_rank))
    if missing:
        problems.append(f"no report from rank(s) {missing} (of {world})")
    digests = {report.get("param_digest") for report in reports}
    if len(digests) > 1:
        problems.append(f"ranks disagree on the trained parameters ({len(digests)} different digests)")
    for report in sorted(reports, key=lambda r: r.get("rank", -1)):
        rank, pod_index, local = report.get("rank"), report.get("pod_index"), report.get("local_rank")
        if isinstance(pod_index, int) and isinstance(local, int) and 0 <= pod_index < options.nodes:
            expected = plan.node_rank_of_pod[pod_index] * options.nproc_per_node + local
            if rank != expected:
                problems.append(f"rank {rank} runs on pod {pod_index} local rank {local}; the plan gives {expected}")
        else:
            problems.append(f"rank {rank}: report lacks pod_index/local_rank")
        if report.get("world_size") != world:
            problems.append(f"rank {rank}: world size {report.get('world_size')}, expected {world}")
        for problem in report.get("problems") or []:
            problems.append(f"rank {rank}: {problem}")
        if not report.get("loss_decreased"):
            problems.append(f"rank {rank}: the loss did not go down")
    return problems


# ---------------------------------------------------------------------------------------------
# edge: run the pods
# ---------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def example_script() -> bytes:
    """The demo's workload, ``examples/train_ddp.py`` (``npu_job.examples``, in every install)."""
    from importlib import resources

    try:
        return resources.files("npu_job.examples").joinpath(EXAMPLE_SCRIPT).read_bytes()
    except OSError as error:
        raise LaunchError(f"npu_job/examples/{EXAMPLE_SCRIPT}: the demo's example script is missing ({error})",
                          tip="reinstall npu-job (the wheel ships it as package data)") from None


# (mark, the phase that ends at it), in order; a phase whose mark was never reached is merged
# into the next one. "finished" is marked by whoever owns the run's end (the CLI, after clean-up).
_PHASES = (("prepared", "cluster+render"), ("pods_started", "start pods"), ("bootstrap_done", "bootstrap"),
           ("training_started", "launch+rendezvous"), ("training_done", "training"),
           ("pods_exited", "shutdown"), ("finished", "checks+clean-up"))


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
PROGRESS_EVERY = 5.0  # seconds without a progress line before the supervisor says where the pods are
# A line that says what went wrong in a pod: "npu-job: error: ...", "RuntimeError: ...", a shell's
# "npu-run: not found", a worker's "FAILED", podsim's "cannot run" (not torch's "Failed to ..." warnings).
_ERROR_LINE = re.compile(r"(?i:error:)|not found|FAILED|cannot run")
_NODE_RANK = re.compile(r"npu-job: node rank (\d+) of (\d+), master (\S+)")


@dataclass
class Prepared:
    """A job staged on disk, ready to start."""

    options: DemoOptions
    workspace: Path
    cluster: SimulatedCluster
    plan: Any
    rendered: Any
    specs: Tuple[Any, ...]  # podsim.PodSpec
    spec_files: Tuple[Path, ...]


def prepare(options: DemoOptions, workspace: Path, host_ips: Sequence[str]) -> Prepared:
    """Simulate the cluster, render the job and stage every pod under ``workspace``."""
    from npu_job import podsim

    workspace.mkdir(parents=True, exist_ok=True)
    shared = workspace / "shared"
    (shared / "code").mkdir(parents=True, exist_ok=True)
    (shared / "output").mkdir(parents=True, exist_ok=True)
    (shared / "code" / EXAMPLE_SCRIPT).write_bytes(example_script())
    cluster = simulated_cluster(options, host_ips)
    values = demo_spec_values(options, free_port(), str(shared.resolve()))
    rendered = render_job(values)
    for name, text, _mode in rendered.files():
        (workspace / "rendered").mkdir(exist_ok=True)
        (workspace / "rendered" / name).write_text(text)
    documents = manifest_documents(rendered)
    _, job = podsim.find_job(documents)
    cluster_files: Dict[str, str] = {}
    plugins = job["spec"].get("plugins") or {}
    pod_annotations = job["spec"]["tasks"][0]["template"].get("metadata", {}).get("annotations") or {}
    if "configmap1980" in plugins and options.deliver_rank_table:
        cluster_files = podsim.cce_cluster_files(
            cluster.rank_table_json, cluster.ranktable_tor_b64 if "cabinet" in pod_annotations else None)
    write_cluster_inputs(cluster, workspace / "cluster")
    pod_volumes = job["spec"]["tasks"][0]["template"]["spec"].get("volumes") or []
    if any((volume.get("configMap") or {}).get("name") == RANK_TABLE_CONFIGMAP for volume in pod_volumes):
        # the job mounts its own rank table: apply that ConfigMap with it, as its user would
        configmap = rank_table_configmap(cluster)
        (workspace / "cluster" / "ranktable-configmap.json").write_text(json.dumps(configmap, indent=1) + "\n")
        documents.append(configmap)
    image_env = podsim.image_environment(os.environ, podsim.this_installation())
    specs = podsim.pod_specs(documents, host_ips, image_env=image_env, cluster_files=cluster_files)
    spec_files = tuple(podsim.stage_pod(spec, workspace / "pods" / spec.name) for spec in specs)
    return Prepared(options, workspace, cluster, expected_plan(cluster, options), rendered, specs, spec_files)


class Supervisor:
    """Runs the staged pods like a kubelet with ``restartPolicy: OnFailure``, and watches their logs
    (saying how far the pods got when nothing else was said for :data:`PROGRESS_EVERY` seconds)."""

    def __init__(self, prepared: Prepared, *, prefix_of: Callable[[int], Sequence[str]] = lambda index: (),
                 progress: Callable[[str], None] = lambda line: None, phases: Optional[Phases] = None,
                 user_namespace: Optional[bool] = None) -> None:
        self.prepared = prepared
        self.user_namespace = user_namespace  # None: only when not root (podsim.unshare_prefix)
        self.prefix_of = prefix_of
        self.progress = progress
        self.phases = phases or Phases()
        self.pods: List[Any] = []  # podsim.PodProcess, by pod index
        self.restarts = [0] * len(prepared.specs)
        self.exit_codes: List[Optional[int]] = [None] * len(prepared.specs)
        self._offsets = [0] * len(prepared.specs)
        self._partial = [""] * len(prepared.specs)
        self.losses: List[Tuple[int, float]] = []
        self.node_rank_lines: Dict[int, str] = {}
        self.log_tail: Dict[int, List[str]] = {i: [] for i in range(len(prepared.specs))}
        self.setup_error: Optional[str] = None  # a pod could not get its namespaces: no retry helps
        self.first_errors: Dict[int, str] = {}  # pod index -> its first error line, in the order seen
        self.joined: Set[int] = set()  # pods whose npu-run joined the rendezvous (this attempt)
        self.through: Set[int] = set()  # pods whose rendezvous round completed (this attempt)
        self._last_progress = time.monotonic()

    def say(self, line: str) -> None:
        """A progress line (and the time of the last one, for :meth:`heartbeat`)."""
        self._last_progress = time.monotonic()
        self.progress(line)

    def heartbeat(self, now: float) -> None:
        """Say where the pods are when nothing was said for :data:`PROGRESS_EVERY` seconds."""
        if now - self._last_progress >= PROGRESS_EVERY:
            self.say(self.status(now))

    def workers_running(self) -> int:
        """Worker processes alive in the pods: ``python [options] SCRIPT ...`` (npu-run's children)."""
        from npu_job.podsim import processes_inside

        count = 0
        for pid in processes_inside(self.prepared.workspace / "pods"):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
            except OSError:
                continue
            program = next((arg for arg in argv[1:] if not arg.startswith("-")), "")
            count += Path(program).name == EXAMPLE_SCRIPT
        return count

    def status(self, now: float) -> str:
        """One line: how far the pods got, from their logs (and how many workers run, from /proc)."""
        pods = len(self.prepared.specs)
        options = self.prepared.options
        workers = f"{self.workers_running()}/{pods * options.nproc_per_node} workers"
        if "training_done" in self.phases.marks:
            exited = sum(code is not None for code in self.exit_codes)
            parts = [f"training done, {workers} still running", f"{exited}/{pods} pods exited"]
        elif self.losses:
            parts = [f"training step {self.losses[-1][0]}/{options.steps}", f"{workers} running"]
        else:
            started = "bootstrapped" if options.routing else "ran train.sh"
            parts = [f"{len(self.node_rank_lines)}/{pods} pods {started}",
                     f"{len(self.joined)}/{pods} joined the rendezvous", f"{len(self.through)}/{pods} through it",
                     f"{workers} running"]
        elapsed = now - self.phases.marks.get("start", now)
        return f"waiting ({elapsed:.0f} s): " + ", ".join(parts)

    def start(self) -> None:
        from npu_job import podsim

        for index, spec_file in enumerate(self.prepared.spec_files):
            self.pods.append(podsim.start_pod(spec_file, prefix=self.prefix_of(index),
                                              user_namespace=self.user_namespace))
        self.phases.mark("pods_started")

    def kill(self, index: int) -> None:
        """SIGKILL one pod (a node failure); the restart policy then brings it back."""
        self.say(f"fault: killing pod {index} ({self.prepared.specs[index].name})")
        self.pods[index].kill()

    def _restart(self, index: int) -> None:
        from npu_job import podsim

        self.restarts[index] += 1
        self.joined.discard(index)
        self.through.discard(index)
        self.say(f"pod {index}: exited {self.pods[index].poll()}; restartPolicy OnFailure: "
                 f"restart {self.restarts[index]}/{self.prepared.options.max_restarts}")
        self.pods[index] = podsim.start_pod(self.prepared.spec_files[index], attempt=self.restarts[index],
                                            prefix=self.prefix_of(index), user_namespace=self.user_namespace)

    def poll_logs(self) -> None:
        for index, pod in enumerate(self.pods):
            log_file = pod.directory / "pod.log"
            try:
                with open(log_file, "rb") as handle:
                    handle.seek(self._offsets[index])
                    chunk = handle.read()
            except OSError:
                continue
            self._offsets[index] += len(chunk)
            text = self._partial[index] + chunk.decode("utf-8", "replace")
            lines = text.split("\n")
            self._partial[index] = lines.pop()
            for line in lines:
                self._on_line(index, line)

    def _on_line(self, index: int, line: str) -> None:
        from npu_job.podsim import SETUP_FAILED

        tail = self.log_tail[index]
        tail.append(line)
        del tail[:-40]
        if line.startswith(SETUP_FAILED) and self.setup_error is None:
            self.setup_error = f"pod {index}: {line[len(SETUP_FAILED):].strip()}"
        if index not in self.first_errors and _ERROR_LINE.search(line):
            self.first_errors[index] = line.strip()
        match = _NODE_RANK.search(line)
        if match:
            self.node_rank_lines[index] = line
            self.say(f"pod {index}: train.sh: node rank {match.group(1)} of {match.group(2)}, "
                     f"master {match.group(3)}")
            if len(self.node_rank_lines) == len(self.prepared.specs):
                self.phases.mark("bootstrap_done")
            return
        if _JOINED.search(line):
            self.joined.add(index)
            return
        if _ROUND_COMPLETE.search(line):
            self.through.add(index)
            if len(self.through) == len(self.prepared.specs):
                workers = len(self.prepared.specs) * self.prepared.options.nproc_per_node
                self.say(f"rendezvous: all {len(self.through)} nodes joined; starting {workers} workers")
            return
        match = _STEP.search(line)
        if match:
            step, total, loss = int(match.group(1)), int(match.group(2)), float(match.group(3))
            self.phases.mark("training_started")
            self.losses.append((step, loss))
            if step == 1 or step == total or step % max(1, total // 5) == 0:
                self.say(f"training: step {step}/{total} loss {loss:.4f}")
            return
        if "train_ddp: done" in line:  # its result is the CLI's closing line: not said twice
            self.phases.mark("training_done")
        elif "train_ddp:" in line and "FAILED" in line:
            self.say(f"pod {index}: {line.strip()}")

    def wait(self, *, until: Optional[Callable[[], bool]] = None) -> bool:
        """Supervise until every pod succeeded or gave up (or ``until()``); False on timeout."""
        deadline = self.phases.marks.get("start", time.monotonic()) + self.prepared.options.timeout
        restart_policy = self.prepared.specs[0].restart_policy
        while True:
            self.poll_logs()
            if until is not None and until():
                return True
            if self.setup_error is not None:
                self.stop()
                raise LaunchError(f"cannot start the pods: {self.setup_error}",
                                  tip="pods need mount, UTS and PID namespaces: run as root, or allow "
                                      "unprivileged user namespaces")
            running = False
            for index, pod in enumerate(self.pods):
                code = pod.poll()
                if code is None:
                    running = True
                elif code != 0 and restart_policy in ("OnFailure", "Always") \
                        and self.restarts[index] < self.prepared.options.max_restarts:
                    self._restart(index)
                    running = True
                else:
                    if self.exit_codes[index] is None:
                        elapsed = time.monotonic() - self.phases.marks.get("start", pod.started)
                        self.say(f"pod {index}: exited {code} at {elapsed:.1f} s")
                    self.exit_codes[index] = code
            if not running:
                self.poll_logs()
                self.phases.mark("pods_exited")
                return True
            self.heartbeat(time.monotonic())
            if time.monotonic() > deadline:
                self.say(f"timeout: the job did not finish within {self.prepared.options.timeout:.0f} s; "
                         "killing every pod")
                self.stop()
                return False
            time.sleep(0.1)

    def stop(self) -> None:
        for index, pod in enumerate(self.pods):
            pod.kill()
            self.exit_codes[index] = pod.poll()


def read_outcomes(prepared: Prepared, supervisor: Supervisor) -> Tuple[List[PodOutcome], List[Dict[str, Any]]]:
    """Each pod's bootstrap files (from its private /tmp) and every worker's report."""
    from npu_job.podfacts import MASTER_FILE, RANK_FILE, ROUTE_PLAN_FILE

    pods = []
    for index, spec_file in enumerate(prepared.spec_files):
        tmp = spec_file.parent / "tmp"
        route_plan = None
        if (tmp / ROUTE_PLAN_FILE).is_file():
            try:
                route_plan = json.loads((tmp / ROUTE_PLAN_FILE).read_text())
            except ValueError:
                route_plan = {"status": "unreadable"}
        pods.append(PodOutcome(
            index, supervisor.exit_codes[index], supervisor.restarts[index], route_plan,
            _read(tmp / RANK_FILE), _read(tmp / MASTER_FILE),
        ))
    reports = []
    for path in sorted((prepared.workspace / "shared" / "output" / "reports").glob("rank-*.json")):
        reports.append(json.loads(path.read_text()))
    return pods, reports


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


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
            "options": {k: getattr(self.options, k) for k in ("nodes", "nproc_per_node", "tors", "seed",
                                                            "steps", "routing")},
            "workspace": str(self.prepared.workspace),
            "plan": {
                "status": str(plan.status), "rank_mapping": plan.rank_mapping,
                "master_index": plan.master_index, "reasons": list(plan.reasons),
                "pods": [{"pod_index": pod, "node_rank": plan.node_rank_of_pod[pod], "tor": tors[pod],
                          "host_ip": self.prepared.specs[pod].host_ip} for pod in range(len(tors))],
            },
            "ring": None if self.score is None else {
                "cross_tor_edges_scheduler_order": self.score.cross_before,
                "cross_tor_edges_planned": self.score.cross_after,
                "lower_bound": self.score.lower_bound,
            },
            "pods": [{"pod_index": p.index, "exit_code": p.exit_code, "restarts": p.restarts,
                      "rank_after_acc": p.rank_after_acc, "master_index": p.master_index,
                      "route_plan_status": (p.route_plan or {}).get("status")} for p in self.pods],
            "workers": [{"rank": r.get("rank"), "pod_index": r.get("pod_index"),
                         "local_rank": r.get("local_rank"), "expected_rank": r.get("expected_rank"),
                         "host": r.get("host"), "ok": r.get("ok"), "start_step": r.get("start_step"),
                         "param_digest": r.get("param_digest")} for r in by_rank],
            "loss": {"train": [loss for _, loss in self.losses],
                     "eval_initial": by_rank[0].get("eval_loss_initial") if by_rank else None,
                     "eval_final": by_rank[0].get("eval_loss_final") if by_rank else None},
            "phases_s": self.phases.durations(),
            "problems": self.problems,
        }


def run(options: DemoOptions, workspace: Path, *, host_ips: Optional[Sequence[str]] = None,
        prefix_of: Callable[[int], Sequence[str]] = lambda index: (),
        progress: Callable[[str], None] = lambda line: None,
        fault: Optional[Callable[[Supervisor], None]] = None,
        user_namespace: Optional[bool] = None, phases: Optional[Phases] = None) -> DemoResult:
    """The whole pipeline; ``fault(supervisor)`` may inject a failure while the pods run.

    ``user_namespace=True`` runs the pods as an unprivileged user would (the default when not root).
    ``phases`` (marked "start" by a caller that started earlier) collects the phases' times.
    """
    phases = phases if phases is not None else Phases()
    phases.mark("start")
    ips = tuple(host_ips) if host_ips is not None else loopback_ips(options.nodes)
    prepared = prepare(options, workspace, ips)
    phases.mark("prepared")
    expect_routing = options.routing and options.deliver_rank_table and options.nodes >= 3
    describe_plan(prepared, progress)
    score = ring_score(prepared.cluster, prepared.plan) if expect_routing else None
    if score is not None:
        progress(f"cross-ToR ring edges: scheduler order {score.cross_before}, planned {score.cross_after}, "
                 f"lower bound {score.lower_bound}")
    supervisor = Supervisor(prepared, prefix_of=prefix_of, progress=progress, phases=phases,
                            user_namespace=user_namespace)
    progress(f"starting {options.nodes} pods x {options.nproc_per_node} workers "
             f"(workspace {workspace})")
    try:
        supervisor.start()
        if fault is not None:
            fault(supervisor)
        finished = supervisor.wait()
    finally:
        supervisor.stop()
    pods, reports = read_outcomes(prepared, supervisor)
    problems = check_outcome(prepared.plan, options, pods, reports, expect_routing=expect_routing)
    if problems and supervisor.first_errors:  # the first thing that went wrong, before its effects
        index, line = next(iter(supervisor.first_errors.items()))
        problems.insert(0, f"first error: pod {index}: {shown(line, 200)}")
    if not finished:
        problems.insert(0, f"the job did not finish within {options.timeout:.0f} s")
    if problems:
        for index, lines in supervisor.log_tail.items():
            if supervisor.exit_codes[index] not in (0, None) or not finished:
                for line in lines[-8:]:
                    log.debug("pod %d: %s", index, line)
    return DemoResult(options, prepared, score, pods, reports, problems, phases, supervisor.losses, finished)


def describe_plan(prepared: Prepared, progress: Callable[[str], None]) -> None:
    plan = prepared.plan
    options = prepared.options
    if not options.routing or not options.deliver_rank_table:
        why = "off (routing disabled)" if not options.routing else "none (no rank table delivered)"
        progress(f"route plan: {why}: every pod keeps the scheduler's order (node rank = VC_TASK_INDEX)")
        return
    tors = tor_of_pod(prepared.cluster)
    progress(f"route plan ({plan.status}): rank_mapping {plan.rank_mapping}; master = pod {plan.master_index}")
    for rank, pod in enumerate(plan.pod_of_node_rank):
        progress(f"  new rank {rank} <- pod {pod} ({prepared.specs[pod].name}, {prepared.specs[pod].host_ip}) "
                 f"on ToR {tors[pod]}")
    for reason in plan.reasons:
        progress(f"  reason: {reason}")


def keep_directory_problem(keep: Optional[str]) -> Optional[str]:
    """Why ``--keep DIR`` cannot hold a run (it must be new or empty), or None."""
    if keep:
        path = Path(keep).resolve()
        if path.exists() and not path.is_dir():
            return f"--keep {path}: not a directory"
        if path.exists() and any(path.iterdir()):
            return f"--keep {path}: the directory is not empty; choose a new one (the demo never overwrites one)"
    return None


def default_workspace(keep: Optional[str]) -> Tuple[Path, bool]:
    """(workspace, remove-after): ``--keep DIR`` or a fresh temporary directory."""
    if keep:
        problem = keep_directory_problem(keep)
        if problem is not None:
            raise InconsistentError(problem)
        path = Path(keep).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path, False
    return Path(tempfile.mkdtemp(prefix="npu-job-demo-")), True
