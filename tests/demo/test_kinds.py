"""The demo's simulator takes the controller's part from the job kind's record and does the
kubelet's part itself, the same for every kind; the fake Kubernetes API lists the pods as the
kind's controller labels them.

Checked with the tests' own kind (``tests/render/fake_kind.py``: pods ``<job>-<i>`` under
subdomain ``<job>``, a label index, container ``trainer``), whose pods look nothing like a
Volcano Job's.
"""

from __future__ import annotations

import base64
import gzip

import pytest
from npu_job.demo import podspec, scenario

from npu_job.errors import InputError
from tests.render import fake_kind
from tests.render.conftest import BUNDLE_STAND_IN, spec_from, with_keys

IPS = ("127.0.0.30", "127.0.0.31", "127.0.0.32")


@pytest.fixture
def registered(monkeypatch):
    yield from fake_kind.register(monkeypatch)


def documents_of(**keys):
    from npu_job.render.render import render

    rendered = render(spec_from(with_keys(**keys)), bundle=BUNDLE_STAND_IN)
    return rendered, scenario.manifest_documents(rendered)


def test_the_pods_of_any_kind_are_its_controllers_with_the_kubelets_env_and_hosts(registered):
    rendered, documents = documents_of(name="tt", kind=fake_kind.NAME, device="cpu", nodes=3)
    specs = podspec.pod_specs(documents, IPS)
    assert [(spec.name, spec.hostname, spec.subdomain) for spec in specs] == [
        (f"tt-{index}", f"tt-{index}", "tt") for index in range(3)
    ]
    for index, spec in enumerate(specs):
        env = spec.env_dict()
        assert env[fake_kind.INDEX_ENV] == str(index) and env["HOSTNAME"] == f"tt-{index}"
        assert env["MA_VJ_NAME"] == "tt"  # the fieldRef on the controller's label
        assert env["NPU_JOB_KIND"] == fake_kind.NAME and "MA_TASK_NAME" not in env
        assert env["MA_CURRENT_HOST_IP"] == IPS[index]
        assert spec.argv == ("/bin/bash", "-c", rendered.pod_command)
        assert spec.restart_policy == "Never" and spec.task == "" and spec.index == index
        others = [(ip, (f"tt-{other}.tt",)) for other, ip in enumerate(IPS)]
        assert spec.hosts == (
            ("127.0.0.1", ("localhost",)),
            *others,
            (IPS[index], (f"tt-{index}.tt", f"tt-{index}")),
        )
        assert "/etc/volcano" not in {mount.mount_path for mount in spec.file_mounts}


def test_the_job_object_is_found_by_its_kinds_apiversion_and_kind(registered):
    _, documents = documents_of(kind=fake_kind.NAME)
    index, job = podspec.find_job(documents)
    assert job["kind"] == "TrainThing" and documents[index] is job
    with pytest.raises(InputError, match="expected exactly one Volcano Job"):
        podspec.find_job(documents, kind=scenario.KINDS["volcano"])


def test_a_pod_count_other_than_the_addresses_names_where_the_kind_counts_pods(registered):
    _, documents = documents_of(kind=fake_kind.NAME, device="cpu", nodes=2)
    with pytest.raises(InputError) as error:
        podspec.pod_specs(documents, IPS)
    assert error.value.field == "spec.replicas"


def test_the_fake_api_lists_the_pods_with_their_controllers_labels(registered):
    rendered, _ = documents_of(name="tt", kind=fake_kind.NAME, device="cpu", nodes=3)
    options = scenario.DemoOptions(nodes=3, tors=3)
    cluster = scenario.simulated_cluster(options, IPS)
    objects = scenario.cluster_objects(cluster, IPS, pods=scenario.rendered_pods(rendered))
    pods = objects["pods"]
    assert [pod["metadata"]["name"] for pod in pods] == ["tt-0", "tt-1", "tt-2"]
    for index, pod in enumerate(pods):
        labels = pod["metadata"]["labels"]
        assert labels[fake_kind.JOB_LABEL] == "tt"
        assert labels[fake_kind.TrainThing.index_label] == str(index)
        assert pod["spec"]["containers"] == [{"name": "trainer", "resources": {}}]
        assert pod["status"]["hostIP"] == IPS[index]
        assert pod["spec"]["nodeName"] == scenario.node_name(IPS[index])


def test_the_volcano_jobs_pods_are_listed_with_volcanos_labels():
    options = scenario.DemoOptions(nodes=3, tors=3, routing_source="api")
    pods = scenario.job_pods(options)
    objects = scenario.cluster_objects(scenario.simulated_cluster(options, IPS), IPS, pods=pods)
    labels = [pod["metadata"]["labels"] for pod in objects["pods"]]
    assert [label["volcano.sh/task-index"] for label in labels] == ["0", "1", "2"]
    assert {(label["volcano.sh/job-name"], label["volcano.sh/task-spec"]) for label in labels} == {
        (scenario.JOB_NAME, scenario.TASK_NAME)
    }
    with pytest.raises(ValueError, match="3 pods for 2 host addresses"):
        scenario.cluster_objects(scenario.simulated_cluster(options, IPS), IPS[:2], pods=pods)


def test_the_demo_renders_the_kind_it_is_given_and_refuses_an_unknown_one(registered):
    values = scenario.demo_spec_values(
        scenario.DemoOptions(kind=fake_kind.NAME), 29500, "/srv/shared"
    )
    assert values["kind"] == fake_kind.NAME
    assert scenario.render_job(values).job.kind == "TrainThing"
    with pytest.raises(ValueError, match="kind must be one of"):
        scenario.DemoOptions(kind="slurm")


@pytest.fixture
def demo_runs(monkeypatch):
    """The options of every run ``npu-job demo`` starts; each stops at once (exit 7)."""
    from npu_job.demo import podsim

    from npu_job import demo
    from npu_job.errors import InconsistentError

    started = []

    def run(options, workspace, **kwargs):
        started.append(options)
        raise InconsistentError("demo: stopped by the test")

    monkeypatch.setattr(demo, "run", run)
    monkeypatch.setattr(podsim, "unshare_unavailable_reason", lambda: None)
    return started


def test_npu_job_demo_kind_runs_the_demo_of_that_kind(registered, demo_runs, tmp_path, capsys):
    from npu_job.cli import main

    assert main(["demo", "--kind", fake_kind.NAME, "--keep", str(tmp_path / "d")]) == 7
    assert [options.kind for options in demo_runs] == [fake_kind.NAME]
    assert "stopped by the test" in capsys.readouterr().err


def test_npu_job_demo_kind_ascendjob_runs_the_npu_job_its_kind_allows(demo_runs, tmp_path):
    """AscendJob runs NPU pods only: the demo renders its NPU job (the workers fall back to gloo
    here) and routes it by the rank table the operator fills."""
    from npu_job.cli import main

    assert main(["demo", "--kind", "ascendjob", "--keep", str(tmp_path / "d")]) == 7
    assert [(o.kind, o.device, o.routing_source) for o in demo_runs] == [
        ("ascendjob", "npu", "rank-table")
    ]
    assert [scenario.demo_device(kind) for kind in ("volcano", "jobset", "ascendjob")] == [
        "cpu",
        "cpu",
        "npu",
    ]


def tor_file_text(cluster) -> str:
    """ranktable_tor.json as CCE's plugin mounts it (base64 of gzip), decoded."""
    return gzip.decompress(base64.b64decode(cluster.ranktable_tor_b64)).decode()


def ascendjob_run():
    options = scenario.DemoOptions(kind="ascendjob", device="npu", nodes=3, tors=3)
    rendered = scenario.render_job(scenario.demo_spec_values(options, 29500, "/srv/shared"))
    pods = scenario.rendered_pods(rendered)
    cluster = scenario.simulated_cluster(options, IPS, [pod.name for pod in pods])
    return rendered, cluster


def test_the_ascendjob_demo_brings_its_topology_and_the_operators_table_fills_rings_config():
    rendered, cluster = ascendjob_run()
    documents = scenario.manifest_documents(rendered)
    kind = rendered.spec.job_kind
    configmap, key, path = scenario.controller_rank_table(kind, scenario.JOB_NAME)
    assert (configmap, key, path) == (
        "rings-config-demo",
        "hccl.json",
        "/user/serverid/devindex/config/hccl.json",
    )
    filled = scenario.filled_by_the_controller(documents, kind, cluster)
    data = {
        doc["metadata"]["name"]: doc.get("data")
        for doc in filled
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap"
    }
    assert data[configmap] == {key: cluster.rank_table_json}
    assert [doc for doc in documents if doc.get("kind") != "ConfigMap"] == [
        doc for doc in filled if doc.get("kind") != "ConfigMap"
    ]
    assert "completed" not in str(documents)  # render's own stays "initializing"
    topology = scenario.user_configmaps(cluster)[scenario.TOPOLOGY_CONFIGMAP]
    specs = podspec.pod_specs(filled + [topology], IPS)
    assert [spec.name for spec in specs] == ["demo-master-0", "demo-worker-0", "demo-worker-1"]
    for spec in specs:
        files = {
            f"{mount.mount_path}/{name}": text
            for mount in spec.file_mounts
            for name, text in mount.files
        }
        assert files[path] == cluster.rank_table_json
        env = spec.env_dict()
        assert files[env["NPU_JOB_TOPOLOGY"]] == cluster.ranktable_tor_b64
        assert "RANK_TABLE_FILE" not in env
    assert rendered.spec.routing_source == "rank-table"


def test_the_simulated_files_name_the_pods_as_the_kinds_controller_does():
    _, cluster = ascendjob_run()
    names = tor_file_text(cluster)
    assert "demo-master-0" in names and "demo-worker-1" in names and "demo-worker-2" not in names
    default = scenario.simulated_cluster(scenario.DemoOptions(nodes=3, tors=3), IPS)
    assert "demo-worker-2" in tor_file_text(default)  # a Volcano Job's task "worker"
    # with no rank table filled by its controller, a Volcano Job's stream is left as rendered
    options = scenario.DemoOptions(nodes=3, tors=3)
    documents = scenario.manifest_documents(
        scenario.render_job(scenario.demo_spec_values(options, 29500, "/srv"))
    )
    assert scenario.filled_by_the_controller(documents, scenario.KINDS["volcano"], default) == (
        documents
    )
