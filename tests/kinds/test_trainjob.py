"""The TrainJob's record says what Kubeflow Trainer makes of a TrainJob and its TrainingRuntime.

Each expectation is a fact of kubeflow/trainer (the jobset plugin's ``Build`` and ``Trainer``,
the torch plugin's ``EnforceMLPolicy``, ``ValidateObjects``; cited in ``kinds/trainjob.py``): the
JobSet the Trainer builds has the TrainJob's name, forces the trainer's replicated job to one
replica of ``numNodes`` pods and adds the ``PET_*`` variables to its ``node`` container; the pods
are then a JobSet's. No cluster runs here, so the objects are written by hand in the shape
npu-job renders.
"""

from __future__ import annotations

import re

import pytest
from npu_job.kinds import KINDS
from npu_job.kinds.indexedjob import COMPLETION_INDEX_ENV, COMPLETION_INDEX_KEY
from npu_job.kinds.jobset import JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL
from npu_job.kinds.trainjob import ANCESTOR_LABEL, TORCH_ENV, trainer_jobset

from npu_job.errors import InputError

KIND = KINDS["trainjob"]
RANDOM = "[bcdfghjklmnpqrstvwxz2456789]{5}"


def runtime(name="llama", namespace="team", num_nodes=1, torch=True, env=()):
    ml_policy = {"numNodes": num_nodes, **({"torch": {}} if torch else {})}
    container = {"name": "node", "image": "runtime-image", "env": list(env)}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "mlPolicy": ml_policy,
            "template": {
                "metadata": {"labels": {"team": "x"}},
                "spec": {
                    "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 1,
                            "template": {
                                "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                "spec": {
                                    "template": {
                                        "metadata": {"labels": {"app": "x"}},
                                        "spec": {
                                            "restartPolicy": "OnFailure",
                                            "containers": [container],
                                        },
                                    }
                                },
                            },
                        }
                    ],
                },
            },
        },
    }


def trainjob(name="llama", namespace="team", runtime_name="llama", **trainer):
    trainer.setdefault("numNodes", 4)
    trainer.setdefault("numProcPerNode", 8)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "TrainingRuntime",
                "name": runtime_name,
            },
            "trainer": trainer,
        },
    }


def stream(job=None, rt=None):
    return [rt if rt is not None else runtime(), job if job is not None else trainjob()]


def node_container(jobset):
    rjob = jobset["spec"]["replicatedJobs"][0]
    return rjob["template"]["spec"]["template"]["spec"]["containers"][0]


def test_the_record_names_the_trainjob_and_selects_its_trainer_pods_as_a_jobsets():
    assert (KIND.api_version, KIND.kind) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert KIND.container_name == "node"
    assert KIND.index_env == "JOB_COMPLETION_INDEX"
    assert KIND.selector("llama") == (
        "jobset.sigs.k8s.io/jobset-name=llama,jobset.sigs.k8s.io/replicatedjob-name=node"
    )
    assert set(KIND.launcher_env) == {
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    }


def test_the_trainer_builds_a_jobset_of_the_trainjobs_name_with_num_nodes_pods():
    built = trainer_jobset(trainjob(numNodes=6), runtime(), "s", "TrainingRuntime llama")
    assert (built["apiVersion"], built["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert (built["metadata"]["name"], built["metadata"]["namespace"]) == ("llama", "team")
    assert built["metadata"]["labels"] == {"team": "x"}  # the runtime template's
    job_spec = built["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (job_spec["parallelism"], job_spec["completions"]) == (6, 6)


def test_without_num_nodes_the_runtimes_ml_policy_counts_the_nodes():
    job = trainjob()
    del job["spec"]["trainer"]["numNodes"]
    built = trainer_jobset(job, runtime(num_nodes=3), "s", "TrainingRuntime llama")
    assert built["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] == 3


def test_the_torch_plugin_adds_the_pet_variables_to_the_node_container():
    built = trainer_jobset(trainjob(numNodes=4, numProcPerNode=8), runtime(), "s", "w")
    env = {item["name"]: item for item in node_container(built)["env"]}
    assert env["PET_NNODES"]["value"] == "4"
    assert env["PET_NPROC_PER_NODE"]["value"] == "8"
    assert env["PET_MASTER_ADDR"]["value"] == "llama-node-0-0.llama"
    assert env["PET_MASTER_PORT"]["value"] == "29500"
    assert env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert {"containerPort": 29500} in node_container(built)["ports"]


def test_without_num_proc_per_node_the_torch_plugin_says_auto_and_never_counts_npus():
    job = trainjob()
    del job["spec"]["trainer"]["numProcPerNode"]
    env = {
        item["name"]: item
        for item in node_container(trainer_jobset(job, runtime(), "s", "w"))["env"]
    }
    assert env["PET_NPROC_PER_NODE"]["value"] == "auto"


def test_a_runtime_without_the_torch_policy_gets_no_pet_variables():
    built = trainer_jobset(trainjob(), runtime(torch=False), "s", "w")
    assert not {item["name"] for item in node_container(built)["env"]} & set(TORCH_ENV)


def test_the_trainjobs_trainer_overrides_image_command_env_and_resources_of_the_node():
    job = trainjob(
        image="mine",
        command=["bash"],
        env=[{"name": "A", "value": "trainjob"}],
        resourcesPerNode={"limits": {"huawei.com/ascend-1980": 8}},
    )
    built = trainer_jobset(job, runtime(env=[{"name": "A", "value": "runtime"}]), "s", "w")
    node = node_container(built)
    assert (node["image"], node["command"]) == ("mine", ["bash"])
    assert [item["value"] for item in node["env"] if item["name"] == "A"] == ["trainjob"]
    assert node["resources"]["limits"] == {"huawei.com/ascend-1980": 8}


def test_the_runtime_in_the_stream_is_left_as_rendered():
    rt = runtime()
    trainer_jobset(trainjob(), rt, "s", "w")
    assert rt == runtime()


def test_its_pods_are_the_jobsets_with_the_pet_variables_beside_the_completion_index():
    pods = KIND.stream_pods(stream(), "job.yaml")
    assert [pod.index for pod in pods] == [0, 1, 2, 3]
    for pod in pods:
        assert re.fullmatch(f"llama-node-0-{pod.index}-{RANDOM}", pod.name), pod.name
        assert (pod.hostname, pod.subdomain) == (f"llama-node-0-{pod.index}", "llama")
        assert pod.dns_names[0] == KIND.dns_name("llama", "", pod.index)
        labels, annotations = dict(pod.labels), dict(pod.annotations)
        assert (labels[JOBSET_NAME_LABEL], labels[REPLICATED_JOB_LABEL]) == ("llama", "node")
        assert labels[COMPLETION_INDEX_KEY] == annotations[COMPLETION_INDEX_KEY] == str(pod.index)
        assert not any(key.startswith("trainer.kubeflow.org/") for key in labels)
        assert dict(pod.env) == {COMPLETION_INDEX_ENV: str(pod.index)}
        env_names = [item["name"] for item in pod.template["spec"]["containers"][0]["env"]]
        assert set(TORCH_ENV) <= set(env_names)
        assert pod.where == (
            "TrainingRuntime llama: spec.template.spec.replicatedJobs[0].template.spec.template"
        )
        assert KIND.selects(labels, "llama")
        assert KIND.pod_index(labels, pod.name) == pod.index


def test_a_trainjob_whose_runtime_is_not_in_the_stream_is_refused_naming_the_reference():
    for documents in (
        [trainjob()],
        stream(rt=runtime(name="other")),
        stream(rt=runtime(namespace="b")),
    ):
        with pytest.raises(InputError, match="TrainingRuntime 'llama'") as caught:
            KIND.stream_pods(documents, "job.yaml")
        assert caught.value.field == "spec.runtimeRef"
    with pytest.raises(InputError, match="TrainingRuntime 'llama'"):
        KIND.controller_pods(trainjob(), "job.yaml")  # the TrainJob alone says no pod template


def test_a_runtime_without_the_trainer_step_or_its_node_container_is_refused():
    rt = runtime()
    rjob = rt["spec"]["template"]["spec"]["replicatedJobs"][0]
    rjob["template"]["metadata"]["labels"] = {}
    with pytest.raises(InputError, match="trainjob-ancestor-step"):
        KIND.stream_pods(stream(rt=rt), "job.yaml")
    rt = runtime()
    node = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    node["spec"]["containers"][0]["name"] = "train"
    with pytest.raises(InputError, match="'node'") as caught:
        KIND.stream_pods(stream(rt=rt), "job.yaml")
    assert caught.value.field.startswith(
        "TrainingRuntime llama: spec.template.spec.replicatedJobs[0]"
    )


def test_the_master_address_of_pod_k_is_its_dns_name():
    assert KIND.dns_name("llama", "whatever", 2) == "llama-node-0-2.llama"
    assert "-node-0-${MA_MASTER_INDEX}.${MA_VJ_NAME}" in KIND.master_address_bash()
