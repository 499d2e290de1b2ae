"""What every kubeflow/common replica-spec kind shares (``kinds/kubeflow.py``), checked on each
registered one: PyTorchJob (training-operator v1.9.0) and AscendJob (ascend-operator, on
kubeflow/common v0.4.3).

Their pods are ``<job>-master-0`` and ``<job>-worker-<i>``, labelled with the replica's lower-case
type and its index within the type; npu-job's index of a pod is 0 for the Master and ``i + 1`` for
Worker ``i``. No controller runs here: the job objects are the shape render writes, and the
controllers' rules are the ones read in their source.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from npu_job.kinds import KINDS
from npu_job.kinds.kubeflow import MasterWorker

from npu_job.errors import InputError

TYPE = "training.kubeflow.org/replica-type"
INDEX = "training.kubeflow.org/replica-index"

REPLICA_KINDS: List[MasterWorker] = [
    kind for kind in KINDS.values() if isinstance(kind, MasterWorker)
]
each_kind = pytest.mark.parametrize("kind", REPLICA_KINDS, ids=lambda kind: kind.name)


def test_the_replica_spec_kinds_are_registered():
    assert {"pytorchjob"} <= {kind.name for kind in REPLICA_KINDS}


def job_object(kind: MasterWorker, nodes: int) -> Dict[str, Any]:
    """A job of one Master and ``nodes - 1`` Workers of one pod template, as render writes it."""
    requests = {"huawei.com/Ascend910": 8}
    template = {
        "spec": {
            "containers": [
                {
                    "name": kind.container_name,
                    "image": "train:1",
                    "resources": {"requests": requests, "limits": requests},
                }
            ]
        }
    }
    replicas: Dict[str, Any] = {"Master": {"replicas": 1, "template": template}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, "template": template}
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": "llm", "labels": {"framework": "pytorch"}},
        "spec": {kind.specs_key: replicas},
    }


@each_kind
@pytest.mark.parametrize(
    "replica_type, replica_index, index",
    [("master", "0", 0), ("worker", "0", 1), ("worker", "6", 7), ("worker", "007", 8)],
)
def test_the_master_is_pod_0_and_worker_i_is_pod_i_plus_1(kind, replica_type, replica_index, index):
    labels = {TYPE: replica_type, INDEX: replica_index}
    assert kind.pod_index(labels, "any-name") == index


@each_kind
@pytest.mark.parametrize(
    "labels",
    [
        {TYPE: "master", INDEX: "1"},  # the controllers allow one Master only
        {TYPE: "ps", INDEX: "0"},  # not a replica type of these kinds
        {TYPE: "worker", INDEX: "-1"},
        {TYPE: "worker", INDEX: "١"},  # a digit of another script
        {TYPE: "Worker", INDEX: "1"},  # the label is lower case
    ],
)
def test_a_pod_whose_labels_say_no_index_of_this_kind_has_none(kind, labels):
    assert kind.pod_index(labels, "llm-worker-1") is None


@each_kind
@pytest.mark.parametrize(
    "name, index",
    [
        ("llm-master-0", 0),
        ("llm-worker-0", 1),
        ("my-worker-job-worker-11", 12),
        ("llm-master-1", None),
        ("llm-7", None),
        ("llm-worker-3-hot-0421", None),  # an AscendJob's hot-switch backup pod
    ],
)
def test_without_the_labels_the_name_gives_the_index(kind, name, index):
    assert kind.pod_index({}, name) == index


@each_kind
def test_the_controller_makes_the_master_then_the_workers_in_index_order(kind):
    pods = kind.controller_pods(job_object(kind, nodes=4), "job.yaml")
    assert [(pod.index, pod.name) for pod in pods] == [
        (0, "llm-master-0"),
        (1, "llm-worker-0"),
        (2, "llm-worker-1"),
        (3, "llm-worker-2"),
    ]
    for pod in pods:
        assert pod.hostname == pod.name and pod.subdomain == ""  # the kubelet's default
        assert kind.pod_index(dict(pod.labels), pod.name) == pod.index
        assert kind.selects(dict(pod.labels), "llm")
        assert dict(pod.env)[kind.index_env] == str(pod.index)
    assert [pod.where for pod in pods[:2]] == [
        f"spec.{kind.specs_key}.Master.template",
        f"spec.{kind.specs_key}.Worker.template",
    ]


@each_kind
def test_replica_types_are_matched_in_any_case_as_the_defaulters_do(kind):
    job = job_object(kind, nodes=2)
    specs = job["spec"][kind.specs_key]
    job["spec"][kind.specs_key] = {"master": specs["Master"], "WORKER": specs["Worker"]}
    assert [pod.name for pod in kind.controller_pods(job, "job.yaml")] == [
        "llm-master-0",
        "llm-worker-0",
    ]


@each_kind
def test_one_master_only(kind):
    job = job_object(kind, nodes=2)
    job["spec"][kind.specs_key]["Master"]["replicas"] = 2
    with pytest.raises(InputError) as caught:
        kind.controller_pods(job, "job.yaml")
    assert (
        str(caught.value) == f"job.yaml: spec.{kind.specs_key}.Master.replicas: expected 1, got 2"
    )


@each_kind
def test_a_job_without_a_master_has_no_index_rule_and_is_an_error(kind):
    job = job_object(kind, nodes=2)
    del job["spec"][kind.specs_key]["Master"]
    with pytest.raises(InputError, match=rf"spec\.{kind.specs_key}\.Master: expected a Master"):
        kind.controller_pods(job, "job.yaml")
