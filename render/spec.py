"""The job spec: its key table, validation into a frozen :class:`JobSpec`, and its warnings.

Each key is declared once, in :data:`SPEC_KEYS`: a :class:`KeySpec` gives its name, its type
(how a value is read and checked, ``--set`` values included: see ``checks.py``), its default
(one value, one per device where it differs, or one derived from other keys), its meaning and,
where ``null`` means more than "the default", what it means. That table drives

* validation (:func:`validate`): the required keys, unknown keys with a did-you-mean, and each
  key's type in table order (``device`` first: other keys' rules depend on it);
* the defaults (:func:`with_defaults`), the dataclasses' defaults among them;
* the README's key table (:func:`spec_keys_markdown`; a test keeps the README equal to it).

``validate(merged)`` walks the merged values (see ``values.py``) once and collects *every*
problem with its key path before raising one :class:`~npu_job.errors.SpecError` (exit 5):
unknown keys, wrong types, out-of-range values, missing required keys, invalid Kubernetes names
(rejected with the rule, never rewritten), and rules across keys (ports that collide, mounts of
undeclared volumes, pod names too long for a hostname).

The validator is a small explicit one rather than JSON Schema: the messages must name the key,
the value and the fix, the cross-key rules need code anyway, and it keeps render free of a
runtime dependency the package does not otherwise need.

What is valid but will disappoint (routing with fewer than 3 nodes, part of a node, a launcher
option that assigns ranks by arrival) is ``lint``'s: its warnings travel in
:attr:`JobSpec.warnings`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from npu_job.render.checks import (
    ABSOLUTE_PATH,
    DNS_LABEL,
    DNS_LABEL_RULE,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_RULE,
    Checker,
    Choice,
    Flag,
    Integer,
    KeyType,
    Mounts,
    PerDevice,
    Quantity,
    Text,
    TextList,
    TextMap,
    Volumes,
    per_device,
)
from npu_job.render.lint import brings_a_rank_table, spec_warnings
from npu_job.render.values import MergedValues

from npu_job.errors import SpecError
from npu_job.podfacts import FULL_NODE_ENV, MIN_NODES, RANK_ENV, TASK_INDEX_ENV

# --- constants the templates and validation share ---------------------------------------------

DEVICES = ("npu", "gpu", "cpu")
#: where a routed job's servers come from: the rank table (CCE's, or the job's own), or the job's
#: pods from the Kubernetes API (the bootstrap's NPU_JOB_PODS=k8s); auto: the API for a gpu/cpu
#: job that brings no rank table
ROUTING_SOURCES = ("auto", "rank-table", "api")
NETWORK_TOPOLOGY_MODES = ("hard", "soft")  # Volcano Job spec.networkTopology.mode
LAUNCHERS = ("npu-run", "torchrun", "torch.distributed.launch")
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
#: resource name per device (None: no accelerator is requested)
DEVICE_RESOURCE = {"npu": "huawei.com/ascend-1980", "gpu": "nvidia.com/gpu", "cpu": None}
#: accelerators of a full ascend-1980 node (Atlas A3 super-pod nodes have 16 and set
#: ``full_node_npus``); with routing on, a pod with fewer keeps the scheduler's order
FULL_NODE_NPUS = 8
MAX_NODE_ACCELERATORS = 16
HCCL_PORT_COUNT = 16  # HCCL uses HCCL_IF_BASE_PORT .. +15

#: host paths every NPU pod mounts (volume name, host path), as the platform's examples do
NPU_HOST_MOUNTS: Tuple[Tuple[str, str], ...] = (
    ("ascend-driver", "/usr/local/Ascend/driver"),
    ("ascend-add-ons", "/usr/local/Ascend/add-ons"),
    ("localtime", "/etc/localtime"),
    ("hccn-conf", "/etc/hccn.conf"),
    ("npu-smi", "/usr/local/sbin/npu-smi"),
)
SCRIPTS_VOLUME = "npu-job-scripts"
SHM_VOLUME = "dshm"
RESERVED_VOLUMES = frozenset({SCRIPTS_VOLUME, SHM_VOLUME} | {name for name, _ in NPU_HOST_MOUNTS})

#: env names npu-job sets itself, and what to use instead
RESERVED_ENV: Mapping[str, str] = {
    "MA_CURRENT_HOST_IP": "set by npu-job from the pod's status.hostIP",
    "MA_NUM_GPUS": "set by npu-job from npus_per_node",
    "MA_NUM_HOSTS": "set by npu-job from nodes",
    "MA_VJ_NAME": "set by npu-job from the volcano.sh/job-name annotation",
    "MA_TASK_NAME": "set by npu-job from the volcano.sh/task-spec annotation",
    "MA_MASTER_INDEX": "set by the pod command from the bootstrap's /tmp/MASTER_INDEX",
    RANK_ENV: "set by the pod command from the bootstrap's /tmp/RANK_AFTER_ACC",
    TASK_INDEX_ENV: "set by Volcano's env plugin",
    "NODE_RANK": "computed by train.sh",
    "MASTER_ADDR": "computed by train.sh",
    "MASTER_PORT": "use the master_port key",
    "NNODES": "use the nodes key",
    "NPUS_PER_NODE": "use the npus_per_node key",
    "HCCL_CONNECT_TIMEOUT": "use the hccl.connect_timeout key",
    "HCCL_IF_BASE_PORT": "use the hccl.base_port key",
    FULL_NODE_ENV: "use the full_node_npus key",
    "NPU_JOB_PODS": "set by npu-job when routing uses the Kubernetes API (routing_source)",
}

_NO_CONTROL = re.compile(r"[^\x00-\x1f\x7f]+\Z")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")
_LABEL_VALUE_RULE = (
    "a label value: up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter "
    "or digit"
)
_ACCELERATOR_HINTS = {
    key: "accelerators are requested from device and npus_per_node"
    for key in ("gpu", "npu", "nvidia.com/gpu", "huawei.com/ascend-1980", "huawei.com/Ascend910")
}
_MOUNT_KEYS = ("name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation")


# --- reading the keys ------------------------------------------------------------------------


class _Context:
    """What the keys read so far tell the next ones: the device, the volumes' names."""

    def __init__(self, read: Mapping[str, Any]) -> None:
        self.read = read
        self.volume_names: Tuple[str, ...] = ()

    @property
    def device(self) -> str:
        return self.read.get("device") or _KEYS["device"].default


# --- the key table ------------------------------------------------------------------------------


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: the default of a key a spec must give
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Derived:
    """A default computed from the other keys' values (given or defaulted); ``words`` say how."""

    words: str
    compute: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class KeySpec:
    """One spec key: its type, its default, and what it means (a row of the README's table).

    ``key`` is dotted for a key of a nested mapping (``hccl.base_port``). ``default`` is a value,
    a :class:`~npu_job.render.checks.PerDevice`, a :class:`Derived` or :data:`REQUIRED`.
    ``null`` says what ``null`` means where it is not "the default" (the spec then holds None).
    """

    key: str
    type: KeyType
    default: Any
    meaning: str
    null: str = ""

    @property
    def documented_default(self) -> str:
        """The README's default column: ``required``, ``none``, `` `8` (`1` for cpu)``, words."""
        if self.default is REQUIRED:
            return "required"
        if isinstance(self.default, Derived):
            return self.default.words
        if isinstance(self.default, PerDevice):
            return self.default.describe(self._shown)
        return self._shown(self.default)

    def _shown(self, value: Any) -> str:
        if value is None:
            return "none"
        if value == ():
            return self.type.empty
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        return f"`{value}`"


SPEC_KEYS: Tuple[KeySpec, ...] = (
    KeySpec(
        "name",
        Text("DNS-1123 label", DNS_LABEL, DNS_LABEL_RULE, 63),
        REQUIRED,
        "Job name. Pods are `<name>-<task_name>-<i>`.",
    ),
    KeySpec(
        "image",
        Text(
            "image reference",
            re.compile(r"[^\s\x00-\x1f\x7f]+\Z"),
            "an image reference (no spaces or control characters)",
        ),
        REQUIRED,
        "Container image (with torch, torch_npu and npu-job installed).",
    ),
    KeySpec(
        "script",
        Text("path", _NO_CONTROL, "a path (no control characters)"),
        REQUIRED,
        "Training entry inside the container, relative to `workdir` or absolute.",
    ),
    KeySpec(
        "device",
        Choice(DEVICES),
        DEVICES[0],
        "What each pod requests: "
        + ", ".join(
            f"{resource or 'no accelerator'} ({device})"
            for device, resource in DEVICE_RESOURCE.items()
        )
        + ".",
    ),
    KeySpec(
        "args",
        TextList(allow_int=True),
        (),
        "Arguments of the script (integers are written in decimal).",
    ),
    KeySpec(
        "launcher_args",
        TextList(allow_int=True),
        (),
        "Extra launcher flags, placed before the script.",
    ),
    KeySpec(
        "nodes",
        Integer(1, 100_000),
        1,
        "Number of pods (one per node): replicas = minAvailable = `MA_NUM_HOSTS`.",
    ),
    KeySpec(
        "full_node_npus",
        Integer(1, MAX_NODE_ACCELERATORS),
        per_device(FULL_NODE_NPUS, cpu=None),
        "Accelerators of a full node: 8 on ascend-1980 nodes, 16 on Atlas A3 super-pod nodes. "
        "`npus_per_node` may not exceed it. With routing on, the pods' bootstrap gets it as "
        f"`{FULL_NODE_ENV}` and keeps the scheduler's order when any server of the rank table "
        "lists another device count (the platform routes full nodes only). A cpu job has no "
        "full node: the key is ignored there.",
    ),
    KeySpec(
        "npus_per_node",
        Integer(1, per_device(MAX_NODE_ACCELERATORS, cpu=1024)),
        per_device(FULL_NODE_NPUS, cpu=1),
        "Accelerators (cpu: processes) per pod: `--nproc_per_node`, `MA_NUM_GPUS`.",
    ),
    KeySpec(
        "namespace",
        Text("DNS-1123 label", DNS_LABEL, DNS_LABEL_RULE, 63),
        "default",
        "Namespace of the Job and its ConfigMap.",
    ),
    KeySpec(
        "task_name",
        Text("DNS-1123 label", DNS_LABEL, DNS_LABEL_RULE, 63),
        "worker",
        "Volcano task name (`MA_TASK_NAME`).",
    ),
    KeySpec(
        "queue",
        Text("DNS-1123 subdomain", DNS_SUBDOMAIN, DNS_SUBDOMAIN_RULE, 253),
        "default",
        "Volcano queue.",
    ),
    KeySpec(
        "priority_class",
        Text("DNS-1123 subdomain", DNS_SUBDOMAIN, DNS_SUBDOMAIN_RULE, 253),
        None,
        "priorityClassName of the Job and its pods.",
    ),
    KeySpec(
        "workdir",
        Text("absolute path", ABSOLUTE_PATH, "an absolute path (starting with '/')"),
        None,
        "Directory train.sh changes to before starting the launcher (none: the image's).",
    ),
    KeySpec(  # it appears in the pod command: plain path characters only
        "scripts_dir",
        Text(
            "absolute path",
            re.compile(r"/[A-Za-z0-9._/-]*\Z"),
            "an absolute path of letters, digits, '.', '_', '-' and '/'",
        ),
        "/opt/npu-job",
        "Where the scripts ConfigMap is mounted; the pod command runs there.",
    ),
    KeySpec(
        "env",
        TextMap(keys="env", reserved=RESERVED_ENV),
        (),
        "Extra container env (name: value); names npu-job sets are rejected.",
    ),
    KeySpec("launcher", Choice(LAUNCHERS), LAUNCHERS[0], "The launcher train.sh starts."),
    KeySpec(
        "routing",
        Flag(),
        Derived(
            f"`nodes >= {MIN_NODES}` on npu, else `false`",
            lambda keys: keys["device"] == "npu" and keys["nodes"] >= MIN_NODES,
        ),
        "Routing acceleration: the pod runs bootstrap.sh to reorder node ranks. On npu, CCE "
        "delivers its inputs (configmap1980 plugin, `cabinet` annotation); a gpu/cpu job brings "
        "its own rank table (env `RANK_TABLE_FILE`: a file in `volumes` or an http(s) URL, or a "
        "mount at `/user/config`) or, without one, routes by its pods from the Kubernetes API "
        "(`routing_source`).",
    ),
    KeySpec(
        "routing_source",
        Choice(ROUTING_SOURCES),
        ROUTING_SOURCES[0],
        "Where routing finds the servers. `rank-table`: a rank table (CCE's on npu, the job's "
        "own on gpu/cpu). `api`: the job's pods, listed by each pod's bootstrap from the "
        "Kubernetes API (`NPU_JOB_PODS=k8s`), and the cluster's Volcano HyperNodes or node labels "
        "as the topology; render adds the ServiceAccount and RBAC this needs (see "
        "`service_account`) and, on npu, leaves out CCE's pieces. `auto`: `api` for a gpu/cpu "
        "job that brings no rank table, else `rank-table`.",
    ),
    KeySpec(
        "service_account",
        Text("DNS-1123 subdomain", DNS_SUBDOMAIN, DNS_SUBDOMAIN_RULE, 253),
        None,
        "The pods' ServiceAccount. None and routing by the API: render emits `<name>-routing` "
        "with least privilege: a Role that may list pods in the namespace and a ClusterRole that "
        "may list nodes and Volcano hypernodes, each bound to it. Given: no RBAC is emitted, and "
        "this account needs those permissions for routing by the API.",
    ),
    KeySpec(
        "tiered_store",
        Flag(),
        Derived("`true` with npu-run", lambda keys: keys["launcher"] == "npu-run"),
        "npu-run's per-node store proxy (`--rdzv_backend=parallel "
        "--enable_tiered_parallel_tcpstore=true`).",
    ),
    KeySpec(
        "host_network",
        Flag(),
        False,
        "Run pods in the host network (dnsPolicy ClusterFirstWithHostNet).",
    ),
    KeySpec(
        "anti_affinity",
        Flag(),
        per_device(True, cpu=False),
        "At most one pod of the job per node (kubernetes.io/hostname).",
    ),
    KeySpec(
        "master_port",
        Integer(1, 65535),
        29500,
        "Rendezvous / TCPStore port on the master node.",
    ),
    KeySpec("max_retry", Integer(0, 2**31 - 1), 3, "Volcano `maxRetry`."),
    KeySpec(
        "network_topology.mode",
        Choice(NETWORK_TOPOLOGY_MODES),
        None,
        "Volcano Job `networkTopology.mode` (Volcano >= 1.12, its network-topology-aware plugin): "
        "`hard` keeps the job inside one HyperNode of at most `highest_tier_allowed`, `soft` "
        "tries to; the bootstrap then orders the ranks inside it. None, with "
        "`highest_tier_allowed` given: `hard`.",
    ),
    KeySpec(
        "network_topology.highest_tier_allowed",
        Integer(0, 2**31 - 1),
        None,
        "Volcano Job `networkTopology.highestTierAllowed`: the highest HyperNode tier the job may "
        "span (hard mode).",
    ),
    KeySpec(
        "node_selector",
        TextMap("map of label values", pattern=_LABEL_VALUE, rule=_LABEL_VALUE_RULE, max_length=63),
        (),
        "Extra nodeSelector; npu adds `accelerator/huawei-npu: ascend-1980` (yours wins).",
    ),
    KeySpec(
        "labels",
        TextMap("map of label values", pattern=_LABEL_VALUE, rule=_LABEL_VALUE_RULE, max_length=63),
        (),
        "Labels of the Job, its pods and the scripts ConfigMap.",
    ),
    KeySpec("annotations", TextMap(), (), "Annotations of the Job and its pods."),
    KeySpec(
        "image_pull_policy",
        Choice(PULL_POLICIES),
        PULL_POLICIES[0],
        "The container's imagePullPolicy.",
    ),
    KeySpec(
        "image_pull_secrets",
        TextList("list of DNS-1123 subdomains", pattern=DNS_SUBDOMAIN, rule=DNS_SUBDOMAIN_RULE),
        (),
        "Names of image pull secrets.",
    ),
    KeySpec(
        "shm_size",
        Quantity(),
        "16Gi",
        "Size of the in-memory /dev/shm.",
        null="no /dev/shm volume: the container runtime's default",
    ),
    KeySpec(
        "hccl.connect_timeout",
        Integer(120, 7200),
        1200,
        "`HCCL_CONNECT_TIMEOUT` in seconds; npu only.",
    ),
    KeySpec(
        "hccl.base_port",
        Integer(1024, 65536 - HCCL_PORT_COUNT),
        60000,
        f"`HCCL_IF_BASE_PORT`; HCCL uses {HCCL_PORT_COUNT} ports from it; npu only.",
    ),
    KeySpec(
        "hccl.reserve_ports",
        Flag(),
        False,
        f"Reserve those {HCCL_PORT_COUNT} ports in the pod (sysctl "
        "`net.ipv4.ip_local_reserved_ports`, a safe sysctl from Kubernetes 1.27); not with "
        "host_network.",
    ),
    KeySpec("resources.cpu", Quantity(), None, "CPU per pod; requests = limits."),
    KeySpec("resources.memory", Quantity(), None, "Memory per pod; requests = limits."),
    KeySpec(
        "bootstrap.url",
        Text(
            "http(s) URL",
            re.compile(r"https?://[^\s]+\Z"),
            "an http:// or https:// URL without spaces",
        ),
        None,
        "Fetch bootstrap.sh from this URL at pod start instead of the bundled one.",
    ),
    KeySpec(
        "pip_install",
        TextList(
            "list of strings (one string: a list of one)",
            pattern=re.compile(r"[^\s-][^\x00-\x1f\x7f]*\Z"),
            rule="a pip requirement such as npu-job==0.1.0 (not an option)",
            one_is_a_list=True,
        ),
        (),
        "pip requirements installed at pod start before anything else (e.g. `npu-job==0.1.0`), "
        "for images without npu-job.",
    ),
    KeySpec(
        "volumes",
        Volumes(reserved=RESERVED_VOLUMES),
        (),
        "Extra Kubernetes volumes (passed through), on top of the NPU driver mounts.",
    ),
    KeySpec(
        "mounts",
        Mounts(keys=_MOUNT_KEYS),
        (),
        "Extra volumeMounts (`name`, `mountPath`, `readOnly`, `subPath`) of `volumes`.",
    ),
)
_KEYS: Mapping[str, KeySpec] = {key.key: key for key in SPEC_KEYS}
_TOP_KEYS = tuple(sorted({key.key.split(".")[0] for key in SPEC_KEYS}))
_SUB_KEYS: Mapping[str, Tuple[str, ...]] = {
    top: tuple(key.key.split(".", 1)[1] for key in SPEC_KEYS if key.key.startswith(top + "."))
    for top in _TOP_KEYS
}
_SUB_KEY_HINTS: Mapping[str, Mapping[str, str]] = {"resources": _ACCELERATOR_HINTS}
#: top-level keys whose ``null`` has a meaning of its own (see :attr:`KeySpec.null`)
_NULL_MEANS_NONE = tuple(key.key for key in SPEC_KEYS if key.null)
assert all("." not in key for key in _NULL_MEANS_NONE), "validate() reads null meanings at the top"
assert all("." not in key.key for key in SPEC_KEYS if key.default is REQUIRED)


def spec_keys_markdown() -> str:
    """The README's spec key table (Markdown), generated from :data:`SPEC_KEYS`."""
    rows = [
        f"| `{key.key}` | {key.type.kind} | {key.documented_default} | {key.meaning}"
        f"{f' `null`: {key.null}.' if key.null else ''} |"
        for key in SPEC_KEYS
    ]
    header = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    return "\n".join(header + rows)


def _default_stage(key: KeySpec) -> int:
    """Values first, then what reads them: per-device defaults (device), derived ones (any)."""
    return 2 if isinstance(key.default, Derived) else 1 if isinstance(key.default, PerDevice) else 0


def with_defaults(given: Mapping[str, Any]) -> Dict[str, Any]:
    """``given`` (dotted key -> value) with every other key's default; no required key's."""
    settled = dict(given)
    for key in sorted(SPEC_KEYS, key=_default_stage):
        if key.key in settled or key.default is REQUIRED:
            continue
        if isinstance(key.default, Derived):
            settled[key.key] = key.default.compute(settled)
        elif isinstance(key.default, PerDevice):
            settled[key.key] = key.default.on(settled["device"])
        else:
            settled[key.key] = key.default
    if _KEYS["full_node_npus"].default.on(settled["device"]) is None:
        settled["full_node_npus"] = None  # cpu: processes, not accelerators; no full node to fill
    return settled


#: an npu job's defaults, which the dataclasses below also take
_DEFAULTS = with_defaults({})


# --- the validated spec ---------------------------------------------------------------------


@dataclass(frozen=True)
class HcclSpec:
    """HCCL settings (device npu only)."""

    connect_timeout: int = _DEFAULTS["hccl.connect_timeout"]
    base_port: int = _DEFAULTS["hccl.base_port"]
    reserve_ports: bool = _DEFAULTS["hccl.reserve_ports"]

    @property
    def port_range(self) -> str:
        return f"{self.base_port}-{self.base_port + HCCL_PORT_COUNT - 1}"


@dataclass(frozen=True)
class ResourceSpec:
    """CPU and memory per pod; requests = limits (as the platform requires for NPUs)."""

    cpu: Optional[str] = _DEFAULTS["resources.cpu"]
    memory: Optional[str] = _DEFAULTS["resources.memory"]


@dataclass(frozen=True)
class NetworkTopologySpec:
    """The Volcano Job's ``spec.networkTopology`` (none given: no constraint)."""

    mode: Optional[str] = _DEFAULTS["network_topology.mode"]
    highest_tier_allowed: Optional[int] = _DEFAULTS["network_topology.highest_tier_allowed"]

    @property
    def given(self) -> bool:
        return self.mode is not None or self.highest_tier_allowed is not None


#: the dataclass a dotted key's group becomes (other dotted keys: ``bootstrap.url`` ->
#: ``JobSpec.bootstrap_url``)
_RECORDS = {"hccl": HcclSpec, "resources": ResourceSpec, "network_topology": NetworkTopologySpec}


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec, every default applied (for an npu job, where built directly)."""

    name: str
    image: str
    script: str
    args: Tuple[str, ...] = _DEFAULTS["args"]
    nodes: int = _DEFAULTS["nodes"]
    npus_per_node: int = _DEFAULTS["npus_per_node"]
    full_node_npus: Optional[int] = _DEFAULTS["full_node_npus"]  # None: no full node (cpu)
    device: str = _DEFAULTS["device"]
    namespace: str = _DEFAULTS["namespace"]
    queue: str = _DEFAULTS["queue"]
    task_name: str = _DEFAULTS["task_name"]
    workdir: Optional[str] = _DEFAULTS["workdir"]
    env: Tuple[Tuple[str, str], ...] = _DEFAULTS["env"]
    routing: bool = _DEFAULTS["routing"]
    routing_source: str = _DEFAULTS["routing_source"]
    service_account: Optional[str] = _DEFAULTS["service_account"]
    launcher: str = _DEFAULTS["launcher"]
    launcher_args: Tuple[str, ...] = _DEFAULTS["launcher_args"]
    tiered_store: bool = _DEFAULTS["tiered_store"]
    master_port: int = _DEFAULTS["master_port"]
    hccl: HcclSpec = field(default_factory=HcclSpec)
    volumes: Tuple[Mapping[str, Any], ...] = _DEFAULTS["volumes"]
    mounts: Tuple[Mapping[str, Any], ...] = _DEFAULTS["mounts"]
    max_retry: int = _DEFAULTS["max_retry"]
    network_topology: NetworkTopologySpec = field(default_factory=NetworkTopologySpec)
    priority_class: Optional[str] = _DEFAULTS["priority_class"]
    node_selector: Tuple[Tuple[str, str], ...] = _DEFAULTS["node_selector"]
    labels: Tuple[Tuple[str, str], ...] = _DEFAULTS["labels"]
    annotations: Tuple[Tuple[str, str], ...] = _DEFAULTS["annotations"]
    resources: ResourceSpec = field(default_factory=ResourceSpec)
    image_pull_policy: str = _DEFAULTS["image_pull_policy"]
    image_pull_secrets: Tuple[str, ...] = _DEFAULTS["image_pull_secrets"]
    shm_size: Optional[str] = _DEFAULTS["shm_size"]
    host_network: bool = _DEFAULTS["host_network"]
    anti_affinity: bool = _DEFAULTS["anti_affinity"]
    scripts_dir: str = _DEFAULTS["scripts_dir"]
    bootstrap_url: Optional[str] = _DEFAULTS["bootstrap.url"]
    pip_install: Tuple[str, ...] = _DEFAULTS["pip_install"]
    #: what is valid but will disappoint (``lint.spec_warnings``); the renderer logs these
    warnings: Tuple[str, ...] = field(default=(), compare=False)

    @property
    def resource_name(self) -> Optional[str]:
        return DEVICE_RESOURCE[self.device]

    @property
    def routes_by_api(self) -> bool:
        """Whether routing lists the job's pods (and the topology) from the Kubernetes API."""
        if not self.routing or self.routing_source == "rank-table":
            return False
        return self.routing_source == "api" or (
            self.device != "npu" and not brings_a_rank_table(self)
        )

    @property
    def routing_service_account(self) -> Optional[str]:
        """The pods' ServiceAccount: the one given, else render's own when routing by the API."""
        if self.service_account is not None:
            return self.service_account
        return f"{self.name}-routing" if self.routes_by_api else None

    @property
    def pod_names(self) -> Tuple[str, ...]:
        return tuple(f"{self.name}-{self.task_name}-{index}" for index in range(self.nodes))


def _field_of(key: str) -> Tuple[Optional[str], str]:
    """The record and field a key fills: ``("hccl", "base_port")``, ``(None, "bootstrap_url")``."""
    group, _, name = key.partition(".")
    return (group, name) if group in _RECORDS else (None, key.replace(".", "_"))


def _job_spec(settled: Mapping[str, Any]) -> JobSpec:
    """The :class:`JobSpec` of every key's value (dotted keys into their records)."""
    top: Dict[str, Any] = {}
    records: Dict[str, Dict[str, Any]] = {group: {} for group in _RECORDS}
    for key, value in settled.items():
        record, name = _field_of(key)
        (top if record is None else records[record])[name] = value
    return JobSpec(**top, **{group: _RECORDS[group](**values) for group, values in records.items()})


# --- validation -------------------------------------------------------------------------------


def validate(merged: MergedValues, source: Optional[str] = None) -> JobSpec:
    """Check the merged values and return the :class:`JobSpec`; raise SpecError listing all."""
    check = Checker(merged)
    tree = check.mapping(merged.tree, (), _TOP_KEYS)
    given: Dict[str, Any] = {}
    context = _Context(given)

    def present(key: str) -> bool:
        return key in tree and tree[key] is not None

    for key in SPEC_KEYS:
        if key.default is REQUIRED:
            check.required(tree, key.key, ())
    groups: Dict[str, Dict[str, Any]] = {}
    for key in sorted(SPEC_KEYS, key=lambda key: key.key != "device"):  # device first
        top, _, sub = key.key.partition(".")
        node: Mapping[str, Any] = tree
        if sub:
            if top not in groups:  # a nested mapping: its own unknown keys when first met
                groups[top] = (
                    check.mapping(tree[top], (top,), _SUB_KEYS[top], _SUB_KEY_HINTS.get(top, {}))
                    if present(top)
                    else {}
                )
            node = groups[top]
        name = sub or top
        if node.get(name) is not None:
            path = (top, sub) if sub else (top,)
            given[key.key] = key.type.read(check, node[name], path, context)
    given = {key: value for key, value in given.items() if value is not None}
    for name in _NULL_MEANS_NONE:  # null from any input, not its absence: the key's own meaning
        if not present(name) and (name in tree or (name,) in merged.nulls):
            given[name] = None

    where = source or " + ".join(merged.sources) or "job spec"
    if check.problems:
        raise SpecError(where, check.problems)
    spec = _job_spec(with_defaults(given))
    _check_across_keys(check, spec)
    if check.problems:
        raise SpecError(where, check.problems)
    explicit = [key for key in tree if tree[key] is not None]
    return replace(spec, warnings=spec_warnings(spec, explicit_keys=explicit))


def _check_across_keys(check: Checker, spec: JobSpec) -> None:
    longest = f"{spec.name}-{spec.task_name}-{spec.nodes - 1}"
    if len(longest) > 63:
        check.problem(
            ("name",),
            f"too long for the pod names: {longest!r} has {len(longest)} characters; a pod's "
            "hostname '<name>-<task_name>-<index>' must have at most 63",
        )
    if spec.full_node_npus is not None and spec.npus_per_node > spec.full_node_npus:
        check.problem(
            ("npus_per_node",),
            f"{spec.npus_per_node} is more than a full node (full_node_npus "
            f"{spec.full_node_npus}); on nodes with {spec.npus_per_node} accelerators (e.g. Atlas "
            f"A3) set full_node_npus: {spec.npus_per_node}",
        )
    if spec.tiered_store and spec.launcher != "npu-run":
        check.problem(
            ("tiered_store",),
            f"the tiered store needs launcher npu-run; launcher is {spec.launcher}",
        )
    if spec.device == "npu":
        low = spec.hccl.base_port
        if low <= spec.master_port < low + HCCL_PORT_COUNT:
            check.problem(
                ("master_port",),
                f"{spec.master_port} collides with HCCL's ports {spec.hccl.port_range} "
                f"(hccl.base_port); choose another port",
            )
        if spec.hccl.reserve_ports and spec.host_network:
            check.problem(
                ("hccl", "reserve_ports"),
                "a pod in the host network cannot set net.* sysctls; reserve the ports on the "
                "nodes (net.ipv4.ip_local_reserved_ports) or turn host_network off",
            )
    if spec.routing and spec.device == "npu":
        for path, key, owner in (
            (("labels",), "ring-controller.cce", "the configmap1980 rank table"),
            (("annotations",), "cabinet", "ToR topology delivery"),
        ):
            if key in dict(getattr(spec, path[0])):
                check.problem(path + (key,), f"set by npu-job for routing ({owner}); remove it")
    ours = (
        {spec.scripts_dir}
        | ({"/dev/shm"} if spec.shm_size else set())
        | ({host for _, host in NPU_HOST_MOUNTS} if spec.device == "npu" else set())
    )
    for index, mount in enumerate(spec.mounts):
        if mount.get("mountPath") in ours:
            check.problem(
                ("mounts", index, "mountPath"),
                f"{mount['mountPath']!r} is mounted by npu-job itself",
            )
