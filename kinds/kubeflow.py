"""Kubeflow's replica-spec jobs: what Kubeflow's PyTorchJob and MindCluster's AscendJob share.

Both controllers are built on kubeflow/common's job controller: kubeflow/training-operator keeps
its own copy (``pkg/controller.v1/common``, tag v1.9.0 = 6f74c7f6b2ed6c27aabd82d0a316b23f0646059c)
and Ascend/mind-cluster's ascend-operator imports kubeflow/common v0.4.3
(21f5ba8833a2e21df17601497a08396c9bae9ab2). So their pods follow one pattern:

* the job object maps replica types to replica specs (``{Master: {replicas, restartPolicy,
  template}, Worker: {...}}``); the defaulters match a type's name in any case
  (``setTypeNameToCamelCase``) and default ``replicas`` to 1;
* replica ``i`` of type ``T`` is the pod ``<job>-<t>-<i>``, ``t`` being ``T`` in lower case
  (``GenGeneralName``, ``pkg/controller.v1/common/util.go`` in both, ``/`` turned into ``-``;
  the pod's name is the template's, ``pkg/controller.v1/control/pod_control.go``);
* each pod is labelled ``training.kubeflow.org/operator-name`` (the controller's name),
  ``training.kubeflow.org/job-name``, ``training.kubeflow.org/replica-type`` (lower case) and
  ``training.kubeflow.org/replica-index`` (``GenLabels``, ``pkg/controller.v1/common/
  job_controller.go``; ``pkg/util/labels/labels.go``; keys in training-operator's
  ``pkg/apis/kubeflow.org/v1/common_types.go``, kubeflow/common's
  ``pkg/apis/common/v1/constants.go``), the Master also ``training.kubeflow.org/job-role:
  master``, and these win over the template's labels of the same keys.

npu-job renders one Master and ``nodes - 1`` Workers of one pod template, so a pod's index in
scheduler order is 0 for the Master and ``i + 1`` for Worker ``i``: the rank both controllers
give a node when a Master exists (``PET_NODE_RANK`` and ``RANK`` on PyTorchJob, ``RANK`` on an
AscendJob whose Master requests NPUs).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from npu_job.errors import InputError, shown
from npu_job.parsing import count_from_text

from .base import ControllerPod, JobKind, Labels, merged, string_pairs

OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
MASTER, WORKER = "Master", "Worker"
REPLICA_TYPES = (MASTER, WORKER)

# <job>-master-0 / <job>-worker-<i>: the type and index at the end of a pod name. Linear: the
# digit run is tried once, after a fixed word.
_TYPE_INDEX = re.compile(r"-(master|worker)-([0-9]+)\Z")


def pod_name(job: str, replica_type: str, index: int) -> str:
    """``GenGeneralName``: the pod (and per-replica Service) of replica ``index`` of a type."""
    return f"{job}-{replica_type.lower()}-{index}".replace("/", "-")


def master_worker_index(replica_type: str, replica_index: int) -> Optional[int]:
    """A pod's index in scheduler order from its lower-case type and its index within the type:
    the Master 0, Worker ``i`` ``i + 1``; None for another type or a Master other than 0 (the
    controllers allow one Master)."""
    if replica_type == MASTER.lower():
        return 0 if replica_index == 0 else None
    if replica_type == WORKER.lower():
        return replica_index + 1
    return None


class Replicas(NamedTuple):
    """One replica spec of a job object, as its controller reads it after defaulting."""

    replica_type: str  # Master or Worker
    count: int
    spec: Mapping[str, Any]  # the replica spec (replicas, restartPolicy, template)
    template: Mapping[str, Any]  # its pod template
    where: str  # e.g. "spec.pytorchReplicaSpecs.Worker", for messages


class MasterWorker(JobKind):
    """A kubeflow/common job of one Master and ``nodes - 1`` Workers (see the module docstring);
    a subclass names its controller, its replica specs' key and the container it demands."""

    job_label = JOB_NAME_LABEL
    index_label = REPLICA_INDEX_LABEL
    #: the job object's key of the replica specs (``spec.<key>``)
    specs_key = ""
    #: the fewest Workers a Worker spec may ask for (the controller's validation)
    min_workers = 1
    name_expected = (
        "a pod name ending in -master-0 or -worker-<index>, as the operator names pods "
        "<job>-<type>-<index>"
    )

    def pod_index(self, labels: Labels, name: str) -> Optional[int]:
        """The Master 0, Worker ``i`` ``i + 1``, from the replica-type and replica-index labels
        (else from the name); None for another type, a Master other than 0, or no index."""
        replica_type = labels.get(REPLICA_TYPE_LABEL)
        text = labels.get(REPLICA_INDEX_LABEL)
        if replica_type is None or text is None:
            return self.index_from_name(name)
        index = count_from_text(text)
        return None if index is None else master_worker_index(replica_type, index)

    def index_from_name(self, name: str) -> Optional[int]:
        match = _TYPE_INDEX.search(name)
        if match is None:
            return None
        index = count_from_text(match.group(2))
        return None if index is None else master_worker_index(match.group(1), index)

    def longest_name(self, job: str, group: str, nodes: int) -> Tuple[str, str]:
        # the Master, or the last Worker of nodes - 1 (its per-replica Service shares the name)
        names = [pod_name(job, MASTER, 0)] + (
            [pod_name(job, WORKER, nodes - 2)] if nodes > 1 else []
        )
        return max(names, key=len), "a pod's hostname '<name>-master-0' or '<name>-worker-<index>'"

    def replicas(self, job_object: Mapping[str, Any], source: str) -> Tuple[Replicas, ...]:
        """The job object's Master and Worker specs, checked as the controller's validation does
        (one Master, Workers at least :attr:`min_workers`, a container ``container_name``
        with an image in each); errors are :class:`InputError` naming ``source``."""
        spec = job_object.get("spec")
        specs = spec.get(self.specs_key) if isinstance(spec, dict) else None
        field = f"spec.{self.specs_key}"
        if not isinstance(specs, dict) or not specs:
            raise InputError(source, field, "expected a map of replica specs (Master, Worker)")
        found: Dict[str, Replicas] = {}
        for key, replica in specs.items():
            canonical = next((t for t in REPLICA_TYPES if t.lower() == str(key).lower()), None)
            where = f"{field}.{key}"
            if canonical is None or canonical in found:
                raise InputError(source, where, f"expected one of {', '.join(REPLICA_TYPES)}")
            if not isinstance(replica, dict) or not isinstance(replica.get("template"), dict):
                raise InputError(source, f"{where}.template", "expected a pod template")
            count = replica.get("replicas", 1)
            least = 1 if canonical == MASTER else self.min_workers
            if not isinstance(count, int) or isinstance(count, bool) or count < least:
                raise InputError(source, f"{where}.replicas", f"expected a count >= {least}")
            if canonical == MASTER and count != 1:
                raise InputError(source, f"{where}.replicas", f"expected 1, got {count}")
            template = replica["template"]
            self._check_containers(template, f"{where}.template.spec.containers", source)
            found[canonical] = Replicas(canonical, count, replica, template, where)
        if MASTER not in found:
            raise InputError(
                source,
                f"{field}.{MASTER}",
                "expected a Master replica spec (the pods' index, Worker i -> i + 1, needs one)",
            )
        return tuple(found[t] for t in REPLICA_TYPES if t in found)

    def _check_containers(self, template: Mapping[str, Any], where: str, source: str) -> None:
        pod_spec = template.get("spec")
        containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
        if not isinstance(containers, list):
            raise InputError(source, where, "expected a list of containers")
        named = [
            c for c in containers if isinstance(c, dict) and c.get("name") == self.container_name
        ]
        if not named or not named[0].get("image"):
            raise InputError(
                source,
                where,
                f"expected a container named {shown(self.container_name)} with an image",
            )


def training_container(template: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The container called ``name`` of a checked pod template (:meth:`MasterWorker.replicas`)."""
    return next(c for c in template["spec"]["containers"] if c.get("name") == name)


def named_port(container: Mapping[str, Any], name: str) -> Optional[int]:
    """The ``containerPort`` of the container's port called ``name``, or None."""
    for port in container.get("ports") or ():
        if isinstance(port, dict) and port.get("name") == name:
            number = port.get("containerPort")
            return number if isinstance(number, int) else None
    return None


def pod_labels(
    kind: MasterWorker, job: str, replica: Replicas, index: int
) -> List[Tuple[str, str]]:
    """The labels the controller puts on replica ``index`` of ``replica`` (over the template's)."""
    labels = [
        (OPERATOR_NAME_LABEL, dict(kind.constant_labels)[OPERATOR_NAME_LABEL]),
        (JOB_NAME_LABEL, job.replace("/", "-")),
        (REPLICA_TYPE_LABEL, replica.replica_type.lower()),
        (REPLICA_INDEX_LABEL, str(index)),
    ]
    if replica.replica_type == MASTER:
        labels.append((JOB_ROLE_LABEL, "master"))
    return labels


def replica_pod(
    job: str,
    replica: Replicas,
    index: int,
    rank: int,
    labels: Sequence[Tuple[str, str]],
    annotations: Sequence[Tuple[str, str]],
    env: Sequence[Tuple[str, str]],
    dns_names: Tuple[str, ...],
) -> ControllerPod:
    """Replica ``index`` of ``replica`` as its controller makes it: the pod ``<job>-<type>-<index>``
    at ``rank`` in scheduler order, the controller's ``labels`` and ``annotations`` over the
    template's, the hostname the kubelet gives it (the template's, else the pod's name)."""
    name = pod_name(job, replica.replica_type, index)
    metadata = replica.template.get("metadata") or {}
    pod_spec = replica.template["spec"]
    return ControllerPod(
        index=rank,
        name=name,
        hostname=str(pod_spec.get("hostname") or name),
        subdomain=str(pod_spec.get("subdomain") or ""),
        labels=merged(string_pairs(metadata.get("labels")), tuple(labels)),
        annotations=merged(string_pairs(metadata.get("annotations")), tuple(annotations)),
        env=tuple(env),
        template=replica.template,
        where=f"{replica.where}.template",
        dns_names=dns_names,
    )
