"""The Indexed Job's record says what Kubernetes' Job controller and API server do to its pods.

Each expectation is a documented fact of ``batch/v1`` Job with ``completionMode: Indexed``
(kubernetes/kubernetes ``pkg/controller/job/job_controller.go``, ``indexed_job_utils.go``,
``pkg/registry/batch/job/strategy.go``; cited in ``kinds/indexedjob.py``): pod names
``<job>-<i>-<random>``, hostnames ``<job>-<i>``, the index as annotation, label and
``JOB_COMPLETION_INDEX``, the API server's selector labels. No cluster runs here, so the job
objects are written by hand in the shape npu-job renders.
"""

from __future__ import annotations

import re

import pytest
from npu_job.kinds import KINDS
from npu_job.kinds.indexedjob import (
    COMPLETION_INDEX_ENV,
    COMPLETION_INDEX_KEY,
    JOB_NAME_LABEL,
    generate_name,
)

from npu_job.errors import InputError

from .shell import master_address

KIND = KINDS["indexedjob"]
RANDOM = "[bcdfghjklmnpqrstvwxz2456789]{5}"


def job_object(completions=4, parallelism=None, name="train", namespace="team", **pod_spec):
    container = {"name": "train", "image": "i", "env": pod_spec.pop("env", [])}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions if parallelism is None else parallelism,
            "template": {
                "metadata": {"labels": pod_spec.pop("labels", {"app": "x"})},
                "spec": {"subdomain": name, "containers": [container], **pod_spec},
            },
        },
    }


def test_the_record_names_the_built_in_job_and_its_index():
    assert (KIND.api_version, KIND.kind) == ("batch/v1", "Job")
    assert KIND.index_env == "JOB_COMPLETION_INDEX"
    assert KIND.index_label == "batch.kubernetes.io/job-completion-index"
    assert KIND.restart_policy in ("Never", "OnFailure")
    assert KIND.selector("train") == "batch.kubernetes.io/job-name=train"


def test_pods_are_named_with_their_index_and_a_random_suffix_and_hosted_by_index():
    pods = KIND.controller_pods(job_object(4), "job.yaml")
    assert [pod.index for pod in pods] == [0, 1, 2, 3]
    for pod in pods:
        assert re.fullmatch(f"train-{pod.index}-{RANDOM}", pod.name), pod.name
        assert (pod.hostname, pod.subdomain) == (f"train-{pod.index}", "train")
        assert pod.where == "spec.template"
    assert len({pod.name for pod in pods}) == 4


def test_every_pod_carries_its_index_three_ways_and_the_api_servers_selector_labels():
    pods = KIND.controller_pods(job_object(3), "job.yaml")
    uids = set()
    for pod in pods:
        labels, annotations = dict(pod.labels), dict(pod.annotations)
        assert labels[COMPLETION_INDEX_KEY] == annotations[COMPLETION_INDEX_KEY] == str(pod.index)
        assert dict(pod.env) == {COMPLETION_INDEX_ENV: str(pod.index)}
        assert labels[JOB_NAME_LABEL] == labels["job-name"] == "train"
        assert labels["batch.kubernetes.io/controller-uid"] == labels["controller-uid"]
        uids.add(labels["controller-uid"])
        assert labels["app"] == "x"  # the template's own
        assert KIND.selects(labels, "train") and not KIND.selects(labels, "other")
        assert KIND.pod_index(labels, pod.name) == pod.index
    assert len(uids) == 1  # one Job, one uid


def test_the_api_server_keeps_a_selector_label_the_template_sets_itself():
    pods = KIND.controller_pods(job_object(1, labels={"job-name": "mine"}), "job.yaml")
    assert dict(pods[0].labels)["job-name"] == "mine"


def test_a_container_that_sets_the_index_variable_itself_keeps_it():
    env = [{"name": COMPLETION_INDEX_ENV, "value": "7"}]
    assert KIND.controller_pods(job_object(2, env=env), "job.yaml")[0].env == ()


def test_only_parallelism_pods_start_at_once_the_lowest_indexes_first():
    pods = KIND.controller_pods(job_object(4, parallelism=2), "job.yaml")
    assert [pod.index for pod in pods] == [0, 1]


def test_each_pod_resolves_under_the_headless_service_as_the_record_says():
    pods = KIND.controller_pods(job_object(3, namespace="team"), "job.yaml")
    for pod in pods:
        name = KIND.dns_name("train", "", pod.index)
        assert name == f"train-{pod.index}.train"
        assert pod.dns_names == (name, f"{name}.team", f"{name}.team.svc")


def test_without_a_subdomain_no_name_resolves():
    job = job_object(2)
    del job["spec"]["template"]["spec"]["subdomain"]
    assert all(pod.dns_names == () for pod in KIND.controller_pods(job, "job.yaml"))


@pytest.mark.parametrize(
    "name, index",
    [
        ("train-3-x7kqp", 3),
        ("train-12-24567", 12),  # a suffix of digits only is still the suffix
        ("my-job-2-0-bcdfg", 0),  # digits in the job name are not the index
    ],
)
def test_a_listed_pods_index_comes_from_its_name_where_the_label_is_missing(name, index):
    # clusters before 1.28 (PodIndexLabel off) annotate the index but do not label it
    assert KIND.pod_index({JOB_NAME_LABEL: "train"}, name) == index


@pytest.mark.parametrize("name", ["train-3", "train-3-abc", "train-3-aeiou", "train-x-bcdfg"])
def test_a_name_without_index_and_random_suffix_gives_no_index(name):
    assert KIND.index_from_name(name) is None


def test_a_long_job_name_is_cut_but_the_index_is_kept():
    job = "j" * 63
    prefix = generate_name(job, 12)
    assert len(prefix) == 58 and prefix.endswith("-12-") and prefix.startswith("j" * 54)
    assert KIND.index_from_name(prefix + "bcdfg") == 12
    pods = KIND.controller_pods(job_object(13, name=job), "job.yaml")
    assert all(len(pod.name) == 63 for pod in pods)
    assert [KIND.index_from_name(pod.name) for pod in pods] == list(range(13))


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda spec: spec.update(completionMode="NonIndexed"), "spec.completionMode"),
        (lambda spec: spec.pop("completions"), "spec.completions"),
        (lambda spec: spec.update(parallelism="2"), "spec.parallelism"),
        (lambda spec: spec.update(template=None), "spec.template"),
    ],
    ids=["not-indexed", "no-completions", "parallelism-text", "no-template"],
)
def test_a_job_object_the_controller_would_not_index_is_refused_naming_the_field(change, field):
    job = job_object(2)
    change(job["spec"])
    with pytest.raises(InputError) as raised:
        KIND.controller_pods(job, "job.yaml")
    assert str(raised.value).startswith(f"job.yaml: {field}: expected")


@pytest.mark.parametrize("master", [0, 1, 11])
def test_train_sh_finds_the_master_where_the_record_says_it_resolves(master):
    out = master_address(KIND, MA_VJ_NAME="train", MA_MASTER_INDEX=str(master))
    assert out == KIND.dns_name("train", "", master)
    assert out in KIND.controller_pods(job_object(12), "job.yaml")[master].dns_names


def test_keys_a_batch_job_has_no_field_for_are_refused_with_a_reason():
    refused = dict(KIND.refused_keys)
    assert {"task_name", "queue", "network_topology"} <= set(refused)
    assert all(reason for reason in refused.values())
    assert "max_retry" not in refused  # it is the Job's backoffLimit
