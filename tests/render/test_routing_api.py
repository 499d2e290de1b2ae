"""render for a job that routes by the Kubernetes API (no rank table): the ServiceAccount and the
least RBAC its pods' bootstrap needs, NPU_JOB_PODS, and the Volcano Job's networkTopology."""

from __future__ import annotations

import kubernetes_validate
import pytest

from npu_job.errors import SpecError

from .conftest import env_of, job_of, parsed, pod_spec, render_values, spec_from, with_keys

ROUTED_CPU = dict(device="cpu", nodes=4, npus_per_node=2, routing=True, anti_affinity=True)


def _by_kind(rendered):
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in parsed(rendered)}


def test_a_routed_job_without_a_rank_table_gets_an_account_and_least_rbac():
    rendered = render_values(with_keys(namespace="team-a", **ROUTED_CPU))
    kinds = [doc.kind for doc in rendered.documents]
    assert kinds == [
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Job",
    ]  # the account before the pods that use it
    documents = _by_kind(rendered)
    account = "demo-routing"
    assert documents["ServiceAccount", account]["metadata"]["namespace"] == "team-a"
    assert documents["Role", account]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    ]
    cluster_role = "npu-job:team-a:demo-routing"  # cluster-scoped: the namespace in the name
    assert documents["ClusterRole", cluster_role]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
        {"apiGroups": ["topology.volcano.sh"], "resources": ["hypernodes"], "verbs": ["list"]},
    ]
    subject = [{"kind": "ServiceAccount", "name": account, "namespace": "team-a"}]
    assert documents["RoleBinding", account]["subjects"] == subject
    assert documents["RoleBinding", account]["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": account,
    }
    assert documents["ClusterRoleBinding", cluster_role]["subjects"] == subject
    assert documents["ClusterRoleBinding", cluster_role]["roleRef"]["name"] == cluster_role
    job = job_of(rendered)
    assert pod_spec(job)["serviceAccountName"] == account
    assert env_of(job)["NPU_JOB_PODS"] == "k8s"
    assert "RANK_TABLE_FILE" not in env_of(job)
    assert rendered.warnings == ()


def test_every_rbac_object_and_the_pod_pass_the_kubernetes_schema():
    rendered = render_values(with_keys(**ROUTED_CPU))
    version = kubernetes_validate.latest_version()
    for document in parsed(rendered):
        if document["kind"] == "Job":
            template = document["spec"]["tasks"][0]["template"]
            document = {
                "apiVersion": "v1",
                "kind": "Pod",
                "spec": template["spec"],
                "metadata": dict(template["metadata"], name="p"),
            }
        kubernetes_validate.validate(document, version, strict=True)


def test_a_given_service_account_gets_no_rbac_but_the_pods_use_it():
    rendered = render_values(with_keys(service_account="routing-reader", **ROUTED_CPU))
    assert [doc.kind for doc in rendered.documents] == ["ConfigMap", "Job"]
    job = job_of(rendered)
    assert pod_spec(job)["serviceAccountName"] == "routing-reader"
    assert env_of(job)["NPU_JOB_PODS"] == "k8s"


def test_a_job_that_brings_a_rank_table_routes_by_it_and_gets_no_rbac():
    rendered = render_values(
        with_keys(env={"RANK_TABLE_FILE": "/rt/jobstart_hccl.json"}, **ROUTED_CPU)
    )
    assert [doc.kind for doc in rendered.documents] == ["ConfigMap", "Job"]
    job = job_of(rendered)
    assert "NPU_JOB_PODS" not in env_of(job) and "serviceAccountName" not in pod_spec(job)


def test_an_npu_job_outside_cce_routes_by_the_api_without_cces_pieces():
    rendered = render_values(with_keys(nodes=4, routing_source="api"))
    job = job_of(rendered)
    assert "configmap1980" not in job["spec"]["plugins"]
    assert "ring-controller.cce" not in job["metadata"]["labels"]
    assert "cabinet" not in (
        job["spec"]["tasks"][0]["template"]["metadata"].get("annotations") or {}
    )
    assert env_of(job)["NPU_JOB_PODS"] == "k8s"
    assert "ServiceAccount" in [doc.kind for doc in rendered.documents]
    cce = job_of(render_values(with_keys(nodes=4)))  # auto on npu: CCE's rank table
    assert "configmap1980" in cce["spec"]["plugins"] and "NPU_JOB_PODS" not in env_of(cce)


def test_routing_off_means_no_account_whatever_the_source():
    rendered = render_values(with_keys(device="cpu", nodes=4, routing_source="api"))
    assert [doc.kind for doc in rendered.documents] == ["ConfigMap", "Job"]
    assert rendered.warnings == ("routing_source is ignored: routing is off",)


@pytest.mark.parametrize(
    "topology, expected",
    [
        ({"mode": "hard", "highest_tier_allowed": 2}, {"mode": "hard", "highestTierAllowed": 2}),
        ({"highest_tier_allowed": 1}, {"mode": "hard", "highestTierAllowed": 1}),
        ({"mode": "soft"}, {"mode": "soft"}),
    ],
)
def test_the_volcano_jobs_network_topology(topology, expected):
    job = job_of(render_values(with_keys(network_topology=topology)))
    assert job["spec"]["networkTopology"] == expected
    assert "networkTopology" not in job_of(render_values(with_keys()))["spec"]


@pytest.mark.parametrize(
    "values, problem",
    [
        ({"routing_source": "cce"}, "routing_source: expected one of auto, rank-table, api"),
        (
            {"network_topology": {"mode": "strict"}},
            "network_topology.mode: expected one of hard, soft",
        ),
        (
            {"network_topology": {"highest_tier_allowed": -1}},
            "network_topology.highest_tier_allowed:",
        ),
        ({"network_topology": {"tier": 2}}, "network_topology.tier:"),
        ({"service_account": "Bad_Name"}, "service_account:"),
        ({"env": {"NPU_JOB_PODS": "k8s"}}, "env.NPU_JOB_PODS:"),
    ],
)
def test_bad_values_are_named(values, problem):
    with pytest.raises(SpecError) as caught:
        spec_from(with_keys(**values))
    assert any(line.startswith(problem) for line in caught.value.problems), caught.value.problems


def test_sharing_nodes_while_routing_by_the_api_is_warned():
    rendered = render_values(with_keys(**dict(ROUTED_CPU, anti_affinity=False)))
    assert rendered.warnings == (
        "routing by the Kubernetes API with anti_affinity off: pods of the job that share a node "
        "make every pod's bootstrap keep the scheduler's order (routing orders nodes)",
    )
