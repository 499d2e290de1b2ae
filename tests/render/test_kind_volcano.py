"""The Volcano Job as rendered holds only fields the Volcano Job CRD lists, of the CRD's types.

The schema below is a minimal one written by hand from the CRD of ``batch.volcano.sh/v1alpha1``
``Job`` (volcano-sh/volcano's ``config/crd/volcano/bases/batch.volcano.sh_jobs.yaml``): the
fields npu-job renders with the CRD's constraints on them, closed wherever the CRD lists
properties (``strict_schema.closed``), so a field the API server would prune fails here. A
policy's ``action`` is any string to the CRD; the schema takes the actions Volcano's admission
webhook lets users give (``pkg/webhooks/admission/jobs/validate/util.go`` ``policyActionMap``
at ed72c7c8).
"""

from __future__ import annotations

import pytest
import yaml
from npu_job.kinds import KINDS

from .conftest import EXAMPLES, example, render_values, with_keys
from .strict_schema import (
    OBJECT_META,
    POD_TEMPLATE,
    array,
    assert_strict,
    integer,
    obj,
    problems,
    string,
    strings,
)

VOLCANO = KINDS["volcano"]

_DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_POLICY_EVENTS = (
    "*",
    "PodPending",
    "PodRunning",
    "PodFailed",
    "PodEvicted",
    "Unknown",
    "TaskCompleted",
    "OutOfSync",
    "CommandIssued",
    "JobUpdated",
    "TaskFailed",
)
_POLICY_ACTIONS = (
    "AbortJob",
    "RestartJob",
    "RestartTask",
    "RestartPod",
    "RestartPartition",
    "TerminateJob",
    "CompleteJob",
    "ResumeJob",
)
_POLICY = obj(
    event=string(enum=_POLICY_EVENTS),
    events=array(string(enum=_POLICY_EVENTS)),
    action=string(enum=_POLICY_ACTIONS),
    exitCode=integer(),
    timeout=string(),
)
VOLCANO_JOB = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("batch.volcano.sh/v1alpha1",)),
    kind=string(enum=("Job",)),
    metadata=OBJECT_META,
    spec=obj(
        schedulerName=string(max_length=63),
        minAvailable=integer(minimum=0),
        maxRetry=integer(minimum=0),
        queue=string(pattern=_DNS_SUBDOMAIN, max_length=253),
        priorityClassName=string(pattern=_DNS_SUBDOMAIN, max_length=253),
        networkTopology=obj(
            mode=string(enum=("hard", "soft")),
            highestTierAllowed=integer(minimum=0),
            highestTierName=string(max_length=253),
        ),
        policies=array(_POLICY),
        plugins={"type": "object", "additionalProperties": strings()},
        tasks=array(
            obj(
                name=string(pattern=_DNS_LABEL, max_length=63),
                replicas=integer(minimum=0),
                minAvailable=integer(minimum=0),
                maxRetry=integer(minimum=0),
                policies=array(_POLICY),
                template=POD_TEMPLATE,
            ),
            min_items=1,
        ),
    ),
)


def job_object(rendered):
    """The rendered stream's Volcano Job (found by the record's apiVersion and kind)."""
    jobs = [
        doc
        for doc in yaml.safe_load_all(rendered.stream())
        if (doc["apiVersion"], doc["kind"]) == (VOLCANO.api_version, VOLCANO.kind)
    ]
    assert len(jobs) == 1
    return jobs[0]


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_examples_volcano_job_holds_only_what_the_crd_lists(name):
    assert_strict(job_object(render_values(example(name))), VOLCANO_JOB, name)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(
            with_keys(
                nodes=4,
                priority_class="high",
                service_account="trainer",
                image_pull_secrets=["pull"],
                annotations={"a": "b"},
                labels={"team": "x"},
                hccl={"reserve_ports": True},
                network_topology={"mode": "soft"},
                resources={"cpu": 8, "memory": "64Gi"},
                env={"A": "1"},
                restart="pod",
            ),
            id="npu-every-optional-piece",
        ),
        pytest.param(
            with_keys(device="gpu", nodes=3, routing=True, host_network=True, shm_size=None),
            id="gpu-host-network-routed-by-the-api",
        ),
        pytest.param(
            with_keys(device="cpu", nodes=2, bootstrap={"url": "https://example.com/b.pyz"}),
            id="cpu-fetched-bundle",
        ),
    ],
)
def test_every_optional_piece_of_the_job_is_a_field_the_crd_lists(values):
    assert_strict(job_object(render_values(values)), VOLCANO_JOB)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("spec", "tasks", 0, "template", "spec", "containers", 0, "envs"), [], "envs"),
        (("spec", "networkTopology", "tier"), 2, "tier"),
        (("spec", "minAvailable"), "3", "'3' is not of type 'integer'"),
        (("spec", "policies", 0, "event"), "PodGone", "'PodGone' is not one of"),
        (("spec", "tasks", 0, "template", "spec", "restartPolicy"), 1, "is not of type 'string'"),
    ],
    ids=["unknown-container-field", "unknown-topology-field", "type", "enum", "pod-field-type"],
)
def test_a_job_object_the_crd_would_not_keep_fails_naming_the_field(path, value, expected):
    job = job_object(render_values(with_keys(nodes=3, network_topology={"mode": "hard"})))
    node = job
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    found = problems(job, VOLCANO_JOB)
    assert len(found) == 1 and expected in found[0], found
    assert found[0].startswith(".".join(str(part) for part in path[:-1]))
    with pytest.raises(AssertionError, match="breaks its schema"):
        assert_strict(job, VOLCANO_JOB)


def policies(*sets):
    return job_object(render_values(with_keys(nodes=4), *sets))["spec"]["policies"]


def test_restart_job_the_default_restarts_every_pod_when_one_is_evicted():
    assert (
        policies() == policies("restart=job") == [{"event": "PodEvicted", "action": "RestartJob"}]
    )


def test_restart_pod_replaces_the_evicted_or_failed_pod_alone():
    rendered = policies("restart=pod")
    assert rendered == [
        {"event": "PodEvicted", "action": "RestartPod"},
        {"event": "PodFailed", "action": "RestartPod"},
    ]
    # the webhook refuses one event in two policies (validatePolicies)
    assert len({policy["event"] for policy in rendered}) == len(rendered)
