"""``--set kind=pytorchjob``: the PyTorchJob holds only fields its CRD lists, maps the spec's keys
as training-operator v1.9.0 reads them, and refuses what it cannot honour.

The schema below is a minimal one written by hand from the CRD of ``kubeflow.org/v1``
``PyTorchJob`` (kubeflow/training-operator ``manifests/base/crds/kubeflow.org_pytorchjobs.yaml``
at tag v1.9.0): the fields npu-job renders, with the CRD's types, closed wherever the CRD lists
properties (``strict_schema.closed``), so a field the API server would prune fails here. The
CRD requires ``spec.pytorchReplicaSpecs``; the operator's webhook adds what the CRD leaves open:
Master ``replicas`` 1, Worker ``replicas`` at least 1, a container named ``pytorch``.
"""

from __future__ import annotations

import pytest
from npu_job.kinds import KINDS

from npu_job.errors import SpecError

from .conftest import EXAMPLES, example, object_of_kind, render_values, spec_from, with_keys
from .strict_schema import (
    OBJECT_META,
    POD_TEMPLATE,
    RUN_POLICY,
    assert_strict,
    obj,
    replica_specs,
    string,
)
from .test_scripts import assert_clean_shell

KIND = KINDS["pytorchjob"]
PYTORCHJOB = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("kubeflow.org/v1",)),
    kind=string(enum=("PyTorchJob",)),
    metadata=OBJECT_META,
    spec=obj(
        required=("pytorchReplicaSpecs",),
        nprocPerNode=string(),
        runPolicy=RUN_POLICY,
        # the webhook's replica types
        pytorchReplicaSpecs=replica_specs(POD_TEMPLATE, ("Master", "Worker")),
    ),
)


def job_object(rendered):
    return object_of_kind(rendered, KIND)


def refused_in(values):
    return sorted(key for key, _ in KIND.refused_keys if key in values)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_renders_a_pytorchjob_the_crd_keeps_whole(name):
    values = example(name)
    unset = [f"{key}=null" for key in refused_in(values)]  # what the kind refuses (below)
    job = job_object(render_values(values, "kind=pytorchjob", *unset))
    assert_strict(job, PYTORCHJOB, name)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1  # the webhook's rule
    assert specs.get("Worker", {"replicas": 0})["replicas"] == values.get("nodes", 1) - 1
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch" and container["image"]


@pytest.mark.parametrize("name", [name for name in EXAMPLES if refused_in(example(name))])
def test_an_example_with_a_key_the_kind_cannot_honour_is_refused_naming_key_and_kind(name):
    with pytest.raises(SpecError) as error:
        spec_from(example(name), "kind=pytorchjob")
    for key in refused_in(example(name)):
        assert any(
            problem.startswith(f"{key}.")
            and "the Kubeflow PyTorchJob (kind pytorchjob) cannot honour it" in problem
            for problem in error.value.problems
        ), error.value.problems


@pytest.mark.parametrize("key, value", [("network_topology.mode", "hard"), ("task_name", "w")])
def test_a_refused_key_given_on_the_command_line_is_a_problem(key, value):
    with pytest.raises(SpecError) as error:
        spec_from(with_keys(kind="pytorchjob"), f"{key}={value}")
    (problem,) = error.value.problems
    assert problem.startswith(f"{key} (from --set): the Kubeflow PyTorchJob (kind pytorchjob)")


def test_the_specs_keys_land_where_the_operator_reads_them():
    values = with_keys(
        kind="pytorchjob",
        nodes=4,
        npus_per_node=8,
        max_retry=5,
        queue="training",
        priority_class="high",
        master_port=29600,
    )
    job = job_object(render_values(values))
    assert job["spec"]["nprocPerNode"] == "8"  # a string: "auto", "cpu", "gpu" or a number
    assert job["spec"]["runPolicy"] == {
        "backoffLimit": 5,
        "schedulingPolicy": {"minAvailable": 4, "queue": "training", "priorityClass": "high"},
    }
    for replica, count in (("Master", 1), ("Worker", 3)):
        spec = job["spec"]["pytorchReplicaSpecs"][replica]
        assert (spec["replicas"], spec["restartPolicy"]) == (count, "OnFailure")
        pod = spec["template"]["spec"]
        assert pod["restartPolicy"] == "OnFailure"
        (container,) = pod["containers"]
        # the port the operator reads MASTER_PORT from and gives the per-replica Services
        assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29600}]
        env = {item["name"]: item for item in container["env"]}
        assert env["MA_VJ_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['training.kubeflow.org/job-name']"
        )
        assert "MA_TASK_NAME" not in env
        term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term[0]["labelSelector"]["matchExpressions"][0]["key"] == (
            "training.kubeflow.org/job-name"
        )
        assert "export RANK_AFTER_ACC=${PET_NODE_RANK};" in container["command"][-1]


def test_one_node_is_a_master_alone():
    job = job_object(render_values(with_keys(kind="pytorchjob", nodes=1)))
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_a_routed_npu_pytorchjob_lists_its_pods_from_the_api_cce_serves_it_no_rank_table():
    rendered = render_values(with_keys(kind="pytorchjob", nodes=4, routing=True))
    assert rendered.spec.routes_by_api
    kinds = [doc.kind for doc in rendered.documents]
    assert kinds == [
        "ConfigMap",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "PyTorchJob",
    ]
    job = job_object(rendered)
    assert "ring-controller.cce" not in job["metadata"]["labels"]
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert "cabinet" not in master["metadata"].get("annotations", {})
    env = {item["name"]: item.get("value") for item in master["spec"]["containers"][0]["env"]}
    assert env["NPU_JOB_PODS"] == "k8s" and env["NPU_JOB_KIND"] == "pytorchjob"
    assert master["spec"]["serviceAccountName"] == "demo-routing"
    assert_strict(job, PYTORCHJOB)


def test_train_sh_unsets_what_the_operator_injects_and_names_the_master_by_its_service(tmp_path):
    rendered = render_values(with_keys(kind="pytorchjob", nodes=4))
    train_sh = dict(rendered.scripts)["train.sh"]
    assert 'NODE_RANK="${RANK_AFTER_ACC:-${PET_NODE_RANK:-0}}"' in train_sh
    unset = next(line for line in train_sh.splitlines() if line.startswith("unset "))
    assert unset.split()[1:] == list(KIND.launcher_env)  # MASTER_ADDR and MASTER_PORT it sets
    assert {"PET_NODE_RANK", "PET_MASTER_ADDR", "PET_NNODES", "RANK", "WORLD_SIZE"} <= set(
        unset.split()
    )
    # npu-run's parallel rendezvous: pod 0's Service <job>-master-0, where its root plans the ranks
    assert KIND.root_address_bash() in train_sh
    assert 'MASTER_ADDR="${MA_VJ_NAME}-master-0"' in train_sh
    assert_clean_shell(rendered, tmp_path)


def test_told_to_use_a_rank_table_it_brings_none_of_render_warns():
    rendered = render_values(
        with_keys(kind="pytorchjob", nodes=4, routing=True, routing_source="rank-table")
    )
    assert not rendered.spec.routes_by_api
    (warning,) = rendered.warnings
    assert warning.startswith(
        "routing is on for kind pytorchjob, but no rank table source is configured (CCE's "
        "configmap1980 plugin serves the NPU pods of Volcano Jobs only)"
    )


def test_restart_job_is_refused_the_operator_restarts_no_gang():
    with pytest.raises(SpecError) as error:
        spec_from(with_keys(kind="pytorchjob", nodes=3, restart="job"))
    (problem,) = error.value.problems
    assert problem.startswith("restart") and "(kind pytorchjob) cannot honour 'job'" in problem
