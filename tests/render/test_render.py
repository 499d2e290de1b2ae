"""The rendered manifests: every element the platform asks for, and nothing NPU-only elsewhere.

The Volcano Job's structure is checked strictly against a minimal schema of the Volcano Job CRD
(test_kind_volcano.py); the pod template is checked by Kubernetes' own schema
(kubernetes-validate), wrapped as a Pod.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from npu_job.render import render as render_module
from npu_job.render.render import render

from npu_job.errors import RenderError

from .conftest import (
    BOOTSTRAP_STAND_IN,
    container,
    env_of,
    job_of,
    names,
    parsed,
    pod_spec,
    render_values,
    spec_from,
    validate_as_pod,
    with_keys,
)
from .strict_schema import assert_strict
from .test_kind_volcano import VOLCANO, VOLCANO_JOB

PLATFORM_POD_COMMAND = (
    "bash bootstrap.sh; export RANK_AFTER_ACC=${VC_TASK_INDEX}; "
    'rank_acc=$(cat /tmp/RANK_AFTER_ACC 2>/dev/null); [ -n "${rank_acc}" ] && export RANK_AFTER_ACC=${rank_acc}; '
    "export MA_MASTER_INDEX=$(cat /tmp/MASTER_INDEX 2>/dev/null || echo 0); bash train.sh"
)
NPU_HOST_PATHS = [
    "/usr/local/Ascend/driver",
    "/usr/local/Ascend/add-ons",
    "/etc/localtime",
    "/etc/hccn.conf",
    "/usr/local/sbin/npu-smi",
]


@pytest.fixture(scope="module")
def routed():
    return render_values(
        with_keys(name="llm", nodes=6, queue="train-q", max_retry=5, hccl={"connect_timeout": 1800})
    )


def test_stream_lists_the_scripts_configmap_before_the_job(routed):
    stream = routed.stream()
    assert stream.startswith("---\n# Source: npu-job/templates/configmap.yaml.j2\n")
    assert "\n---\n# Source: npu-job/templates/job.yaml.j2\n" in stream
    kinds = [(doc["kind"], doc["metadata"]["name"]) for doc in parsed(routed)]
    assert kinds == [("ConfigMap", "llm-scripts"), ("Job", "llm")]
    configmap = parsed(routed)[0]
    assert configmap["data"] == {
        "train.sh": routed.scripts[0][1],
        "bootstrap.sh": BOOTSTRAP_STAND_IN,
    }


def test_routed_npu_job_has_every_element_of_the_platform_example(routed):
    job = job_of(routed)
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1"
    assert job["metadata"]["labels"]["ring-controller.cce"] == "ascend-1980"
    assert job["metadata"]["labels"]["fault-scheduling"] == "force"
    spec = job["spec"]
    assert spec["schedulerName"] == "volcano"
    assert spec["minAvailable"] == spec["tasks"][0]["replicas"] == 6
    assert spec["policies"] == [{"event": "PodEvicted", "action": "RestartJob"}]
    assert spec["plugins"] == {
        "configmap1980": ["--rank-table-version=v2"],
        "env": [],
        "svc": ["--publish-not-ready-addresses=true"],
    }
    assert (spec["maxRetry"], spec["queue"]) == (5, "train-q")
    template = spec["tasks"][0]["template"]
    assert template["metadata"]["annotations"] == {"cabinet": "cabinet"}
    pod = template["spec"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == [
        {
            "labelSelector": {
                "matchExpressions": [
                    {"key": "volcano.sh/job-name", "operator": "In", "values": ["llm"]}
                ]
            },
            "topologyKey": "kubernetes.io/hostname",
        }
    ]
    env = env_of(job)
    assert env["MA_CURRENT_HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["MA_VJ_NAME"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['volcano.sh/job-name']"}
    }
    assert env["MA_TASK_NAME"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['volcano.sh/task-spec']"}
    }
    assert (env["MA_NUM_GPUS"], env["MA_NUM_HOSTS"], env["HCCL_CONNECT_TIMEOUT"]) == (
        "8",
        "6",
        "1800",
    )
    resources = container(job)["resources"]
    assert resources["requests"] == resources["limits"] == {"huawei.com/ascend-1980": 8}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounted = {m["name"]: m["mountPath"] for m in container(job)["volumeMounts"]}
    assert sorted(host_paths.values()) == sorted(NPU_HOST_PATHS)
    assert all(mounted[name] == path for name, path in host_paths.items())
    assert pod["nodeSelector"] == {"accelerator/huawei-npu": "ascend-1980"}
    assert pod["restartPolicy"] == "OnFailure"


def test_pod_command_is_the_platform_pattern_run_in_the_scripts_mount(routed):
    command = container(job_of(routed))["command"]
    assert command[:2] == ["/bin/bash", "-c"]
    assert command[2] == "cd /opt/npu-job || exit 1; " + PLATFORM_POD_COMMAND
    assert routed.pod_command == command[2]
    scripts = next(v for v in pod_spec(job_of(routed))["volumes"] if v["name"] == "npu-job-scripts")
    assert scripts["configMap"]["name"] == "llm-scripts"
    assert {"name": "npu-job-scripts", "mountPath": "/opt/npu-job", "readOnly": True} in container(
        job_of(routed)
    )["volumeMounts"]


def test_the_scripts_read_the_files_and_variables_the_bootstrap_and_npu_run_use(routed):
    """The pod command and train.sh are shell text; the names they share with the bootstrap and
    npu-run come from npu_job.podfacts, and a rename there must reach them."""
    from npu_job import podfacts

    train_sh = dict(routed.scripts)["train.sh"]
    out = podfacts.OUTPUT_DIR
    assert f"export {podfacts.RANK_ENV}=${{{VOLCANO.index_env}}}" in routed.pod_command
    assert f"cat {out}/{podfacts.RANK_FILE} " in routed.pod_command
    assert f"cat {out}/{podfacts.MASTER_FILE} " in routed.pod_command
    assert f"${{{podfacts.RANK_ENV}:-${{{VOLCANO.index_env}:-0}}}}" in train_sh
    assert f"[ -f {out}/{podfacts.ENV_FILE} ]" in train_sh
    assert f"${{{podfacts.RANK_TABLE_ENV}:-}}" in train_sh


def test_routing_off_runs_no_bootstrap_and_keeps_scheduler_order():
    rendered = render_values(with_keys(nodes=2))
    job = job_of(rendered)
    assert rendered.pod_command == (
        "cd /opt/npu-job || exit 1; export RANK_AFTER_ACC=${VC_TASK_INDEX}; export MA_MASTER_INDEX=0; bash train.sh"
    )
    assert [name for name, _ in rendered.scripts] == ["train.sh"]
    assert "configmap1980" not in job["spec"]["plugins"]
    assert "ring-controller.cce" not in job["metadata"]["labels"]
    assert "annotations" not in job["spec"]["tasks"][0]["template"]["metadata"]


@pytest.mark.parametrize(
    "values, expected",
    [
        pytest.param({"nodes": 6}, "8", id="ascend-1980-default"),
        pytest.param(
            {"nodes": 6, "npus_per_node": 16, "full_node_npus": 16}, "16", id="a3-super-pod-node"
        ),
        pytest.param(
            {"nodes": 3, "npus_per_node": 4}, "8", id="partial-nodes-the-bootstrap-will-refuse"
        ),
        pytest.param({"nodes": 6, "routing": False}, None, id="routing-off-no-bootstrap"),
    ],
)
def test_routed_pods_tell_the_bootstrap_the_full_node_size(values, expected):
    """One rule: the bootstrap refuses partial nodes by the same full_node_npus render warns with."""
    env = env_of(job_of(render_values(with_keys(**values))))
    assert env.get("NPU_JOB_FULL_NODE_DEVICES") == expected


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_routed_gpu_and_cpu_jobs_run_the_bootstrap_without_the_cce_pieces(device):
    """The bootstrap is device-independent; only CCE's delivery of its inputs is NPU-only."""
    rendered = render_values(
        with_keys(
            device=device,
            nodes=3,
            npus_per_node=4,
            routing=True,
            env={"RANK_TABLE_FILE": "/rt/jobstart_hccl.json"},
        )
    )
    job = job_of(rendered)
    assert rendered.pod_command == "cd /opt/npu-job || exit 1; " + PLATFORM_POD_COMMAND
    assert [name for name, _ in rendered.scripts] == ["train.sh", "bootstrap.sh"]
    assert "configmap1980" not in job["spec"]["plugins"]
    assert "ring-controller.cce" not in job["metadata"]["labels"]
    assert "cabinet" not in (
        job["spec"]["tasks"][0]["template"]["metadata"].get("annotations") or {}
    )
    assert env_of(job)["RANK_TABLE_FILE"] == "/rt/jobstart_hccl.json"
    assert env_of(job).get("NPU_JOB_FULL_NODE_DEVICES") == ("8" if device == "gpu" else None)
    if device == "gpu":  # 4 of a full node's 8 GPUs: the one warning says the bootstrap will refuse
        assert len(rendered.warnings) == 1 and "NPU_JOB_FULL_NODE_DEVICES=8" in rendered.warnings[0]
    else:
        assert rendered.warnings == ()


def test_a_routed_cpu_job_told_to_use_a_rank_table_without_one_logs_that_it_will_fall_back():
    import logging

    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = (
        records.append
    )  # on the logger itself: the CLI's set-up stops propagation to caplog
    logger = logging.getLogger("npu_job.render")
    logger.addHandler(handler)
    try:
        rendered = render_values(
            with_keys(device="cpu", nodes=3, routing=True, routing_source="rank-table")
        )
    finally:
        logger.removeHandler(handler)
    assert "bash bootstrap.sh" in rendered.pod_command
    assert [r.getMessage() for r in records] == list(rendered.warnings)
    assert "no rank table source is configured" in rendered.warnings[0]
    assert "keeps the scheduler's order" in rendered.warnings[0]


@pytest.mark.parametrize("device, resource", [("gpu", "nvidia.com/gpu"), ("cpu", None)])
def test_gpu_and_cpu_jobs_have_no_npu_only_pieces(device, resource):
    rendered = render_values(
        with_keys(device=device, nodes=3, npus_per_node=4, launcher="torchrun")
    )
    job = job_of(rendered)
    text = rendered.stream()
    for npu_only in [
        "configmap1980",
        "ring-controller",
        "cabinet",
        "ascend",
        "hccn",
        "npu-smi",
        "HCCL_",
        "accelerator/huawei-npu",
    ]:
        assert npu_only not in text, npu_only
    requests = container(job)["resources"]["requests"] if resource else {}
    assert requests == ({resource: 4} if resource else {})
    assert "resources" in container(job) or resource is None
    assert env_of(job)["MA_NUM_GPUS"] == "4"
    assert ("affinity" in pod_spec(job)) is (device == "gpu")
    assert "nodeSelector" not in pod_spec(job)


def test_user_volumes_mounts_selectors_labels_and_resources_are_added_to_ours():
    values = with_keys(
        nodes=3,
        volumes=[{"name": "data", "nfs": {"server": "10.0.0.9", "path": "/export/data"}}],
        mounts=[{"name": "data", "mountPath": "/data", "readOnly": True}],
        node_selector={"accelerator/huawei-npu": "ascend-1980-b", "pool": "a"},
        labels={"team": "llm"},
        annotations={"note": "a: b # c"},
        resources={"cpu": 190, "memory": "1500Gi"},
        priority_class="high-priority",
        image_pull_secrets=["swr-secret"],
        host_network=True,
    )
    job = job_of(render_values(values))
    pod = pod_spec(job)
    assert names(pod["volumes"])[-1] == "data" and pod["volumes"][-1]["nfs"]["server"] == "10.0.0.9"
    assert container(job)["volumeMounts"][-1] == {
        "name": "data",
        "mountPath": "/data",
        "readOnly": True,
    }
    assert pod["nodeSelector"] == {"accelerator/huawei-npu": "ascend-1980-b", "pool": "a"}
    assert (
        job["metadata"]["labels"]["team"]
        == job["spec"]["tasks"][0]["template"]["metadata"]["labels"]["team"]
        == "llm"
    )
    assert job["spec"]["tasks"][0]["template"]["metadata"]["annotations"] == {
        "cabinet": "cabinet",
        "note": "a: b # c",
    }
    assert container(job)["resources"]["limits"] == {
        "huawei.com/ascend-1980": 8,
        "cpu": "190",
        "memory": "1500Gi",
    }
    assert job["spec"]["priorityClassName"] == pod["priorityClassName"] == "high-priority"
    assert pod["imagePullSecrets"] == [{"name": "swr-secret"}]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(with_keys(), id="single-npu"),
        pytest.param(
            with_keys(
                nodes=6,
                env={"A": "1"},
                resources={"cpu": "8", "memory": "64Gi"},
                hccl={"reserve_ports": True},
            ),
            id="routed-npu",
        ),
        pytest.param(with_keys(device="gpu", nodes=2, host_network=True, shm_size=None), id="gpu"),
        pytest.param(
            with_keys(
                device="cpu",
                nodes=3,
                volumes=[{"name": "d", "emptyDir": {}}],
                mounts=[{"name": "d", "mountPath": "/d"}],
            ),
            id="cpu",
        ),
    ],
)
def test_manifests_pass_kubernetes_and_volcano_schemas(values):
    """Pod template: Kubernetes' own schema (strict: unknown fields fail). Job: the minimal
    schema of the Volcano Job CRD (test_kind_volcano.py), strict too."""
    documents = parsed(render_values(values))
    version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(documents[0], version, strict=True)
    job = documents[1]
    template = job["spec"]["tasks"][0]["template"]
    validate_as_pod(template, version)
    assert_strict(job, VOLCANO_JOB)


def test_template_errors_name_the_template_and_line(monkeypatch):
    broken = {
        "job.yaml.j2": "a: 1\nb: {{ spec.no_such_key }}\n",
        "configmap.yaml.j2": "x: {% if %}\n",
    }
    real = render_module._package_text
    spec = spec_from(with_keys())
    monkeypatch.setattr(render_module, "_package_text", lambda name: broken.get(name) or real(name))
    render_module._environment.cache_clear()  # compiled templates are cached per process
    monkeypatch.setattr(render_module, "_environment", render_module._environment.__wrapped__)
    with pytest.raises(RenderError, match=r"templates/configmap.yaml.j2, line 1: .*"):
        render(spec)
    broken.pop("configmap.yaml.j2")
    with pytest.raises(RenderError, match=r"templates/job.yaml.j2, line 2: .*no_such_key"):
        render(spec)


def test_render_is_deterministic():
    values = with_keys(nodes=6, env={"B": "2", "A": "1"}, labels={"z": "1", "a": "2"})
    assert render_values(values).stream() == render_values(values).stream()


def test_bundled_bootstrap_is_shipped_verbatim():
    from importlib import resources

    bundled = resources.files("npu_job.scripts").joinpath("bootstrap.sh").read_text()
    rendered = render(spec_from(with_keys(nodes=3)))
    assert dict(rendered.scripts)["bootstrap.sh"] == bundled
    assert yaml.safe_load_all(rendered.stream()).__next__()["data"]["bootstrap.sh"] == bundled


def test_bootstrap_url_ships_a_fetcher_of_the_bundle_instead_of_the_bundle():
    rendered = render_values(
        with_keys(nodes=3, bootstrap={"url": "https://obs.example.com/x/npu-job.pyz?a=1&b=$(x)"})
    )
    scripts = dict(rendered.scripts)
    fetcher = scripts["fetch-bundle.sh"]
    assert "url='https://obs.example.com/x/npu-job.pyz?a=1&b=$(x)'" in fetcher
    assert scripts["bootstrap.sh"] == BOOTSTRAP_STAND_IN  # the same bootstrap.sh, told where
    assert rendered.bundle is None and "binaryData" not in parsed(rendered)[0]
    job = job_of(rendered)
    assert env_of(job)["NPU_JOB_BUNDLE"] == "/tmp/npu-job.pyz"
    assert rendered.pod_command.startswith(
        "cd /opt/npu-job || exit 1; bash fetch-bundle.sh; bash bootstrap.sh;"
    )


def test_hccl_ports_can_be_reserved_in_the_pod():
    pod = pod_spec(
        job_of(render_values(with_keys(hccl={"base_port": 61000, "reserve_ports": True})))
    )
    assert pod["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_local_reserved_ports", "value": "61000-61015"}
    ]
    assert "securityContext" not in pod_spec(job_of(render_values(with_keys())))
