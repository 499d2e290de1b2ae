"""The job spec's keys: each declared once, in :data:`SPEC_KEYS`, with the constants they share.

A :class:`KeySpec` gives a key's name, its type (how a value is read and checked, ``--set``
values included: see ``checks.py``), its default (one value, one per device where it differs, or
one derived from other keys), its meaning and, where ``null`` means more than "the default", what
it means. That table drives

* validation (:func:`~npu_job.render.spec.validate`): the required keys, unknown keys with a
  did-you-mean, and each key's type in table order;
* the defaults (:func:`with_defaults`), the :class:`~npu_job.render.spec.JobSpec` dataclasses'
  defaults among them;
* the key table of docs/render.md (:func:`spec_keys_markdown`; a test keeps the page equal to it).

The constants here (devices, resource names, the NPU host mounts, the env names npu-job sets
itself) are shared by the key table, the validation across keys and the templates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Tuple

from npu_job.kinds import DEFAULT, KIND_ENV, KINDS
from npu_job.kinds.base import GROUP_NAME_ENV, JOB_NAME_ENV

from npu_job.podfacts import FULL_NODE_ENV, MIN_NODES, RANK_ENV

from .checks import (
    ABSOLUTE_PATH,
    DNS_LABEL,
    DNS_LABEL_RULE,
    DNS_SUBDOMAIN,
    DNS_SUBDOMAIN_RULE,
    Choice,
    Flag,
    FlagOrInteger,
    Integer,
    KeyType,
    Mounts,
    Named,
    PerDevice,
    Quantity,
    Text,
    TextList,
    TextMap,
    Volumes,
    per_device,
)

# --- constants the templates and validation share ---------------------------------------------

DEVICES = ("npu", "gpu", "cpu")
#: where a routed job's servers come from: the rank table (CCE's, or the job's own), or the job's
#: pods from the Kubernetes API (the bootstrap's NPU_JOB_PODS=k8s); auto: the API for a gpu/cpu
#: job that brings no rank table
ROUTING_SOURCES = ("auto", "rank-table", "api")
NETWORK_TOPOLOGY_MODES = ("hard", "soft")  # Volcano Job spec.networkTopology.mode
LAUNCHERS = ("npu-run", "torchrun", "torch.distributed.launch")
#: what a pod's failure restarts: every pod of the job, or the failed pod alone
RESTARTS = ("job", "pod")
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
#: resource name per device (None: no accelerator is requested)
DEVICE_RESOURCE = {"npu": "huawei.com/ascend-1980", "gpu": "nvidia.com/gpu", "cpu": None}
#: the label of CCE's NPU nodes, in every NPU pod's nodeSelector (before the spec's own)
NPU_NODE_SELECTOR: Tuple[Tuple[str, str], ...] = (("accelerator/huawei-npu", "ascend-1980"),)
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
    JOB_NAME_ENV: "set by npu-job from the job-name label of the pod (Volcano: annotation)",
    GROUP_NAME_ENV: "set by npu-job from the task label of the pod (Volcano: annotation)",
    "MA_MASTER_INDEX": "set by the pod command from the bootstrap's /tmp/MASTER_INDEX",
    RANK_ENV: "set by the pod command from the bootstrap's /tmp/RANK_AFTER_ACC",
    "NODE_RANK": "computed by train.sh",
    "MASTER_ADDR": "computed by train.sh",
    "MASTER_PORT": "use the master_port key",
    "NNODES": "use the nodes key",
    "NPUS_PER_NODE": "use the npus_per_node key",
    "HCCL_CONNECT_TIMEOUT": "use the hccl.connect_timeout key",
    "HCCL_IF_BASE_PORT": "use the hccl.base_port key",
    FULL_NODE_ENV: "use the full_node_npus key",
    "NPU_JOB_PODS": "set by npu-job when routing uses the Kubernetes API (routing_source)",
    KIND_ENV: "set by npu-job from the kind key",
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
    """One spec key: its type, its default, and what it means (a row of docs/render.md's table).

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
        """The docs' default column: ``required``, ``none``, `` `8` (`1` for cpu)``, words."""
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
        "Container image: python3 and torch (torch_npu on NPUs); npu-job comes with the job "
        "(`bundle`).",
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
        "kind",
        Named(KINDS, "job kind"),
        DEFAULT,
        "The job object render makes and the controller that runs its pods: one of the "
        "[job kinds](#job-kinds). Keys a kind cannot honour are refused when given.",
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
        "probe",
        FlagOrInteger(1, 3600, "seconds"),
        False,
        "npu-run's probe (`--probe`, or `--probe=SECONDS` for a number): before the workers "
        "start, time all_reduce under the plan's node order and the scheduler's, and keep the "
        "plan unless it measures slower (docs/launcher.md). `true`: a 60 s budget. Needs "
        "launcher npu-run with the parallel rendezvous (`tiered_store`).",
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
        "restart",
        Choice(RESTARTS),
        Derived(
            "the kind's own",
            lambda keys: KINDS[keys["kind"]].restart_default,
        ),
        "What a pod's failure restarts, through the kind's controller: `job`, every pod of the "
        "job (all nodes planned again from scratch); `pod`, the failed pod alone, replaced while "
        "the others keep running and rejoin the next rendezvous round. Each kind's default is "
        "what its controller does unless told, and a kind refuses a value it has no mechanism "
        "for ([restart policies](#restart-policies-restart)).",
    ),
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
        "Pods fetch the bundle from this URL at start (`npu-job bundle -o FILE`, hosted by you) "
        "instead of the scripts ConfigMap carrying it.",
    ),
    KeySpec(
        "bundle",
        Flag(),
        True,
        "Ship the pod side (the bootstrap and npu-run) with the job as `npu-job.pyz`, so that the "
        "image needs nothing installed; `false`: the image brings npu-job (`pip_install`, or its "
        "Dockerfile).",
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
        "pip requirements installed at pod start before anything else (e.g. a package the "
        "training script needs).",
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
#: each key by its (dotted) name; the top-level keys; the keys of each nested mapping
KEYS: Mapping[str, KeySpec] = {key.key: key for key in SPEC_KEYS}
TOP_KEYS = tuple(sorted({key.key.split(".")[0] for key in SPEC_KEYS}))
SUB_KEYS: Mapping[str, Tuple[str, ...]] = {
    top: tuple(key.key.split(".", 1)[1] for key in SPEC_KEYS if key.key.startswith(top + "."))
    for top in TOP_KEYS
}
#: keys that do not belong in a nested mapping, and where what they mean is said instead
SUB_KEY_HINTS: Mapping[str, Mapping[str, str]] = {"resources": _ACCELERATOR_HINTS}
#: top-level keys whose ``null`` has a meaning of its own (see :attr:`KeySpec.null`)
NULL_MEANS_NONE = tuple(key.key for key in SPEC_KEYS if key.null)
assert all("." not in key for key in NULL_MEANS_NONE), "validate() reads null meanings at the top"
assert all("." not in key.key for key in SPEC_KEYS if key.default is REQUIRED)


def spec_keys_markdown() -> str:
    """docs/render.md's spec key table (Markdown), generated from :data:`SPEC_KEYS`."""
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
    if KEYS["full_node_npus"].default.on(settled["device"]) is None:
        settled["full_node_npus"] = None  # cpu: processes, not accelerators; no full node to fill
    return settled
