"""Kubeflow Trainer's TrainJob (``trainer.kubeflow.org/v1alpha1`` ``TrainJob``), on a runtime
npu-job renders beside it: a namespaced ``TrainingRuntime`` that holds the JobSet's template.

The Trainer makes a JobSet of the TrainJob's name out of the runtime; its pods are then a
JobSet's (:mod:`npu_job.kinds.jobset`). Read in kubeflow/trainer at
8c0f5059bd51ec3ba6d6a6a7b2e1471de7bc13b3:

* ``spec.runtimeRef`` names the runtime (kind ``ClusterTrainingRuntime`` and group
  ``trainer.kubeflow.org`` when unset: ``pkg/apis/trainer/v1alpha1/trainjob_types.go``); the
  webhook refuses a TrainJob whose TrainingRuntime does not exist yet
  (``pkg/runtime/core/trainingruntime.go`` ``ValidateObjects``);
* the jobset plugin builds the JobSet with the TrainJob's name and namespace from the runtime's
  ``spec.template`` (``pkg/runtime/framework/plugins/jobset/jobset.go`` ``Build``); in the
  replicated job labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` it forces
  ``replicas: 1`` and gives the container named ``node`` the trainer's image, command, args and
  env where the TrainJob sets them (``builder.go`` ``Trainer``), merges
  ``trainer.resourcesPerNode`` into that container's resources (``trainingruntime.go``
  ``newRuntimeInfo``), and sets the Job's ``parallelism`` and ``completions`` to the node count:
  ``trainer.numNodes``, else the runtime's ``mlPolicy.numNodes``, else 1 (``syncParallelCount``);
* with ``mlPolicy.torch`` the torch plugin (``pkg/runtime/framework/plugins/torch/torch.go``
  ``EnforceMLPolicy``; names in ``pkg/constants/constants.go``) adds to that container
  ``PET_NNODES`` (the node count), ``PET_NPROC_PER_NODE`` (``trainer.numProcPerNode``; else
  ``auto``, which it turns into a CPU count where no GPU is asked for: NPUs are not counted),
  ``PET_NODE_RANK`` (a fieldRef to the completion-index annotation), ``PET_MASTER_ADDR``
  (``<trainjob>-node-0-0.<trainjob>``, whatever the runtime's subdomain) and ``PET_MASTER_PORT``
  (29500, also a container port); the webhook refuses these names in ``trainer.env``
  (``TorchRunReservedEnvNames``).

The Trainer sets no label of its own on the pods (the ancestor label is the Job template's), so
the pods are selected as a JobSet's: ``jobset-name`` is the TrainJob's name and
``replicatedjob-name`` is ``node``. Not modelled here, as npu-job's runtime uses none of them:
initializer jobs, ``runtimePatches``, ``podGroupPolicy``, the torchtune command, ``envInjection``
and the CPU count behind ``auto``.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from npu_job.errors import InputError

from . import indexedjob, jobset
from .base import ControllerPod, JobKind

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
RUNTIME_KIND = "TrainingRuntime"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
#: the name of the trainer's replicated job and of its container
NODE = "node"
#: the port the torch plugin gives ``PET_MASTER_PORT`` and opens on the container
TRAINER_PORT = 29500
PET_NNODES, PET_NPROC_PER_NODE = "PET_NNODES", "PET_NPROC_PER_NODE"
PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT = (
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
TORCH_ENV = (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)


def _upsert(items: List[Any], item: Mapping[str, Any], key: str) -> None:
    """Replace the entry of ``items`` whose ``key`` is ``item``'s, else append ``item``."""
    for position, existing in enumerate(items):
        if isinstance(existing, dict) and existing.get(key) == item[key]:
            items[position] = dict(item)
            return
    items.append(dict(item))


def _ancestor(rjob: Mapping[str, Any]) -> Optional[str]:
    """The ancestor label of a replicated job's Job template (which step of a TrainJob it is)."""
    template = rjob.get("template")
    metadata = template.get("metadata") if isinstance(template, dict) else None
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    return labels.get(ANCESTOR_LABEL) if isinstance(labels, dict) else None


def runtime_of(
    trainjob: Mapping[str, Any], documents: Sequence[Any], source: str
) -> Mapping[str, Any]:
    """The TrainingRuntime of ``documents`` that ``trainjob``'s ``runtimeRef`` names."""
    spec = trainjob.get("spec")
    ref = spec.get("runtimeRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict) or not ref.get("name"):
        raise InputError(source, "spec.runtimeRef.name", "expected the runtime's name")
    kind = ref.get("kind") or "ClusterTrainingRuntime"
    group = ref.get("apiGroup") or API_GROUP
    namespace = (trainjob.get("metadata") or {}).get("namespace") or "default"
    for document in documents:
        meta = document.get("metadata") if isinstance(document, dict) else None
        if (
            isinstance(meta, dict)
            and (document.get("apiVersion"), document.get("kind")) == (f"{group}/v1alpha1", kind)
            and meta.get("name") == ref["name"]
            and (kind != RUNTIME_KIND or (meta.get("namespace") or "default") == namespace)
        ):
            return document
    raise InputError(
        source,
        "spec.runtimeRef",
        f"expected the {kind} {ref['name']!r} it names in the same stream (npu-job renders its "
        "own TrainingRuntime before the TrainJob)",
    )


def trainer_jobset(
    trainjob: Mapping[str, Any], runtime: Mapping[str, Any], source: str, where: str
) -> Dict[str, Any]:
    """The JobSet the Trainer makes of ``trainjob`` and its ``runtime`` (see the module
    docstring); ``where`` names the runtime's JobSet template in messages."""
    metadata = trainjob.get("metadata") or {}
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    runtime_spec = runtime.get("spec") or {}
    template = runtime_spec.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise InputError(source, where, "expected the JobSet's template")
    spec = copy.deepcopy(template["spec"])
    ml_policy = runtime_spec.get("mlPolicy") or {}
    nodes = trainer.get("numNodes", ml_policy.get("numNodes", 1))
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 0:
        raise InputError(source, "spec.trainer.numNodes", "expected a count")
    trainers = [
        position
        for position, rjob in enumerate(spec.get("replicatedJobs") or ())
        if isinstance(rjob, dict) and _ancestor(rjob) == ANCESTOR_TRAINER
    ]
    if len(trainers) != 1:
        raise InputError(
            source,
            f"{where}.spec.replicatedJobs",
            f"expected one replicated job labelled {ANCESTOR_LABEL}: {ANCESTOR_TRAINER}",
        )
    rjob = spec["replicatedJobs"][trainers[0]]
    rjob["replicas"] = 1
    job_spec = rjob["template"].setdefault("spec", {})
    job_spec["parallelism"] = job_spec["completions"] = nodes
    pod_spec = (job_spec.get("template") or {}).get("spec")
    containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
    node = next(
        (c for c in containers or () if isinstance(c, dict) and c.get("name") == NODE), None
    )
    if node is None:
        raise InputError(
            source,
            f"{where}.spec.replicatedJobs[{trainers[0]}].template.spec.template.spec.containers",
            f"expected the container {NODE!r}",
        )
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            node[key] = trainer[key]
    env = node.setdefault("env", [])
    for item in trainer.get("env") or ():
        _upsert(env, item, "name")
    per_node = trainer.get("resourcesPerNode") or {}
    for part in ("limits", "requests"):
        if per_node.get(part):
            node.setdefault("resources", {}).setdefault(part, {}).update(per_node[part])
    if ml_policy.get("torch") is not None:
        name = str(metadata.get("name") or "")
        procs = trainer.get("numProcPerNode")
        for item in (
            {"name": PET_NNODES, "value": str(nodes)},
            {"name": PET_NPROC_PER_NODE, "value": "auto" if procs is None else str(procs)},
            {
                "name": PET_NODE_RANK,
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{indexedjob.COMPLETION_INDEX_KEY}']"
                    }
                },
            },
            {"name": PET_MASTER_ADDR, "value": f"{name}-{NODE}-0-0.{name}"},
            {"name": PET_MASTER_PORT, "value": str(TRAINER_PORT)},
        ):
            _upsert(env, item, "name")
        _upsert(node.setdefault("ports", []), {"containerPort": TRAINER_PORT}, "containerPort")
    template_meta = template.get("metadata") or {}
    return {
        "apiVersion": jobset.API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace") or "default",
            "labels": dict(template_meta.get("labels") or {}),
            "annotations": dict(template_meta.get("annotations") or {}),
        },
        "spec": spec,
    }


class TrainJob(JobKind):
    name = "trainjob"
    title = "TrainJob"
    api_version = API_VERSION
    kind = "TrainJob"
    template = "trainjob.yaml.j2"
    source = "kubeflow/trainer 8c0f5059bd51ec3ba6d6a6a7b2e1471de7bc13b3; its JobSet's pods: " + (
        jobset.KIND.source
    )
    job_label = jobset.JOBSET_NAME_LABEL
    # the trainer's replicated job is always "node": no group to choose, a label to require
    constant_labels = ((jobset.REPLICATED_JOB_LABEL, NODE),)
    index_label = indexedjob.COMPLETION_INDEX_KEY
    index_env = indexedjob.COMPLETION_INDEX_ENV
    container_name = NODE
    restart_policy = jobset.KIND.restart_policy
    attempt_label = jobset.RESTART_ATTEMPT_LABEL
    # the runtime's JobSet template restarts as the jobset kind's; the Trainer writes no
    # backoffLimit of its own (none under pkg/ at 8c0f5059b), so restart "job"'s 0 reaches the Job
    restart_default = jobset.KIND.restart_default
    launcher_env = TORCH_ENV
    replicas_field = "spec.trainer.numNodes"
    refused_keys = (
        ("task_name", f"the Trainer names its replicated job and container {NODE!r}"),
        *jobset.KIND.refused_keys,
    )
    name_expected = (
        "a pod name ending in -<index>-<5 random characters>, as the Job controller names the "
        f"pods of a TrainJob's Job <trainjob>-{NODE}-0-<index>-<random>"
    )

    def index_from_name(self, name: str) -> Optional[int]:
        return indexedjob.KIND.index_from_name(name)

    def dns_name(self, job: str, group: str, index: int) -> str:
        return jobset.KIND.dns_name(job, NODE, index)

    def name_problem(self, job: str) -> str:
        return jobset.KIND.name_problem(job)  # the TrainJob's CRD asks the same of its name

    def longest_name(self, job: str, group: str, nodes: int) -> Tuple[str, str]:
        longest, what = jobset.KIND.longest_name(job, NODE, nodes)
        return longest, what.replace("<task_name>", NODE)

    def master_address_bash(self) -> str:
        return f'MASTER_ADDR="${{MA_VJ_NAME}}-{NODE}-0-${{MA_MASTER_INDEX}}.${{MA_VJ_NAME}}"'

    def stream_pods(self, documents: Sequence[Any], source: str) -> Tuple[ControllerPod, ...]:
        trainjob = self.job_object(documents, source)
        runtime = runtime_of(trainjob, documents, source)
        where = (
            f"{runtime.get('kind')} {(runtime.get('metadata') or {}).get('name')}: spec.template"
        )
        built = trainer_jobset(trainjob, runtime, source, where)
        return jobset.jobset_pods(built, source, where=f"{where}.")

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        # the pod template is the runtime's: a TrainJob alone makes no pods it can say
        return self.stream_pods((job_object,), source)


KIND = TrainJob()
