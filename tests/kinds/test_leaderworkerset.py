"""The LeaderWorkerSet's record says what kubernetes-sigs/lws and the StatefulSets it makes do to
its pods.

Each expectation is a fact read in kubernetes-sigs/lws (cited in ``kinds/leaderworkerset.py``):
the leader ``<lws>-<g>`` of a group and its workers ``<lws>-<g>-<w>`` from ordinal 1, hostnames
their names under the Service ``<lws>``, the labels and annotations of the StatefulSet templates
and the pod webhook, the three ``LWS_*`` variables first in every container, and the
``restartPolicy: Always`` a StatefulSet demands. No cluster runs here, so the objects are written
by hand in the shape npu-job renders.
"""

from __future__ import annotations

import hashlib

import pytest
from npu_job.kinds import KINDS
from npu_job.kinds.leaderworkerset import (
    GROUP_INDEX_LABEL,
    GROUP_KEY_LABEL,
    LEADER_NAME_ANNOTATION,
    NAME_LABEL,
    SIZE_ANNOTATION,
    WORKER_INDEX_LABEL,
)

from npu_job.errors import InputError

from .shell import master_address

KIND = KINDS["leaderworkerset"]


def pod_template(restart="Always", labels=None):
    return {
        "metadata": {"labels": labels or {"app": "x"}},
        "spec": {"containers": [{"name": "train", "image": "i"}], "restartPolicy": restart},
    }


def lws_object(size=4, name="llm", namespace="team", replicas=1, policy="Shared", leader=None):
    group = {"size": size, "workerTemplate": pod_template()}
    if leader is not None:
        group["leaderTemplate"] = leader
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "networkConfig": {"subdomainPolicy": policy},
            "leaderWorkerTemplate": group,
        },
    }


def test_the_record_names_the_crd_the_worker_index_and_statefulset_restarts():
    assert (KIND.api_version, KIND.kind) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert (KIND.index_env, KIND.index_label) == ("LWS_WORKER_INDEX", WORKER_INDEX_LABEL)
    assert KIND.restart_policy == "Always"
    assert KIND.selector("llm", "0") == f"{NAME_LABEL}=llm,{GROUP_INDEX_LABEL}=0"


def test_the_leader_is_index_0_and_its_workers_count_from_1():
    pods = KIND.controller_pods(lws_object(4), "lws.yaml")
    assert [(pod.index, pod.name) for pod in pods] == [
        (0, "llm-0"),
        (1, "llm-0-1"),
        (2, "llm-0-2"),
        (3, "llm-0-3"),
    ]
    for pod in pods:
        assert (pod.hostname, pod.subdomain) == (pod.name, "llm")
        labels = dict(pod.labels)
        assert labels[WORKER_INDEX_LABEL] == str(pod.index)
        assert labels[GROUP_INDEX_LABEL] == "0" and labels[NAME_LABEL] == "llm"
        assert labels["app"] == "x"
        assert KIND.selects(labels, "llm", "0") and not KIND.selects(labels, "llm", "1")
        assert KIND.pod_index(labels, pod.name) == KIND.index_from_name(pod.name) == pod.index


def test_workers_carry_their_leaders_group_key_and_name_and_every_pod_the_group_size():
    pods = KIND.controller_pods(lws_object(3), "lws.yaml")
    key = hashlib.sha1(b"team/llm-0").hexdigest()  # the webhook's, of <namespace>/<leader>
    assert {dict(pod.labels)[GROUP_KEY_LABEL] for pod in pods} == {key}
    assert [dict(pod.annotations).get(LEADER_NAME_ANNOTATION) for pod in pods] == [
        None,
        "llm-0",
        "llm-0",
    ]
    assert {dict(pod.annotations)[SIZE_ANNOTATION] for pod in pods} == {"3"}


def test_every_pod_gets_the_leaders_address_the_group_size_and_its_worker_index():
    pods = KIND.controller_pods(lws_object(3, namespace="team"), "lws.yaml")
    for pod in pods:
        assert pod.env == (
            ("LWS_LEADER_ADDRESS", "llm-0.llm.team"),
            ("LWS_GROUP_SIZE", "3"),
            ("LWS_WORKER_INDEX", str(pod.index)),
        )
    assert "llm-0.llm.team" in pods[0].dns_names, "the leader's address resolves to the leader"


def test_each_pod_resolves_where_the_record_says():
    pods = KIND.controller_pods(lws_object(5), "lws.yaml")
    for pod in pods:
        name = KIND.dns_name("llm", "0", pod.index)
        assert name == ("llm-0.llm" if pod.index == 0 else f"llm-0-{pod.index}.llm")
        assert pod.dns_names == (name, f"{name}.team", f"{name}.team.svc")


def test_a_group_per_replica_each_with_its_own_leader():
    pods = KIND.controller_pods(lws_object(2, replicas=2), "lws.yaml")
    assert [pod.name for pod in pods] == ["llm-0", "llm-0-1", "llm-1", "llm-1-1"]
    assert [dict(pod.labels)[GROUP_INDEX_LABEL] for pod in pods] == ["0", "0", "1", "1"]
    assert dict(pods[3].env)["LWS_LEADER_ADDRESS"] == "llm-1.llm.team"


def test_a_service_per_group_puts_each_group_under_its_leaders_name():
    pods = KIND.controller_pods(lws_object(2, policy="UniquePerReplica"), "lws.yaml")
    assert [pod.subdomain for pod in pods] == ["llm-0", "llm-0"]
    assert dict(pods[1].env)["LWS_LEADER_ADDRESS"] == "llm-0.llm-0.team"


def test_the_leader_is_made_from_the_leader_template_where_there_is_one():
    leader = pod_template(labels={"role": "leader"})
    pods = KIND.controller_pods(lws_object(3, leader=leader), "lws.yaml")
    assert pods[0].where == "spec.leaderWorkerTemplate.leaderTemplate"
    assert dict(pods[0].labels)["role"] == "leader"
    assert {pod.where for pod in pods[1:]} == {"spec.leaderWorkerTemplate.workerTemplate"}


def test_size_1_is_the_leader_alone():
    assert [pod.name for pod in KIND.controller_pods(lws_object(1), "lws.yaml")] == ["llm-0"]


@pytest.mark.parametrize("restart", ["OnFailure", "Never"])
def test_a_pod_template_a_statefulset_refuses_is_refused_naming_it(restart):
    job = lws_object(2)
    job["spec"]["leaderWorkerTemplate"]["workerTemplate"] = pod_template(restart)
    with pytest.raises(InputError) as raised:
        KIND.controller_pods(job, "lws.yaml")
    assert str(raised.value).startswith(
        "lws.yaml: spec.leaderWorkerTemplate.workerTemplate.spec.restartPolicy: expected Always"
    )


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda spec: spec.pop("leaderWorkerTemplate"), "spec.leaderWorkerTemplate"),
        (
            lambda spec: spec["leaderWorkerTemplate"].update(size=0),
            "spec.leaderWorkerTemplate.size",
        ),
        (lambda spec: spec.update(replicas=-1), "spec.replicas"),
        (lambda spec: spec.update(networkConfig={"subdomainPolicy": "Own"}), "spec.networkConfig"),
    ],
    ids=["no-group", "size-0", "negative-replicas", "unknown-subdomain-policy"],
)
def test_an_object_the_controller_would_not_take_is_refused_naming_the_field(change, field):
    job = lws_object(2)
    change(job["spec"])
    with pytest.raises(InputError) as raised:
        KIND.controller_pods(job, "lws.yaml")
    assert str(raised.value).startswith(f"lws.yaml: {field}")


@pytest.mark.parametrize("master", [0, 1, 7])
def test_train_sh_finds_the_master_where_the_record_says_it_resolves(master):
    # MA_TASK_NAME is the group's index, the record's group label
    out = master_address(KIND, MA_VJ_NAME="llm", MA_TASK_NAME="0", MA_MASTER_INDEX=str(master))
    assert out == KIND.dns_name("llm", "0", master)
    assert out in KIND.controller_pods(lws_object(8), "lws.yaml")[master].dns_names


def test_the_leaders_address_is_a_launcher_variable_train_sh_unsets():
    assert "LWS_LEADER_ADDRESS" in KIND.launcher_env


def test_keys_a_leaderworkerset_has_no_field_for_are_refused_with_a_reason():
    refused = dict(KIND.refused_keys)
    assert {"task_name", "queue", "max_retry", "network_topology"} <= set(refused)
    assert all(reason for reason in refused.values())


def test_the_longest_name_is_the_one_whose_worker_statefulset_fits_its_revision_label():
    # controller-revision-hash: <lws>-0-<hash of up to 10 characters>, at most 63
    assert KIND.name_problem("x" * 50) == ""
    assert "x" * 51 + "-0" in KIND.name_problem("x" * 51)
    assert "letter" in KIND.name_problem("0" + "x" * 10)
