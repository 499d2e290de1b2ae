"""What a Kubernetes training job kind gives its pods: the record every part of npu-job reads.

A job kind (the Volcano Job, Kubeflow's PyTorchJob, JobSet, ...) is a controller that turns one
object into pods. Everything npu-job must know of it lives in one :class:`JobKind` subclass, one
module per kind (registered in :mod:`npu_job.kinds`):

* render: the object's apiVersion and kind, its template (the job object around the shared pod
  template, in ``npu_job/render/templates``), the container name and pod restart policy the
  controller demands, the spec keys it cannot honour, the RBAC its pods need;
* the bootstrap: the label selector of the job's pods, the index of a listed pod, the variable the
  controller sets to this pod's index (its scheduler order);
* npu-run's ``--node_rank=auto``: that variable again;
* the demo's pod simulator: the pods the controller makes of a rendered object
  (:meth:`JobKind.controller_pods`: names, hostnames, labels, annotations, injected environment,
  the names that resolve to each pod).

Pure and standard library only (the pod side runs it on the image's Python 3.7): facts and
functions of values, nothing that reads a file, the network or the environment.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

from npu_job.parsing import count_from_text

Labels = Mapping[str, str]


class RoleRule(NamedTuple):
    """One rule of the namespaced Role the job's pods are bound to (beyond listing pods)."""

    api_group: str
    resource: str
    verbs: Tuple[str, ...]


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
    dns_names: Tuple[str, ...]  # the names that resolve to this pod in the cluster
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
    #: spec keys the kind cannot honour, each with why (render refuses them naming both)
    refused_keys: Tuple[Tuple[str, str], ...] = ()
    #: Role rules the pods need besides listing pods
    role_rules: Tuple[RoleRule, ...] = ()
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

    #: what :meth:`index_from_name` expects of a pod name, for messages
    name_expected: str = "a pod name ending in -<index>"

    def index_from_name(self, name: str) -> Optional[int]:
        """The index a pod's name gives, or None (the default: names carry no index)."""
        return None

    def dns_name(self, job: str, group: str, index: int) -> str:
        """The name that resolves to pod ``index`` of the job in the cluster ("" when the kind
        gives pods none)."""
        raise NotImplementedError

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        """The pods the controller makes of a rendered ``job_object``, in index order (the demo's
        simulator; errors are :class:`~npu_job.errors.InputError` naming ``source``)."""
        raise NotImplementedError


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
