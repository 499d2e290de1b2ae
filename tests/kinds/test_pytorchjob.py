"""The PyTorchJob record against training-operator v1.9.0 (6f74c7f6b2ed6c27aabd82d0a316b23f0646059c).

What the operator does, as read in its source (and cited in ``kinds/pytorchjob.py``): pods
``<job>-master-0`` and ``<job>-worker-<i>`` labelled with the operator's name, the job's name and
the replica's type and index; ``RANK``/``PET_NODE_RANK`` 0 for the Master and ``i + 1`` for Worker
``i``; one headless Service per replica named as its pod. No PyTorchJob controller runs here: the
job objects below are what render writes, and :meth:`controller_pods` is checked against the
operator's rules, not against a running operator. The master address rule runs in a real bash.
"""

from __future__ import annotations

import copy
import subprocess
from typing import Any, Dict

import pytest
from npu_job.kinds import KINDS
from npu_job.kinds.pytorchjob import KIND

from npu_job.errors import InputError

TYPE = "training.kubeflow.org/replica-type"
INDEX = "training.kubeflow.org/replica-index"
OPERATOR = "training.kubeflow.org/operator-name"
JOB = "training.kubeflow.org/job-name"


def template(**container: Any) -> Dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "llm", OPERATOR: "someone-else"}, "annotations": {"a": "1"}},
        "spec": {"containers": [{"name": "pytorch", "image": "train:1", **container}]},
    }


def job_object(nodes: int = 3, **spec: Any) -> Dict[str, Any]:
    port = {"ports": [{"name": "pytorchjob-port", "containerPort": 29500}]}
    replicas: Dict[str, Any] = {"Master": {"replicas": 1, "template": template(**port)}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, "template": template(**port)}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "llm", "namespace": "team"},
        "spec": {"nprocPerNode": "8", "pytorchReplicaSpecs": replicas, **spec},
    }


def test_the_record_is_registered_under_its_spec_value():
    assert KINDS["pytorchjob"] is KIND
    assert (KIND.api_version, KIND.kind) == ("kubeflow.org/v1", "PyTorchJob")
    assert KIND.template == "pytorchjob.yaml.j2"
    assert KIND.container_name == "pytorch"  # the webhook demands a container of that name
    assert KIND.restart_policy == "OnFailure"  # the operator's default replica restart policy
    assert KIND.index_env == "PET_NODE_RANK"
    assert KIND.master_port_name == "pytorchjob-port"


def test_the_selector_is_the_job_name_and_the_operator_so_another_kubeflow_job_stays_out():
    assert KIND.selector("llm") == f"{JOB}=llm,{OPERATOR}=pytorchjob-controller"
    ours = {JOB: "llm", OPERATOR: "pytorchjob-controller", TYPE: "worker", INDEX: "0"}
    assert KIND.selects(ours, "llm")
    assert not KIND.selects({**ours, OPERATOR: "tfjob-controller"}, "llm")  # a TFJob named llm
    assert not KIND.selects({**ours, JOB: "other"}, "llm")


def test_pod_k_is_reached_by_its_replicas_service_named_as_the_pod():
    assert [KIND.dns_name("llm", "", k) for k in range(4)] == [
        "llm-master-0",
        "llm-worker-0",
        "llm-worker-1",
        "llm-worker-2",
    ]


@pytest.mark.parametrize("index", ["0", "1", "2", "9", "010", "00"])
def test_train_sh_names_the_master_as_dns_name_does(index):
    script = f"set -euo pipefail\nMA_VJ_NAME=llm\nMA_MASTER_INDEX={index}\n"
    script += KIND.master_address_bash() + '\nprintf %s "$MASTER_ADDR"\n'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout == KIND.dns_name("llm", "", int(index, 10))


@pytest.mark.parametrize("index", ["", "x", "1a", "-1"])
def test_train_sh_leaves_a_master_index_that_is_no_number_to_its_own_check(index):
    script = f"set -euo pipefail\nMA_VJ_NAME=llm\nMA_MASTER_INDEX={index!r}\n"
    script += KIND.master_address_bash() + '\nprintf "<%s>" "$MASTER_ADDR"\n'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout == "<>"


def test_each_pod_is_reached_by_its_services_name_which_is_the_pods():
    pods = KIND.controller_pods(job_object(nodes=4), "job.yaml")
    assert [pod.dns_names for pod in pods] == [(KIND.dns_name("llm", "", k),) for k in range(4)]
    assert [pod.dns_names for pod in pods] == [(pod.name,) for pod in pods]


def test_the_operators_labels_win_over_the_templates_and_gang_scheduling_annotates():
    master, worker = KIND.controller_pods(job_object(nodes=2), "job.yaml")
    assert dict(master.labels) == {
        "app": "llm",
        OPERATOR: "pytorchjob-controller",
        JOB: "llm",
        TYPE: "master",
        INDEX: "0",
        "training.kubeflow.org/job-role": "master",
    }
    assert "training.kubeflow.org/job-role" not in dict(worker.labels)
    assert dict(worker.annotations) == {
        "a": "1",
        "scheduling.k8s.io/group-name": "llm",
        "volcano.sh/task-spec": "worker",
    }


def test_the_injected_environment_is_the_operators_for_a_job_with_a_master():
    pods = KIND.controller_pods(job_object(nodes=3), "job.yaml")
    assert [dict(pod.env)["PET_NODE_RANK"] for pod in pods] == ["0", "1", "2"]
    assert list(pods[2].env) == [  # appended in this order after the container's own
        ("PYTHONUNBUFFERED", "1"),
        ("MASTER_PORT", "29500"),
        ("PET_MASTER_PORT", "29500"),
        ("MASTER_ADDR", "llm-master-0"),
        ("PET_MASTER_ADDR", "llm-master-0"),
        ("WORLD_SIZE", "24"),  # every replica times nprocPerNode: processes
        ("RANK", "2"),
        ("PET_NODE_RANK", "2"),
        ("PET_NPROC_PER_NODE", "8"),
        ("PET_NNODES", "3"),
    ]
    injected = {name for pod in pods for name, _ in pod.env}
    train_sh_sets = {"MASTER_ADDR", "MASTER_PORT"}
    assert injected - {"PYTHONUNBUFFERED"} == set(KIND.launcher_env) | train_sh_sets


def test_the_operators_defaults_fill_the_port_and_nproc_per_node():
    job = job_object(nodes=2)
    del job["spec"]["nprocPerNode"]  # defaulted to "auto", which WORLD_SIZE counts as 1
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        del replica["template"]["spec"]["containers"][0]["ports"]
        del replica["replicas"]  # defaulted to 1
    env = dict(KIND.controller_pods(job, "job.yaml")[1].env)
    assert (env["MASTER_PORT"], env["PET_NPROC_PER_NODE"], env["WORLD_SIZE"]) == (
        "23456",
        "auto",
        "2",
    )


def _broken(change) -> Dict[str, Any]:
    job = copy.deepcopy(job_object(nodes=3))
    change(job["spec"])
    return job


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda s: s["pytorchReplicaSpecs"]["Worker"].update(replicas=0),
            "job.yaml: spec.pytorchReplicaSpecs.Worker.replicas: expected a count >= 1",
        ),
        (
            lambda s: s["pytorchReplicaSpecs"].update(PS=s["pytorchReplicaSpecs"]["Worker"]),
            "job.yaml: spec.pytorchReplicaSpecs.PS: expected one of Master, Worker",
        ),
        (
            lambda s: s["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][
                0
            ].update(name="train"),
            "job.yaml: spec.pytorchReplicaSpecs.Worker.template.spec.containers: expected a "
            "container named 'pytorch' with an image",
        ),
        (
            lambda s: s.update(elasticPolicy={"maxReplicas": 4}),
            "job.yaml: spec.elasticPolicy: none",
        ),
        (lambda s: s.pop("pytorchReplicaSpecs"), "job.yaml: spec.pytorchReplicaSpecs: expected"),
    ],
)
def test_a_job_object_the_operator_would_refuse_is_an_error_naming_the_field(change, message):
    with pytest.raises(InputError) as caught:
        KIND.controller_pods(_broken(change), "job.yaml")
    assert str(caught.value).startswith(message)


def test_the_spec_keys_a_pytorchjob_cannot_honour_are_refused_with_a_reason():
    refused = dict(KIND.refused_keys)
    assert set(refused) == {"network_topology", "task_name"}
    assert all(reason for reason in refused.values())
