"""Running the demo: stage the pods, start and supervise them, read what they left (the edge).

:func:`run` is the whole pipeline: :func:`prepare` simulates the cluster and renders the job
(``scenario``), turns the manifest into pod specs (``podspec``) and stages each pod on disk
(``podsim``); a :class:`Supervisor` starts the pods like a kubelet with ``restartPolicy:
OnFailure``, follows their logs and says how far they got; :func:`read_outcomes` collects each
pod's bootstrap files and every worker's report for ``checks.check_outcome``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from npu_job.errors import InconsistentError, LaunchError, shown
from npu_job.podfacts import MASTER_FILE, RANK_FILE, RANK_TABLE_NAME, ROUTE_PLAN_FILE
from npu_job.polling import Backoff, poll

from . import podspec
from .checks import (
    DemoResult,
    Phases,
    PodOutcome,
    Prepared,
    bundle_identity,
    check_outcome,
    describe_plan,
    expect_routing,
    expected_plan,
    ring_score,
)
from .podlog import first_line, read_pod_line
from .scenario import (
    EXAMPLE_SCRIPT,
    INITIALIZING_RANK_TABLE,
    INPUT_FILES,
    JOB_NAME,
    RANK_TABLE_DIR,
    ClusterAPI,
    DemoOptions,
    SimulatedCluster,
    cluster_objects,
    controller_rank_table,
    demo_spec_values,
    filled_by_the_controller,
    loopback_ips,
    manifest_documents,
    render_job,
    rendered_pods,
    simulated_cluster,
    user_configmaps,
)

log = logging.getLogger(__name__)
# podsim is imported where pods are staged or started, not here: every pod runs
# ``python -m npu_job.demo.podsim``, which imports this package (npu_job.demo imports this module)
# first, and runpy warns in each pod when the module it runs was imported before.

PROGRESS_EVERY = (
    5.0  # seconds without a progress line before the supervisor says where the pods are
)
SUPERVISE_POLL = Backoff.fixed(0.1)  # the supervisor looks at the pods and their logs this often


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
        raise LaunchError(
            f"npu_job/examples/{EXAMPLE_SCRIPT}: the demo's example script is missing ({error})",
            tip="reinstall npu-job (the wheel ships it as package data)",
        ) from None


def write_cluster_inputs(cluster: SimulatedCluster, directory: Path) -> Tuple[Path, ...]:
    """The cluster's rank table and ranktable_tor.json as CCE delivers them (:data:`INPUT_FILES`),
    under ``directory``: the inputs of ``npu-job plan`` and ``npu-job bootstrap``."""
    from npu_job.fileio import write_atomic

    texts = (cluster.rank_table_json, cluster.ranktable_tor_b64)
    return tuple(
        write_atomic(directory / name, text, durable=False)
        for name, text in zip(INPUT_FILES, texts)
    )


def prepare(
    options: DemoOptions, workspace: Path, host_ips: Sequence[str], api: Optional[ClusterAPI] = None
) -> Prepared:
    """Simulate the cluster, render the job and stage every pod under ``workspace``; ``api``:
    the Kubernetes API the pods of a ``routing_source="api"`` run reach (it must serve
    :func:`~npu_job.demo.scenario.cluster_objects` of this run, written to
    ``cluster/cluster.json``)."""
    import yaml

    from . import images, podsim

    workspace.mkdir(parents=True, exist_ok=True)
    shared = workspace / "shared"
    (shared / "code").mkdir(parents=True, exist_ok=True)
    (shared / "output").mkdir(parents=True, exist_ok=True)
    (shared / "code" / EXAMPLE_SCRIPT).write_bytes(example_script())
    values = demo_spec_values(options, free_port(), str(shared.resolve()))
    rendered = render_job(values)
    pods = rendered_pods(rendered)
    cluster = simulated_cluster(options, host_ips, [pod.name for pod in pods])
    from npu_job.fileio import write_atomic

    for name, data, mode in rendered.files():  # the bundle is bytes
        write_atomic(workspace / "rendered" / name, data, mode, durable=False)
    documents = manifest_documents(rendered)
    template = pods[0].template
    cluster_files: Dict[str, str] = {}
    # CCE's rank table comes with the Volcano Job's configmap1980 plugin (no other kind has one)
    job = yaml.safe_load(rendered.job.text)
    plugins = (job.get("spec") or {}).get("plugins") or {}
    pod_annotations = (template.get("metadata") or {}).get("annotations") or {}
    if "configmap1980" in plugins and options.deliver_rank_table:
        cluster_files = podspec.cce_cluster_files(
            cluster.rank_table_json,
            cluster.ranktable_tor_b64 if "cabinet" in pod_annotations else None,
        )
    write_cluster_inputs(cluster, workspace / "cluster")
    if options.deliver_rank_table:  # the controller's own rank table, where the kind has one
        documents = filled_by_the_controller(documents, rendered.spec.job_kind, cluster)
    mounted = {
        (volume.get("configMap") or {}).get("name")
        for volume in (template.get("spec") or {}).get("volumes") or []
    }
    for name, configmap in user_configmaps(cluster).items():
        if name in mounted:  # the job mounts its user's own ConfigMap: apply it with the job
            (workspace / "cluster" / f"{name}-configmap.json").write_text(
                json.dumps(configmap, indent=1) + "\n"
            )
            documents.append(configmap)
    objects = None
    cluster_env: Dict[str, str] = {}
    if options.routing_source == "api":
        if api is None:
            raise ValueError("routing_source 'api' needs the Kubernetes API the pods reach (api=)")
        objects = cluster_objects(cluster, host_ips, api.namespace, pods=pods)
        listed = [
            {"kind": kind, "apiVersion": version, **item}
            for kind, version, key in (
                ("HyperNode", "topology.volcano.sh/v1alpha1", "hypernodes"),
                ("Node", "v1", "nodes"),
                ("Pod", "v1", "pods"),
            )
            for item in objects[key]
        ]
        (workspace / "cluster" / "cluster.json").write_text(
            json.dumps(  # npu-job plan --pods ...
                {"apiVersion": "v1", "kind": "List", "items": listed}, indent=1
            )
            + "\n"
        )
        cluster_files.update(api.pod_files())
        cluster_env = api.pod_env()
    image = images.make_image(options.image, workspace / "image", os.environ)
    specs = podspec.pod_specs(
        documents,
        host_ips,
        image_env=image.env,
        image_paths=image.paths,
        cluster_files=cluster_files,
        cluster_env=cluster_env,
    )
    spec_files = tuple(podsim.stage_pod(spec, workspace / "pods" / spec.name) for spec in specs)
    filled = controller_rank_table(rendered.spec.job_kind, JOB_NAME)
    held_back = f"{RANK_TABLE_DIR}/{RANK_TABLE_NAME}" if filled is None else filled[2]
    for index in options.initializing_on:  # their node has not had the filled-in table yet
        staged = podsim.staged_file(specs[index], spec_files[index].parent, held_back)
        if staged is None:
            raise ValueError(f"initializing_on: pod {index} is given no rank table to hold back")
        write_atomic(staged, INITIALIZING_RANK_TABLE, durable=False)
    return Prepared(
        options,
        workspace,
        cluster,
        expected_plan(cluster, options, objects),
        rendered,
        specs,
        spec_files,
        image,
    )


class Supervisor:
    """Runs the staged pods like a kubelet with ``restartPolicy: OnFailure``, and watches their logs
    (saying how far the pods got when nothing else was said for :data:`PROGRESS_EVERY` seconds)."""

    def __init__(
        self,
        prepared: Prepared,
        *,
        prefix_of: Callable[[int], Sequence[str]] = lambda index: (),
        progress: Callable[[str], None] = lambda line: None,
        phases: Optional[Phases] = None,
        user_namespace: Optional[bool] = None,
    ) -> None:
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
        self.first_errors: Dict[
            int, str
        ] = {}  # pod index -> its first error line, in the order seen
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
        """Workers alive in the pods: ``python [options] SCRIPT ...`` (npu-run's children)."""
        from . import podsim

        count = 0
        for pid in podsim.processes_inside(self.prepared.workspace / "pods"):
            try:
                argv = (
                    Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
                )
            except OSError:
                continue
            program = next((arg for arg in argv[1:] if not arg.startswith("-")), "")
            count += Path(program).name == EXAMPLE_SCRIPT
        return count

    def status(self, now: float) -> str:
        """One line: how far the pods got, from their logs (and how many workers run)."""
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
            parts = [
                f"{len(self.node_rank_lines)}/{pods} pods {started}",
                f"{len(self.joined)}/{pods} joined the rendezvous",
                f"{len(self.through)}/{pods} through it",
                f"{workers} running",
            ]
        elapsed = now - self.phases.marks.get("start", now)
        return f"waiting ({elapsed:.0f} s): " + ", ".join(parts)

    def start(self) -> None:
        from . import podsim

        for index, spec_file in enumerate(self.prepared.spec_files):
            self.pods.append(
                podsim.start_pod(
                    spec_file, prefix=self.prefix_of(index), user_namespace=self.user_namespace
                )
            )
        self.phases.mark("pods_started")

    def kill(self, index: int) -> None:
        """SIGKILL one pod (a node failure); the restart policy then brings it back."""
        self.say(f"fault: killing pod {index} ({self.prepared.specs[index].name})")
        self.pods[index].kill()

    def sync_volumes(self, index: int) -> None:
        """The kubelet's sync of one pod's ConfigMap volumes: they take the ConfigMaps' content
        (a held-back rank table of ``initializing_on`` becomes the filled-in one)."""
        from . import podsim

        self.say(f"pod {index}: the kubelet syncs its ConfigMap volumes")
        podsim.stage_volumes(self.prepared.specs[index], self.prepared.spec_files[index].parent)

    def _restart(self, index: int) -> None:
        from . import podsim

        self.restarts[index] += 1
        self.joined.discard(index)
        self.through.discard(index)
        self.say(
            f"pod {index}: exited {self.pods[index].poll()}; restartPolicy OnFailure: "
            f"restart {self.restarts[index]}/{self.prepared.options.max_restarts}"
        )
        self.pods[index] = podsim.start_pod(
            self.prepared.spec_files[index],
            attempt=self.restarts[index],
            prefix=self.prefix_of(index),
            user_namespace=self.user_namespace,
        )

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
        tail = self.log_tail[index]
        tail.append(line)
        del tail[:-40]
        seen = read_pod_line(line)
        if seen.setup_failed is not None and self.setup_error is None:
            self.setup_error = f"pod {index}: {seen.setup_failed}"
        if index not in self.first_errors and seen.error:
            self.first_errors[index] = line.strip()
        if seen.node_rank is not None:
            rank, nodes, master = seen.node_rank
            self.node_rank_lines[index] = line
            self.say(f"pod {index}: train.sh: node rank {rank} of {nodes}, master {master}")
            if len(self.node_rank_lines) == len(self.prepared.specs):
                self.phases.mark("bootstrap_done")
        elif seen.joined:
            self.joined.add(index)
        elif seen.round_complete:
            self.through.add(index)
            if len(self.through) == len(self.prepared.specs):
                workers = len(self.prepared.specs) * self.prepared.options.nproc_per_node
                self.say(
                    f"rendezvous: all {len(self.through)} nodes joined; starting {workers} workers"
                )
        elif seen.step is not None:
            step, total, loss = seen.step
            self.phases.mark("training_started")
            self.losses.append((step, loss))
            if step == 1 or step == total or step % max(1, total // 5) == 0:
                self.say(f"training: step {step}/{total} loss {loss:.4f}")
        elif seen.done:  # its result is the CLI's closing line: not said twice
            self.phases.mark("training_done")
        elif seen.failed:
            self.say(f"pod {index}: {line.strip()}")

    def wait(self, *, until: Optional[Callable[[], bool]] = None) -> bool:
        """Supervise until every pod succeeded or gave up (or ``until()``); False on timeout.

        The timeout counts from the start of the pods; between looks, a progress line when
        nothing was said for a while (:meth:`heartbeat`).
        """
        deadline = self.phases.marks.get("start", time.monotonic()) + self.prepared.options.timeout
        finished = poll(
            lambda: self._look(until),
            deadline - time.monotonic(),
            SUPERVISE_POLL,
            tick=lambda elapsed: self.heartbeat(time.monotonic()),
        )
        if finished is None:
            self.say(
                f"timeout: the job did not finish within {self.prepared.options.timeout:.0f} "
                "s; killing every pod"
            )
            self.stop()
            return False
        return True

    def _look(self, until: Optional[Callable[[], bool]]) -> Optional[bool]:
        """One look at the pods: True once every pod is done (or ``until()``), else None;
        a failed pod is restarted as its restart policy says."""
        self.poll_logs()
        if until is not None and until():
            return True
        if self.setup_error is not None:
            self.stop()
            raise LaunchError(
                f"cannot start the pods: {self.setup_error}",
                tip="pods need mount, UTS and PID namespaces: run as root, or allow "
                "unprivileged user namespaces",
            )
        restart_policy = self.prepared.specs[0].restart_policy
        running = False
        for index, pod in enumerate(self.pods):
            code = pod.poll()
            if code is None:
                running = True
            elif (
                code != 0
                and restart_policy in ("OnFailure", "Always")
                and self.restarts[index] < self.prepared.options.max_restarts
            ):
                self._restart(index)
                running = True
            else:
                if self.exit_codes[index] is None:
                    elapsed = time.monotonic() - self.phases.marks.get("start", pod.started)
                    self.say(f"pod {index}: exited {code} at {elapsed:.1f} s")
                self.exit_codes[index] = code
        if running:
            return None
        self.poll_logs()
        self.phases.mark("pods_exited")
        return True

    def stop(self) -> None:
        for index, pod in enumerate(self.pods):
            pod.kill()
            self.exit_codes[index] = pod.poll()


def read_outcomes(
    prepared: Prepared, supervisor: Supervisor
) -> Tuple[List[PodOutcome], List[Dict[str, Any]]]:
    """Each pod's bootstrap files (from its private /tmp) and every worker's report."""
    pods = []
    for index, spec_file in enumerate(prepared.spec_files):
        restarts = supervisor.restarts[index]
        tmp = spec_file.parent / "tmp"
        route_plan = None
        if (tmp / ROUTE_PLAN_FILE).is_file():
            try:
                route_plan = json.loads((tmp / ROUTE_PLAN_FILE).read_text())
            except ValueError:
                route_plan = {"status": "unreadable"}
        pods.append(
            PodOutcome(
                index,
                supervisor.exit_codes[index],
                restarts,
                route_plan,
                _read(tmp / RANK_FILE),
                _read(tmp / MASTER_FILE),
                first_line(
                    _read_log(spec_file.parent / "pod.log"), prepared.specs[index].name, restarts
                ),
            )
        )
    reports = []
    for path in sorted((prepared.workspace / "shared" / "output" / "reports").glob("rank-*.json")):
        reports.append(json.loads(path.read_text()))
    return pods, reports


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def run(
    options: DemoOptions,
    workspace: Path,
    *,
    host_ips: Optional[Sequence[str]] = None,
    prefix_of: Callable[[int], Sequence[str]] = lambda index: (),
    progress: Callable[[str], None] = lambda line: None,
    fault: Optional[Callable[[Supervisor], None]] = None,
    user_namespace: Optional[bool] = None,
    phases: Optional[Phases] = None,
    api: Optional[ClusterAPI] = None,
) -> DemoResult:
    """The whole pipeline; ``fault(supervisor)`` may inject a failure while the pods run.

    ``user_namespace=True`` runs the pods as an unprivileged user would (the default when not root).
    ``phases`` (marked "start" by a caller that started earlier) collects the phases' times.
    """
    phases = phases if phases is not None else Phases()
    phases.mark("start")
    ips = tuple(host_ips) if host_ips is not None else loopback_ips(options.nodes)
    prepared = prepare(options, workspace, ips, api)
    phases.mark("prepared")
    routed = expect_routing(options)
    describe_plan(prepared, progress)
    score = ring_score(prepared.cluster, prepared.plan) if routed else None
    if score is not None:
        progress(
            f"cross-ToR ring edges: scheduler order {score.cross_before}, planned "
            f"{score.cross_after}, lower bound {score.lower_bound}"
        )
    supervisor = Supervisor(
        prepared,
        prefix_of=prefix_of,
        progress=progress,
        phases=phases,
        user_namespace=user_namespace,
    )
    progress(f"image ({options.image}): {prepared.image.description}")
    progress(
        f"starting {options.nodes} pods x {options.nproc_per_node} workers (workspace {workspace})"
    )
    try:
        supervisor.start()
        if fault is not None:
            fault(supervisor)
        finished = supervisor.wait()
    finally:
        supervisor.stop()
    pods, reports = read_outcomes(prepared, supervisor)
    bundle = prepared.rendered.bundle
    identity = bundle_identity(bundle) if options.routing and bundle is not None else None
    problems = check_outcome(
        prepared.plan, options, pods, reports, expect_routing=routed, identity=identity
    )
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
    return DemoResult(
        options, prepared, score, pods, reports, problems, phases, supervisor.losses, finished
    )


def keep_directory_problem(keep: Optional[str]) -> Optional[str]:
    """Why ``--keep DIR`` cannot hold a run (it must be new or empty), or None."""
    if keep:
        path = Path(keep).resolve()
        if path.exists() and not path.is_dir():
            return f"--keep {path}: not a directory"
        if path.exists() and any(path.iterdir()):
            return (
                f"--keep {path}: the directory is not empty; choose a new one "
                "(the demo never overwrites one)"
            )
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
