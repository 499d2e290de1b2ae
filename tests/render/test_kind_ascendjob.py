"""``--set kind=ascendjob``: the AscendJob holds only fields its CRD lists, comes after the rank
table's ConfigMap the operator fills, maps the spec's keys as ascend-operator reads them, and
refuses what it cannot honour.

The schema below is a minimal one written by hand from the CRD of ``mindxdl.gitee.com/v1``
``AscendJob`` (Ascend/mind-cluster ``component/ascend-operator/build/ascend-operator.yaml`` at
22bb3d98, its CustomResourceDefinition): the fields npu-job renders, with the CRD's types, closed
wherever the CRD lists properties (``strict_schema.closed``). The CRD requires
``spec.replicaSpecs``; a pod template's ``metadata`` is kept whole
(``x-kubernetes-preserve-unknown-fields``); its older pod spec lists none of ``hostUsers``,
``os``, ``resourceClaims``, ``resources``, ``schedulingGates`` (which npu-job does not render).
The operator's validation adds what the CRD leaves open: the label ``framework``, one Master, a
container named ``ascend``.
"""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from npu_job.kinds import KINDS
from npu_job.kinds.ascendjob import POD_RESCHEDULING_LABEL

from npu_job import podfacts
from npu_job.errors import SpecError

from .conftest import (
    EXAMPLES,
    example,
    object_of_kind,
    parsed,
    render_values,
    spec_from,
    with_keys,
)
from .strict_schema import (
    OBJECT_META,
    POD_SPEC,
    RUN_POLICY,
    assert_strict,
    obj,
    open_object,
    replica_specs,
    string,
)
from .test_scripts import assert_clean_shell

KIND = KINDS["ascendjob"]
ASCENDJOB = obj(
    required=("apiVersion", "kind", "metadata", "spec"),
    apiVersion=string(enum=("mindxdl.gitee.com/v1",)),
    kind=string(enum=("AscendJob",)),
    metadata=OBJECT_META,
    spec=obj(
        required=("replicaSpecs",),
        schedulerName=string(),
        successPolicy=string(),
        runPolicy=RUN_POLICY,
        # a pod template's metadata is kept whole; the framework pytorch's replica types
        replicaSpecs=replica_specs(
            obj(metadata=open_object(), spec=POD_SPEC), ("Master", "Worker")
        ),
    ),
)


def job_object(rendered):
    return object_of_kind(rendered, KIND)


NPU_EXAMPLES = [name for name in EXAMPLES if example(name).get("device", "npu") == "npu"]


@pytest.mark.parametrize("name", NPU_EXAMPLES)
def test_every_npu_example_renders_an_ascendjob_the_crd_keeps_whole(name):
    values = example(name)
    job = job_object(render_values(values, "kind=ascendjob"))
    assert_strict(job, ASCENDJOB, name)
    assert job["metadata"]["labels"]["framework"] == "pytorch"  # the replica types' framework
    specs = job["spec"]["replicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    assert specs.get("Worker", {"replicas": 0})["replicas"] == values.get("nodes", 1) - 1
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "ascend" and container["image"]


@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - set(NPU_EXAMPLES)))
def test_a_gpu_or_cpu_example_is_refused_naming_the_device_and_the_kind(name):
    with pytest.raises(SpecError) as error:
        spec_from(example(name), "kind=ascendjob")
    device = example(name)["device"]
    assert (
        "device (from job.yaml): the MindCluster AscendJob (kind ascendjob) runs npu pods "
        f"only, not {device}; choose another kind"
    ) in error.value.problems


@pytest.mark.parametrize("key, value", [("network_topology.mode", "hard"), ("task_name", "w")])
def test_a_refused_key_given_on_the_command_line_is_a_problem(key, value):
    with pytest.raises(SpecError) as error:
        spec_from(with_keys(kind="ascendjob"), f"{key}={value}")
    (problem,) = error.value.problems
    assert problem.startswith(f"{key} (from --set): the MindCluster AscendJob (kind ascendjob)")


def test_the_rank_tables_configmap_comes_before_the_job_and_the_pods_mount_it():
    rendered = render_values(with_keys(kind="ascendjob", nodes=4, routing=False))
    docs = parsed(rendered)
    assert [(doc["kind"], doc["metadata"]["name"]) for doc in docs] == [
        ("ConfigMap", "demo-scripts"),
        ("ConfigMap", "rings-config-demo"),  # the operator fills it only if it is there first
        ("AscendJob", "demo"),
    ]
    configmap = docs[1]
    assert json.loads(configmap["data"]["hccl.json"]) == {"status": "initializing"}
    kubernetes_validate.validate(configmap, kubernetes_validate.latest_version(), strict=True)
    pod = docs[2]["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]
    (volume,) = [
        v for v in pod["volumes"] if v.get("configMap", {}).get("name") == "rings-config-demo"
    ]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert f"{mount['mountPath']}/hccl.json" in podfacts.DEFAULT_RANK_TABLES
    assert volume["name"] != "ranktable"  # that name would make the operator write its own file


def test_the_specs_keys_land_where_the_operator_reads_them():
    values = with_keys(
        kind="ascendjob",
        nodes=3,
        npus_per_node=8,
        max_retry=5,
        queue="training",
        priority_class="high",
        master_port=29600,
        node_selector={"accelerator-type": "module-910b-8"},
        labels={"ring-controller.atlas": "ascend-910"},
        resources={"cpu": 32},
    )
    job = job_object(render_values(values))
    labels = job["metadata"]["labels"]
    assert labels["ring-controller.atlas"] == "ascend-910"  # the spec's own wins
    assert labels["fault-scheduling"] == "force"  # MindCluster's Volcano plugin reschedules
    assert job["spec"]["schedulerName"] == "volcano"
    assert job["spec"]["runPolicy"] == {
        "backoffLimit": 5,
        "schedulingPolicy": {"minAvailable": 3, "queue": "training", "priorityClass": "high"},
    }
    for replica, count in (("Master", 1), ("Worker", 2)):
        spec = job["spec"]["replicaSpecs"][replica]
        assert (spec["replicas"], spec["restartPolicy"]) == (count, "Never")
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        # MindCluster's device plugin names the NPUs and labels their nodes
        assert container["resources"]["requests"] == {"huawei.com/Ascend910": 8, "cpu": "32"}
        assert pod["nodeSelector"] == {
            "accelerator": "huawei-Ascend910",
            "accelerator-type": "module-910b-8",
        }
        # the Service <name>-master-0 the operator makes takes this port: MASTER_PORT
        assert container["ports"] == [{"name": "ascendjob-port", "containerPort": 29600}]
        env = {item["name"]: item for item in container["env"]}
        assert env["MA_VJ_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.labels['training.kubeflow.org/job-name']"
        )
        # the operator sets it only on a container requesting nothing but NPUs (cpu is here)
        assert env["ASCEND_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.annotations['huawei.com/Ascend910']"
        )
        assert "export RANK_AFTER_ACC=${RANK};" in container["command"][-1]


def test_a_routed_ascendjob_lists_its_pods_from_the_api_and_told_to_use_the_rank_table_does():
    # the operator's rank table has no switch topology beside it: the API gives both
    auto = render_values(with_keys(kind="ascendjob", nodes=4, routing=True))
    assert auto.spec.routes_by_api and auto.warnings == ()
    told = render_values(
        with_keys(kind="ascendjob", nodes=4, routing=True, routing_source="rank-table")
    )
    assert not told.spec.routes_by_api and told.spec.delivered_rank_table
    assert told.warnings == ()  # the operator delivers one: no warning of a missing source
    for rendered in (auto, told):
        job = job_object(rendered)
        assert "ring-controller.cce" not in job["metadata"]["labels"]
        assert_strict(job, ASCENDJOB)


def test_train_sh_unsets_what_the_operator_injects_and_reaches_the_master_by_its_address(
    tmp_path,
):
    rendered = render_values(with_keys(kind="ascendjob", nodes=4))
    train_sh = dict(rendered.scripts)["train.sh"]
    assert 'NODE_RANK="${RANK_AFTER_ACC:-${RANK:-0}}"' in train_sh
    unset = next(line for line in train_sh.splitlines() if line.startswith("unset "))
    assert unset.split()[1:] == list(KIND.launcher_env)
    assert {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"} <= set(unset.split())
    # npu-run's parallel rendezvous: the Master (pod 0) by the operator's Service, whatever the plan
    assert train_sh.index(KIND.root_address_bash()) < train_sh.index(unset)
    assert_clean_shell(rendered, tmp_path)


def test_restart_pod_asks_mindcluster_to_reschedule_the_faulty_pod_alone():
    job = job_object(render_values(with_keys(kind="ascendjob", nodes=3, restart="pod")))
    assert_strict(job, ASCENDJOB)
    labels = job["metadata"]["labels"]
    assert (labels["fault-scheduling"], labels[POD_RESCHEDULING_LABEL]) == ("force", "on")
    default = job_object(render_values(with_keys(kind="ascendjob", nodes=3)))
    assert POD_RESCHEDULING_LABEL not in default["metadata"]["labels"]


@pytest.mark.parametrize("restart", ["job", "pod"])
def test_the_pod_rescheduling_label_is_the_restart_keys(restart):
    with pytest.raises(SpecError) as error:
        spec_from(
            with_keys(kind="ascendjob", restart=restart, labels={POD_RESCHEDULING_LABEL: "on"})
        )
    (problem,) = error.value.problems
    assert problem.startswith(f"labels.{POD_RESCHEDULING_LABEL}") and "restart" in problem
