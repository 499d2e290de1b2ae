"""The validated job spec: the frozen :class:`JobSpec` and :func:`validate`, which makes one.

``validate(merged)`` walks the merged values (see ``values.py``) once, key by key of the key
table (:data:`~npu_job.render.keys.SPEC_KEYS`, ``device`` first: other keys' rules depend on it),
and collects *every* problem with its key path before raising one
:class:`~npu_job.errors.SpecError` (exit 5): unknown keys, wrong types, out-of-range values,
missing required keys, invalid Kubernetes names (rejected with the rule, never rewritten), and
rules across keys (ports that collide, mounts of undeclared volumes, pod names too long for a
hostname).

The validator is a small explicit one rather than JSON Schema: the messages must name the key,
the value and the fix, the cross-key rules need code anyway, and it keeps render free of a
runtime dependency the package does not otherwise need.

What is valid but will disappoint (routing with fewer than 3 nodes, part of a node, a launcher
option that assigns ranks by arrival) is ``lint``'s: its warnings travel in
:attr:`JobSpec.warnings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from npu_job.kinds import KINDS
from npu_job.kinds.base import JobKind

from npu_job.errors import SpecError
from npu_job.podfacts import DEFAULT_RANK_TABLES

from .checks import Checker
from .keys import (
    DEVICE_RESOURCE,
    HCCL_PORT_COUNT,
    KEYS,
    NPU_HOST_MOUNTS,
    NPU_NODE_SELECTOR,
    NULL_MEANS_NONE,
    REQUIRED,
    RESERVED_ENV,
    RESTARTS,
    SPEC_KEYS,
    SUB_KEY_HINTS,
    SUB_KEYS,
    TOP_KEYS,
    with_defaults,
)
from .lint import brings_a_rank_table, spec_warnings
from .values import MergedValues

# --- reading the keys ------------------------------------------------------------------------


class _Context:
    """What the keys read so far tell the next ones: the device, the volumes' names."""

    def __init__(self, read: Mapping[str, Any]) -> None:
        self.read = read
        self.volume_names: Tuple[str, ...] = ()

    @property
    def device(self) -> str:
        return self.read.get("device") or KEYS["device"].default


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
    kind: str = _DEFAULTS["kind"]
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
    probe: Union[bool, int] = _DEFAULTS["probe"]  # True: npu-run's default budget; int: seconds
    master_port: int = _DEFAULTS["master_port"]
    hccl: HcclSpec = field(default_factory=HcclSpec)
    volumes: Tuple[Mapping[str, Any], ...] = _DEFAULTS["volumes"]
    mounts: Tuple[Mapping[str, Any], ...] = _DEFAULTS["mounts"]
    max_retry: int = _DEFAULTS["max_retry"]
    restart: str = _DEFAULTS["restart"]  # "job" or "pod" (keys.RESTARTS)
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
    bundle: bool = _DEFAULTS["bundle"]
    pip_install: Tuple[str, ...] = _DEFAULTS["pip_install"]
    #: what is valid but will disappoint (``lint.spec_warnings``); the renderer logs these
    warnings: Tuple[str, ...] = field(default=(), compare=False)

    @property
    def job_kind(self) -> JobKind:
        """The record of :attr:`kind` (:mod:`npu_job.kinds`)."""
        return KINDS[self.kind]

    @property
    def resource_name(self) -> Optional[str]:
        """The extended resource each pod requests ``npus_per_node`` of (None for cpu): where
        the kind's cluster names NPUs otherwise than CCE (its ``npu_resource``), that name."""
        if self.device == "npu" and self.job_kind.npu_resource:
            return self.job_kind.npu_resource
        return DEVICE_RESOURCE[self.device]

    @property
    def accelerator_node_selector(self) -> Tuple[Tuple[str, str], ...]:
        """The nodeSelector the pods get before the spec's own: the NPU nodes' label (the kind's
        cluster's, its ``npu_node_selector``, where it labels them otherwise than CCE)."""
        if self.device != "npu":
            return ()
        own = self.job_kind.npu_node_selector
        return NPU_NODE_SELECTOR if own is None else own

    @property
    def delivered_rank_table(self) -> bool:
        """Whether the cluster delivers the pods a rank table: CCE, to an NPU Volcano Job, or
        the kind's controller, in a ConfigMap it fills where the bootstrap looks."""
        return self.cce_rank_table or any(
            f"{mount.path}/{name}" in DEFAULT_RANK_TABLES
            for mount in self.job_kind.configmap_mounts
            for name, _ in mount.data
        )

    @property
    def uses_bundle(self) -> bool:
        """Whether the pods run npu-job from the job's bundle (the bootstrap, or npu-run)."""
        return self.bundle and (self.routing or self.launcher == "npu-run")

    @property
    def fetches_bundle(self) -> bool:
        """Whether the pods download the bundle (``bootstrap.url``) rather than mount it."""
        return self.uses_bundle and self.bootstrap_url is not None

    @property
    def routes_by_api(self) -> bool:
        """Whether routing lists the job's pods (and the topology) from the Kubernetes API."""
        if not self.routing or self.routing_source == "rank-table":
            return False
        return self.routing_source == "api" or (
            not self.cce_rank_table and not brings_a_rank_table(self)
        )

    @property
    def cce_rank_table(self) -> bool:
        """Whether CCE delivers the pods their rank table and switch topology: an NPU job of a
        kind whose object CCE's configmap1980 plugin serves (the Volcano Job)."""
        return self.device == "npu" and self.job_kind.cce_rank_table

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
    tree = check.mapping(merged.tree, (), TOP_KEYS)
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
                    check.mapping(tree[top], (top,), SUB_KEYS[top], SUB_KEY_HINTS.get(top, {}))
                    if present(top)
                    else {}
                )
            node = groups[top]
        name = sub or top
        if node.get(name) is not None:
            path = (top, sub) if sub else (top,)
            given[key.key] = key.type.read(check, node[name], path, context)
    given = {key: value for key, value in given.items() if value is not None}
    for name in NULL_MEANS_NONE:  # null from any input, not its absence: the key's own meaning
        if not present(name) and (name in tree or (name,) in merged.nulls):
            given[name] = None

    _refuse_keys_of_the_kind(check, given, present("kind"))

    where = source or " + ".join(merged.sources) or "job spec"
    if check.problems:
        raise SpecError(where, check.problems)
    spec = _job_spec(with_defaults(given))
    _check_across_keys(check, spec)
    if check.problems:
        raise SpecError(where, check.problems)
    explicit = [key for key in tree if tree[key] is not None]
    return replace(spec, warnings=spec_warnings(spec, explicit_keys=explicit))


def _refuse_keys_of_the_kind(check: Checker, given: Mapping[str, Any], kind_given: bool) -> None:
    """A problem for each key the user gave (never a default) that the job kind cannot honour:
    a refused key or one of its nested keys, or a ``restart`` value it has no mechanism for."""
    if kind_given and "kind" not in given:  # an unknown kind: its own problem says so
        return
    kind = KINDS[given.get("kind", KEYS["kind"].default)]
    device = given.get("device", KEYS["device"].default)
    if device not in kind.devices:
        check.problem(
            ("device",),
            f"the {kind.title} (kind {kind.name}) runs {' or '.join(kind.devices)} pods only, "
            f"not {device}; choose another kind",
        )
    restart = given.get("restart")
    for value, why in kind.refused_restarts:
        if restart == value:
            check.problem(
                ("restart",),
                f"the {kind.title} (kind {kind.name}) cannot honour {value!r}: {why}; use "
                f"{kind.restart_default!r} (its default) or choose another kind",
            )
    for refused, why in kind.refused_keys:
        for key in given:
            if key == refused or key.startswith(refused + "."):
                check.problem(
                    tuple(key.split(".")),
                    f"the {kind.title} (kind {kind.name}) cannot honour it: {why}; remove it "
                    "or choose another kind",
                )


def _check_across_keys(check: Checker, spec: JobSpec) -> None:
    kind = spec.job_kind
    controller_env = {kind.index_env, *kind.launcher_env} - set(RESERVED_ENV)
    for name, _ in spec.env:
        if name in controller_env:
            check.problem(
                ("env", name),
                f"set in every pod by the {kind.title}'s controller (kind {kind.name}); remove it",
            )
    restart_labels = {key for value in RESTARTS for key, _ in kind.restart_labels(value)}
    for key, _ in spec.labels:
        if key in restart_labels:
            check.problem(
                ("labels", key),
                f"set by npu-job from the restart key (kind {kind.name}); use restart instead",
            )
    not_a_name = kind.name_problem(spec.name)
    if not_a_name:
        check.problem(
            ("name",), f"the {kind.title} (kind {kind.name}) cannot take it: {not_a_name}"
        )
    longest, what = kind.longest_name(spec.name, spec.task_name, spec.nodes)
    if len(longest) > 63:
        check.problem(
            ("name",),
            f"too long for the pod names: {longest!r} has {len(longest)} characters; {what} "
            "must have at most 63",
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
    if spec.probe is not False and spec.launcher != "npu-run":
        check.problem(("probe",), f"the probe needs launcher npu-run; launcher is {spec.launcher}")
    elif spec.probe is not False and not (
        spec.tiered_store or "--rdzv_backend=parallel" in spec.launcher_args
    ):
        check.problem(
            ("probe",),
            "the probe needs npu-run's parallel rendezvous: set tiered_store: true (or pass "
            "--rdzv_backend=parallel in launcher_args)",
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
