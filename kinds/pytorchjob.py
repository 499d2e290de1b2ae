"""Kubeflow's PyTorchJob (``kubeflow.org/v1`` ``PyTorchJob``, training-operator v1.9.0).

Read in kubeflow/training-operator at tag v1.9.0 (6f74c7f6b2ed6c27aabd82d0a316b23f0646059c);
the replica-spec pattern it shares with AscendJob is :mod:`.kubeflow`'s.

* Validation (``pkg/webhooks/pytorch/pytorchjob_webhook.go``): replica types Master and Worker
  only, Master ``replicas`` exactly 1, Worker ``replicas`` at least 1, in every replica a
  container named ``pytorch`` with an image, a job name that is a DNS-1035 label.
* Defaults (``pkg/apis/kubeflow.org/v1/pytorch_defaults.go``): ``replicas`` 1, ``restartPolicy:
  OnFailure``, ``nprocPerNode: auto``, and the ``pytorch`` container's port
  ``pytorchjob-port`` = 23456 when it has none of that name.
* Pods (``pkg/controller.v1/common/pod.go`` ``createNewPod``): ``<job>-master-0`` and
  ``<job>-worker-<i>``, labelled ``training.kubeflow.org/operator-name=pytorchjob-controller``
  (``pkg/controller.v1/pytorch/pytorchjob_controller.go``) and the rest of :mod:`.kubeflow`'s
  labels; the replica's ``restartPolicy`` replaces the template's (``pkg/core/pod.go``
  ``SetRestartPolicy``); with Volcano gang scheduling (the operator's ``--gang-scheduler-name=
  volcano``) the annotations ``scheduling.k8s.io/group-name: <job>`` (its PodGroup, which takes
  ``runPolicy.schedulingPolicy``'s queue and priority class, ``pkg/controller.v1/common/job.go``)
  and ``volcano.sh/task-spec: <type>``, and ``schedulerName: volcano`` where the template sets
  none (``pkg/controller.v1/control/podgroup_control.go``).
* Environment (``pkg/controller.v1/pytorch/envvar.go`` ``setPodEnv``, ``master.go``), appended to
  every container after its own (so it wins over a variable of the same name): ``PYTHONUNBUFFERED=
  1``; with a Master, ``MASTER_PORT``/``PET_MASTER_PORT`` (the Master's ``pytorchjob-port``),
  ``MASTER_ADDR``/``PET_MASTER_ADDR`` (``<job>-master-0``), ``WORLD_SIZE`` (all replicas times
  ``nprocPerNode``, which counts 1 unless it is a number), ``RANK`` and ``PET_NODE_RANK`` (Master
  0, Worker ``i`` ``i + 1``); ``PET_NPROC_PER_NODE`` (``nprocPerNode``) and ``PET_NNODES`` (all
  replicas). Workers also get an init container that waits until ``nslookup <job>-master-0``
  answers (``initcontainer.go``), which the demo does not run.
* Names (``pkg/controller.v1/common/service.go`` ``CreateNewService``): one headless Service per
  replica, named as its pod, selecting it by its labels; so pod ``k`` resolves as
  ``<job>-master-0`` (k = 0) or ``<job>-worker-<k-1>`` in the namespace. The Services do not
  publish not-ready addresses: a name resolves once its pod is Ready.
* Restarts (``ReconcilePods``, ``pkg/controller.v1/common/pod.go``; ``pkg/core/job.go``
  ``PastBackoffLimit``): with ``OnFailure`` the kubelet restarts a failed container in place; a
  pod that still ends Failed is deleted and made again under its name and index; the job fails
  once the running pods' container restarts reach ``runPolicy.backoffLimit``.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Tuple

from npu_job.errors import InputError

from .base import ControllerPod
from .kubeflow import (
    MASTER,
    OPERATOR_NAME_LABEL,
    WORKER,
    MasterWorker,
    named_port,
    pod_labels,
    pod_name,
    replica_pod,
    training_container,
)

CONTROLLER = "pytorchjob-controller"
CONTAINER = "pytorch"
PORT_NAME = "pytorchjob-port"
DEFAULT_PORT = 23456
DEFAULT_NPROC_PER_NODE = "auto"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
TASK_SPEC_ANNOTATION = "volcano.sh/task-spec"


class PyTorchJob(MasterWorker):
    name = "pytorchjob"
    title = "Kubeflow PyTorchJob"
    api_version = "kubeflow.org/v1"
    kind = "PyTorchJob"
    template = "pytorchjob.yaml.j2"
    source = "kubeflow/training-operator v1.9.0 6f74c7f6b2ed6c27aabd82d0a316b23f0646059c"
    constant_labels = ((OPERATOR_NAME_LABEL, CONTROLLER),)
    index_env = "PET_NODE_RANK"
    container_name = CONTAINER
    restart_policy = "OnFailure"
    specs_key = "pytorchReplicaSpecs"
    replicas_field = "spec.pytorchReplicaSpecs.*.replicas"
    min_workers = 1
    master_port_name = PORT_NAME
    # what torchrun would read of them (PET_* as its flags' defaults) and what the workers would
    # inherit where npu-run sets none; MASTER_ADDR and MASTER_PORT train.sh sets itself
    launcher_env = (
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "PET_NODE_RANK",
        "PET_NPROC_PER_NODE",
        "PET_NNODES",
        "RANK",
        "WORLD_SIZE",
    )
    # ReconcilePods deletes and remakes a failed pod alone; the operator restarts no gang
    restart_default = "pod"
    refused_restarts = (
        (
            "job",
            "training-operator v1 deletes and remakes a failed pod alone and has no restart of "
            "all the job's pods",
        ),
    )
    refused_keys = (
        (
            "network_topology",
            "it is the Volcano Job's spec.networkTopology; the PodGroup training-operator makes "
            "of runPolicy.schedulingPolicy has no network topology",
        ),
        (
            "task_name",
            "it names a Volcano task; a PyTorchJob's replica types are Master and Worker, its "
            "pods <name>-master-0 and <name>-worker-<i>",
        ),
    )

    def dns_name(self, job: str, group: str, index: int) -> str:
        if index == 0:
            return pod_name(job, MASTER, 0)
        return pod_name(job, WORKER, index - 1)

    def master_address_bash(self) -> str:
        # pod k's Service: <job>-master-0 for k = 0, <job>-worker-<k-1> after it (10#: digits
        # with leading zeros are decimal here too; a non-number is refused after this)
        return (
            'case "$MA_MASTER_INDEX" in\n'
            "  '' | *[!0-9]*) MASTER_ADDR='' ;;\n"
            '  *) if [ "$((10#$MA_MASTER_INDEX))" -eq 0 ]; then\n'
            '       MASTER_ADDR="${MA_VJ_NAME}-master-0"\n'
            "     else\n"
            '       MASTER_ADDR="${MA_VJ_NAME}-worker-$((10#$MA_MASTER_INDEX - 1))"\n'
            "     fi ;;\n"
            "esac"
        )

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        metadata = job_object.get("metadata") or {}
        job = str(metadata.get("name") or "")
        replicas = self.replicas(job_object, source)
        spec = job_object["spec"]
        if spec.get("elasticPolicy") is not None:
            raise InputError(
                source, "spec.elasticPolicy", "none (npu-job renders a static membership)"
            )
        nproc = spec.get("nprocPerNode", DEFAULT_NPROC_PER_NODE)
        if not isinstance(nproc, str):
            raise InputError(source, "spec.nprocPerNode", "expected a string")
        master = training_container(replicas[0].template, CONTAINER)
        port = named_port(master, PORT_NAME)
        total = sum(replica.count for replica in replicas)
        per_node = int(nproc) if nproc.isdigit() and nproc.isascii() else 1
        master_addr = pod_name(job, MASTER, 0)
        pods: List[ControllerPod] = []
        for replica in replicas:
            for index in range(replica.count):
                rank = index if replica.replica_type == MASTER else index + 1
                master_port = str(DEFAULT_PORT if port is None else port)
                env = (
                    ("PYTHONUNBUFFERED", "1"),
                    ("MASTER_PORT", master_port),
                    ("PET_MASTER_PORT", master_port),
                    ("MASTER_ADDR", master_addr),
                    ("PET_MASTER_ADDR", master_addr),
                    ("WORLD_SIZE", str(total * per_node)),
                    ("RANK", str(rank)),
                    (self.index_env, str(rank)),
                    ("PET_NPROC_PER_NODE", nproc),
                    ("PET_NNODES", str(total)),
                )
                gang = (
                    (GROUP_NAME_ANNOTATION, job),
                    (TASK_SPEC_ANNOTATION, replica.replica_type.lower()),
                )
                labels = pod_labels(self, job, replica, index)
                # its Service is named as the pod
                names = (pod_name(job, replica.replica_type, index),)
                pods.append(replica_pod(job, replica, index, rank, labels, gang, env, names))
        return tuple(pods)


KIND = PyTorchJob()
