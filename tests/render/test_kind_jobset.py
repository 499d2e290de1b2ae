"""The JobSet as rendered holds only fields the JobSet CRD lists, of the CRD's types, in the
layout the kind's record reads: one replicated job of one Indexed Job of ``nodes`` pods.

The schema below is a minimal one written by hand from the CRD of ``jobset.x-k8s.io/v1alpha2``
``JobSet`` (kubernetes-sigs/jobset ``config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml``
at 08dfbdfd): the fields npu-job renders with the CRD's constraints on them, closed wherever the
CRD lists properties (``strict_schema.closed``), so a field the API server would prune fails here.
"""

from __future__ import annotations

import pytest
from npu_job.kinds import KINDS

from npu_job.errors import SpecError

from .conftest import (
    EXAMPLES,
    as_kind,
    example,
    kind_object,
    refused_given,
    render_values,
    spec_from,
    with_keys,
)
from .strict_schema import (
    OBJECT_META,
    POD_TEMPLATE,
    array,
    assert_strict,
    boolean,
    integer,
    obj,
    problems,
    string,
)

JOBSET = KINDS["jobset"]

INT32 = {"minimum": -(2**31), "maximum": 2**31 - 1}

#: a JobSet's spec; also the TrainingRuntime's JobSet template (test_kind_trainjob.py)
JOBSET_SPEC = obj(
    network=obj(
        enableDNSHostnames=boolean(), publishNotReadyAddresses=boolean(), subdomain=string()
    ),
    failurePolicy=obj(
        maxRestarts=integer(**INT32),
        restartStrategy=string(enum=("Recreate", "BlockingRecreate", "InPlaceRestart")),
    ),
    replicatedJobs=array(
        obj(
            required=("name", "template"),
            name=string(),
            groupName=string(),
            replicas=integer(minimum=0, maximum=INT32["maximum"]),
            template=obj(
                metadata=OBJECT_META,
                spec=obj(
                    required=("template",),
                    completionMode=string(),
                    completions=integer(**INT32),
                    parallelism=integer(**INT32),
                    backoffLimit=integer(**INT32),
                    template=POD_TEMPLATE,
                ),
            ),
        )
    ),
)
JOBSET_SCHEMA = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("jobset.x-k8s.io/v1alpha2",)),
    kind=string(enum=("JobSet",)),
    metadata=OBJECT_META,
    spec=JOBSET_SPEC,
)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_examples_jobset_holds_only_what_the_crd_lists(name):
    assert_strict(kind_object(as_kind(name, "jobset")), JOBSET_SCHEMA, name)


@pytest.mark.parametrize(
    "name", [name for name in EXAMPLES if refused_given(example(name), JOBSET)]
)
def test_an_example_with_a_key_the_jobset_cannot_honour_is_refused_naming_key_and_kind(name):
    with pytest.raises(SpecError) as error:
        spec_from(example(name), "kind=jobset")
    for key in refused_given(example(name), JOBSET):
        assert any(
            problem.startswith(key) and "(kind jobset) cannot honour it" in problem
            for problem in error.value.problems
        ), (key, error.value.problems)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_examples_jobset_is_one_indexed_job_of_all_its_pods_at_once(name):
    rendered = as_kind(name, "jobset")
    spec = rendered.spec
    jobset = kind_object(rendered)
    assert jobset["spec"]["network"] == {
        "enableDNSHostnames": True,
        "publishNotReadyAddresses": True,
    }
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": spec.max_retry}
    (rjob,) = jobset["spec"]["replicatedJobs"]
    assert (rjob["name"], rjob["replicas"]) == (spec.task_name, 1)
    job_spec = rjob["template"]["spec"]
    assert (job_spec["completionMode"], job_spec["completions"], job_spec["parallelism"]) == (
        "Indexed",
        spec.nodes,
        spec.nodes,
    )
    pod = job_spec["template"]["spec"]
    assert pod["restartPolicy"] == JOBSET.restart_policy
    assert [container["name"] for container in pod["containers"]] == [JOBSET.container_name]
    # the record reads what the template rendered: one pod per node, each named as it says
    pods = JOBSET.controller_pods(jobset, name)
    assert [p.index for p in pods] == list(range(spec.nodes))
    assert [p.dns_names[0] for p in pods] == [
        JOBSET.dns_name(spec.name, spec.task_name, index) for index in range(spec.nodes)
    ]


#: specs that render every optional piece of the pod template and the job object a kind of the
#: JobSet family (jobset, trainjob) honours, by name (with_keys(kind=..., **PIECES[name]))
OPTIONAL_PIECES = {
    "npu-every-optional-piece": dict(
        nodes=4,
        priority_class="high",
        service_account="trainer",
        image_pull_secrets=["pull"],
        annotations={"a": "b"},
        labels={"team": "x"},
        hccl={"reserve_ports": True},
        resources={"cpu": 8, "memory": "64Gi"},
        env={"A": "1"},
        max_retry=0,
        restart="job",
    ),
    "gpu-host-network-routed-by-the-api": dict(
        device="gpu", nodes=3, routing=True, host_network=True, shm_size=None
    ),
    "cpu-fetched-bundle": dict(device="cpu", nodes=2, bootstrap={"url": "https://e.com/b"}),
}


@pytest.mark.parametrize("piece", sorted(OPTIONAL_PIECES))
def test_every_optional_piece_of_the_jobset_is_a_field_the_crd_lists(piece):
    values = with_keys(kind="jobset", **OPTIONAL_PIECES[piece])
    assert_strict(kind_object(render_values(values)), JOBSET_SCHEMA)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("spec", "network", "hostnames"), True, "hostnames"),
        (("spec", "replicatedJobs", 0, "template", "spec", "indexed"), True, "indexed"),
        (("spec", "failurePolicy", "maxRestarts"), "3", "'3' is not of type 'integer'"),
        (("spec", "failurePolicy", "restartStrategy"), "Now", "'Now' is not one of"),
    ],
    ids=["unknown-network-field", "unknown-job-field", "type", "enum"],
)
def test_a_jobset_the_crd_would_not_keep_fails_naming_the_field(path, value, expected):
    jobset = kind_object(render_values(with_keys(kind="jobset", nodes=3)))
    node = jobset
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    found = problems(jobset, JOBSET_SCHEMA)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    "key, value",
    [("queue", "research"), ("network_topology", {"mode": "hard"})],
)
def test_a_key_the_jobset_cannot_honour_is_refused_naming_key_and_kind(key, value):
    with pytest.raises(SpecError) as error:
        spec_from(with_keys(kind="jobset", **{key: value}))
    (problem,) = error.value.problems
    assert problem.startswith(key) and "(kind jobset) cannot honour it" in problem, problem
    spec_from(with_keys(kind="volcano", **{key: value}))  # the Volcano Job honours it


def test_a_name_too_long_for_the_jobsets_pod_names_is_refused_as_its_webhook_would():
    # 'a' * 50: the Volcano Job's hostnames a...-worker-7 fit; the JobSet's pod names
    # a...-worker-0-7-<5 random characters> do not, and its webhook refuses the JobSet
    values = with_keys(name="a" * 50, nodes=8)
    spec_from(values)
    with pytest.raises(SpecError) as error:
        spec_from(values, "kind=jobset")
    assert error.value.problems == (
        f"name (from job.yaml): too long for the pod names: '{'a' * 50}-worker-0-7-abcde' has 67 "
        "characters; a pod's name '<name>-<task_name>-0-<index>-<5 random characters>' must "
        "have at most 63",
    )
    longest = JOBSET.longest_name("a" * 46, "worker", 8)[0]
    assert len(longest) == 63
    spec_from(with_keys(name="a" * 46, nodes=8), "kind=jobset")


def test_a_name_that_begins_with_a_digit_is_refused_as_the_jobsets_webhook_would():
    spec_from(with_keys(name="7b-train"))  # a DNS-1123 label: the Volcano Job takes it
    with pytest.raises(SpecError) as error:
        spec_from(with_keys(name="7b-train"), "kind=jobset")
    (problem,) = error.value.problems
    assert problem.startswith("name (from job.yaml): the JobSet (kind jobset) cannot take it: ")
    assert "a Service's name must start with a letter" in problem


def test_restart_pod_the_default_leaves_failed_pods_to_the_job_controller():
    (rjob,) = kind_object(render_values(with_keys(kind="jobset", nodes=3)))["spec"][
        "replicatedJobs"
    ]
    assert "backoffLimit" not in rjob["template"]["spec"]  # Kubernetes' 6, then the JobSet's


def test_restart_job_fails_the_job_at_its_first_failure_so_the_jobset_recreates_every_pod():
    jobset = kind_object(render_values(with_keys(kind="jobset", nodes=3, restart="job")))
    (rjob,) = jobset["spec"]["replicatedJobs"]
    assert rjob["template"]["spec"]["backoffLimit"] == 0
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 3}  # Recreate, max_retry times
