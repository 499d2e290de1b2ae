"""The AscendJob record against MindCluster's ascend-operator (Ascend/mind-cluster 22bb3d98).

What the operator does, as read in its source (and cited in ``kinds/ascendjob.py``): pods
``<job>-master-0`` and ``<job>-worker-<i>`` with kubeflow/common's labels, ``RANK`` and
``hccl/rankIndex`` 0 for a Master that requests NPUs and ``i + 1`` for Worker ``i``, its PyTorch
variables on the ``ascend`` container, one ClusterIP Service for the Master, and the rank table in
a ConfigMap ``rings-config-<job>`` it fills. No ascend-operator runs here: the job objects are what
render writes, the rank tables are built from the operator's Go structs (``ranktable/common``,
``ranktable/v1``, ``v1dot2``, ``v2dot0``: field names and order as ``encoding/json`` writes them)
and read by the bootstrap's own parser; the master address rule runs in a real bash.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest
from npu_job.bootstrap.ranktable import parse_rank_table
from npu_job.kinds import KINDS
from npu_job.kinds.ascendjob import KIND

from npu_job import podfacts
from npu_job.errors import InputError

TYPE = "training.kubeflow.org/replica-type"
INDEX = "training.kubeflow.org/replica-index"
OPERATOR = "training.kubeflow.org/operator-name"
JOB = "training.kubeflow.org/job-name"


def template(npus: int = 8) -> Dict[str, Any]:
    requests = {"huawei.com/Ascend910": npus} if npus else {}
    return {
        "metadata": {"labels": {"app": "llm"}},
        "spec": {
            "containers": [
                {
                    "name": "ascend",
                    "image": "train:1",
                    "ports": [{"name": "ascendjob-port", "containerPort": 29500}],
                    "resources": {"requests": requests, "limits": requests},
                }
            ]
        },
    }


def job_object(nodes: int = 3, master_npus: int = 8) -> Dict[str, Any]:
    replicas: Dict[str, Any] = {"Master": {"replicas": 1, "template": template(master_npus)}}
    if nodes > 1:
        replicas["Worker"] = {"replicas": nodes - 1, "template": template()}
    return {
        "apiVersion": "mindxdl.gitee.com/v1",
        "kind": "AscendJob",
        "metadata": {"name": "llm", "uid": "u-1", "labels": {"framework": "pytorch"}},
        "spec": {"replicaSpecs": replicas},
    }


def test_the_record_is_registered_under_its_spec_value():
    assert KINDS["ascendjob"] is KIND
    assert (KIND.api_version, KIND.kind) == ("mindxdl.gitee.com/v1", "AscendJob")
    assert KIND.container_name == "ascend"  # the operator's validation demands it
    assert KIND.restart_policy == "Never"  # the operator's default
    assert KIND.index_env == "RANK"
    assert KIND.master_port_name == "ascendjob-port"
    assert KIND.devices == ("npu",)  # the operator sets RANK only on a pod that requests NPUs
    assert KIND.npu_resource == "huawei.com/Ascend910"  # MindCluster's device plugin
    assert KIND.master_by_pod_ip and KIND.dns_name("llm", "", 1) == ""


def test_the_selector_keeps_a_pytorchjob_of_the_same_name_out():
    assert KIND.selector("llm") == f"{JOB}=llm,{OPERATOR}=ascendjob-controller"
    ours = {JOB: "llm", OPERATOR: "ascendjob-controller", TYPE: "worker", INDEX: "0"}
    assert KIND.selects(ours, "llm")
    assert not KIND.selects({**ours, OPERATOR: "pytorchjob-controller"}, "llm")


def test_a_master_with_npus_is_rank_0_and_worker_i_rank_i_plus_1_in_the_annotation_too():
    pods = KIND.controller_pods(job_object(nodes=4), "job.yaml")
    assert [dict(pod.annotations)["hccl/rankIndex"] for pod in pods] == ["0", "1", "2", "3"]
    assert [pod.index for pod in pods] == [0, 1, 2, 3]


def test_a_master_without_npus_would_share_rank_0_with_worker_0():
    # what npu-job never renders (its Master and Workers are one pod template), and why
    pods = KIND.controller_pods(job_object(nodes=3, master_npus=0), "job.yaml")
    assert [dict(pod.annotations)["hccl/rankIndex"] for pod in pods] == ["0", "0", "1"]
    assert [dict(pod.env)["RANK"] for pod in pods] == ["0", "0", "1"]
    assert dict(pods[0].env)["WORLD_SIZE"] == "16"  # the Workers' NPUs only


def test_the_injected_environment_is_the_operators():
    worker = KIND.controller_pods(job_object(nodes=2), "job.yaml")[1]
    assert list(worker.env) == [
        ("MINDX_TASK_ID", "u-1"),
        ("MINDX_SERVER_IP", "clusterd-grpc-svc.mindx-dl.svc.cluster.local"),
        ("MINDX_SERVER_DOMAIN", "clusterd-grpc-svc.mindx-dl.svc.cluster.local"),
        ("HostNetwork", "false"),
        ("HCCL_LOGIC_SUPERPOD_ID", "0"),
        ("REPLICA_TYPE", "Worker"),
        ("LOCAL_WORLD_SIZE", "8"),
        ("WORLD_SIZE", "16"),  # processes, not nodes
        ("LOCAL_RANK", "0,1,2,3,4,5,6,7"),  # a list, not a local rank
        ("MASTER_ADDR", "llm-master-0"),  # the Service (its ClusterIP in a cluster)
        ("MASTER_PORT", "29500"),
        ("RANK", "1"),
    ]
    for name in KIND.launcher_env:
        assert name in dict(worker.env)


def test_the_operators_labels_and_their_deprecated_twins():
    master = KIND.controller_pods(job_object(nodes=2), "job.yaml")[0]
    assert dict(master.labels) == {
        "app": "llm",
        OPERATOR: "ascendjob-controller",
        "group-name": "mindxdl.gitee.com",
        JOB: "llm",
        "job-name": "llm",
        TYPE: "master",
        "replica-type": "master",
        INDEX: "0",
        "replica-index": "0",
        "training.kubeflow.org/job-role": "master",
        "version": "0",
    }
    assert dict(master.annotations) == {
        "hccl/rankIndex": "0",
        "volcano.sh/task-spec": "master",
        "scheduling.k8s.io/group-name": "llm-u-1",
    }


def test_only_the_master_has_a_name_that_resolves_its_services():
    pods = KIND.controller_pods(job_object(nodes=3), "job.yaml")
    assert [pod.dns_names for pod in pods] == [("llm-master-0",), (), ()]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda j: j["metadata"]["labels"].update(framework="mindspore"),
            "job.yaml: metadata.labels.framework: expected 'pytorch'",
        ),
        (
            lambda j: j["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"][
                0
            ].update(name="pytorch"),
            "job.yaml: spec.replicaSpecs.Worker.template.spec.containers: expected a container "
            "named 'ascend' with an image",
        ),
    ],
)
def test_a_job_object_the_operator_would_refuse_is_an_error_naming_the_field(change, message):
    job = copy.deepcopy(job_object())
    change(job)
    with pytest.raises(InputError) as caught:
        KIND.controller_pods(job, "job.yaml")
    assert str(caught.value).startswith(message)


def test_workers_may_be_none():
    assert [pod.name for pod in KIND.controller_pods(job_object(nodes=1), "job.yaml")] == [
        "llm-master-0"
    ]


# --- the rank table the operator writes into rings-config-<job> --------------------------------


def test_the_rank_table_configmap_is_mounted_where_the_bootstrap_looks():
    (mount,) = KIND.configmap_mounts
    assert mount.name_for("llm") == "rings-config-llm"  # the operator's configmapPrefix + job
    files = dict(mount.data)
    assert json.loads(files["hccl.json"]) == {"status": "initializing"}
    assert f"{mount.path}/hccl.json" in podfacts.DEFAULT_RANK_TABLES


def operator_table(version: str, servers: List[Dict[str, Any]]) -> bytes:
    """hccl.json as ``BaseGenerator.ToString`` marshals it: status, server_list (each server's
    device list, server_id, host_ip, container_ip), server_count, version; sorted by rank."""
    document: Dict[str, Any] = {
        "status": "completed",
        "server_list": servers,
        "server_count": str(len(servers)),
        "version": version,
    }
    if version == "1.2":
        document["super_pod_list"] = [
            {"super_pod_id": "0", "server_list": [{"server_id": s["server_id"]} for s in servers]}
        ]
    return json.dumps(document, separators=(",", ":")).encode()


def operator_server(rank: int, npus: int = 8, super_device: bool = False) -> Dict[str, Any]:
    devices = []
    for local in range(npus):
        device = {"device_id": str(local), "device_ip": f"29.{rank}.{local}.1"}
        if super_device:
            device["super_device_id"] = str(rank * npus + local)
        devices.append({**device, "rank_id": str(rank * npus + local)})
    host = f"192.168.0.{10 + rank}"
    return {
        "device": devices,
        "server_id": host,
        "host_ip": host,
        "container_ip": f"172.16.0.{rank}",
    }


@pytest.mark.parametrize("version", ["1.0", "1.2"])
def test_the_bootstrap_reads_the_tables_the_operator_writes_for_npu_jobs(version):
    servers = [operator_server(rank, super_device=version == "1.2") for rank in range(3)]
    table = parse_rank_table(operator_table(version, servers), "hccl.json")
    assert table.is_completed and table.node_count == 3
    assert [server.server_id for server in table.servers] == [s["server_id"] for s in servers]
    assert [server.container_ip for server in table.servers] == [
        "172.16.0.0",
        "172.16.0.1",
        "172.16.0.2",
    ]  # the pods' addresses: where a plan's master is reached
    if version == "1.2":
        assert {server.super_pod_id for server in table.servers} == {"0"}


def test_the_initializing_table_render_writes_is_not_ready():
    (mount,) = KIND.configmap_mounts
    table = parse_rank_table(dict(mount.data)["hccl.json"].encode(), "hccl.json")
    assert not table.is_completed and table.node_count == 0


def test_the_v2_table_of_huawei_npu_pods_is_one_the_bootstrap_cannot_read():
    # ranktable/v2dot0: rank_list of integer ids and levels, no servers: nothing says which pod a
    # rank is on. Written only for pods requesting huawei.com/npu, which npu-job never asks for.
    document = {
        "status": "completed",
        "version": "2.0",
        "rank_list": [{"rank_id": 0, "local_id": 0, "device_id": 0}],
        "rank_count": 1,
    }
    with pytest.raises(InputError, match="server_list"):
        parse_rank_table(json.dumps(document).encode(), "hccl.json")


# --- how train.sh finds the master -------------------------------------------------------------


def run_master_rule(tmp_path: Path, index: str, planned: str = "") -> subprocess.CompletedProcess:
    env_file = f"{podfacts.OUTPUT_DIR}/{podfacts.ENV_FILE}"
    rule = KIND.master_address_bash()
    assert env_file in rule
    stand_in = tmp_path / podfacts.ENV_FILE  # not the machine's own /tmp
    if planned:
        stand_in.write_text(f"export NPU_JOB_MASTER_ADDR={planned}\n")
    script = "set -euo pipefail\nMASTER_ADDR=10.96.0.7\n"
    script += f"MA_MASTER_INDEX={index}\n" + rule.replace(env_file, str(stand_in))
    script += '\nprintf %s "$MASTER_ADDR"\n'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def test_the_planned_master_is_reached_by_the_pod_ip_the_bootstrap_wrote(tmp_path):
    done = run_master_rule(tmp_path, "2", planned="172.16.0.2")
    assert (done.returncode, done.stdout) == (0, "172.16.0.2")


def test_without_a_plan_pod_0_is_reached_through_the_operators_service(tmp_path):
    done = run_master_rule(tmp_path, "0")
    assert (done.returncode, done.stdout) == (0, "10.96.0.7")


def test_a_planned_master_without_an_address_stops_train_sh_with_one_line(tmp_path):
    done = run_master_rule(tmp_path, "2")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "npu-job: error: train.sh: the plan puts rank 0 on pod 2, whose address the bootstrap "
        "did not write (NPU_JOB_MASTER_ADDR)\n"
    )


def test_the_spec_keys_an_ascendjob_cannot_honour_are_refused_with_a_reason():
    refused = dict(KIND.refused_keys)
    assert set(refused) == {"network_topology", "task_name"}
    assert all(reason for reason in refused.values())
