"""kubernetes-sigs/lws's LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``): npu-job renders one
group (``replicas: 1``) of ``size`` = nodes pods, the leader and its workers.

Read in kubernetes-sigs/lws at 060ab4da17eea1f0865fcbd3236bb1075e2cea32:

* the leader StatefulSet ``<lws>`` (``pkg/controllers/leaderworkerset_controller.go``
  ``constructLeaderStatefulSetApplyConfiguration``: service name ``<lws>``, the leader template or
  else the worker template, labelled ``name`` and ``worker-index: 0``, annotated ``size``) makes
  leader ``<lws>-<g>`` of group ``g``; per leader, a worker StatefulSet ``<lws>-<g>``
  (``pkg/controllers/pod_controller.go`` ``constructWorkerStatefulSetApplyConfiguration``: ordinals
  from 1, ``size - 1`` replicas, labelled ``name``, ``group-index`` and the leader's
  ``group-key``, annotated ``size`` and ``leader-name``) makes workers ``<lws>-<g>-<w>``;
* the pod webhook (``pkg/webhooks/pod_webhook.go`` ``Default``) labels the leader's
  ``group-index`` (from its ordinal) and ``group-key`` (sha1 of ``<namespace>/<leader name>``)
  and each worker's ``worker-index`` (its ordinal), then ``AddLWSVariables``
  (``pkg/utils/pod/pod_utils.go``) puts ``LWS_LEADER_ADDRESS`` (``<lws>-<g>.<subdomain>.<ns>``),
  ``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX`` first in every container, over any the template
  sets;
* ``networkConfig.subdomainPolicy: Shared`` (``api/leaderworkerset/v1/leaderworkerset_types.go``)
  gives one headless Service ``<lws>`` that publishes not-ready addresses
  (``pkg/utils/controller/controller_utils.go`` ``CreateHeadlessServiceIfNotExists``);
* ``restartPolicy: RecreateGroupOnPodRestart`` (``pod_controller.go`` ``handleRestartPolicy``):
  any container restart or pod deletion in a group deletes its leader, which takes the worker
  StatefulSet with it, and the controller makes the whole group again (the ``restart`` key's
  ``job``, the default). ``None`` (``NoneRestartPolicy``, which replaces the deprecated
  ``Default``) leaves a failed pod to its StatefulSet, which starts it again alone under its
  name, the rest of the group running on (``handleRestartPolicy`` returns at once): ``restart:
  pod``.

And in kubernetes/kubernetes: a StatefulSet pod's hostname is its name under the Service as
subdomain, labelled ``statefulset.kubernetes.io/pod-name`` and ``apps.kubernetes.io/pod-index``
(``pkg/controller/statefulset/stateful_set_utils.go`` ``initIdentity``, read through the search
index, version not pinned), and a StatefulSet's pod template must say ``restartPolicy: Always``
(``pkg/apis/apps/validation/validation.go`` ``ValidateStatefulSetSpec``): an LWS pod that ends,
even of success, is started again. A StatefulSet labels its pods ``controller-revision-hash:
<StatefulSet>-<hash>``, which fails a label's 63 characters past a 52-character StatefulSet name
(kubernetes/kubernetes#64023, open), so the worker StatefulSet ``<lws>-0`` bounds the name.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

from npu_job.errors import InputError, shown

from .base import (
    ControllerPod,
    JobKind,
    count_of,
    index_suffix,
    merged,
    name_and_namespace,
    service_name_problem,
    string_pairs,
    subdomain_names,
)

NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"
SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
LEADER_NAME_ANNOTATION = "leaderworkerset.sigs.k8s.io/leader-name"
SUBDOMAIN_POLICY_ANNOTATION = "leaderworkerset.sigs.k8s.io/subdomainPolicy"
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
GROUP_SIZE_ENV = "LWS_GROUP_SIZE"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
# the StatefulSet controller's labels (k8s.io/api apps/v1)
STS_POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
STS_POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
STS_REVISION_LABEL = "controller-revision-hash"

#: the longest job name whose worker StatefulSet ``<lws>-0`` still fits the StatefulSet
#: controller's pod label ``controller-revision-hash: <StatefulSet>-<hash of up to 10
#: characters>`` in a label value's 63 (kubernetes/kubernetes#64023, open: longer, no pod is made)
MAX_NAME = 63 - len("-0") - 1 - 10

SHARED = "Shared"
UNIQUE_PER_REPLICA = "UniquePerReplica"


def _sha1(text: str) -> str:
    """The webhook's ``Sha1Hash`` (``pkg/utils/utils.go``): the hex sha1 of ``text``."""
    import hashlib  # the demo's alone: the pod side plans without it

    return hashlib.sha1(text.encode()).hexdigest()


def _revision(template: Mapping[str, Any]) -> str:
    """A stand-in for the controllers' template hashes: the same template, the same value."""
    import hashlib  # the demo's alone: the pod side plans without it
    import json

    text = json.dumps(template, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


class LeaderWorkerSet(JobKind):
    name = "leaderworkerset"
    title = "LeaderWorkerSet"
    api_version = "leaderworkerset.x-k8s.io/v1"
    kind = "LeaderWorkerSet"
    template = "leaderworkerset.yaml.j2"
    source = "kubernetes-sigs/lws 060ab4da17eea1f0865fcbd3236bb1075e2cea32"
    job_label = NAME_LABEL
    # the group's index: one group is one training job (npu-job renders one, group 0)
    group_label = GROUP_INDEX_LABEL
    index_label = WORKER_INDEX_LABEL
    index_env = WORKER_INDEX_ENV
    container_name = "train"
    # StatefulSet pods: Kubernetes refuses any other
    restart_policy = "Always"
    replicas_field = "spec.leaderWorkerTemplate.size"
    # LWS's own master address (the leader, where the plan may not put rank 0) and group size:
    # train.sh passes --master_addr and --nnodes, and unsets these so no script takes them instead
    launcher_env = (LEADER_ADDRESS_ENV, GROUP_SIZE_ENV)
    refused_keys = (
        (
            "task_name",
            "a LeaderWorkerSet has no tasks: its pods are <name>-0 (the leader) and "
            "<name>-0-<index>",
        ),
        ("queue", "a LeaderWorkerSet has no queue: queues are the Volcano Job's"),
        (
            "max_retry",
            "a LeaderWorkerSet has no retry limit: its StatefulSets start pods again for as "
            "long as it exists",
        ),
        ("network_topology", "network-topology-aware scheduling is a field of the Volcano Job"),
    )
    name_expected = (
        "a pod name ending in -<index>, as LeaderWorkerSet names the leader <lws>-0 (index 0) "
        "and its workers <lws>-0-<index>"
    )

    def index_from_name(self, name: str) -> Optional[int]:
        # group 0: the leader <lws>-0 ends in its worker index 0, a worker <lws>-0-<w> in w
        return index_suffix(name)

    def dns_name(self, job: str, group: str, index: int) -> str:
        leader = f"{job}-{group or '0'}"
        return f"{leader}.{job}" if index == 0 else f"{leader}-{index}.{job}"

    def name_problem(self, job: str) -> str:
        if len(job) > MAX_NAME:
            return (
                f"{len(job)} characters; at most {MAX_NAME}, or its worker StatefulSet {job}-0 "
                "cannot label its pods with its revision (controller-revision-hash: "
                f"{job}-0-<hash>, at most 63 characters)"
            )
        return service_name_problem(job)

    def longest_name(self, job: str, group: str, nodes: int) -> Tuple[str, str]:
        # group 0's last worker (the leader, worker 0, is <lws>-0)
        longest = f"{job}-0-{nodes - 1}" if nodes > 1 else f"{job}-0"
        return longest, "a pod's hostname '<name>-0-<index>'"

    def master_address_bash(self) -> str:
        # MA_TASK_NAME is the group's index here (group_label); the leader is worker 0
        return (
            'if [ "$MA_MASTER_INDEX" = 0 ]; then\n'
            '  MASTER_ADDR="${MA_VJ_NAME}-${MA_TASK_NAME}.${MA_VJ_NAME}"\n'
            "else\n"
            '  MASTER_ADDR="${MA_VJ_NAME}-${MA_TASK_NAME}-${MA_MASTER_INDEX}.${MA_VJ_NAME}"\n'
            "fi"
        )

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        lws, namespace = name_and_namespace(job_object)
        spec = job_object.get("spec")
        if not isinstance(spec, dict):
            raise InputError(source, "spec", "expected the LeaderWorkerSet's spec")
        replicas = count_of(spec.get("replicas"), 1)
        if replicas is None:
            raise InputError(source, "spec.replicas", "expected a count")
        group_spec = spec.get("leaderWorkerTemplate")
        if not isinstance(group_spec, dict):
            raise InputError(source, "spec.leaderWorkerTemplate", "expected the group's templates")
        size = count_of(group_spec.get("size"), 1, minimum=1)
        if size is None:
            raise InputError(source, "spec.leaderWorkerTemplate.size", "expected a count from 1")
        policy = (spec.get("networkConfig") or {}).get("subdomainPolicy") or SHARED
        if policy not in (SHARED, UNIQUE_PER_REPLICA):
            raise InputError(
                source,
                "spec.networkConfig.subdomainPolicy",
                f"expected {SHARED} or {UNIQUE_PER_REPLICA}; got {shown(policy)}",
            )
        worker_where = "spec.leaderWorkerTemplate.workerTemplate"
        worker_template = self._template(group_spec.get("workerTemplate"), source, worker_where)
        leader_where, leader_template = worker_where, worker_template
        if group_spec.get("leaderTemplate") is not None:
            leader_where = "spec.leaderWorkerTemplate.leaderTemplate"
            leader_template = self._template(group_spec.get("leaderTemplate"), source, leader_where)
        revision = _revision(group_spec)
        pods: List[ControllerPod] = []
        for group in range(replicas):
            leader = f"{lws}-{group}"
            # the leader's subdomain is its StatefulSet's Service, or (UniquePerReplica) the
            # webhook sets its own name; its workers' StatefulSet is served by the same
            subdomain = lws if policy == SHARED else leader
            group_key = _sha1(f"{namespace}/{leader}")
            leader_address = f"{leader}.{subdomain}.{namespace}"
            common = (
                (NAME_LABEL, lws),
                (GROUP_INDEX_LABEL, str(group)),
                (GROUP_KEY_LABEL, group_key),
            )
            leader_annotations: Tuple[Tuple[str, str], ...] = ((SIZE_ANNOTATION, str(size)),)
            if policy == UNIQUE_PER_REPLICA:
                leader_annotations += ((SUBDOMAIN_POLICY_ANNOTATION, UNIQUE_PER_REPLICA),)
            members = [(0, leader, leader_template, leader_where, f"{lws}-{revision}")]
            members += [
                (
                    worker,
                    f"{leader}-{worker}",
                    worker_template,
                    worker_where,
                    f"{leader}-{revision}",
                )
                for worker in range(1, size)
            ]
            for worker, name, template, where, sts_revision in members:
                template_meta = template.get("metadata") or {}
                own = common + (
                    (WORKER_INDEX_LABEL, str(worker)),
                    (REVISION_LABEL, revision),
                    (STS_POD_NAME_LABEL, name),
                    (STS_POD_INDEX_LABEL, str(worker if worker else group)),
                    (STS_REVISION_LABEL, sts_revision),
                )
                annotations = (
                    leader_annotations
                    if worker == 0
                    else ((SIZE_ANNOTATION, str(size)), (LEADER_NAME_ANNOTATION, leader))
                )
                pods.append(
                    ControllerPod(
                        index=worker,
                        name=name,
                        hostname=name,
                        subdomain=subdomain,
                        labels=merged(string_pairs(template_meta.get("labels")), own),
                        annotations=merged(
                            string_pairs(template_meta.get("annotations")), annotations
                        ),
                        env=(
                            (LEADER_ADDRESS_ENV, leader_address),
                            (GROUP_SIZE_ENV, str(size)),
                            (WORKER_INDEX_ENV, str(worker)),
                        ),
                        template=template,
                        where=where,
                        dns_names=subdomain_names(name, subdomain, namespace),
                    )
                )
        return tuple(pods)

    def _template(self, template: Any, source: str, where: str) -> Mapping[str, Any]:
        """A pod template the StatefulSet accepts, else the error naming where it sits."""
        if not isinstance(template, dict):
            raise InputError(source, where, "expected a pod template")
        restart = (template.get("spec") or {}).get("restartPolicy") or "Always"
        if restart != self.restart_policy:
            raise InputError(
                source,
                f"{where}.spec.restartPolicy",
                f"expected {self.restart_policy}, the only restart policy of a StatefulSet's "
                f"pods; got {shown(restart)}",
            )
        return template


KIND = LeaderWorkerSet()
