"""JobSet (``jobset.x-k8s.io/v1alpha2`` ``JobSet``): one replicated Job of Indexed pods.

npu-job renders one replicated job (``task_name``) of ``replicas: 1``, so the JobSet makes one
Indexed Job of ``nodes`` completions and the pods' completion indexes are the node ranks. Read in
kubernetes-sigs/jobset at 08dfbdfd682714a9ab929633eca8dc95315187e7:

* the Job of replica ``j`` is ``<jobset>-<rj>-<j>`` (``pkg/util/placement/placement.go``
  ``GenJobName``); ``constructJob`` copies the replicated job's template, and
  ``labelAndAnnotateObject`` labels *and* annotates the Job and its pod template with
  ``jobset.sigs.k8s.io/jobset-name``, ``jobset-uid``, ``replicatedjob-name``,
  ``replicatedjob-replicas``, ``global-replicas``, ``job-index``, ``job-global-index``,
  ``job-key`` (sha1 of ``<namespace>/<job>``), ``restart-attempt`` (the JobSet's
  ``status.restarts``), ``group-name``, ``group-replicas`` and ``job-group-index``
  (``pkg/controllers/jobset_controller.go``; keys in ``api/jobset/v1alpha2/jobset_types.go``
  and ``pkg/constants/constants.go``);
* with ``network.enableDNSHostnames`` it sets the pod template's ``subdomain`` to
  ``network.subdomain``, else the JobSet's name (``GetSubdomain``), and makes the headless
  Service of that name selecting ``jobset-name`` (``createHeadlessSvcIfNecessary``:
  ``publishNotReadyAddresses`` as ``network`` says, true when unset);
* its webhook (``pkg/webhooks/jobset_webhook.go``) defaults ``completionMode: Indexed``, the pod
  ``restartPolicy: OnFailure`` and both network switches on, and refuses a JobSet whose longest
  pod name ``<jobset>-<rj>-<j>-<k>-abcde`` is not a DNS-1035 label;
* a JobSet restart deletes every Job and makes it again, with ``restart-attempt`` one higher,
  each "as soon as its previous iteration (and its Pods) is deleted" (``jobset_types.go``,
  ``Recreate``); ``failurePolicy.maxRestarts`` caps the restarts, and without a
  ``failurePolicy`` the first failed Job fails the JobSet (``pkg/controllers/failure_policy.go``);
* ``failurePolicy.restartStrategy: InPlaceRestart`` (KEP-467, ``keps/467-InPlaceRestart``) is in
  the v1alpha2 CRD, from JobSet v0.11.0 (commit 0f8c28af), but alpha: the webhook refuses it
  unless the controller runs with the ``InPlaceRestart`` feature gate, off by default
  (``pkg/features/features.go``, ``pkg/webhooks/jobset_webhook.go``), and it restarts pods in
  place only through an agent sidecar in every pod (``cmd/in-place-restart-agent``: an image the
  user builds, with rights to watch the JobSet and patch its pod) and Kubernetes' alpha
  ``restartPolicyRules``. npu-job renders neither: a JobSet ``restart`` keeps ``Recreate``.

The ``restart`` key: by default (``pod``) a failed pod is replaced alone by the Job controller
and counts against the Job's ``backoffLimit`` (6, Kubernetes' default), past which the JobSet
restarts whole; ``job`` renders ``backoffLimit: 0``, so that the first failure fails the Job and
``failurePolicy`` recreates every pod (``pastBackoffLimitOnFailure`` in Kubernetes'
``pkg/controller/job/job_controller.go``: with 0, one container restart or failed pod is past
it).

The Job controller then makes the pods of each Job as it does for any Indexed Job
(:mod:`npu_job.kinds.indexedjob`): pod ``k`` is ``<job>-<k>-<random>`` with hostname
``<job>-<k>``, the index as label, annotation and ``JOB_COMPLETION_INDEX``. So pod ``k`` resolves
as ``<jobset>-<rj>-0-<k>.<jobset>``.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Mapping, Optional, Tuple

from npu_job.errors import InputError

from . import indexedjob
from .base import ControllerPod, JobKind, service_name_problem, string_pairs

API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS_LABEL = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS_LABEL = "jobset.sigs.k8s.io/global-replicas"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX_LABEL = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY_LABEL = "jobset.sigs.k8s.io/job-key"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
GROUP_NAME_LABEL = "jobset.sigs.k8s.io/group-name"
GROUP_REPLICAS_LABEL = "jobset.sigs.k8s.io/group-replicas"
JOB_GROUP_INDEX_LABEL = "jobset.sigs.k8s.io/job-group-index"
#: the replicated job's ``groupName`` when it gives none (the CRD's default)
DEFAULT_GROUP = "default"


def job_name(jobset: str, replicated_job: str, replica: int) -> str:
    """The child Job of ``replica`` (``GenJobName``): ``<jobset>-<rj>-<replica>``."""
    return f"{jobset}-{replicated_job}-{replica}"


def jobset_pods(
    jobset: Mapping[str, Any], source: str, where: str = ""
) -> Tuple[ControllerPod, ...]:
    """The pods the JobSet controller and the Job controller make of ``jobset`` (an object as the
    JobSet webhook receives it: its defaults applied here), in index order; ``where`` prefixes
    the fields messages name (where the JobSet's spec came from, for a TrainJob's)."""
    metadata = jobset.get("metadata") or {}
    name = str(metadata.get("name") or "")
    namespace = str(metadata.get("namespace") or "default")
    spec = jobset.get("spec")
    if not isinstance(spec, dict):
        raise InputError(source, f"{where}spec", "expected the JobSet's spec")
    replicated = spec.get("replicatedJobs")
    if (
        not isinstance(replicated, list)
        or len(replicated) != 1
        or not isinstance(replicated[0], dict)
    ):
        raise InputError(
            source,
            f"{where}spec.replicatedJobs",
            "expected one replicated job (npu-job's layout: its pods' completion indexes are the "
            "node ranks)",
        )
    rjob = replicated[0]
    rj_where = f"{where}spec.replicatedJobs[0]"
    replicas = rjob.get("replicas", 1)
    if replicas != 1 or isinstance(replicas, bool):
        raise InputError(source, f"{rj_where}.replicas", "expected 1 (one Job of indexed pods)")
    rj = str(rjob.get("name") or "")
    template = rjob.get("template")
    job_spec = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(job_spec, dict):
        raise InputError(source, f"{rj_where}.template.spec", "expected a Job spec")
    if job_spec.get("completionMode", "Indexed") != "Indexed":
        raise InputError(source, f"{rj_where}.template.spec.completionMode", "expected Indexed")
    for count in ("completions", "parallelism"):
        value = job_spec.get(count)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(source, f"{rj_where}.template.spec.{count}", "expected a count")
    pod_template = job_spec.get("template")
    if not isinstance(pod_template, dict) or not isinstance(pod_template.get("spec"), dict):
        raise InputError(source, f"{rj_where}.template.spec.template", "expected a pod template")

    # only the demo's simulator gets here; the pod side, which imports every kind, does not load
    # hashlib (OpenSSL) at start (tests/bootstrap/test_planner.py)
    import hashlib
    import uuid

    network = spec.get("network") or {}
    subdomain = ""
    if network.get("enableDNSHostnames", True) is not False:  # the webhook's default: on
        subdomain = str(network.get("subdomain") or name)
    child = job_name(name, rj, 0)
    group = str(rjob.get("groupName") or DEFAULT_GROUP)
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"npu-job-demo:jobset:{namespace}/{name}"))
    own: Dict[str, str] = {
        JOBSET_NAME_LABEL: name,
        JOBSET_UID_LABEL: uid,
        REPLICATED_JOB_LABEL: rj,
        RESTART_ATTEMPT_LABEL: "0",
        REPLICATED_JOB_REPLICAS_LABEL: "1",
        GLOBAL_REPLICAS_LABEL: "1",
        JOB_INDEX_LABEL: "0",
        JOB_KEY_LABEL: hashlib.sha1(f"{namespace}/{child}".encode()).hexdigest(),
        JOB_GLOBAL_INDEX_LABEL: "0",
        GROUP_NAME_LABEL: group,
        GROUP_REPLICAS_LABEL: "1",
        JOB_GROUP_INDEX_LABEL: "0",
    }
    pod_meta = pod_template.get("metadata") or {}
    pod_spec = dict(pod_template["spec"])
    pod_spec.setdefault("restartPolicy", "OnFailure")  # the webhook's default
    if subdomain:
        pod_spec["subdomain"] = subdomain
    job_object = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": child,
            "namespace": namespace,
            "labels": {**dict(string_pairs((template.get("metadata") or {}).get("labels"))), **own},
        },
        "spec": {
            **copy.deepcopy(job_spec),
            "completionMode": "Indexed",
            "template": {
                "metadata": {
                    "labels": {**dict(string_pairs(pod_meta.get("labels"))), **own},
                    "annotations": {**dict(string_pairs(pod_meta.get("annotations"))), **own},
                },
                "spec": pod_spec,
            },
        },
    }
    pods = indexedjob.KIND.controller_pods(job_object, source)
    return tuple(pod._replace(where=f"{rj_where}.template.spec.template") for pod in pods)


class JobSet(JobKind):
    name = "jobset"
    title = "JobSet"
    api_version = API_VERSION
    kind = "JobSet"
    template = "jobset.yaml.j2"
    source = (
        "kubernetes-sigs/jobset 08dfbdfd682714a9ab929633eca8dc95315187e7; its Job's pods: "
        + indexedjob.KIND.source
    )
    job_label = JOBSET_NAME_LABEL
    group_label = REPLICATED_JOB_LABEL
    index_label = indexedjob.COMPLETION_INDEX_KEY
    index_env = indexedjob.COMPLETION_INDEX_ENV
    container_name = "train"
    # JobSet's default: a failed container restarts in place, on its node, under its index
    restart_policy = "OnFailure"
    attempt_label = RESTART_ATTEMPT_LABEL
    restart_default = "pod"
    replicas_field = "spec.replicatedJobs[0].template.spec.completions"
    refused_keys = (
        (
            "queue",
            "a JobSet has no queue: queues are the Volcano Job's (Kueue's is the label "
            "kueue.x-k8s.io/queue-name, under labels)",
        ),
        (
            "network_topology",
            "network-topology-aware scheduling is a field of the Volcano Job",
        ),
    )
    name_expected = (
        "a pod name ending in -<index>-<5 random characters>, as the Job controller names the "
        "pods of a JobSet's Job <jobset>-<replicated job>-0-<index>-<random>"
    )

    def index_from_name(self, name: str) -> Optional[int]:
        return indexedjob.KIND.index_from_name(name)

    def dns_name(self, job: str, group: str, index: int) -> str:
        # the template sets no network.subdomain: the Service is the JobSet's name
        return f"{job_name(job, group, 0)}-{index}.{job}"

    def name_problem(self, job: str) -> str:
        return service_name_problem(job)  # the headless Service is the JobSet's name

    def longest_name(self, job: str, group: str, nodes: int) -> Tuple[str, str]:
        # the webhook's own check: the last pod's name with five characters for the random part
        return (
            f"{job_name(job, group, 0)}-{nodes - 1}-abcde",
            "a pod's name '<name>-<task_name>-0-<index>-<5 random characters>'",
        )

    def master_address_bash(self) -> str:
        return 'MASTER_ADDR="${MA_VJ_NAME}-${MA_TASK_NAME}-0-${MA_MASTER_INDEX}.${MA_VJ_NAME}"'

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        return jobset_pods(job_object, source)


KIND = JobSet()
