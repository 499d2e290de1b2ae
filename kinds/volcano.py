"""The Volcano Job (``batch.volcano.sh/v1alpha1`` ``Job``): npu-job's first kind and its default.

Read in volcano-sh/volcano at ed72c7c815a9fd547a787134676f73d42e9d049c:

* pods are named ``<job>-<task>-<i>`` for ``i`` in ``0..replicas-1`` of each task
  (``pkg/controllers/job/helpers/helpers.go`` ``PodNameFmt``; ``job_controller_util.go``
  ``createJobPod``), labelled ``volcano.sh/job-name``, ``volcano.sh/task-spec`` and
  ``volcano.sh/task-index`` (``staging/src/volcano.sh/apis/pkg/apis/batch/v1alpha1/labels.go``)
  and annotated with the same three;
* the ``env`` plugin sets ``VC_TASK_INDEX`` and ``VK_TASK_INDEX`` to the last hyphen-separated
  part of the pod name (``pkg/controllers/job/plugins/env/env.go``, ``helpers.go``
  ``GetPodIndexUnderTask``);
* the ``svc`` plugin sets each pod's hostname to its name under subdomain ``<job>``, makes the
  headless Service ``<job>`` (so ``<job>-<task>-<i>.<job>`` resolves), and mounts
  ``/etc/volcano`` with ``<task>.host``, ``VC_<TASK>_HOSTS`` and ``VC_<TASK>_NUM``, the last two
  injected as variables too (``pkg/controllers/job/plugins/svc/svc.go``);
* ``policies`` map a pod's event to an action: ``PodEvicted`` when a pod of the job is deleted,
  ``PodFailed`` when one ends Failed (``pkg/controllers/job/job_controller_handler.go``
  ``deletePod``, ``updatePod``). ``RestartJob`` deletes every pod (the job's version one higher)
  and makes them again; ``RestartTask`` deletes every pod of the event's task, which in npu-job's
  one-task layout is every pod again; ``RestartPod`` deletes the event's pod alone and keeps the
  PodGroup, and the controller makes that pod again under its name
  (``staging/src/volcano.sh/apis/pkg/apis/bus/v1alpha1/actions.go``;
  ``pkg/controllers/job/job_controller_actions.go`` ``killPods``). Each restart counts one
  against ``maxRetry`` (``state/running.go``, ``state/restarting.go``). ``RestartPod`` came in
  with commit 68da9635 (2024-11-11), first released in Volcano v1.11.0: the admission webhook of
  an earlier Volcano refuses it as an invalid policy action
  (``pkg/webhooks/admission/jobs/validate/util.go`` ``policyActionMap``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from npu_job.errors import InputError

from .base import ControllerPod, JobKind, index_suffix, merged, string_pairs

JOB_NAME_LABEL = "volcano.sh/job-name"
TASK_SPEC_LABEL = "volcano.sh/task-spec"
TASK_INDEX_LABEL = "volcano.sh/task-index"
#: the env plugin's index of this pod in its task (scheduler order)
TASK_INDEX_ENV = "VC_TASK_INDEX"
SVC_MOUNT_PATH = "/etc/volcano"


def svc_env_name(task: str, suffix: str) -> str:
    """``VC_<TASK>_HOSTS`` / ``VC_<TASK>_NUM``: the task name upper-cased, ``-`` -> ``_``."""
    return f"VC_{task.upper().replace('-', '_')}_{suffix}"


class Volcano(JobKind):
    name = "volcano"
    title = "Volcano Job"
    api_version = "batch.volcano.sh/v1alpha1"
    kind = "Job"
    template = "job.yaml.j2"
    source = "volcano-sh/volcano ed72c7c815a9fd547a787134676f73d42e9d049c"
    job_label = JOB_NAME_LABEL
    group_label = TASK_SPEC_LABEL
    index_label = TASK_INDEX_LABEL
    index_env = TASK_INDEX_ENV
    container_name = "train"
    restart_policy = "OnFailure"
    cce_rank_table = True
    identity_metadata = "annotations"
    replicas_field = "spec.tasks[*].replicas"
    name_expected = (
        "a pod name ending in -<index>, as Volcano names pods <job>-<task>-<index> "
        "(the digits of a random suffix are not an index)"
    )

    def index_from_name(self, name: str) -> Optional[int]:
        return index_suffix(name)

    def dns_name(self, job: str, group: str, index: int) -> str:
        return f"{job}-{group}-{index}.{job}"

    def master_address_bash(self) -> str:
        return 'MASTER_ADDR="${MA_VJ_NAME}-${MA_TASK_NAME}-${MA_MASTER_INDEX}.${MA_VJ_NAME}"'

    def controller_pods(
        self, job_object: Mapping[str, Any], source: str
    ) -> Tuple[ControllerPod, ...]:
        metadata = job_object.get("metadata") or {}
        job = str(metadata.get("name") or "")
        spec = job_object.get("spec")
        tasks = spec.get("tasks") if isinstance(spec, dict) else None
        if not isinstance(tasks, list) or not tasks:
            raise InputError(source, "spec.tasks", "expected a list of tasks")
        plugins = spec.get("plugins") or {}
        has_svc, has_env = "svc" in plugins, "env" in plugins
        names: List[List[str]] = []
        for position, task in enumerate(tasks):
            replicas = task.get("replicas", 1) if isinstance(task, dict) else None
            if not isinstance(replicas, int) or replicas < 0:
                raise InputError(source, f"spec.tasks[{position}].replicas", "expected a count")
            names.append([f"{job}-{task.get('name')}-{index}" for index in range(replicas)])
        svc_env: Dict[str, str] = {}
        svc_files: List[Tuple[str, str]] = []
        if has_svc:
            for task, task_names in zip(tasks, names):
                task_name = str(task.get("name"))
                fqdns = ",".join(self.dns_name(job, task_name, i) for i in range(len(task_names)))
                svc_env[svc_env_name(task_name, "HOSTS")] = fqdns
                svc_env[svc_env_name(task_name, "NUM")] = str(len(task_names))
                svc_files += [
                    (f"{task_name.replace('-', '_')}.host", fqdns.replace(",", "\n")),
                    (svc_env_name(task_name, "HOSTS"), fqdns),
                    (svc_env_name(task_name, "NUM"), str(len(task_names))),
                ]
        files = ((SVC_MOUNT_PATH, tuple(sorted(svc_files))),) if svc_files else ()
        pods: List[ControllerPod] = []
        for position, (task, task_names) in enumerate(zip(tasks, names)):
            task_name = str(task.get("name"))
            where = f"spec.tasks[{position}].template"
            template = task.get("template")
            if not isinstance(template, dict):
                raise InputError(source, where, "expected a pod template")
            template_meta = template.get("metadata") or {}
            for index, name in enumerate(task_names):
                own = {
                    JOB_NAME_LABEL: job,
                    TASK_SPEC_LABEL: task_name,
                    TASK_INDEX_LABEL: str(index),
                }
                env = (
                    [("VK_TASK_INDEX", str(index)), (self.index_env, str(index))] if has_env else []
                )
                env += sorted(svc_env.items())
                pods.append(
                    ControllerPod(
                        index=index,
                        name=name,
                        hostname=name,
                        subdomain=job if has_svc else "",
                        labels=merged(
                            string_pairs(template_meta.get("labels")), tuple(own.items())
                        ),
                        annotations=merged(
                            string_pairs(template_meta.get("annotations")), tuple(own.items())
                        ),
                        env=tuple(env),
                        template=template,
                        where=where,
                        dns_names=(self.dns_name(job, task_name, index),) if has_svc else (),
                        files=files,
                    )
                )
        return tuple(pods)


KIND = Volcano()
