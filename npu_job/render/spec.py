"""The job spec: its keys, their defaults and rules, and validation into a frozen :class:`JobSpec`.

``validate(merged)`` walks the merged values (see ``values.py``) once and collects *every*
problem with its key path before raising one :class:`~npu_job.errors.SpecError` (exit 5): unknown
keys with a did-you-mean, wrong types, out-of-range values, missing required keys, invalid
Kubernetes names (rejected with the rule, never rewritten), and rules across keys (ports that
collide, mounts of undeclared volumes, pod names too long for a hostname).

The validator is a small explicit one rather than JSON Schema: the messages must name the key,
the value and the fix, the cross-key rules need code anyway, and it keeps render free of a
runtime dependency the package does not otherwise need. :data:`SPEC_KEYS` documents every key
with its default; the README table is generated from it (:func:`spec_keys_markdown`).

:func:`spec_warnings` lists what is valid but will disappoint (routing with fewer than 3 nodes,
part of a node, a launcher option that assigns ranks by arrival).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from npu_job.errors import LISTED_PROBLEMS, SpecError
from npu_job.podfacts import DEFAULT_RANK_TABLES, RANK_TABLE_ENV
from npu_job.render.values import MergedValues, Path, SetScalar, format_path, typed

# --- constants the templates and validation share ---------------------------------------------

DEVICES = ("npu", "gpu", "cpu")
LAUNCHERS = ("npu-run", "torchrun", "torch.distributed.launch")
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
#: resource name per device (None: no accelerator is requested)
DEVICE_RESOURCE = {"npu": "huawei.com/ascend-1980", "gpu": "nvidia.com/gpu", "cpu": None}
#: default of ``full_node_npus``: accelerators of a full node (ascend-1980: 8; Atlas A3 super-pod
#: nodes have 16 and set the key); with routing on, a pod with fewer keeps the scheduler's order
FULL_NODE = {"npu": 8, "gpu": 8}
MAX_NODE_ACCELERATORS = 16
#: the bootstrap's env var for the full node size (``--full-node-devices``)
FULL_NODE_ENV = "NPU_JOB_FULL_NODE_DEVICES"
MIN_ROUTING_NODES = 3
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
    "RANK_AFTER_ACC": "set by the pod command from the bootstrap's /tmp/RANK_AFTER_ACC",
    "VC_TASK_INDEX": "set by Volcano's env plugin",
    "NODE_RANK": "computed by train.sh",
    "MASTER_ADDR": "computed by train.sh",
    "MASTER_PORT": "use the master_port key",
    "NNODES": "use the nodes key",
    "NPUS_PER_NODE": "use the npus_per_node key",
    "HCCL_CONNECT_TIMEOUT": "use the hccl.connect_timeout key",
    "HCCL_IF_BASE_PORT": "use the hccl.base_port key",
    FULL_NODE_ENV: "use the full_node_npus key",
}

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_QUANTITY = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[KMGTPE]i|[numkMGTPE])?\Z")
_NO_CONTROL = re.compile(r"[^\x00-\x1f\x7f]+\Z")
_URL = re.compile(r"https?://[^\s]+\Z")

DNS_LABEL_RULE = (
    "a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or "
    "digit, at most 63 characters"
)
DNS_SUBDOMAIN_RULE = "a DNS-1123 subdomain: DNS-1123 labels joined by '.', at most 253 characters"


# --- the validated spec ---------------------------------------------------------------------


@dataclass(frozen=True)
class HcclSpec:
    """HCCL settings (device npu only)."""

    connect_timeout: int = 1200  # HCCL_CONNECT_TIMEOUT, seconds
    base_port: int = 60000  # HCCL_IF_BASE_PORT; HCCL uses 16 ports from here
    reserve_ports: bool = False  # pod sysctl net.ipv4.ip_local_reserved_ports for those 16 ports

    @property
    def port_range(self) -> str:
        return f"{self.base_port}-{self.base_port + HCCL_PORT_COUNT - 1}"


@dataclass(frozen=True)
class ResourceSpec:
    """CPU and memory per pod; requests = limits (as the platform requires for NPUs)."""

    cpu: Optional[str] = None
    memory: Optional[str] = None


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec with every default applied (``routing`` etc. resolved)."""

    name: str
    image: str
    script: str
    args: Tuple[str, ...] = ()
    nodes: int = 1
    npus_per_node: int = 8
    full_node_npus: Optional[int] = 8  # accelerators of a full node; None: no full-node rule (cpu)
    device: str = "npu"
    namespace: str = "default"
    queue: str = "default"
    task_name: str = "worker"
    workdir: Optional[str] = None
    env: Tuple[Tuple[str, str], ...] = ()
    routing: bool = False
    launcher: str = "npu-run"
    launcher_args: Tuple[str, ...] = ()
    tiered_store: bool = True
    master_port: int = 29500
    hccl: HcclSpec = field(default_factory=HcclSpec)
    volumes: Tuple[Mapping[str, Any], ...] = ()
    mounts: Tuple[Mapping[str, Any], ...] = ()
    max_retry: int = 3
    priority_class: Optional[str] = None
    node_selector: Tuple[Tuple[str, str], ...] = ()
    labels: Tuple[Tuple[str, str], ...] = ()
    annotations: Tuple[Tuple[str, str], ...] = ()
    resources: ResourceSpec = field(default_factory=ResourceSpec)
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: Tuple[str, ...] = ()
    shm_size: Optional[str] = "16Gi"
    host_network: bool = False
    anti_affinity: bool = True
    scripts_dir: str = "/opt/npu-job"
    bootstrap_url: Optional[str] = None
    pip_install: Tuple[str, ...] = ()
    #: what is valid but will disappoint (see :func:`spec_warnings`); the renderer logs these
    warnings: Tuple[str, ...] = field(default=(), compare=False)

    @property
    def resource_name(self) -> Optional[str]:
        return DEVICE_RESOURCE[self.device]

    @property
    def pod_names(self) -> Tuple[str, ...]:
        return tuple(f"{self.name}-{self.task_name}-{index}" for index in range(self.nodes))


@dataclass(frozen=True)
class KeyDoc:
    """Documentation of one spec key (the README table is generated from these)."""

    key: str
    default: str
    meaning: str
    #: what ``null`` means when it is not "the default" (the key's JobSpec field is then None)
    null: str = ""


SPEC_KEYS: Tuple[KeyDoc, ...] = (
    KeyDoc("name", "required", "Job name; a DNS-1123 label. Pods are `<name>-<task_name>-<i>`."),
    KeyDoc("image", "required", "Container image (with torch, torch_npu and npu-job installed)."),
    KeyDoc("script", "required", "Training entry inside the container, relative to `workdir` or absolute."),
    KeyDoc("args", "`[]`", "Arguments of the script (strings; integers are written in decimal)."),
    KeyDoc("nodes", "`1`", "Number of pods (one per node): replicas = minAvailable = `MA_NUM_HOSTS`."),
    KeyDoc("npus_per_node", "`8` (`1` for cpu)", "Accelerators (cpu: processes) per pod: `--nproc_per_node`, `MA_NUM_GPUS`."),
    KeyDoc("full_node_npus", "`8` (npu, gpu); none for cpu", f"Accelerators of a full node: 8 on ascend-1980 nodes, 16 on Atlas A3 super-pod nodes. `npus_per_node` may not exceed it. With routing on, the pods' bootstrap gets it as `{FULL_NODE_ENV}` and keeps the scheduler's order when any server of the rank table lists another device count (the platform routes full nodes only)."),
    KeyDoc("device", "`npu`", "`npu` (huawei.com/ascend-1980), `gpu` (nvidia.com/gpu) or `cpu` (none)."),
    KeyDoc("namespace", "`default`", "Namespace of the Job and its ConfigMap."),
    KeyDoc("queue", "`default`", "Volcano queue."),
    KeyDoc("task_name", "`worker`", "Volcano task name (`MA_TASK_NAME`)."),
    KeyDoc("workdir", "image's", "Absolute directory train.sh changes to before starting the launcher."),
    KeyDoc("env", "`{}`", "Extra container env (name: string); names npu-job sets are rejected."),
    KeyDoc("routing", "`nodes >= 3` on npu, else `false`", "Routing acceleration: the pod runs bootstrap.sh to reorder node ranks. On npu, CCE delivers its inputs (configmap1980 plugin, `cabinet` annotation); on gpu/cpu the job brings its own rank table (env `RANK_TABLE_FILE`: a file in `volumes` or an http(s) URL, or a mount at `/user/config`), else render warns and the bootstrap keeps the scheduler's order."),
    KeyDoc("launcher", "`npu-run`", "`npu-run`, `torchrun` or `torch.distributed.launch`."),
    KeyDoc("launcher_args", "`[]`", "Extra launcher flags, placed before the script."),
    KeyDoc("tiered_store", "`true` with npu-run", "npu-run's per-node store proxy (`--rdzv_backend=parallel --enable_tiered_parallel_tcpstore=true`)."),
    KeyDoc("master_port", "`29500`", "Rendezvous / TCPStore port on the master node."),
    KeyDoc("hccl.connect_timeout", "`1200`", "`HCCL_CONNECT_TIMEOUT` in seconds (120..7200); npu only."),
    KeyDoc("hccl.base_port", "`60000`", "`HCCL_IF_BASE_PORT`; HCCL uses 16 ports from it; npu only."),
    KeyDoc("hccl.reserve_ports", "`false`", "Reserve those 16 ports in the pod (sysctl `net.ipv4.ip_local_reserved_ports`, a safe sysctl from Kubernetes 1.27); not with host_network."),
    KeyDoc("volumes", "`[]`", "Extra Kubernetes volumes (passed through), on top of the NPU driver mounts."),
    KeyDoc("mounts", "`[]`", "Extra volumeMounts (`name`, `mountPath`, `readOnly`, `subPath`) of `volumes`."),
    KeyDoc("max_retry", "`3`", "Volcano `maxRetry`."),
    KeyDoc("priority_class", "none", "priorityClassName of the Job and its pods."),
    KeyDoc("node_selector", "`{}`", "Extra nodeSelector; npu adds `accelerator/huawei-npu: ascend-1980` (yours wins)."),
    KeyDoc("labels", "`{}`", "Labels of the Job, its pods and the scripts ConfigMap."),
    KeyDoc("annotations", "`{}`", "Annotations of the Job and its pods."),
    KeyDoc("resources.cpu", "none", "CPU per pod (a Kubernetes quantity); requests = limits."),
    KeyDoc("resources.memory", "none", "Memory per pod (a Kubernetes quantity); requests = limits."),
    KeyDoc("image_pull_policy", "`IfNotPresent`", "`IfNotPresent`, `Always` or `Never`."),
    KeyDoc("image_pull_secrets", "`[]`", "Names of image pull secrets."),
    KeyDoc("shm_size", "`16Gi`", "Size of the in-memory /dev/shm.", null="no /dev/shm volume: the container runtime's default"),
    KeyDoc("host_network", "`false`", "Run pods in the host network (dnsPolicy ClusterFirstWithHostNet)."),
    KeyDoc("anti_affinity", "`true` (`false` for cpu)", "At most one pod of the job per node (kubernetes.io/hostname)."),
    KeyDoc("scripts_dir", "`/opt/npu-job`", "Where the scripts ConfigMap is mounted; the pod command runs there."),
    KeyDoc("bootstrap.url", "none", "Fetch bootstrap.sh from this http(s) URL at pod start instead of the bundled one."),
    KeyDoc("pip_install", "`[]`", "pip requirements installed at pod start before anything else (e.g. `npu-job==0.1.0`), for images without npu-job."),
)



def spec_keys_markdown() -> str:
    """The README's spec key table (Markdown), generated from :data:`SPEC_KEYS`."""
    rows = [
        f"| `{doc.key}` | {doc.default} | {doc.meaning}{f' `null`: {doc.null}.' if doc.null else ''} |"
        for doc in SPEC_KEYS
    ]
    return "\n".join(["| key | default | meaning |", "| --- | --- | --- |", *rows])


_TOP_KEYS = tuple(sorted({doc.key.split(".")[0] for doc in SPEC_KEYS}))
_SUB_KEYS: Mapping[str, Tuple[str, ...]] = {
    top: tuple(doc.key.split(".", 1)[1] for doc in SPEC_KEYS if doc.key.startswith(top + "."))
    for top in ("hccl", "resources", "bootstrap")
}
#: top-level keys whose ``null`` has a meaning of its own (see :attr:`KeyDoc.null`)
_NULL_MEANS_NONE = tuple(doc.key for doc in SPEC_KEYS if doc.null)
assert all("." not in key for key in _NULL_MEANS_NONE), "validate() reads null meanings at the top level"
_ACCELERATOR_HINTS = {
    key: "accelerators are requested from device and npus_per_node"
    for key in ("gpu", "npu", "nvidia.com/gpu", "huawei.com/ascend-1980", "huawei.com/Ascend910")
}
_MOUNT_KEYS = ("name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation")


# --- the checker: one pass, all problems ----------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, SetScalar):
        return repr(value.raw)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57] + "...")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


class _Checker:
    """Reads typed values out of the merged tree, recording a problem for each bad one."""

    def __init__(self, merged: MergedValues) -> None:
        self.merged = merged
        self.problems: List[str] = []
        self.suggested: set = set()  # key paths a did-you-mean already named

    def problem(self, path: Path, message: str) -> None:
        where = format_path(path)
        origin = self.merged.origin_of(path) if len(self.merged.sources) > 1 else None
        suffix = f" (from {origin})" if origin else ""
        self.problems.append(f"{where}{suffix}: {message}")

    # scalars ------------------------------------------------------------------------------

    def string(
        self,
        value: Any,
        path: Path,
        *,
        pattern: Optional["re.Pattern[str]"] = None,
        rule: str = "",
        max_length: Optional[int] = None,
        allow_int: bool = False,
    ) -> Optional[str]:
        if isinstance(value, SetScalar):
            value = value.raw
        if isinstance(value, int) and not isinstance(value, bool) and allow_int:
            value = str(value)
        if not isinstance(value, str):
            hint = " (quote it to keep it exactly as written)" if isinstance(value, (bool, int, float)) else ""
            self.problem(path, f"expected a string, got {_describe(value)}{hint}")
            return None
        if re.search("[\ud800-\udfff]", value):
            self.problem(path, "is not valid UTF-8 text")
            return None
        if "\x00" in value:
            self.problem(path, "contains a NUL character, which no process argument or environment value can carry")
            return None
        if pattern is not None and not pattern.match(value):
            self.problem(path, f"{_describe(value)} is not {rule}")
            return None
        if max_length is not None and len(value) > max_length:
            self.problem(path, f"{_describe(value)} is too long ({len(value)} characters, at most {max_length})")
            return None
        return value

    def integer(self, value: Any, path: Path, low: int, high: int) -> Optional[int]:
        if isinstance(value, SetScalar):
            value = value.typed
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(path, f"expected an integer, got {_describe(value)}")
            return None
        if not low <= value <= high:
            self.problem(path, f"expected an integer from {low} to {high}, got {value}")
            return None
        return value

    def boolean(self, value: Any, path: Path) -> Optional[bool]:
        if isinstance(value, SetScalar):
            value = value.typed
        if not isinstance(value, bool):
            self.problem(path, f"expected true or false, got {_describe(value)}")
            return None
        return value

    def choice(self, value: Any, path: Path, choices: Sequence[str]) -> Optional[str]:
        text = self.string(value, path)
        if text is None:
            return None
        if text not in choices:
            close = difflib.get_close_matches(text, choices, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.problem(path, f"expected one of {', '.join(choices)}; got {text!r}{hint}")
            return None
        return text

    def quantity(self, value: Any, path: Path) -> Optional[str]:
        if isinstance(value, SetScalar):
            value = value.raw
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        text = self.string(value, path, pattern=_QUANTITY, rule="a Kubernetes quantity such as 16, 500m, 64Gi")
        return text

    # containers ---------------------------------------------------------------------------

    def mapping(
        self, value: Any, path: Path, known: Optional[Sequence[str]] = None, hints: Mapping[str, str] = {}
    ) -> Dict[str, Any]:
        """A mapping; with ``known``, each unknown key is a problem with a did-you-mean (or a hint)."""
        if not isinstance(value, dict):
            self.problem(path, f"expected a mapping, got {_describe(value)}")
            return {}
        if known is not None:
            for key in value:
                if key in known:
                    continue
                if len(self.problems) >= LISTED_PROBLEMS:  # unlisted: spare a did-you-mean per key
                    self.problem(path + (key,), "unknown key")
                    continue
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                if key in hints:
                    hint = hints[key]
                elif close:
                    hint = f"did you mean {close[0]!r}?"
                    self.suggested.add(path + (close[0],))
                else:
                    hint = f"known keys: {', '.join(known)}"
                self.problem(path + (key,), f"unknown key ({hint})")
        return value

    def required(self, mapping: Mapping[str, Any], key: str, path: Path) -> bool:
        """Whether ``key`` has a value; if not, a problem (unless a did-you-mean already points here)."""
        if mapping.get(key) is not None:
            return True
        if path + (key,) not in self.suggested:
            self.problem(path + (key,), "required key is missing")
        return False

    def sequence(self, value: Any, path: Path) -> List[Any]:
        if isinstance(value, SetScalar) and value.raw == "":
            return []  # --set args= means an empty list, as `{}` does
        if not isinstance(value, list):
            self.problem(path, f"expected a list, got {_describe(value)}")
            return []
        return value

    def string_list(self, value: Any, path: Path, **string_rules: Any) -> Tuple[str, ...]:
        items = [self.string(item, path + (i,), **string_rules) for i, item in enumerate(self.sequence(value, path))]
        return tuple(item for item in items if item is not None)

    def string_map(
        self, value: Any, path: Path, *, key_check: Any, allow_int: bool = True, **value_rules: Any
    ) -> Tuple[Tuple[str, str], ...]:
        pairs = []
        for key, item in self.mapping(value, path).items():
            if not key_check(str(key), path + (key,)):
                continue
            text = self.string(item, path + (key,), allow_int=allow_int, **value_rules)
            if text is not None:
                pairs.append((str(key), text))
        return tuple(pairs)

    # name rules ---------------------------------------------------------------------------

    def qualified_key(self, key: str, path: Path) -> bool:
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or len(name) > 63 or not _QUALIFIED_NAME.match(name):
            self.problem(
                path,
                "not a valid key: an optional DNS-1123 subdomain and '/', then up to 63 letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit",
            )
            return False
        return True

    def env_name(self, key: str, path: Path) -> bool:
        if not _ENV_NAME.match(key):
            self.problem(path, "not a valid variable name: letters, digits and '_', not starting with a digit")
            return False
        if key in RESERVED_ENV:
            self.problem(path, f"reserved: {RESERVED_ENV[key]}")
            return False
        return True


# --- validation -------------------------------------------------------------------------------


def validate(merged: MergedValues, source: Optional[str] = None) -> JobSpec:
    """Check the merged values and return the :class:`JobSpec`; raise SpecError listing all problems."""
    check = _Checker(merged)
    tree = check.mapping(merged.tree, (), _TOP_KEYS)
    values: Dict[str, Any] = {}

    def present(key: str) -> bool:
        return key in tree and tree[key] is not None

    for key in ("name", "image", "script"):
        check.required(tree, key, ())

    # plain keys
    if present("device"):
        values["device"] = check.choice(tree["device"], ("device",), DEVICES)
    device = values.get("device") or "npu"
    if present("name"):
        values["name"] = check.string(tree["name"], ("name",), pattern=_DNS_LABEL, rule=DNS_LABEL_RULE, max_length=63)
    if present("image"):
        values["image"] = check.string(
            tree["image"], ("image",), pattern=re.compile(r"[^\s\x00-\x1f\x7f]+\Z"), rule="an image reference (no spaces or control characters)"
        )
    if present("script"):
        values["script"] = check.string(tree["script"], ("script",), pattern=_NO_CONTROL, rule="a path (no control characters)")
    for key in ("args", "launcher_args"):
        if present(key):
            values[key] = check.string_list(tree[key], (key,), allow_int=True)
    if present("nodes"):
        values["nodes"] = check.integer(tree["nodes"], ("nodes",), 1, 100_000)
    max_per_node = MAX_NODE_ACCELERATORS if device in FULL_NODE else 1024
    if present("full_node_npus"):
        values["full_node_npus"] = check.integer(tree["full_node_npus"], ("full_node_npus",), 1, MAX_NODE_ACCELERATORS)
    if present("npus_per_node"):
        values["npus_per_node"] = check.integer(tree["npus_per_node"], ("npus_per_node",), 1, max_per_node)
    elif device == "cpu":
        values["npus_per_node"] = 1
    for key in ("namespace", "task_name"):
        if present(key):
            values[key] = check.string(tree[key], (key,), pattern=_DNS_LABEL, rule=DNS_LABEL_RULE, max_length=63)
    for key in ("queue", "priority_class"):
        if present(key):
            values[key] = check.string(tree[key], (key,), pattern=_DNS_SUBDOMAIN, rule=DNS_SUBDOMAIN_RULE, max_length=253)
    if present("workdir"):
        values["workdir"] = check.string(
            tree["workdir"], ("workdir",), pattern=re.compile(r"/[^\x00-\x1f\x7f]*\Z"), rule="an absolute path (starting with '/')"
        )
    if present("scripts_dir"):  # it appears in the pod command: keep it to plain path characters
        values["scripts_dir"] = check.string(
            tree["scripts_dir"], ("scripts_dir",), pattern=re.compile(r"/[A-Za-z0-9._/-]*\Z"),
            rule="an absolute path of letters, digits, '.', '_', '-' and '/'",
        )
    if present("env"):
        values["env"] = check.string_map(tree["env"], ("env",), key_check=check.env_name)
    if present("launcher"):
        values["launcher"] = check.choice(tree["launcher"], ("launcher",), LAUNCHERS)
    for key in ("routing", "tiered_store", "host_network", "anti_affinity"):
        if present(key):
            values[key] = check.boolean(tree[key], (key,))
    if present("master_port"):
        values["master_port"] = check.integer(tree["master_port"], ("master_port",), 1, 65535)
    if present("max_retry"):
        values["max_retry"] = check.integer(tree["max_retry"], ("max_retry",), 0, 2**31 - 1)
    for key in ("node_selector", "labels"):
        if present(key):
            values[key] = check.string_map(
                tree[key], (key,), key_check=check.qualified_key,
                pattern=re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z"),
                rule="a label value: up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
                max_length=63,
            )
    if present("annotations"):
        values["annotations"] = check.string_map(tree["annotations"], ("annotations",), key_check=check.qualified_key)
    if present("image_pull_policy"):
        values["image_pull_policy"] = check.choice(tree["image_pull_policy"], ("image_pull_policy",), PULL_POLICIES)
    if present("image_pull_secrets"):
        values["image_pull_secrets"] = check.string_list(
            tree["image_pull_secrets"], ("image_pull_secrets",), pattern=_DNS_SUBDOMAIN, rule=DNS_SUBDOMAIN_RULE
        )
    if present("shm_size"):
        values["shm_size"] = check.quantity(tree["shm_size"], ("shm_size",))
    for key in _NULL_MEANS_NONE:  # null from any input, not its absence: the key's own meaning
        if not present(key) and (key in tree or (key,) in merged.nulls):
            values[key] = None

    # nested records
    hccl_values: Dict[str, Any] = {}
    if present("hccl"):
        hccl = check.mapping(tree["hccl"], ("hccl",), _SUB_KEYS["hccl"])
        if hccl.get("connect_timeout") is not None:
            hccl_values["connect_timeout"] = check.integer(hccl["connect_timeout"], ("hccl", "connect_timeout"), 120, 7200)
        if hccl.get("base_port") is not None:
            hccl_values["base_port"] = check.integer(hccl["base_port"], ("hccl", "base_port"), 1024, 65536 - HCCL_PORT_COUNT)
        if hccl.get("reserve_ports") is not None:
            hccl_values["reserve_ports"] = check.boolean(hccl["reserve_ports"], ("hccl", "reserve_ports"))
    resource_values: Dict[str, Optional[str]] = {}
    if present("resources"):
        resources = check.mapping(tree["resources"], ("resources",), _SUB_KEYS["resources"], _ACCELERATOR_HINTS)
        for key in _SUB_KEYS["resources"]:
            if resources.get(key) is not None:
                resource_values[key] = check.quantity(resources[key], ("resources", key))
    if present("bootstrap"):
        bootstrap = check.mapping(tree["bootstrap"], ("bootstrap",), _SUB_KEYS["bootstrap"])
        if bootstrap.get("url") is not None:
            values["bootstrap_url"] = check.string(
                bootstrap["url"], ("bootstrap", "url"), pattern=_URL, rule="an http:// or https:// URL without spaces"
            )
    if present("pip_install"):
        requirements = tree["pip_install"]
        if isinstance(requirements, (str, SetScalar)):
            requirements = [requirements]
        values["pip_install"] = check.string_list(
            requirements, ("pip_install",), pattern=re.compile(r"[^\s-][^\x00-\x1f\x7f]*\Z"),
            rule="a pip requirement such as npu-job==0.1.0 (not an option)",
        )
    volume_names = _check_volumes(check, tree.get("volumes"), values) if present("volumes") else ()
    if present("mounts"):
        _check_mounts(check, tree["mounts"], volume_names, values)

    where = source or " + ".join(merged.sources) or "job spec"
    if check.problems:
        raise SpecError(where, check.problems)
    spec = _resolve_defaults(values, hccl_values, resource_values)
    _check_across_keys(check, spec)
    if check.problems:
        raise SpecError(where, check.problems)
    return replace(spec, warnings=spec_warnings(spec, explicit_keys=[key for key in tree if tree[key] is not None]))


def _check_volumes(check: _Checker, value: Any, values: Dict[str, Any]) -> Tuple[str, ...]:
    names: List[str] = []
    volumes = []
    for index, item in enumerate(check.sequence(value, ("volumes",))):
        path: Path = ("volumes", index)
        volume = check.mapping(item, path)
        if not volume:
            continue
        if not check.required(volume, "name", path):
            continue
        name = check.string(volume["name"], path + ("name",), pattern=_DNS_LABEL, rule=DNS_LABEL_RULE, max_length=63)
        if name is None:
            continue
        if name in RESERVED_VOLUMES:
            check.problem(path + ("name",), f"{name!r} is used by npu-job itself; choose another name")
        elif name in names:
            check.problem(path + ("name",), f"{name!r} is declared twice")
        if len(volume) < 2:
            check.problem(path, "expected a volume source beside 'name' (for example hostPath, nfs, persistentVolumeClaim)")
        names.append(name)
        volumes.append(typed(volume))
    values["volumes"] = tuple(volumes)
    return tuple(names)


def _check_mounts(check: _Checker, value: Any, volume_names: Sequence[str], values: Dict[str, Any]) -> None:
    mounts = []
    paths: List[str] = []
    for index, item in enumerate(check.sequence(value, ("mounts",))):
        path: Path = ("mounts", index)
        mount = check.mapping(item, path, _MOUNT_KEYS)
        if not mount:
            continue
        name = check.string(mount["name"], path + ("name",)) if check.required(mount, "name", path) else None
        if name is not None and name not in volume_names:
            close = difflib.get_close_matches(name, volume_names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "declare it under volumes"
            check.problem(path + ("name",), f"{name!r} is not a volume in volumes ({hint})")
        mount_path = None
        if check.required(mount, "mountPath", path):
            mount_path = check.string(
                mount["mountPath"], path + ("mountPath",), pattern=re.compile(r"/[^\x00-\x1f\x7f]*\Z"), rule="an absolute path"
            )
        if mount_path is not None:
            if mount_path in paths:
                check.problem(path + ("mountPath",), f"{mount_path!r} is mounted twice")
            paths.append(mount_path)
        if mount.get("readOnly") is not None:
            check.boolean(mount["readOnly"], path + ("readOnly",))
        for key in ("subPath", "subPathExpr", "mountPropagation"):
            if mount.get(key) is not None:
                check.string(mount[key], path + (key,))
        mounts.append(typed(mount))
    values["mounts"] = tuple(mounts)


def _resolve_defaults(
    values: Mapping[str, Any], hccl: Mapping[str, Any], resources: Mapping[str, Optional[str]]
) -> JobSpec:
    settled = {key: value for key, value in values.items() if value is not None or key in _NULL_MEANS_NONE}
    device = settled.get("device", "npu")
    nodes = settled.get("nodes", 1)
    launcher = settled.get("launcher", "npu-run")
    settled.setdefault("routing", device == "npu" and nodes >= MIN_ROUTING_NODES)
    settled.setdefault("tiered_store", launcher == "npu-run")
    settled.setdefault("anti_affinity", device != "cpu")
    if device in FULL_NODE:
        settled.setdefault("full_node_npus", FULL_NODE[device])
    else:  # cpu: processes, not accelerators; there is no full node to fill
        settled["full_node_npus"] = None
    return JobSpec(hccl=HcclSpec(**hccl), resources=ResourceSpec(**resources), **settled)


def _check_across_keys(check: _Checker, spec: JobSpec) -> None:
    longest = f"{spec.name}-{spec.task_name}-{spec.nodes - 1}"
    if len(longest) > 63:
        check.problem(
            ("name",),
            f"too long for the pod names: {longest!r} has {len(longest)} characters; a pod's hostname "
            f"'<name>-<task_name>-<index>' must have at most 63",
        )
    if spec.full_node_npus is not None and spec.npus_per_node > spec.full_node_npus:
        check.problem(
            ("npus_per_node",),
            f"{spec.npus_per_node} is more than a full node (full_node_npus {spec.full_node_npus}); "
            f"on nodes with {spec.npus_per_node} accelerators (e.g. Atlas A3) set full_node_npus: {spec.npus_per_node}",
        )
    if spec.tiered_store and spec.launcher != "npu-run":
        check.problem(("tiered_store",), f"the tiered store needs launcher npu-run; launcher is {spec.launcher}")
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
                "a pod in the host network cannot set net.* sysctls; reserve the ports on the nodes "
                "(net.ipv4.ip_local_reserved_ports) or turn host_network off",
            )
    if spec.routing and spec.device == "npu":
        for path, key, owner in (
            (("labels",), "ring-controller.cce", "the configmap1980 rank table"),
            (("annotations",), "cabinet", "ToR topology delivery"),
        ):
            if key in dict(getattr(spec, path[0])):
                check.problem(path + (key,), f"set by npu-job for routing ({owner}); remove it")
    ours = {spec.scripts_dir} | ({"/dev/shm"} if spec.shm_size else set()) | ({host for _, host in NPU_HOST_MOUNTS} if spec.device == "npu" else set())
    for index, mount in enumerate(spec.mounts):
        if mount.get("mountPath") in ours:
            check.problem(("mounts", index, "mountPath"), f"{mount['mountPath']!r} is mounted by npu-job itself")


def spec_warnings(spec: JobSpec, explicit_keys: Iterable[str] = ()) -> Tuple[str, ...]:
    """What is valid but will disappoint, one sentence each (the renderer logs them)."""
    warnings: List[str] = []
    explicit = set(explicit_keys)
    full = spec.full_node_npus
    if spec.routing and spec.device != "npu" and not _brings_a_rank_table(spec):
        warnings.append(
            f"routing is on for device {spec.device}, but no rank table source is configured (CCE's "
            f"configmap1980 plugin serves NPU jobs only): set env RANK_TABLE_FILE (a file in one of "
            f"volumes, or an http(s) URL) or mount one at {_default_rank_table_dirs()[0]}; without it each "
            f"pod's bootstrap finds no rank table and keeps the scheduler's order"
        )
    if spec.routing and spec.nodes < MIN_ROUTING_NODES:
        warnings.append(
            f"routing is on with {spec.nodes} node(s): the bootstrap needs at least {MIN_ROUTING_NODES} "
            f"and will keep the scheduler's order"
        )
    if full is not None and spec.npus_per_node < full:
        tail = (
            f"; each pod's bootstrap ({FULL_NODE_ENV}={full}) will find partial nodes in the rank table, "
            f"write a failed route_plan.json and keep the scheduler's order (NODE_RANK = VC_TASK_INDEX, "
            f"master index 0): routing acceleration needs full nodes"
            if spec.routing else ""
        )
        warnings.append(f"npus_per_node is {spec.npus_per_node}, below a full node (full_node_npus {full}){tail}")
    arrival = _arrival_order_flags(spec.launcher_args)
    if spec.routing and arrival:
        warnings.append(
            f"launcher_args {' '.join(arrival)} assigns node ranks by arrival, so the launcher "
            f"cannot apply the bootstrap's new ranks (use the default static/parallel rendezvous)"
        )
    if spec.full_node_npus is None and "full_node_npus" in explicit:
        warnings.append(f"full_node_npus is ignored for device {spec.device}: it has no full node")
    if spec.device != "npu" and "hccl" in explicit:
        warnings.append(f"hccl settings are ignored for device {spec.device}")
    if spec.bootstrap_url and not spec.routing:
        warnings.append("bootstrap.url is ignored: routing is off, so the pod runs no bootstrap")
    return tuple(warnings)


def _default_rank_table_dirs() -> Tuple[str, ...]:
    """Where the bootstrap looks for a rank table when ``RANK_TABLE_FILE`` is not set."""
    import posixpath

    return tuple(posixpath.dirname(path) for path in DEFAULT_RANK_TABLES)


def _brings_a_rank_table(spec: JobSpec) -> bool:
    """Whether the pods get a rank table without CCE: ``RANK_TABLE_FILE`` or a default location."""
    if RANK_TABLE_ENV in dict(spec.env):
        return True
    for mount in spec.mounts:
        path = str(mount.get("mountPath", "")).rstrip("/")
        if any(place == path or place.startswith(path + "/") or path.startswith(place + "/")
               for place in _default_rank_table_dirs()):
            return True
    return False


def _arrival_order_flags(args: Sequence[str]) -> List[str]:
    """Launcher flags under which ranks follow arrival order, not ``--node_rank``."""
    flags = []
    for index, arg in enumerate(args):
        match = re.match(r"--rdzv[-_]backend(?:=(.*))?\Z", arg)
        if match:
            inline = match.group(1)
            backend = inline if inline is not None else (args[index + 1] if index + 1 < len(args) else "")
            if backend not in ("static", "parallel"):
                flags.append(arg if inline is not None else f"{arg} {backend}")
        elif arg == "--standalone":
            flags.append(arg)
    return flags
