"""What a Kubernetes training job kind gives its pods: the record every part of npu-job reads.

A job kind (the Volcano Job, Kubeflow's PyTorchJob, JobSet, ...) is a controller that turns one
object into pods. Everything npu-job must know of it lives in one :class:`JobKind` subclass, one
module per kind (registered in :mod:`npu_job.kinds`):

* render: the object's apiVersion and kind, its template (the job object around the shared pod
  template, in ``npu_job/render/templates``), the container name and pod restart policy the
  controller demands, the spec keys it cannot honour, what it does when a pod fails unless told
  and the ``restart`` values it has no mechanism for, the RBAC its pods need, where the pod's
  identity variables come from (:meth:`JobKind.identity_env`), how ``train.sh`` finds the master
  (:meth:`JobKind.master_address_bash`) and which launcher variables the controller injects
  that ``train.sh`` unsets (:attr:`JobKind.launcher_env`);
* the bootstrap: the label selector of the job's pods, the index of a listed pod, which listed
  pods are left over from an earlier attempt of the job, the variable the controller sets to this
  pod's index (its scheduler order);
* npu-run's ``--node_rank=auto``: that variable again;
* the demo's pod simulator: the pods the controller makes of a rendered object
  (:meth:`JobKind.controller_pods`: names, hostnames, labels, annotations, injected environment,
  the names that resolve to each pod), or of the rendered stream where the controller reads
  another object beside it (:meth:`JobKind.stream_pods`).

Pure and standard library only (the pod side runs it on the image's Python 3.7): facts and
functions of values, nothing that reads a file, the network or the environment.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

from npu_job.errors import InputError
from npu_job.parsing import count_from_text

Labels = Mapping[str, str]

#: The platform's variables of the pod's identity (the routing-acceleration guide's names): the
#: job's name and the name of the part of the job the pod belongs to.
JOB_NAME_ENV = "MA_VJ_NAME"
GROUP_NAME_ENV = "MA_TASK_NAME"


class IdentityVar(NamedTuple):
    """One identity variable of the training container: set from the pod's own metadata
    (``valueFrom.fieldRef``), read by ``train.sh``."""

    name: str  # the variable
    metadata: str  # "labels" or "annotations"
    key: str  # the label or annotation

    @property
    def field_path(self) -> str:
        return f"metadata.{self.metadata}['{self.key}']"

    @property
    def words(self) -> str:
        """Where it comes from, as messages say it: ``annotation volcano.sh/job-name``."""
        return f"{self.metadata[:-1]} {self.key}"


class RoleRule(NamedTuple):
    """One rule of the namespaced Role the job's pods are bound to (beyond listing pods)."""

    api_group: str
    resource: str
    verbs: Tuple[str, ...]


class ConfigMapMount(NamedTuple):
    """A ConfigMap the kind's controller fills for the job, which render writes first (so that the
    controller finds it) and the training container mounts."""

    volume: str  # the pod's volume name
    configmap: str  # its name, ``{name}`` standing for the job's
    path: str  # the directory it is mounted at
    data: Tuple[Tuple[str, str], ...]  # what render writes in it, before the controller does

    def name_for(self, job: str) -> str:
        return self.configmap.format(name=job)


class ControllerPod(NamedTuple):
    """A pod as the kind's controller creates it, before the kubelet starts its container: what the
    demo's simulator needs beyond the pod template itself."""

    index: int  # the pod's index in scheduler order (its node rank without a plan)
    name: str
    hostname: str
    subdomain: str  # "" when the controller sets none
    labels: Tuple[Tuple[str, str], ...]
    annotations: Tuple[Tuple[str, str], ...]
    env: Tuple[Tuple[str, str], ...]  # what the controller injects into the container
    template: Mapping[str, Any]  # the pod template (metadata, spec) the pod is made from
    where: str  # where that template sits in the job object, for messages
    # the names that resolve to this pod from other pods of the cluster (its own hostname
    # resolves inside the pod anyway: the kubelet's /etc/hosts names it)
    dns_names: Tuple[str, ...]
    # files the controller mounts into the container: (directory, ((file name, text), ...))
    files: Tuple[Tuple[str, Tuple[Tuple[str, str], ...]], ...] = ()


class JobKind:
    """The facts of one job kind (subclass per kind; one instance each, in the registry)."""

    #: the job spec's ``kind`` value
    name: str = ""
    #: how docs and messages call it
    title: str = ""
    api_version: str = ""
    kind: str = ""
    #: the job object's template, in ``npu_job/render/templates``
    template: str = ""
    #: where the facts below were read: the controller's repository, files and commit
    source: str = ""

    #: the label whose value is the job's name, on every pod of the job
    job_label: str = ""
    #: the label whose value names the part of the job the training pods are (Volcano's task,
    #: JobSet's replicated job), or "" when the training pods are the whole job
    group_label: str = ""
    #: labels every pod of this kind's controller carries, with their values (they keep another
    #: controller's job of the same name out of the selector)
    constant_labels: Tuple[Tuple[str, str], ...] = ()
    #: the label a listed pod's index is read from
    index_label: str = ""
    #: the environment variable the controller sets to this pod's index in scheduler order
    index_env: str = ""
    #: the container name the controller demands of the training container
    container_name: str = "train"
    #: the pod template's ``restartPolicy`` the controller accepts
    restart_policy: str = "OnFailure"
    #: the name of the training container's port the controller reads the master's port from
    #: (render gives that port the job's master_port), "" when the controller reads none
    master_port_name: str = ""
    #: CCE's configmap1980 plugin, a Volcano Job plugin, delivers the kind's NPU pods their rank
    #: table and switch topology; where it does not, a routed NPU job of the kind lists its pods
    #: from the Kubernetes API unless it brings a rank table itself
    cce_rank_table: bool = False
    #: the devices (spec key ``device``) the kind's controller can run
    devices: Tuple[str, ...] = ("npu", "gpu", "cpu")
    #: the extended resource an NPU pod requests where the kind's cluster names NPUs otherwise
    #: than render's default (CCE's), "" for that default
    npu_resource: str = ""
    #: the nodeSelector of an NPU pod where the kind's cluster labels NPU nodes otherwise than
    #: render's default (CCE's), None for that default
    npu_node_selector: Optional[Tuple[Tuple[str, str], ...]] = None
    #: ConfigMaps the controller fills for the job: render writes each before the job object and
    #: the training container mounts it
    configmap_mounts: Tuple[ConfigMapMount, ...] = ()
    #: variables of the training container set from its pod's fields (name, fieldPath) that the
    #: kind's cluster needs and its controller does not always set
    pod_field_env: Tuple[Tuple[str, str], ...] = ()
    #: spec keys the kind cannot honour, each with why (render refuses them naming both)
    refused_keys: Tuple[Tuple[str, str], ...] = ()
    #: the spec key ``restart``'s value that says what the controller does when a pod fails,
    #: unless told otherwise (``job``: every pod of the job starts again; ``pod``: the failed
    #: pod is replaced alone): the default, which renders the kind's object as it always did
    restart_default: str = "job"
    #: values of ``restart`` the controller has no mechanism for, each with why (render refuses
    #: them naming the key, the value and the kind)
    refused_restarts: Tuple[Tuple[str, str], ...] = ()
    #: Role rules the pods need besides listing pods
    role_rules: Tuple[RoleRule, ...] = ()
    #: the pod metadata that carries :attr:`job_label` and :attr:`group_label` for the identity
    #: variables (:meth:`identity_env`): ``"labels"``, or ``"annotations"`` where the controller
    #: annotates its pods with the same keys
    identity_metadata: str = "labels"
    #: launcher variables the controller injects into the training container (torchrun reads
    #: ``PET_*`` as its flags' defaults; ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...):
    #: ``train.sh`` unsets them once it has read what it needs, so that none undoes the plan.
    #: The variables ``train.sh`` sets itself (``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
    #: ``NNODES``, ``NPUS_PER_NODE``) are overwritten instead, listed here or not.
    launcher_env: Tuple[str, ...] = ()
    #: where the job object says how many pods it makes (messages of the demo's simulator)
    replicas_field: str = "spec.replicas"
    #: the label whose value counts the restarts of the whole job, on every pod ("" where the
    #: kind has none): a listed pod of a lower count than another is left over from an earlier
    #: attempt (:meth:`of_latest_attempt`)
    attempt_label: str = ""

    def restart_labels(self, restart: str) -> Tuple[Tuple[str, str], ...]:
        """Labels of the job object by which the controller does what the spec key ``restart``
        says (none by default: the kind's template renders it)."""
        return ()

    def identity_env(self) -> Tuple[IdentityVar, ...]:
        """The training container's identity variables: ``MA_VJ_NAME`` from :attr:`job_label`
        and, where the kind has one, ``MA_TASK_NAME`` from :attr:`group_label`, both read from
        the pod's :attr:`identity_metadata` (``train.sh`` requires each)."""
        pairs = [(JOB_NAME_ENV, self.job_label)]
        if self.group_label:
            pairs.append((GROUP_NAME_ENV, self.group_label))
        return tuple(IdentityVar(name, self.identity_metadata, key) for name, key in pairs)

    def master_address_bash(self) -> str:
        """Bash lines of ``train.sh`` that set ``MASTER_ADDR`` to the address of the pod whose
        index is ``$MA_MASTER_INDEX`` (the pod of the planned rank 0; scheduler order without a
        plan). They run after the identity variables (:meth:`identity_env`) are checked and
        before the launcher variables (:attr:`launcher_env`) are unset, under ``set -euo
        pipefail``; a kind whose pods have DNS names gives that pod's (:meth:`dns_name`)."""
        raise NotImplementedError

    def root_address_bash(self) -> str:
        """Bash lines of ``train.sh`` that set ``MASTER_ADDR`` to the stable address of pod index
        0, where npu-run's ``parallel`` rendezvous keeps its root store whatever rank the plan
        gives that pod (the root plans the ranks, so the root's address does not move with rank
        0, and a replaced pod finds it): the kind's :meth:`dns_name` of pod 0, spelled in the
        identity variables, which ``train.sh`` has checked before these lines run."""
        return f'MASTER_ADDR="{self.dns_name("${MA_VJ_NAME}", "${MA_TASK_NAME}", 0)}"'

    #: the kind gives its pods no DNS name (:meth:`dns_name` says ""): the pod holding the new
    #: rank 0 is reached by its pod IP, which the bootstrap writes as ``NPU_JOB_MASTER_ADDR``, and
    #: so it waits, listing the job's pods, until every one has its IP (``status.podIP``)
    master_by_pod_ip: bool = False

    def selector(self, job: str, group: str = "") -> str:
        """The ``labelSelector`` of the job's pods (of one group, when given)."""
        terms = [f"{self.job_label}={job}"]
        if group and self.group_label:
            terms.append(f"{self.group_label}={group}")
        terms.extend(f"{key}={value}" for key, value in self.constant_labels)
        return ",".join(terms)

    def selects(self, labels: Labels, job: str, group: str = "") -> bool:
        """Whether a pod with ``labels`` is one of the job's (of the group, when given)."""
        # asked of every listed pod (thousands): plain tests, no generator per pod
        get = labels.get
        if get(self.job_label) != job:
            return False
        if group and self.group_label and get(self.group_label) != group:
            return False
        for key, value in self.constant_labels:
            if get(key) != value:
                return False
        return True

    def pod_index(self, labels: Labels, name: str) -> Optional[int]:
        """A listed pod's index in scheduler order: its :attr:`index_label`, else what its name
        says (:meth:`index_from_name`); None when neither says."""
        text = labels.get(self.index_label)
        if text is not None:
            return count_from_text(text)
        return self.index_from_name(name)

    def of_latest_attempt(self, pods: Sequence[Labels]) -> Tuple[bool, ...]:
        """For each listed pod's labels, whether it belongs to the latest attempt of the job among
        them: a pod whose :attr:`attempt_label` counts fewer restarts than another pod's is one
        the controller is replacing, and is not one of the job's pods. Every pod belongs where the
        kind counts no attempts, and a pod whose count is missing or not a count is kept (its
        index, not its attempt, decides whether it is the job's)."""
        if not self.attempt_label:
            return (True,) * len(pods)
        attempts = [count_from_text(labels.get(self.attempt_label) or "") for labels in pods]
        latest = max((attempt for attempt in attempts if attempt is not None), default=None)
        return tuple(attempt is None or attempt == latest for attempt in attempts)

    #: what :meth:`index_from_name` expects of a pod name, for messages
    name_expected: str = "a pod name ending in -<index>"

    def index_from_name(self, name: str) -> Optional[int]:
        """The index a pod's name gives, or None (the default: names carry no index)."""
        return None

    def dns_name(self, job: str, group: str, index: int) -> str:
        """The name that resolves to pod ``index`` of the job in the cluster ("" when the kind
        gives pods none)."""
        raise NotImplementedError

    def name_problem(self, job: str) -> str:
        """Why the kind cannot take ``job`` as the job's name, which render has already found a
        DNS-1123 label ("" when it can: the default), for a rule of the objects its controller
        names after it."""
        return ""

    def pod_subdomain(self, job: str) -> str:
        """The pod template's ``subdomain``: the headless Service the kind's own template renders
        for the pods of job ``job`` ("" where the controller gives pods their subdomain, or
        none)."""
        return ""

    def longest_name(self, job: str, group: str, nodes: int) -> Tuple[str, str]:
        """The longest name the controller makes of a job of ``nodes`` pods that must be a DNS
        label of at most 63 characters, and what it is, for messages (by default the Volcano
        Job's: the hostname of its last pod)."""
        return f"{job}-{group}-{nodes - 1}", "a pod's hostname '<name>-<task_name>-<index>'"

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        """The pods the controller makes of a rendered ``job_object``, in index order (the demo's
        simulator; errors are :class:`~npu_job.errors.InputError` naming ``source``)."""
        raise NotImplementedError

    def job_object(self, documents: Sequence[Any], source: str) -> Mapping[str, Any]:
        """The job object of a rendered stream (its documents, parsed): the one document of
        :attr:`api_version` and :attr:`kind`."""
        found = [
            document
            for document in documents
            if isinstance(document, dict)
            and (document.get("apiVersion"), document.get("kind")) == (self.api_version, self.kind)
        ]
        if len(found) != 1:
            raise InputError(
                source, "", f"expected one {self.api_version} {self.kind}, got {len(found)}"
            )
        return found[0]

    def stream_pods(self, documents: Sequence[Any], source: str) -> Tuple[ControllerPod, ...]:
        """The pods the controller makes of a rendered stream: those of its job object
        (:meth:`job_object`, :meth:`controller_pods`). A kind whose controller reads another
        object of the stream beside it (a TrainJob its TrainingRuntime) says so here."""
        return self.controller_pods(self.job_object(documents, source), source)


# A pod name's last hyphen-separated part, when it is all digits (a name of digits alone counts
# too). Linear: the digit run is tried once.
_INDEX_SUFFIX = re.compile(r"(?:\A|-)([0-9]+)\Z")


def index_suffix(name: str) -> Optional[int]:
    """The index a name ends in (``<job>-<task>-<index>``), or None."""
    match = _INDEX_SUFFIX.search(name)
    return None if match is None else count_from_text(match.group(1))


def string_pairs(mapping: Any) -> Tuple[Tuple[str, str], ...]:
    """A manifest's ``labels``/``annotations`` mapping as sorted string pairs (none: empty)."""
    if not isinstance(mapping, dict):
        return ()
    return tuple(sorted((str(key), str(value)) for key, value in mapping.items()))


def merged(*groups: Tuple[Tuple[str, str], ...]) -> Tuple[Tuple[str, str], ...]:
    """Label or annotation pairs, later groups winning, sorted by key."""
    table: Dict[str, str] = {}
    for group in groups:
        table.update(group)
    return tuple(sorted(table.items()))


def count_of(value: Any, default: Optional[int] = None, minimum: int = 0) -> Optional[int]:
    """A count field of a job object: ``value`` (``default`` when absent) when it is an integer
    of at least ``minimum``, else None (true and false are no counts)."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    return None


def name_and_namespace(job_object: Mapping[str, Any]) -> Tuple[str, str]:
    """A job object's ``metadata.name`` and ``metadata.namespace`` (``default`` without one)."""
    metadata = job_object.get("metadata") or {}
    return str(metadata.get("name") or ""), str(metadata.get("namespace") or "default")


def service_name_problem(job: str) -> str:
    """Why a Service cannot be named ``job`` (a DNS-1123 label): a Service's name is a DNS-1035
    label, which starts with a letter; "" when it can."""
    if job[:1].isalpha():
        return ""
    return (
        "it also names the headless Service of the pods' DNS names, and a Service's name must "
        "start with a letter"
    )


def subdomain_names(hostname: str, subdomain: str, namespace: str) -> Tuple[str, ...]:
    """The names cluster DNS gives a pod with ``hostname`` under a headless Service
    ``subdomain`` (``<hostname>.<subdomain>``, with the namespace, and with ``.svc``; the
    cluster's domain comes after that); none without a subdomain."""
    if not subdomain:
        return ()
    name = f"{hostname}.{subdomain}"
    return (name, f"{name}.{namespace}", f"{name}.{namespace}.svc")
