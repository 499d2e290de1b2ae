"""Kubernetes' own Indexed Job (``batch/v1`` ``Job``, ``completionMode: Indexed``) and the
headless Service npu-job renders beside it, since the Job makes none.

Read in kubernetes/kubernetes:

* ``pkg/controller/job/job_controller.go`` @ 6ae037f1db843e99547258d7dd292301a74ba0eb
  (``manageJob``): each pod of index ``i`` gets the annotation and, with the ``PodIndexLabel``
  gate (beta and on from 1.28, GA and locked on from 1.32), the label
  ``batch.kubernetes.io/job-completion-index``, the hostname ``<job>-<i>`` and the generateName
  below; ``pastBackoffLimitOnFailure``: with ``restartPolicy: OnFailure`` the container restarts
  of all running and pending pods add up against ``backoffLimit``;
* ``pkg/controller/job/indexed_job_utils.go`` @ 78fc8e44052f699bf598f84b697b41e5a328c9c5:
  ``podGenerateNameWithIndex`` names pods ``<job>-<i>-`` plus the API server's five random
  characters, cutting the job name (never the index) to fit; ``addCompletionIndexEnvVariable``
  adds ``JOB_COMPLETION_INDEX`` (a fieldRef to that label, or to the annotation without the
  gate) to every container and init container that does not set it already;
* ``pkg/registry/batch/job/strategy.go`` @ 36f36813ae40015c94d2df1493447edaa145dd5a
  (``generateSelector``): the API server labels the template ``batch.kubernetes.io/job-name``,
  ``job-name``, ``batch.kubernetes.io/controller-uid`` and ``controller-uid``, keeping any the
  template sets itself.

The Job gives pods no DNS name of their own: the Kubernetes docs' "Job with Pod-to-Pod
Communication" pairs it with a headless Service selecting the pods and the pod template's
``subdomain`` naming it. npu-job's template names that Service after the job, so pod ``k``
resolves as ``<job>-<k>.<job>``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from npu_job.errors import InputError
from npu_job.parsing import count_from_text

from .base import (
    ControllerPod,
    JobKind,
    count_of,
    merged,
    name_and_namespace,
    service_name_problem,
    string_pairs,
    subdomain_names,
)

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_JOB_NAME_LABEL = "job-name"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"
#: the one key Kubernetes uses for the index, as an annotation always and as a label from 1.28
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"

#: what the API server's generateName appends (k8s.io/apimachinery ``names.SimpleNameGenerator``:
#: five characters of ``utilrand``'s alphabet, which leaves out vowels and look-alike digits)
_RANDOM_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_RANDOM_LENGTH = 5
#: ``names.MaxGeneratedNameLength``: 63 characters less the random suffix
_MAX_GENERATED_PREFIX = 63 - _RANDOM_LENGTH

# <job>-<index>-<random>: the index is the part before the random suffix (linear: one digit run)
_NAME_INDEX = re.compile(r"-([0-9]+)-[" + _RANDOM_ALPHABET + r"]{5}\Z")


def generate_name(job: str, index: int) -> str:
    """The pod's generateName (``podGenerateNameWithIndex``): ``<job>-<index>-``, the job name cut
    so that the whole fits, the index kept."""
    suffix = f"-{index}-"
    prefix = job + suffix
    if len(prefix) > _MAX_GENERATED_PREFIX:
        prefix = prefix[: _MAX_GENERATED_PREFIX - len(suffix)] + suffix
    return prefix


def random_suffix(seed: str) -> str:
    """Five characters of the API server's alphabet, the same for the same ``seed`` (the demo's
    stand-in for the random part of a generated name)."""
    import hashlib  # the demo's alone: the pod side plans without it

    digest = hashlib.sha256(seed.encode("utf-8")).digest()
    return "".join(
        _RANDOM_ALPHABET[byte % len(_RANDOM_ALPHABET)] for byte in digest[:_RANDOM_LENGTH]
    )


def container_named(template: Mapping[str, Any], name: str) -> Optional[Mapping[str, Any]]:
    """The pod template's container called ``name``, else its first; None when it has none."""
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not containers:
        return None
    for container in containers:
        if isinstance(container, dict) and container.get("name") == name:
            return container
    first = containers[0]
    return first if isinstance(first, dict) else None


def sets_env(container: Optional[Mapping[str, Any]], name: str) -> bool:
    """Whether ``container`` already defines the variable ``name`` (a controller that adds it
    only when missing then leaves it alone)."""
    env = container.get("env") if container is not None else None
    return isinstance(env, list) and any(
        isinstance(item, dict) and item.get("name") == name for item in env
    )


def _demo_uid(namespace: str, job: str) -> str:
    """A stand-in for the Job's uid the API server gives it: the same for the same job."""
    import uuid  # the demo's alone, like hashlib

    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"npu-job-demo:{namespace}/{job}"))


class IndexedJob(JobKind):
    name = "indexedjob"
    title = "Indexed Job"
    api_version = "batch/v1"
    kind = "Job"
    template = "indexedjob.yaml.j2"
    source = (
        "kubernetes/kubernetes pkg/controller/job/job_controller.go 6ae037f1, "
        "pkg/controller/job/indexed_job_utils.go 78fc8e44, pkg/registry/batch/job/strategy.go "
        "36f36813"
    )
    job_label = JOB_NAME_LABEL
    index_label = COMPLETION_INDEX_KEY
    index_env = COMPLETION_INDEX_ENV
    container_name = "train"
    # in place, on its node: the pod keeps its name, address and index (Never would replace it
    # with a new pod, anywhere, beside the failed one)
    restart_policy = "OnFailure"
    replicas_field = "spec.completions"
    # the Job controller replaces a failed pod alone; no field makes it restart every pod
    restart_default = "pod"
    refused_restarts = (
        (
            "job",
            "a batch/v1 Job replaces each failed pod alone and has no restart of all its pods "
            "(backoffLimit only fails the Job)",
        ),
    )
    refused_keys = (
        (
            "task_name",
            "a batch/v1 Job has no tasks: its pods are <name>-<index>-<random>, with hostnames "
            "<name>-<index>",
        ),
        ("queue", "a batch/v1 Job has no queue: queues are the Volcano Job's"),
        ("network_topology", "network-topology-aware scheduling is a field of the Volcano Job"),
    )
    name_expected = (
        "a pod name ending in -<index>-<5 random characters>, as the Job controller names "
        "Indexed Job pods <job>-<index>-<random>"
    )

    def index_from_name(self, name: str) -> Optional[int]:
        # the label is missing where PodIndexLabel is off (before 1.28); the name always has it
        match = _NAME_INDEX.search(name)
        return None if match is None else count_from_text(match.group(1))

    def dns_name(self, job: str, group: str, index: int) -> str:
        return f"{job}-{index}.{job}"

    def name_problem(self, job: str) -> str:
        return service_name_problem(job)

    def longest_name(self, job: str, group: str, nodes: int) -> Tuple[str, str]:
        return f"{job}-{nodes - 1}", "a pod's hostname '<name>-<index>'"

    def pod_subdomain(self, job: str) -> str:
        return job  # the Service the template renders before the Job

    def master_address_bash(self) -> str:
        # the template names the headless Service after the job
        return 'MASTER_ADDR="${MA_VJ_NAME}-${MA_MASTER_INDEX}.${MA_VJ_NAME}"'

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        job, namespace = name_and_namespace(job_object)
        spec = job_object.get("spec")
        if not isinstance(spec, dict):
            raise InputError(source, "spec", "expected the Job's spec")
        if spec.get("completionMode") != "Indexed":
            raise InputError(source, "spec.completionMode", "expected Indexed")
        # the API server requires completions of an Indexed Job; parallelism defaults to 1
        completions = count_of(spec.get("completions"))
        if completions is None:
            raise InputError(source, "spec.completions", "expected a count")
        parallelism = count_of(spec.get("parallelism"), 1)
        if parallelism is None:
            raise InputError(source, "spec.parallelism", "expected a count")
        where = "spec.template"
        template = spec.get("template")
        if not isinstance(template, dict):
            raise InputError(source, where, "expected a pod template")
        template_meta = template.get("metadata") or {}
        pod_spec = template.get("spec") or {}
        subdomain = str(pod_spec.get("subdomain") or "")
        uid = _demo_uid(namespace, job)
        # generateSelector's labels yield to the template's own
        selector_labels = (
            (JOB_NAME_LABEL, job),
            (LEGACY_JOB_NAME_LABEL, job),
            (CONTROLLER_UID_LABEL, uid),
            (LEGACY_CONTROLLER_UID_LABEL, uid),
        )
        injects_index = not sets_env(container_named(template, self.container_name), self.index_env)
        pods: List[ControllerPod] = []
        # the controller starts the lowest indexes first, parallelism of them at a time
        for index in range(min(completions, parallelism)):
            hostname = f"{job}-{index}"
            name = generate_name(job, index) + random_suffix(f"{namespace}/{job}/{index}")
            own: Dict[str, str] = {COMPLETION_INDEX_KEY: str(index)}
            dns_names = subdomain_names(hostname, subdomain, namespace)
            pods.append(
                ControllerPod(
                    index=index,
                    name=name,
                    hostname=hostname,
                    subdomain=subdomain,
                    labels=merged(
                        selector_labels,
                        string_pairs(template_meta.get("labels")),
                        tuple(own.items()),
                    ),
                    annotations=merged(
                        string_pairs(template_meta.get("annotations")), tuple(own.items())
                    ),
                    env=((self.index_env, str(index)),) if injects_index else (),
                    template=template,
                    where=where,
                    dns_names=dns_names,
                )
            )
        return tuple(pods)


KIND = IndexedJob()
