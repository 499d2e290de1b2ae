"""``kind: leaderworkerset`` renders a LeaderWorkerSet of one group that holds only fields its CRD
lists, and refuses the keys it has no field for.

The schema below is a minimal one written by hand from the CRD of ``leaderworkerset.x-k8s.io/v1``
``LeaderWorkerSet`` (kubernetes-sigs/lws ``config/crd/bases/``): the fields npu-job renders with
the CRD's constraints on them (``leaderWorkerTemplate`` and its ``workerTemplate`` required,
``replicas`` 0..1000000, the enums of ``restartPolicy`` and ``subdomainPolicy``, which
``networkConfig`` requires), closed wherever the CRD lists properties. The pod template is also
checked strictly as a Pod by kubernetes-validate, as the other render tests check theirs.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from npu_job.kinds import KINDS

from npu_job.errors import SpecError

from .conftest import (
    EXAMPLES,
    example,
    refused_given,
    render_values,
    validate_as_pod,
    with_keys,
)
from .strict_schema import OBJECT_META, POD_TEMPLATE, assert_strict, integer, obj, string

KIND = KINDS["leaderworkerset"]
SET_KIND = "kind=leaderworkerset"

LEADER_WORKER_SET = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("leaderworkerset.x-k8s.io/v1",)),
    kind=string(enum=("LeaderWorkerSet",)),
    metadata=OBJECT_META,
    spec=obj(
        required=("leaderWorkerTemplate",),
        replicas=integer(minimum=0, maximum=1000000),
        startupPolicy=string(enum=("LeaderCreated", "LeaderReady")),
        networkConfig=obj(
            required=("subdomainPolicy",),
            subdomainPolicy=string(enum=("Shared", "UniquePerReplica")),
        ),
        leaderWorkerTemplate=obj(
            required=("workerTemplate",),
            size=integer(),
            restartPolicy=string(
                enum=("Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None")
            ),
            leaderTemplate=POD_TEMPLATE,
            workerTemplate=POD_TEMPLATE,
        ),
    ),
)


def leader_worker_set(values, *sets):
    docs = list(yaml.safe_load_all(render_values(values, SET_KIND, *sets).stream()))
    assert docs[0]["kind"] == "ConfigMap"
    last = docs[-1]
    assert (last["apiVersion"], last["kind"]) == (KIND.api_version, KIND.kind), "the job last"
    return last, docs


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_renders_a_leaderworkerset_its_crd_keeps_whole(name):
    values = example(name)
    nulls = [
        f"{key}=null" for key in refused_given(values, KIND)
    ]  # the keys back to their defaults
    lws, docs = leader_worker_set(values, *nulls)
    assert_strict(lws, LEADER_WORKER_SET, name)
    version = kubernetes_validate.latest_version()
    for document in docs[:-1]:
        kubernetes_validate.validate(document, version, strict=True)
    validate_as_pod(lws["spec"]["leaderWorkerTemplate"]["workerTemplate"], version)


@pytest.mark.parametrize("name", [name for name in EXAMPLES if refused_given(example(name), KIND)])
def test_an_example_that_gives_a_key_the_set_cannot_honour_is_refused_naming_it(name):
    values = example(name)
    with pytest.raises(SpecError) as raised:
        render_values(values, SET_KIND)
    message = str(raised.value)
    assert (
        all(key in message for key in refused_given(values, KIND)) and "leaderworkerset" in message
    )


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(with_keys(nodes=1), id="the-leader-alone"),
        pytest.param(with_keys(nodes=6, anti_affinity=True), id="npu-six"),
        pytest.param(with_keys(device="gpu", nodes=3, routing=True), id="gpu-routed-by-the-api"),
        pytest.param(with_keys(device="cpu", nodes=2, labels={"team": "x"}), id="cpu-labelled"),
    ],
)
def test_one_group_of_one_pod_per_node_that_restarts_together(values):
    lws, _ = leader_worker_set(values)
    spec = lws["spec"]
    nodes = values.get("nodes", 1)
    assert spec["replicas"] == 1 and spec["leaderWorkerTemplate"]["size"] == nodes
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["networkConfig"] == {"subdomainPolicy": "Shared"}
    assert "leaderTemplate" not in spec["leaderWorkerTemplate"], "the leader is a worker too"
    pod_spec = spec["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert pod_spec["restartPolicy"] == "Always"
    pods = KIND.controller_pods(lws, "config.yaml")
    assert [pod.index for pod in pods] == list(range(nodes))
    name = lws["metadata"]["name"]
    assert [pod.dns_names[0] for pod in pods] == [
        KIND.dns_name(name, "0", index) for index in range(nodes)
    ]


@pytest.mark.parametrize(
    "assignment, key",
    [
        ("task_name=trainer", "task_name"),
        ("queue=research", "queue"),
        ("max_retry=5", "max_retry"),
        ("network_topology.mode=hard", "network_topology.mode"),
    ],
)
def test_a_given_key_the_set_cannot_honour_is_refused_naming_the_key_and_the_kind(assignment, key):
    with pytest.raises(SpecError) as raised:
        render_values(with_keys(nodes=2), SET_KIND, assignment)
    message = str(raised.value)
    assert key in message and "leaderworkerset" in message
    assert dict(KIND.refused_keys)[key.split(".")[0]] in message


@pytest.mark.parametrize("name", ["LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"])
def test_a_variable_the_webhook_overwrites_cannot_be_set_in_env(name):
    with pytest.raises(SpecError) as raised:
        render_values(with_keys(nodes=2, env={name: "x"}), SET_KIND)
    assert f"env.{name}" in str(raised.value)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("x" * 51, "worker StatefulSet"),  # its pods' controller-revision-hash label
        ("7b-train", "start with a letter"),  # the controller's Service <name>
    ],
)
def test_a_name_the_controllers_objects_cannot_carry_is_refused_naming_the_kind(name, expected):
    with pytest.raises(SpecError) as raised:
        render_values(with_keys(name=name, nodes=2), SET_KIND)
    message = str(raised.value)
    assert "name" in message and "leaderworkerset" in message and expected in message
    leader_worker_set(with_keys(name="x" * 50, nodes=2))  # the longest it takes


def test_restart_pod_leaves_a_failed_pod_to_its_statefulset():
    lws, _ = leader_worker_set(with_keys(nodes=3), "restart=pod")
    assert_strict(lws, LEADER_WORKER_SET)
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "None"
    assert lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["restartPolicy"] == (
        "Always"
    )
