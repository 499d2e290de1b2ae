"""MindCluster's AscendJob (``mindxdl.gitee.com/v1`` ``AscendJob``, ascend-operator).

Read in Ascend/mind-cluster at 22bb3d987bc0208c3eb7395e222b661276133c58, under
``component/ascend-operator/pkg`` unless said otherwise, with kubeflow/common v0.4.3 (the
replica-spec pattern it shares with PyTorchJob is :mod:`.kubeflow`'s):

* Validation (``controllers/v1/ascendjob_validate.go``): the job label ``framework`` (``pytorch``
  here) decides the replica types, Master and Worker; the Master's ``replicas`` is 1, Workers may
  be 0; every replica has a container named ``ascend`` with an image. Defaults
  (``api/v1/defaults.go``): ``replicas`` 1, ``restartPolicy: Never``, and the Master's ``ascend``
  container gets the port ``ascendjob-port`` = 2222 when it has none of that name.
* Pods (``controllers/v1/pod.go`` ``createPodSpec``, ``labels.go``, ``annotation.go``):
  ``<job>-master-0`` and ``<job>-worker-<i>``, labelled ``training.kubeflow.org/operator-name=
  ascendjob-controller`` (``component/ascend-common/api/default_name.go``) with kubeflow/common's
  labels and their deprecated twins (``job-name``, ``group-name``, ``replica-type``,
  ``replica-index``), ``training.kubeflow.org/job-role: master`` on the Master and ``version``
  (the job's restart count); annotated ``hccl/rankIndex`` with the pod's rank, and with gang
  scheduling (``--enableGangScheduling``, on by default in ``main.go``) ``scheduling.k8s.io/
  group-name: <job>-<uid>`` and ``volcano.sh/task-spec: <type>``.
* Rank (``createPodSpec``; ``controllers/v1/job.go`` ``syncReplicas``): when the Master requests
  NPUs (job annotation ``nonWorkerPodMountChipStatus``), the Master is 0 and Worker ``i`` is
  ``i + 1``, as npu-job renders it; otherwise Master and Worker 0 would both be 0.
* Environment, on the ``ascend`` container only, after its own (``controllers/v1/env.go``
  ``setCommonEnv``, ``setPytorchEnv``): ``MINDX_TASK_ID`` (the job's uid), ``MINDX_SERVER_IP`` and
  ``MINDX_SERVER_DOMAIN`` (ClusterD), ``HostNetwork``, ``HCCL_LOGIC_SUPERPOD_ID``,
  ``REPLICA_TYPE``; when the container requests NPUs: ``LOCAL_WORLD_SIZE`` (its NPUs),
  ``WORLD_SIZE`` (NPUs of all NPU pods: processes), ``LOCAL_RANK`` (``0,1,...,n-1``, a list),
  ``MASTER_ADDR`` and ``MASTER_PORT`` (the ClusterIP of the Service ``<job>-master-0`` and its
  port ``ascendjob-port``), ``RANK`` (the rank above). ``ASCEND_VISIBLE_DEVICES`` (the device
  annotation, for Ascend Docker Runtime) only when the container requests nothing but NPUs.
* Names (``controllers/v1/service.go`` ``genService``, ``jobinfo.go`` ``getOrCreateSvc``): one
  Service, ``<job>-master-0``, of type ClusterIP (not headless), made before the pods: no pod has a
  DNS name of its own, and the master of a plan is reached by its pod IP.
* Rank table (``controllers/v1/pod.go`` ``saveRankTable``, ``ascendjob_controller.go``
  ``writeRanktableToCm``, ``ranktable/``): once every pod has its devices, the operator writes
  ``hccl.json`` (and ``version``) into the ConfigMap ``rings-config-<job>`` if that exists when it
  first looks (it never makes one), in the v1.0 format (``server_list`` of ``server_id``,
  ``host_ip``, ``container_ip`` and ``device`` entries with string ``rank_id`` s, servers sorted by
  rank; v1.2 adds ``super_pod_list`` for A3 super-pod jobs), both of which the bootstrap reads;
  v2.0 (``rank_list``, integer ids, no servers), which it cannot, only for pods requesting
  ``huawei.com/npu``, which npu-job never asks for. render makes that ConfigMap before the job and
  mounts it where the bootstrap looks (:data:`npu_job.podfacts.DEFAULT_RANK_TABLES`).
* Restarts (``controllers/v1/ascendjob_controller.go``, ``job.go``, ``pod.go`` ``checkPodStatus``):
  a missing pod is made again under its name and rank; each deletion of a pod of the current
  ``version`` counts one, and the job fails past ``runPolicy.backoffLimit`` (0 or unset: no
  limit). With ``restartPolicy: Never`` a failed pod fails the job.
* Fault rescheduling (MindCluster's Volcano plugin, ``component/ascend-for-volcano``): the job
  label ``fault-scheduling: force`` (render's on every NPU job) deletes and reschedules every pod
  of a job with a faulty node or NPU; with ``pod-rescheduling: "on"`` as well
  (``common/util/type.go`` ``SinglePodTag``; the operator reads it too, ``controllers/v1/job.go``
  ``isPodScheduleStrategy``) it deletes the faulty pod alone, falling back to the whole job when
  that pod stays pending for ``PendingTimes`` sessions (``internal/rescheduling/job.go``
  ``IsJobSingleRescheduling``). So ``restart: job`` (the default) and ``restart: pod``.
"""

from __future__ import annotations

import posixpath
from typing import Any, List, Mapping, Tuple

from npu_job.errors import InputError, shown
from npu_job.podfacts import (
    DEFAULT_RANK_TABLES,
    ENV_FILE,
    MASTER_ADDR_ENV,
    MINDX_RANK_TABLE_NAME,
    OUTPUT_DIR,
)

from .base import ConfigMapMount, ControllerPod
from .kubeflow import (
    MASTER,
    OPERATOR_NAME_LABEL,
    WORKER,
    MasterWorker,
    Replicas,
    named_port,
    pod_labels,
    pod_name,
    replica_pod,
    training_container,
)

CONTROLLER = "ascendjob-controller"
CONTAINER = "ascend"
PORT_NAME = "ascendjob-port"
DEFAULT_PORT = 2222
FRAMEWORK_LABEL = "framework"
FRAMEWORK = "pytorch"
RANK_INDEX_ANNOTATION = "hccl/rankIndex"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
TASK_SPEC_ANNOTATION = "volcano.sh/task-spec"
SP_BLOCK_ANNOTATION = "sp-block"
#: what kubeflow/common v0.4.3's GenLabels adds besides the current keys (deprecated twins)
GROUP_NAME_LABEL = ("group-name", "mindxdl.gitee.com")
VERSION_LABEL = "version"
#: the job label by which MindCluster reschedules the faulty pod alone ("on"), not the whole job
POD_RESCHEDULING_LABEL = "pod-rescheduling"
#: MindCluster's device plugin: the resource of its 910-family NPUs and the label of their nodes
#: (component/ascend-common/api/default_name.go, ascend-device-plugin/pkg/server/manager.go)
NPU_RESOURCE = "huawei.com/Ascend910"
NPU_NODE_LABEL = ("accelerator", "huawei-Ascend910")
RESOURCE_PREFIX = "huawei.com/"
#: ClusterD's Service as the operator names it where it finds no ClusterIP for it
CLUSTERD_DOMAIN = "clusterd-grpc-svc.mindx-dl.svc.cluster.local"
#: the rank table's ConfigMap, which the operator fills (rings-config-<job>, key hccl.json)
RANK_TABLE_CONFIGMAP = "rings-config-{name}"
RANK_TABLE_DIR = next(
    posixpath.dirname(path)
    for path in DEFAULT_RANK_TABLES
    if posixpath.basename(path) == MINDX_RANK_TABLE_NAME
)
NOT_READY_TABLE = '{"status":"initializing"}'


class AscendJob(MasterWorker):
    name = "ascendjob"
    title = "MindCluster AscendJob"
    api_version = "mindxdl.gitee.com/v1"
    kind = "AscendJob"
    template = "ascendjob.yaml.j2"
    source = (
        "Ascend/mind-cluster 22bb3d987bc0208c3eb7395e222b661276133c58 (ascend-operator), "
        "kubeflow/common v0.4.3 21f5ba8833a2e21df17601497a08396c9bae9ab2"
    )
    constant_labels = ((OPERATOR_NAME_LABEL, CONTROLLER),)
    index_env = "RANK"
    container_name = CONTAINER
    # the operator's default: a failed pod fails the job (MindCluster's fault handling, not the
    # kubelet, reschedules); OnFailure would restart a crashing container with no limit
    restart_policy = "Never"
    specs_key = "replicaSpecs"
    min_workers = 0
    master_port_name = PORT_NAME
    master_by_pod_ip = True
    devices = ("npu",)
    npu_resource = NPU_RESOURCE
    npu_node_selector = (NPU_NODE_LABEL,)
    configmap_mounts = (
        ConfigMapMount(
            "rings-config",
            RANK_TABLE_CONFIGMAP,
            RANK_TABLE_DIR,
            ((MINDX_RANK_TABLE_NAME, NOT_READY_TABLE),),
        ),
    )
    # the operator sets it only on a container that requests nothing but NPUs (cpu or memory
    # requests count as virtual resources, env.go isVirtualResourceReq)
    pod_field_env = (("ASCEND_VISIBLE_DEVICES", f"metadata.annotations['{NPU_RESOURCE}']"),)
    # RANK counts nodes, WORLD_SIZE processes, LOCAL_RANK is a list: none of them is what a
    # launcher means by it; MASTER_ADDR and MASTER_PORT train.sh sets itself
    launcher_env = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    # fault-scheduling: force (every NPU job's label) reschedules the whole job on a fault
    restart_default = "job"
    refused_keys = (
        (
            "network_topology",
            "it is the Volcano Job's spec.networkTopology; the PodGroup ascend-operator makes of "
            "runPolicy.schedulingPolicy has no network topology",
        ),
        (
            "task_name",
            "it names a Volcano task; an AscendJob's replica types are Master and Worker, its "
            "pods <name>-master-0 and <name>-worker-<i>",
        ),
    )

    def restart_labels(self, restart: str) -> Tuple[Tuple[str, str], ...]:
        return ((POD_RESCHEDULING_LABEL, "on"),) if restart == "pod" else ()

    def dns_name(self, job: str, group: str, index: int) -> str:
        return ""

    def root_address_bash(self) -> str:
        # no pod DNS names: pod 0 is the Master, which the operator's Service names
        return (
            'MASTER_ADDR="${MASTER_ADDR:?is set by the AscendJob controller to its Service'
            ' <job>-master-0}"'
        )

    def master_address_bash(self) -> str:
        # the plan's master by its pod IP (the bootstrap writes it beside the plan); without a
        # plan pod 0, the Master, through the operator's Service
        env_file = posixpath.join(OUTPUT_DIR, ENV_FILE)
        return "\n".join(
            (
                "MASTER_ADDR_OF_PLAN=''",
                f"if [ -f {env_file} ]; then",
                "  # shellcheck source=/dev/null  # written at run time by the bootstrap",
                f'  MASTER_ADDR_OF_PLAN="$(. {env_file} && printf %s "${{{MASTER_ADDR_ENV}:-}}")"',
                "fi",
                'if [ -n "$MASTER_ADDR_OF_PLAN" ]; then',
                '  MASTER_ADDR="$MASTER_ADDR_OF_PLAN"',
                'elif [ "$MA_MASTER_INDEX" = 0 ]; then',
                '  MASTER_ADDR="${MASTER_ADDR:?is set by the AscendJob controller to its Service'
                ' <job>-master-0}"',
                "else",
                '  echo "npu-job: error: train.sh: the plan puts rank 0 on pod ${MA_MASTER_INDEX},'
                f' whose address the bootstrap did not write ({MASTER_ADDR_ENV})" >&2',
                "  exit 2",
                "fi",
            )
        )

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        metadata = job_object.get("metadata") or {}
        job = str(metadata.get("name") or "")
        uid = str(metadata.get("uid") or "")
        framework = (metadata.get("labels") or {}).get(FRAMEWORK_LABEL)
        if framework != FRAMEWORK:
            raise InputError(
                source,
                f"metadata.labels.{FRAMEWORK_LABEL}",
                f"expected {shown(FRAMEWORK)} (the replica types Master and Worker), "
                f"got {shown(framework)}",
            )
        replicas = self.replicas(job_object, source)
        master = replicas[0]
        master_npus = npus(training_container(master.template, CONTAINER))
        chips = master_npus > 0  # nonWorkerPodMountChipStatus
        npu_spec = (
            master if chips else next((r for r in replicas if r.replica_type == WORKER), None)
        )
        per_pod = 0 if npu_spec is None else npus(training_container(npu_spec.template, CONTAINER))
        npu_pods = sum(r.count for r in replicas if chips or r.replica_type == WORKER)
        port = named_port(training_container(master.template, CONTAINER), PORT_NAME)
        service = pod_name(job, MASTER, 0)
        try:
            sp_block = int(str((metadata.get("annotations") or {}).get(SP_BLOCK_ANNOTATION, 0)))
        except ValueError:
            sp_block = 0
        pods: List[ControllerPod] = []
        for replica in replicas:
            pod_spec = replica.template["spec"]
            container = training_container(replica.template, CONTAINER)
            for index in range(replica.count):
                rank = index + 1 if chips and replica.replica_type == WORKER else index
                env = [
                    ("MINDX_TASK_ID", uid),
                    ("MINDX_SERVER_IP", CLUSTERD_DOMAIN),
                    ("MINDX_SERVER_DOMAIN", CLUSTERD_DOMAIN),
                    ("HostNetwork", "true" if pod_spec.get("hostNetwork") else "false"),
                ]
                own_npus = npus(container)
                if own_npus > 0:
                    nodes = 1 if sp_block < own_npus else sp_block // own_npus
                    superpod = rank // nodes if sp_block > 0 else 0
                    env.append(("HCCL_LOGIC_SUPERPOD_ID", str(superpod)))
                env.append(("REPLICA_TYPE", replica.replica_type))
                if per_pod > 0:
                    env += [
                        ("LOCAL_WORLD_SIZE", str(per_pod)),
                        ("WORLD_SIZE", str(per_pod * npu_pods)),
                        ("LOCAL_RANK", ",".join(str(i) for i in range(per_pod))),
                        # the Service's ClusterIP, which exists only in a cluster: its name,
                        # which resolves to the same pod
                        ("MASTER_ADDR", service),
                        ("MASTER_PORT", str(DEFAULT_PORT if port is None else port)),
                        (self.index_env, str(rank)),
                    ]
                annotations = [(RANK_INDEX_ANNOTATION, str(rank))]
                annotations.append((TASK_SPEC_ANNOTATION, replica.replica_type.lower()))
                if uid:
                    annotations.append((GROUP_NAME_ANNOTATION, f"{job}-{uid}"))
                labels = ascend_labels(self, job, replica, index)
                names = (service,) if replica.replica_type == MASTER else ()
                pods.append(replica_pod(job, replica, index, rank, labels, annotations, env, names))
        return tuple(sorted(pods, key=lambda pod: pod.index))


def npus(container: Mapping[str, Any]) -> int:
    """The NPUs a container requests: its first ``huawei.com/`` request, as the operator reads it
    (``getContainerResourceReq``), 0 without one."""
    requests = (container.get("resources") or {}).get("requests") or {}
    for name, value in requests.items():
        if RESOURCE_PREFIX in str(name):
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def ascend_labels(
    kind: MasterWorker, job: str, replica: Replicas, index: int
) -> List[Tuple[str, str]]:
    """kubeflow/common v0.4.3's labels with their deprecated twins, and the ``version`` label
    (``setPodLabels``: 0 for a job's first pods)."""
    labels = pod_labels(kind, job, replica, index)
    labels += [
        GROUP_NAME_LABEL,
        ("job-name", job.replace("/", "-")),
        ("replica-type", replica.replica_type.lower()),
        ("replica-index", str(index)),
        (VERSION_LABEL, "0"),
    ]
    return labels


KIND = AscendJob()
