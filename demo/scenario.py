"""What the demo runs: its options, the simulated cluster and the job spec (pure).

The demo (``npu-job demo`` and the pod-level end-to-end tests) runs the whole npu-job chain on one
machine. The chain is the real one; only the cluster is simulated. Values in, values out; this
module owns the first two steps, the other modules of :mod:`npu_job.demo` the rest:

1. **cluster** (:func:`simulated_cluster`): a CCE-format rank table and ``ranktable_tor.json``
   from the planner's synthetic generator, with the scheduler's pod order scattered over the ToRs
   and every ``server_id`` set to the address the pod will have here (what ``status.hostIP``
   gives, matched by the bootstrap against ``MA_CURRENT_HOST_IP``); for a job routed by the API,
   what the Kubernetes API holds (:func:`cluster_objects`);
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
   what a line of a pod's log says is read by ``podlog``;
4. **checks**: what every pod must arrive at and whether it did, in ``checks``.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from npu_job.bootstrap.options import TOPOLOGY_ENV
from npu_job.kinds import DEFAULT, KINDS
from npu_job.kinds.base import ControllerPod, JobKind

from npu_job.podfacts import (
    DEFAULT_RANK_TABLES,
    RANK_TABLE_ENV,
    RANK_TABLE_NAME,
    RANKTABLE_TOR_NAME,
)

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
#: the switch topology of a job whose controller fills a rank table but delivers no ToR file
#: (AscendJob): the user's own ``ranktable_tor.json``, mounted there and named by TOPOLOGY_ENV
TOPOLOGY_CONFIGMAP = f"{JOB_NAME}-topology"
TOPOLOGY_DIR = "/user/topology"
DEVICES = ("cpu", "npu")
ROUTING_SOURCES = ("rank-table", "api")  # the job's own rank table (CCE's on npu), or the pods
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the kubelet mounts it
LOOPBACK_BASE = "127.0.0."  # pod k gets 127.0.0.(10+k): all of 127/8 is local on Linux
# What the pods' image holds (``images.make_image`` makes them): python3 with torch and no
# npu-job; the same with a CPython 3.7 python3 and torch in another interpreter; this installation
STOCK_IMAGE, STOCK_PY37_IMAGE, INSTALLED_IMAGE = "stock", "stock-py37", "installed"
IMAGES = (STOCK_IMAGE, STOCK_PY37_IMAGE, INSTALLED_IMAGE)


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
    # a pod whose host the delivered rank table leaves out (a table one server short of the job:
    # every pod must refuse it alike and keep the scheduler's order); None: every pod is listed
    unlisted_pod: Optional[int] = None
    # pods whose mounted rank table still says "initializing" until the caller syncs their volumes
    # (Supervisor.sync_volumes, as the kubelet would, up to a minute late): at their deadline they
    # fall back while the others plan
    initializing_on: Tuple[int, ...] = ()
    device: str = "cpu"  # "npu": render the NPU job (CCE's configmap1980 delivers the rank table)
    checkpoint_every: int = 0  # >0: train_ddp checkpoints to the shared volume (resume after kill)
    step_delay: float = 0.0
    timeout: float = 240.0  # the whole run, seconds; past it every pod is killed
    max_restarts: int = 2  # OnFailure container restarts per pod before the run counts as failed
    # "api": no rank table; each pod's bootstrap lists the job's pods, the cluster's Nodes and its
    # HyperNodes from a Kubernetes API the caller serves (run(..., api=ClusterAPI(...)))
    routing_source: str = "rank-table"
    image: str = STOCK_IMAGE  # one of IMAGES: what software the pods' image holds
    kind: str = DEFAULT  # the job kind rendered and simulated (npu_job.kinds.KINDS)
    probe: Union[bool, int] = False  # the spec key probe: npu-run --probe (int: its seconds)

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
        if self.image not in IMAGES:
            raise ValueError(f"image must be one of {', '.join(IMAGES)}, got {self.image!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(sorted(KINDS))}, got {self.kind!r}")
        if self.routing and self.deliver_rank_table and not 1 <= self.tors <= self.nodes:
            raise ValueError(f"tors must be within 1..nodes ({self.nodes}), got {self.tors}")
        if any(not 0 <= index < self.nodes for index in self.initializing_on):
            raise ValueError(
                f"initializing_on must hold pod indices below {self.nodes}, "
                f"got {self.initializing_on}"
            )
        if self.unlisted_pod is not None and not 0 <= self.unlisted_pod < self.nodes:
            raise ValueError(
                f"unlisted_pod must be a pod index below {self.nodes}, got {self.unlisted_pod}"
            )


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

    # npu_job.bootstrap.base.model.RankTable, as the pods will read it (every pod's server)
    table: Any
    # npu_job.bootstrap.base.model.Topology, as the pods will read it (no slots in CCE's format)
    topology: Any
    rank_table_json: str
    ranktable_tor_b64: str


INPUT_FILES = (RANK_TABLE_NAME, RANKTABLE_TOR_NAME)  # what CCE mounts at /user/config
#: what a rank table says before the platform fills it in
INITIALIZING_RANK_TABLE = '{"status": "initializing"}\n'


def loopback_ips(count: int) -> Tuple[str, ...]:
    if count > 240:
        raise ValueError("at most 240 loopback pods")
    return tuple(f"{LOOPBACK_BASE}{10 + index}" for index in range(count))


def demo_device(kind: str) -> str:
    """The device the demo's job asks for: ``cpu`` (this machine's), or ``npu`` for a kind whose
    controller runs NPU pods only (AscendJob), whose workers fall back to gloo here."""
    return "cpu" if "cpu" in KINDS[kind].devices else "npu"


def controller_rank_table(kind: JobKind, job: str) -> Optional[Tuple[str, str, str]]:
    """``(ConfigMap, key, path in the pod)`` of the rank table the kind's controller fills for the
    job once every pod has its devices (AscendJob's ``rings-config-<job>``), None for a kind
    without one."""
    names = {posixpath.basename(path) for path in DEFAULT_RANK_TABLES}
    for mount in kind.configmap_mounts:
        for key, _ in mount.data:
            if key in names:
                return mount.name_for(job), key, posixpath.join(mount.path, key)
    return None


def simulated_cluster(
    options: DemoOptions, host_ips: Sequence[str], pod_names: Sequence[str] = ()
) -> SimulatedCluster:
    """A CCE cluster for ``options`` whose server ids are the pods' host addresses (pure); its
    files name pod k ``pod_names[k]`` (by default as a Volcano Job's task ``worker`` names it)."""
    from .synthetic import synthetic_cluster

    tors = min(max(1, options.tors), options.nodes)
    table, topology = synthetic_cluster(
        options.nodes,
        tors,
        npus_per_node=options.nproc_per_node,
        seed=options.seed,
        job_name=JOB_NAME,
        scatter=True,
    )
    cluster = cce_cluster(table, topology, host_ips, pod_names)
    if options.unlisted_pod is None:
        return cluster
    return replace(cluster, rank_table_json=_without_server(cluster.table, options.unlisted_pod))


def _without_server(table: Any, pod_index: int) -> str:
    """The rank table's text without pod ``pod_index``'s server (one server short of the job)."""
    from npu_job.bootstrap.ranktable import rank_table_document

    listed = tuple(server for server in table.servers if server.pod_index != pod_index)
    return json.dumps(rank_table_document(replace(table, servers=listed)), indent=1) + "\n"


def cce_cluster(
    table: Any, topology: Any, host_ips: Sequence[str], pod_names: Sequence[str] = ()
) -> SimulatedCluster:
    """A generated ``(table, topology)`` as CCE delivers it to pods at ``host_ips`` named
    ``pod_names`` (by default a Volcano Job's) (pure): every ``server_id`` becomes its pod's
    address, then the rank table and ``ranktable_tor.json`` are encoded and read back with the
    bootstrap's own readers."""

    def pod_name(index: int) -> str:
        return pod_names[index] if pod_names else f"{JOB_NAME}-{TASK_NAME}-{index}"

    from npu_job.bootstrap.base.model import Placement, Topology
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
            # the pod's own address, where the table gives one (MindX's hccl.json does): here
            # every pod has its host's
            container_ip=None if server.container_ip is None else renamed[server.server_id],
            pod_name=pod_name(server.pod_index),
        )
        for server in table.servers
    )
    table = replace(table, servers=servers)
    placements: Dict[str, Placement] = {
        renamed[sid]: placement for sid, placement in topology.placements.items()
    }
    topology = Topology(placements, source=topology.source)
    rank_table = json.dumps(rank_table_document(table), indent=1, sort_keys=True) + "\n"
    tor = encode_ranktable_tor(table, topology, pod_name)
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
        "kind": options.kind,
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
    if options.probe is not False:
        values["probe"] = options.probe
    if options.routing_source == "api":
        values["routing_source"] = "api"  # no rank table: the job's pods from the API
        values["anti_affinity"] = True  # one pod per node, as routing needs
    by_rank_table = options.routing and options.routing_source != "api"
    if by_rank_table and controller_rank_table(KINDS[options.kind], JOB_NAME) is not None:
        # the controller's rank table (AscendJob's hccl.json) brings no switch topology: the
        # user's ranktable_tor.json, named by NPU_JOB_TOPOLOGY, in a ConfigMap they apply
        values["routing_source"] = "rank-table"
        env[TOPOLOGY_ENV] = f"{TOPOLOGY_DIR}/{RANKTABLE_TOR_NAME}"
        volumes.append({"name": "topology", "configMap": {"name": TOPOLOGY_CONFIGMAP}})
        mounts.append({"name": "topology", "mountPath": TOPOLOGY_DIR, "readOnly": True})
    if options.device == "npu":
        values["full_node_npus"] = options.nproc_per_node  # the simulated nodes are this small
    elif by_rank_table and options.deliver_rank_table:
        env[RANK_TABLE_ENV] = f"{RANK_TABLE_DIR}/{RANK_TABLE_NAME}"
        volumes.append({"name": "ranktable", "configMap": {"name": RANK_TABLE_CONFIGMAP}})
        mounts.append({"name": "ranktable", "mountPath": RANK_TABLE_DIR, "readOnly": True})
    # what the kind cannot honour is left to its defaults (the task name is the default's anyway)
    refused = {key for key, _ in KINDS[options.kind].refused_keys}
    return {key: value for key, value in values.items() if key not in refused}


def user_configmaps(cluster: SimulatedCluster) -> Dict[str, Dict[str, Any]]:
    """name -> the ConfigMap a job's user creates beside the job, for the demo's jobs that mount
    it: a CPU job's rank table and ToR file (``kubectl create configmap demo-ranktable
    --from-file=jobstart_hccl.json --from-file=ranktable_tor.json``), and the ToR file alone of a
    job whose controller fills its rank table (``demo-topology``)."""
    contents = {
        RANK_TABLE_CONFIGMAP: {
            RANK_TABLE_NAME: cluster.rank_table_json,
            RANKTABLE_TOR_NAME: cluster.ranktable_tor_b64,
        },
        TOPOLOGY_CONFIGMAP: {RANKTABLE_TOR_NAME: cluster.ranktable_tor_b64},
    }
    return {
        name: {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"},
            "data": data,
        }
        for name, data in contents.items()
    }


def filled_by_the_controller(
    documents: Sequence[Any], kind: JobKind, cluster: SimulatedCluster
) -> List[Any]:
    """``documents`` (the rendered stream) with the rank table the kind's controller fills once
    every pod has its devices (AscendJob's ascend-operator: ``hccl.json``, v1.0, servers in rank
    order, in ``rings-config-<job>``) filled with the simulated cluster's; as they were for a kind
    without one."""
    filled = controller_rank_table(kind, JOB_NAME)
    if filled is None:
        return list(documents)
    configmap, key, _ = filled
    return [
        {**doc, "data": {**(doc.get("data") or {}), key: cluster.rank_table_json}}
        if isinstance(doc, dict)
        and doc.get("kind") == "ConfigMap"
        and (doc.get("metadata") or {}).get("name") == configmap
        else doc
        for doc in documents
    ]


def render_job(values: Mapping[str, Any]) -> Any:
    """``values`` through npu-job render's validation and templates -> ``RenderedJob``."""
    from npu_job.render.render import render
    from npu_job.render.spec import validate
    from npu_job.render.values import SpecInput, merge_values

    return render(validate(merge_values([SpecInput(source="demo spec", values=dict(values))])))


def manifest_documents(rendered: Any) -> List[Any]:
    import yaml

    return [doc for doc in yaml.safe_load_all(rendered.stream()) if doc]


def rendered_pods(rendered: Any) -> Tuple[ControllerPod, ...]:
    """The pods the kind's controller makes of a rendered job (``RenderedJob``)."""
    return rendered.spec.job_kind.stream_pods(manifest_documents(rendered), rendered.job.source)


def job_pods(options: DemoOptions) -> Tuple[ControllerPod, ...]:
    """The pods the kind's controller makes of the job a run with ``options`` renders, before the
    run (the master port and the shared directory, placeholders here, change none of them): what
    a test serves from the Kubernetes API before it starts the run."""
    return rendered_pods(render_job(demo_spec_values(options, 29500, "/job")))


def node_name(host_ip: str) -> str:
    """The node a pod on ``host_ip`` runs on (``spec.nodeName``, as podspec resolves it)."""
    return f"node-{host_ip}"


def cluster_objects(
    cluster: SimulatedCluster,
    host_ips: Sequence[str],
    namespace: str = "default",
    *,
    pods: Sequence[ControllerPod],
) -> Dict[str, List[Dict[str, Any]]]:
    """What the Kubernetes API holds once the scheduler placed the job (pure): its ``pods`` as the
    kind's controller made them (:func:`job_pods`, :func:`rendered_pods`: names, labels and
    annotations, container names) on their nodes and host IPs, the Nodes, and the HyperNodes of
    the simulated fabric: one per ToR (tier 1) holding its nodes by ``exactMatch``, all under one
    spine (tier 2), as Volcano's label discovery writes them."""
    if len(pods) != len(host_ips):
        raise ValueError(f"{len(pods)} pods for {len(host_ips)} host addresses")
    listed, nodes = [], []
    for pod, ip in zip(pods, host_ips):
        containers = (pod.template.get("spec") or {}).get("containers") or []
        listed.append(
            {
                "metadata": {
                    "name": pod.name,
                    "namespace": namespace,
                    "labels": dict(pod.labels),
                    "annotations": dict(pod.annotations),
                },
                "spec": {
                    "nodeName": node_name(ip),
                    "containers": [
                        {"name": container.get("name"), "resources": {}} for container in containers
                    ],
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
    return {"pods": listed, "nodes": nodes, "hypernodes": hypernodes}
