"""The JobSet's record says what the JobSet controller, its webhook and the Job controller do.

Each expectation is a fact of kubernetes-sigs/jobset (``constructJob``,
``labelAndAnnotateObject``, ``GetSubdomain``, the webhook's defaults; cited in
``kinds/jobset.py``) and of the Indexed Job its replicated job becomes: pods
``<jobset>-<rj>-0-<k>-<random>`` with hostnames ``<jobset>-<rj>-0-<k>`` under the JobSet's
headless Service, the JobSet's labels and annotations beside the Job's, the completion index as
label, annotation and ``JOB_COMPLETION_INDEX``. No cluster runs here, so the JobSet objects are
written by hand in the shape npu-job renders.
"""

from __future__ import annotations

import hashlib
import re

import pytest
from npu_job.kinds import KINDS
from npu_job.kinds.indexedjob import COMPLETION_INDEX_ENV, COMPLETION_INDEX_KEY
from npu_job.kinds.jobset import (
    JOB_KEY_LABEL,
    JOBSET_NAME_LABEL,
    REPLICATED_JOB_LABEL,
    RESTART_ATTEMPT_LABEL,
)

from npu_job.errors import InputError

KIND = KINDS["jobset"]
RANDOM = "[bcdfghjklmnpqrstvwxz2456789]{5}"


def jobset_object(nodes=4, name="llama", rj="worker", namespace="team", network=None, **pod):
    container = {"name": "train", "image": "i", "env": pod.pop("env", [])}
    spec = {
        "failurePolicy": {"maxRestarts": 3},
        "replicatedJobs": [
            {
                "name": rj,
                "replicas": 1,
                "template": {
                    "spec": {
                        "completionMode": "Indexed",
                        "completions": nodes,
                        "parallelism": nodes,
                        "template": {
                            "metadata": {
                                "labels": pod.pop("labels", {"app": "x"}),
                                "annotations": pod.pop("annotations", {"note": "n"}),
                            },
                            "spec": {"containers": [container], **pod},
                        },
                    }
                },
            }
        ],
    }
    if network is not None:
        spec["network"] = network
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def rjob_spec(jobset):
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]


def test_the_record_names_the_jobset_its_pods_and_their_index():
    assert (KIND.api_version, KIND.kind) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert KIND.index_env == "JOB_COMPLETION_INDEX"
    assert KIND.index_label == "batch.kubernetes.io/job-completion-index"
    assert KIND.restart_policy == "OnFailure"  # the JobSet webhook's default
    assert KIND.selector("llama", "worker") == (
        "jobset.sigs.k8s.io/jobset-name=llama,jobset.sigs.k8s.io/replicatedjob-name=worker"
    )


def test_one_job_of_indexed_pods_named_and_hosted_after_the_jobset_and_its_replicated_job():
    pods = KIND.controller_pods(jobset_object(4), "job.yaml")
    assert [pod.index for pod in pods] == [0, 1, 2, 3]
    for pod in pods:
        assert re.fullmatch(f"llama-worker-0-{pod.index}-{RANDOM}", pod.name), pod.name
        assert (pod.hostname, pod.subdomain) == (f"llama-worker-0-{pod.index}", "llama")
        assert pod.where == "spec.replicatedJobs[0].template.spec.template"
        assert dict(pod.labels)["batch.kubernetes.io/job-name"] == "llama-worker-0"
    assert len({pod.name for pod in pods}) == 4


def test_each_pod_resolves_under_the_jobsets_headless_service_as_the_record_says():
    for pod in KIND.controller_pods(jobset_object(3), "job.yaml"):
        name = KIND.dns_name("llama", "worker", pod.index)
        assert name == f"llama-worker-0-{pod.index}.llama"
        assert pod.dns_names == (name, f"{name}.team", f"{name}.team.svc")


def test_the_jobset_labels_and_annotates_every_pod_with_the_same_keys_and_values():
    pods = KIND.controller_pods(jobset_object(2), "job.yaml")
    uids = set()
    for pod in pods:
        labels, annotations = dict(pod.labels), dict(pod.annotations)
        jobset_keys = {key for key in labels if key.startswith("jobset.sigs.k8s.io/")}
        assert jobset_keys == {key for key in annotations if key.startswith("jobset.sigs.k8s.io/")}
        assert len(jobset_keys) == 12
        assert all(labels[key] == annotations[key] for key in jobset_keys)
        assert labels[JOBSET_NAME_LABEL] == "llama"
        assert labels[REPLICATED_JOB_LABEL] == "worker"
        assert labels[RESTART_ATTEMPT_LABEL] == "0"  # a new JobSet has restarted no times
        assert labels["jobset.sigs.k8s.io/group-name"] == "default"
        assert labels[JOB_KEY_LABEL] == hashlib.sha1(b"team/llama-worker-0").hexdigest()
        uids.add(labels["jobset.sigs.k8s.io/jobset-uid"])
        # the Job controller's index, three ways
        assert labels[COMPLETION_INDEX_KEY] == annotations[COMPLETION_INDEX_KEY] == str(pod.index)
        assert dict(pod.env) == {COMPLETION_INDEX_ENV: str(pod.index)}
        # the template's own
        assert (labels["app"], annotations["note"]) == ("x", "n")
        assert KIND.selects(labels, "llama", "worker")
        assert not KIND.selects(labels, "llama", "launcher")
        assert KIND.pod_index(labels, pod.name) == pod.index
    assert len(uids) == 1


def test_the_jobsets_labels_win_over_the_templates_own():
    pods = KIND.controller_pods(jobset_object(1, labels={JOBSET_NAME_LABEL: "mine"}), "job.yaml")
    assert dict(pods[0].labels)[JOBSET_NAME_LABEL] == "llama"


@pytest.mark.parametrize(
    "network, subdomain",
    [
        (None, "llama"),  # the webhook turns DNS hostnames on
        ({"enableDNSHostnames": True, "subdomain": "ring"}, "ring"),
        ({"enableDNSHostnames": False}, ""),
    ],
    ids=["default", "own-subdomain", "off"],
)
def test_the_pods_subdomain_is_the_networks(network, subdomain):
    pods = KIND.controller_pods(jobset_object(2, network=network), "job.yaml")
    assert {pod.subdomain for pod in pods} == {subdomain}
    if not subdomain:
        assert all(pod.dns_names == () for pod in pods)


def test_the_webhooks_defaults_apply_to_what_the_template_leaves_out():
    jobset = jobset_object(2)
    del rjob_spec(jobset)["completionMode"]
    pods = KIND.controller_pods(jobset, "job.yaml")
    assert [pod.index for pod in pods] == [0, 1]
    assert pods[0].template["spec"]["restartPolicy"] == "OnFailure"
    assert "restartPolicy" not in rjob_spec(jobset)["template"]["spec"]  # the input is kept


def test_only_parallelism_pods_start_at_once():
    jobset = jobset_object(4)
    rjob_spec(jobset)["parallelism"] = 2
    assert [pod.index for pod in KIND.controller_pods(jobset, "job.yaml")] == [0, 1]


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda js: js["spec"]["replicatedJobs"].append({"name": "b"}), "spec.replicatedJobs"),
        (lambda js: js["spec"]["replicatedJobs"][0].update(replicas=2), "replicas"),
        (lambda js: rjob_spec(js).update(completionMode="NonIndexed"), "completionMode"),
        (lambda js: rjob_spec(js).pop("completions"), "completions"),
        (lambda js: rjob_spec(js).update(template=None), "template.spec.template"),
        (lambda js: js.pop("spec"), "spec"),
    ],
    ids=[
        "two-replicated-jobs",
        "two-replicas",
        "not-indexed",
        "no-completions",
        "no-pods",
        "no-spec",
    ],
)
def test_a_jobset_npu_job_would_not_render_is_refused_naming_the_field(change, field):
    jobset = jobset_object(2)
    change(jobset)
    with pytest.raises(InputError) as caught:
        KIND.controller_pods(jobset, "job.yaml")
    assert caught.value.field.endswith(field), caught.value


@pytest.mark.parametrize(
    "name, index",
    [("llama-worker-0-3-x7kqp", 3), ("llama-worker-0-12-24567", 12), ("a-0-1-0-bcdfg", 0)],
)
def test_a_listed_pods_index_comes_from_its_name_where_the_label_is_missing(name, index):
    # clusters before 1.28 (PodIndexLabel off) annotate the completion index but do not label it
    assert KIND.pod_index({JOBSET_NAME_LABEL: "llama"}, name) == index


def test_pods_left_over_from_an_earlier_attempt_are_not_the_jobs():
    pods = [
        {RESTART_ATTEMPT_LABEL: "1"},
        {RESTART_ATTEMPT_LABEL: "0"},
        {},
        {RESTART_ATTEMPT_LABEL: "2"},
    ]
    assert KIND.of_latest_attempt(pods) == (False, False, True, True)
    assert KIND.of_latest_attempt(pods[:2]) == (True, False)
    assert KIND.of_latest_attempt([{RESTART_ATTEMPT_LABEL: "x"}, {}]) == (True, True)


def test_a_kind_that_counts_no_attempts_keeps_every_pod():
    pods = [{RESTART_ATTEMPT_LABEL: "1"}, {RESTART_ATTEMPT_LABEL: "0"}]
    assert KINDS["volcano"].of_latest_attempt(pods) == (True, True)


def test_the_longest_name_the_record_says_is_as_long_as_the_last_pods_name():
    for nodes in (1, 10, 128):
        last = KIND.controller_pods(jobset_object(nodes), "job.yaml")[-1]
        assert len(last.name) == len(KIND.longest_name("llama", "worker", nodes)[0])
