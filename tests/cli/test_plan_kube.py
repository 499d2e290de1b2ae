"""``npu-job plan`` on the cluster's own objects as files: a job's pods instead of a rank table,
HyperNodes or node labels as the topology, and the one-file `kubectl get hypernodes,nodes,pods
-o json > cluster.json` a user runs on a laptop. Fixtures: tests/bootstrap/fixtures/kube."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from npu_job.bootstrap.base.model import Device, RankTable, Server
from npu_job.bootstrap.ranktable import rank_table_document

from npu_job.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "bootstrap" / "fixtures" / "kube"
CLUSTER = FIXTURES / "cluster.json"
PODS = FIXTURES / "pods.json"
NODES = FIXTURES / "nodes.json"
HYPERNODES = FIXTURES / "hypernodes-three-tier.yaml"
# the job's pods 0..7 run on these nodes; ranked by tor-0, tor-1 (spine-0), tor-2, tor-3 (spine-1)
ORDER = [
    "node-0",
    "node-2",
    "node-4",
    "node-3",
    "node-7",
    "node-10",
    "node-8",
    "node-11",
]  # by IP in a ToR


def plan_json(capsys, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_cluster_file_gives_the_plan(capsys):
    report = plan_json(capsys, "--pods", str(CLUSTER))
    assert report["status"] == "success" and report["pods"] == str(CLUSTER)
    assert report["rank_table"] is None
    assert report["topology"] == f"{CLUSTER} (volcano-hypernodes)"
    assert [entry["node"] for entry in report["order"]] == ORDER
    assert report["order"][0] == {
        "node_rank": 0,
        "pod_index": 4,
        "server_id": "10.1.7.21",
        "node": "node-0",
        "tiers": ["cluster-a", "spine-0"],
        "tors": ["tor-0"],
        "slot": None,
    }
    assert report["master_index"] == 4
    scores = report["scores"]
    assert scores["ours"]["ring_cross_edges"] == scores["ours"]["ring_lower_bound"] == 5
    assert scores["scheduler"]["ring_cross_edges"] == 8


def test_pods_with_the_topology_and_nodes_as_separate_files_plan_alike(capsys):
    whole = plan_json(capsys, "--pods", str(CLUSTER))
    apart = plan_json(
        capsys, "--pods", str(PODS), "--topology", str(HYPERNODES), "--nodes", str(NODES)
    )
    assert apart["mapping_digest"] == whole["mapping_digest"]
    assert apart["input_digest"] == whole["input_digest"]


def test_pods_alone_have_no_topology_and_the_plan_says_so(capsys):
    report = plan_json(capsys, "--pods", str(PODS))
    assert report["status"] == "failed" and report["reasons"] == ["no switch topology available"]


def test_node_labels_by_named_keys_from_the_cluster_file(capsys):
    cluster = json.loads(CLUSTER.read_text())
    report = plan_json(
        capsys,
        "--pods",
        str(PODS),
        "--topology",
        str(NODES),
        "--topology-labels",
        "topology.kubernetes.io/zone,example.com/rack",
    )
    assert report["topology"] == f"{NODES} (k8s-node-labels)" and report["status"] == "success"
    racks = {
        n["metadata"]["name"]: n["metadata"]["labels"].get("example.com/rack")
        for n in cluster["items"]
        if n["kind"] == "Node"
    }
    assert [entry["tors"] for entry in report["order"]] == sorted(
        ([racks[e["node"]] or "zone-a"] for e in report["order"]),
        key=lambda tors: (tors != ["zone-a"], tors),
    )  # node-11 (no rack) by the zone alone, first


def test_a_rank_table_of_node_addresses_with_hypernodes_and_nodes(tmp_path, capsys):
    nodes = json.loads(NODES.read_text())["items"]
    ips = [n["status"]["addresses"][0]["address"] for n in nodes]
    servers = tuple(
        Server(ip, i, tuple(Device(str(d), None, i * 2 + d) for d in range(2)))
        for i, ip in enumerate(ips)
    )
    (tmp_path / "t.json").write_text(
        json.dumps(rank_table_document(RankTable("1.0", "completed", servers)))
    )
    report = plan_json(
        capsys,
        "--rank-table",
        str(tmp_path / "t.json"),
        "--topology",
        str(HYPERNODES),
        "--nodes",
        str(NODES),
    )
    assert report["status"] == "success"
    assert report["order"][0]["tiers"] == ["cluster-a", "spine-0"]
    assert report["order"][-1]["server_id"] == ips[11]  # node-11: in no HyperNode


def test_a_job_not_all_scheduled_is_one_line_exit_4(tmp_path, capsys):
    document = json.loads(PODS.read_text())
    del document["items"][3]["spec"]["nodeName"]
    (tmp_path / "pods.json").write_text(json.dumps(document))
    assert main(["plan", "--pods", str(tmp_path / "pods.json")]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"npu-job: error: {tmp_path / 'pods.json'}: pods: expected every pod of job 'llama' "
        "scheduled; 7 of 8 pods of job 'llama' scheduled; waiting: 'llama-worker-3' not scheduled"
    ]


@pytest.mark.parametrize(
    "count",
    [b"1000000000000", b'"999999999"', b"9" * 4300, b"1025"],
    ids=["an int", "a string", "4300 digits", "one past the cap"],
)
def test_a_pod_asking_for_more_than_1024_devices_is_one_line_exit_3(count, tmp_path, capsys):
    """The roster builds an object per device: a count is refused before any is built (it took
    plan past 2 GiB), for an int and for digits alike."""
    document = json.loads(PODS.read_text())
    document["items"][5]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 7}}
    text = (
        json.dumps(document).encode().replace(b'"nvidia.com/gpu": 7', b'"nvidia.com/gpu": ' + count)
    )
    (tmp_path / "pods.json").write_bytes(text)
    assert main(["plan", "--pods", str(tmp_path / "pods.json")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"npu-job: error: {tmp_path / 'pods.json'}: items[5] (Pod 'llama-worker-5'): "
        "spec.containers[0].resources.limits.nvidia.com/gpu: expected a whole number of "
        "devices, at most 1024, got "
    ), err


def test_pods_of_two_jobs_need_job_and_it_picks_one(tmp_path, capsys):
    document = json.loads(PODS.read_text())
    stranger = json.loads(json.dumps(document["items"][0]))
    stranger["metadata"]["labels"]["volcano.sh/job-name"] = "other"
    document["items"].append(stranger)
    (tmp_path / "pods.json").write_text(json.dumps(document))
    assert main(["plan", "--pods", str(tmp_path / "pods.json")]) == 3
    err = capsys.readouterr().err
    assert "expected the pods of one Volcano Job, got pods of 2 jobs ('llama', 'other')" in err
    assert "TIP: --job names the one to plan" in err
    assert (
        plan_json(
            capsys,
            "--pods",
            str(tmp_path / "pods.json"),
            "--job",
            "llama",
            "--topology",
            str(CLUSTER),
        )["status"]
        == "success"
    )


@pytest.mark.parametrize(
    "argv", [[], ["--rank-table", "x", "--pods", "y"]], ids=["neither", "both"]
)
def test_one_of_rank_table_and_pods_is_required(argv, capsys):
    assert main(["plan", *argv]) == 2
    assert "--rank-table" in capsys.readouterr().err


def test_the_laptop_command_as_a_user_runs_it():
    """`npu-job plan --pods cluster.json` in its own process: the text report, notes on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "npu_job", "plan", "--pods", str(CLUSTER)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        lines[0]
        == "plan: success (ring), 8 nodes on 5 switch group(s); master index 4 (pod of new rank 0)"
    )
    assert "       0          4  10.1.7.21 (node-0)   cluster-a > spine-0 > tor-0" in lines
    assert "       7          6  10.1.5.77 (node-11)  - (no topology)" in lines


def test_the_pods_of_another_kind_are_planned_with_its_kind_and_an_unknown_one_refused(
    tmp_path, capsys, monkeypatch
):
    """--kind names the kind whose labels mark the job's pods (a kind of the tests' own here,
    tests/bootstrap/testkind.py, registered as a kind module's registry line does)."""
    from npu_job import kinds

    from ..bootstrap.testkind import NUMBERED, as_numbered

    monkeypatch.setitem(kinds.KINDS, NUMBERED.name, NUMBERED)
    document = json.loads(CLUSTER.read_text())
    document["items"] = [
        as_numbered(item) if item["kind"] == "Pod" else item for item in document["items"]
    ]
    (tmp_path / "cluster.json").write_text(json.dumps(document))
    report = plan_json(capsys, "--pods", str(tmp_path / "cluster.json"), "--kind", "numbered")
    assert [entry["node"] for entry in report["order"]] == ORDER
    assert main(["plan", "--pods", str(tmp_path / "cluster.json")]) == 3  # no Volcano Job's
    assert "expected pods of a Volcano Job (label volcano.sh/job-name)" in capsys.readouterr().err
    assert main(["plan", "--pods", str(CLUSTER), "--kind", "slurm"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "npu-job: error: command line: --kind: expected a job kind, one of "
        f"{', '.join(sorted(kinds.KINDS))}; got 'slurm'"
    ]
