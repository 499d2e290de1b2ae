"""``kind: indexedjob`` renders a headless Service and a ``batch/v1`` Indexed Job that Kubernetes
takes as they are, and refuses the keys a batch Job has no field for.

The Job and the Service are Kubernetes' own types: kubernetes-validate checks them strictly
against the API's schema (unknown fields fail), as the other render tests check the objects they
render. On top of that a minimal schema written by hand from the ``batch/v1`` Job API pins what
npu-job renders of them (``completionMode: Indexed`` with ``completions``, which the API server
then requires, a headless Service that publishes not-ready pods), and the Service is shown to
select every pod the Job controller makes (``npu_job.kinds.indexedjob``).
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from npu_job.kinds import KINDS

from npu_job.errors import SpecError

from .conftest import EXAMPLES, example, refused_given, render_values, with_keys
from .strict_schema import (
    OBJECT_META,
    POD_TEMPLATE,
    assert_strict,
    boolean,
    integer,
    obj,
    string,
    string_map,
)

KIND = KINDS["indexedjob"]
SET_KIND = "kind=indexedjob"

INDEXED_JOB = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("batch/v1",)),
    kind=string(enum=("Job",)),
    metadata=OBJECT_META,
    spec=obj(
        required=("completionMode", "completions", "template"),
        completionMode=string(enum=("Indexed",)),
        completions=integer(minimum=1),
        parallelism=integer(minimum=1),
        backoffLimit=integer(minimum=0),
        template=POD_TEMPLATE,
    ),
)
HEADLESS_SERVICE = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("v1",)),
    kind=string(enum=("Service",)),
    metadata=OBJECT_META,
    spec=obj(
        required=("clusterIP", "publishNotReadyAddresses", "selector"),
        clusterIP=string(enum=("None",)),
        publishNotReadyAddresses={"const": True, **boolean()},
        selector=string_map(),
    ),
)


def documents(rendered):
    return list(yaml.safe_load_all(rendered.stream()))


def service_and_job(values, *sets):
    docs = documents(render_values(values, SET_KIND, *sets))
    kinds = [(doc["apiVersion"], doc["kind"]) for doc in docs]
    assert kinds[0] == ("v1", "ConfigMap")
    # the stream: ConfigMap, any RBAC, then the Service, then the Job that needs them
    assert kinds[-2:] == [("v1", "Service"), ("batch/v1", "Job")], kinds
    return docs[-2], docs[-1], docs


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_renders_objects_kubernetes_takes_strictly(name):
    values = example(name)
    nulls = [
        f"{key}=null" for key in refused_given(values, KIND)
    ]  # the keys back to their defaults
    service, job, docs = service_and_job(values, *nulls)
    version = kubernetes_validate.latest_version()
    for document in docs:
        kubernetes_validate.validate(document, version, strict=True)
    assert_strict(job, INDEXED_JOB, f"{name}'s Job")
    assert_strict(service, HEADLESS_SERVICE, f"{name}'s Service")


@pytest.mark.parametrize("name", [name for name in EXAMPLES if refused_given(example(name), KIND)])
def test_an_example_that_gives_a_key_the_job_cannot_honour_is_refused_naming_it(name):
    values = example(name)
    with pytest.raises(SpecError) as raised:
        render_values(values, SET_KIND)
    message = str(raised.value)
    for key in refused_given(values, KIND):
        assert key in message
    assert "indexedjob" in message


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(with_keys(nodes=1), id="one-node"),
        pytest.param(with_keys(nodes=6, max_retry=0, anti_affinity=True), id="npu-six"),
        pytest.param(
            with_keys(device="gpu", nodes=3, routing=True, host_network=True, priority_class="p"),
            id="gpu-routed-by-the-api",
        ),
        pytest.param(with_keys(device="cpu", nodes=2, labels={"team": "x"}), id="cpu-labelled"),
    ],
)
def test_the_job_runs_one_pod_per_node_that_resolves_under_the_service(values):
    service, job, _ = service_and_job(values)
    spec = job["spec"]
    nodes = values.get("nodes", 1)
    assert spec["completions"] == spec["parallelism"] == nodes
    assert spec["backoffLimit"] == values.get("max_retry", 3)
    pod_spec = spec["template"]["spec"]
    assert pod_spec["restartPolicy"] == KIND.restart_policy
    assert pod_spec["subdomain"] == service["metadata"]["name"] == job["metadata"]["name"]
    assert service["metadata"]["namespace"] == job["metadata"]["namespace"]
    # npu-job's and the spec's labels, not the job's scheduler labels (CCE's ring-controller...)
    managed = {"app.kubernetes.io/managed-by": "npu-job", **values.get("labels", {})}
    assert service["metadata"]["labels"] == managed
    selector = service["spec"]["selector"]
    pods = KIND.controller_pods(job, "config.yaml")
    assert len(pods) == nodes
    for pod in pods:
        assert selector.items() <= dict(pod.labels).items(), "the Service selects every pod"
        assert KIND.dns_name(job["metadata"]["name"], "", pod.index) in pod.dns_names


@pytest.mark.parametrize(
    "assignment, key",
    [
        ("task_name=trainer", "task_name"),
        ("queue=research", "queue"),
        ("network_topology.mode=hard", "network_topology.mode"),
    ],
)
def test_a_given_key_the_job_cannot_honour_is_refused_naming_the_key_and_the_kind(assignment, key):
    with pytest.raises(SpecError) as raised:
        render_values(with_keys(nodes=2), SET_KIND, assignment)
    message = str(raised.value)
    assert key in message and "indexedjob" in message
    assert dict(KIND.refused_keys)[key.split(".")[0]] in message


def test_refused_keys_left_at_their_defaults_are_no_problem():
    _, job, _ = service_and_job(with_keys(nodes=2))
    assert job["spec"]["completionMode"] == "Indexed"


def test_a_name_a_service_cannot_have_is_refused_naming_the_kind():
    # the Service is named after the job, and a Service's name must start with a letter
    with pytest.raises(SpecError) as raised:
        render_values(with_keys(name="7b-train", nodes=2), SET_KIND)
    message = str(raised.value)
    assert "name" in message and "indexedjob" in message and "start with a letter" in message
    render_values(with_keys(name="7b-train", nodes=2))  # the Volcano Job's own rules differ


def test_restart_job_is_refused_a_job_replaces_failed_pods_alone():
    with pytest.raises(SpecError) as error:
        service_and_job(with_keys(nodes=3), "restart=job")
    (problem,) = error.value.problems
    assert problem.startswith("restart") and "(kind indexedjob) cannot honour 'job'" in problem
