"""``npu-job plan``: the order and its comparison, as text and JSON; bad files are one line, exit 3.

Inputs are generated clusters written in the CCE formats (v1.0 rank table, base64+gzip
``ranktable_tor.json``) and the plain topology format, with the project's own serialisers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from npu_job.bootstrap import planner
from npu_job.bootstrap.base.model import Collective
from npu_job.bootstrap.ranktable import rank_table_document
from npu_job.bootstrap.topology import encode_ranktable_tor
from npu_job.demo.synthetic import synthetic_cluster

from npu_job.cli import main
from npu_job.cli.plan import MISSING_FILE_TIP
from tests.bootstrap.documents import plain_topology_document


@pytest.fixture()
def cluster_dir(tmp_path: Path) -> Path:
    """A 24-node job on 4 ToRs (2 spine groups), one node without topology, one on two ToRs."""
    table, topology = synthetic_cluster(
        24, 4, seed=3, missing_topology=1, multi_tor=1, spine_groups=2
    )
    (tmp_path / "jobstart_hccl.json").write_text(json.dumps(rank_table_document(table)))
    (tmp_path / "ranktable_tor.json").write_bytes(encode_ranktable_tor(table, topology))
    (tmp_path / "topology.json").write_text(json.dumps(plain_topology_document(topology)))
    return tmp_path


def plan_subprocess(*argv: str) -> subprocess.CompletedProcess:
    """``python -m npu_job plan ARGV`` as a separate process, as a user would run it."""
    command = [sys.executable, "-m", "npu_job", "plan", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def run_json(capsys, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _actions(configure) -> dict:
    """The flags ``configure`` adds to a parser, by destination."""
    import argparse

    parser = argparse.ArgumentParser()
    configure(parser)
    return {action.dest: action for action in parser._actions if action.option_strings}


def test_plan_takes_a_pods_settings_from_the_bootstraps_option_table():
    """A setting plan shares with a pod is a row of the one option table, spelled, checked and
    parsed as the bootstrap's flag; plan's help for it is the row's too."""
    from npu_job.bootstrap.command import configure as bootstrap_flags
    from npu_job.bootstrap.options import OPTIONS, BootstrapOptions

    from npu_job.cli.plan import configure as plan_flags

    plan, pod = _actions(plan_flags), _actions(bootstrap_flags)
    shared = sorted(set(plan) & set(BootstrapOptions._fields) - {"json"})  # plan's --json: its own
    rows = {option.name: option for option in OPTIONS}
    assert shared == sorted(name for name, row in rows.items() if row.plan is not None)
    assert len(shared) == 12
    for name in shared:
        mine, theirs, row = plan[name], pod[name], rows[name]
        assert (mine.option_strings, mine.choices, mine.type, mine.default) == (
            theirs.option_strings,
            theirs.choices,
            theirs.type,
            theirs.default,
        ), name
        assert mine.help == row.plan.help and mine.metavar == (row.plan.metavar or theirs.metavar)


def test_text_output_lists_the_new_order_and_compares_three_orders(cluster_dir, capsys):
    assert (
        main(
            [
                "plan",
                "--rank-table",
                str(cluster_dir / "jobstart_hccl.json"),
                "--topology",
                str(cluster_dir / "topology.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("plan: success (ring), 24 nodes on")
    assert "new rank  pod index  server" in out
    assert out.count("spine-") >= 23  # switch path of every placed node, outermost tier first
    assert "- (no topology)" in out
    comparison = out[out.index("comparison for ring: U=8 uplinks per ToR") :]
    for label in (
        "cross-ToR edges of a ring r->r+1 (lower bound 6)",
        "ring edges crossing each tier, outermost first",
        "max flows out of one ToR",
        "expected colliding flow pairs",
        "busbw fraction, ECMP Monte-Carlo",
    ):
        assert label in comparison
    ring_row = next(
        line for line in comparison.splitlines() if line.startswith("cross-ToR edges of a ring")
    )
    assert (
        ring_row.split()[-1] == "6"
    )  # ours reaches the bound: 4 ToRs + the two-ToR node + the unplaced node


def test_json_matches_the_planner_and_reaches_the_ring_bound(cluster_dir, capsys):
    report = run_json(
        capsys,
        "--rank-table",
        str(cluster_dir),
        "--topology",
        str(cluster_dir / "topology.json"),
        "--seed",
        "4",
    )
    assert (
        report["version"] == 1 and report["status"] == "success" and report["collective"] == "ring"
    )
    assert [entry["node_rank"] for entry in report["order"]] == list(range(24))
    assert sorted(entry["pod_index"] for entry in report["order"]) == list(range(24))
    assert set(report["scores"]) == {"scheduler", "random", "ours"}
    ours = report["scores"]["ours"]
    assert ours["ring_cross_edges"] == ours["ring_lower_bound"] == 6
    assert ours["ring_cross_edges_by_tier"] == ours["ring_lower_bound_by_tier"]
    assert ours["busbw_fraction"] == pytest.approx(1.0)
    assert report["scores"]["scheduler"]["ring_cross_edges"] > 6
    assert report["model"] == {"uplinks": 8, "samples": 16, "seed": 4}

    table, topology = synthetic_cluster(
        24, 4, seed=3, missing_topology=1, multi_tor=1, spine_groups=2
    )
    expected = planner.plan(table, topology)
    assert (report["rank_mapping"], report["input_digest"]) == (
        expected.rank_mapping,
        expected.input_digest,
    )


def test_ranktable_tor_beside_the_rank_table_is_used_by_default(cluster_dir, capsys):
    report = run_json(capsys, "--rank-table", str(cluster_dir / "jobstart_hccl.json"))
    assert report["topology"] == f"{cluster_dir / 'ranktable_tor.json'} (cce-ranktable-tor)"
    assert report["status"] == "success"


@pytest.mark.parametrize("beside", [True, False], ids=["ranktable_tor.json beside", "no topology"])
def test_plan_reads_the_files_a_pod_reads_and_plans_as_it_does(cluster_dir, capsys, beside):
    """npu-job plan and a pod's bootstrap share one loader: on the same files (and a cluster that
    offers nothing else), the same topology source and the same order."""
    from npu_job.bootstrap.ranktable import parse_rank_table
    from npu_job.bootstrap.run import bootstrap

    if not beside:
        (cluster_dir / "ranktable_tor.json").unlink()
    report = run_json(capsys, "--rank-table", str(cluster_dir))
    table = parse_rank_table((cluster_dir / "jobstart_hccl.json").read_bytes(), "t")
    me = table.servers[0]
    env = {
        "RANK_TABLE_FILE": str(cluster_dir),
        "MA_CURRENT_HOST_IP": me.server_id,
        "VC_TASK_INDEX": str(me.pod_index),
        "NPU_JOB_OUTPUT_DIR": str(cluster_dir / "out"),
        "NPU_JOB_K8S_TOPOLOGY": "0",
    }
    pod = bootstrap({}, env).route_plan
    assert pod["topology"] == (report["topology"] or "none")
    if beside:
        assert (pod["status"], report["status"]) == ("success", "success")
        assert pod["mapping_digest"] == report["mapping_digest"]
    else:
        assert pod["status"] == report["status"] == "failed"


def test_collective_comes_from_hccl_algo_unless_given(cluster_dir, capsys, monkeypatch):
    monkeypatch.setenv("HCCL_ALGO", "level0:NA;level1:H-D_R")
    assert run_json(capsys, "--rank-table", str(cluster_dir))["collective"] == "rhd"
    assert (
        run_json(capsys, "--rank-table", str(cluster_dir), "--collective", "nhr")["collective"]
        == "nhr"
    )


def test_uplinks_and_samples_shape_the_model(cluster_dir, capsys):
    report = run_json(capsys, "--rank-table", str(cluster_dir), "--uplinks", "1", "--samples", "0")
    scheduler = report["scores"]["scheduler"]
    assert scheduler["uplinks"] == 1 and scheduler["busbw_fraction"] is None
    assert scheduler["best_max_link_load"] == scheduler["max_flows_out"]  # one uplink: ceil(x / 1)


def test_a_job_that_cannot_be_planned_is_shown_with_its_reason(tmp_path, capsys):
    table, topology = synthetic_cluster(2, 2, seed=1)
    (tmp_path / "jobstart_hccl.json").write_text(json.dumps(rank_table_document(table)))
    (tmp_path / "ranktable_tor.json").write_bytes(encode_ranktable_tor(table, topology))
    assert main(["plan", "--rank-table", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: failed (ring)")
    assert "reason: only 2 node(s); reordering needs at least 3 (platform rule)" in out


@pytest.mark.parametrize(
    ("files", "argv", "expected"),
    [
        ({}, ["--rank-table", "{d}/missing.json"], "{d}/missing.json: file: "),
        (
            {"t.json": '{"status": "completed", "server_list": ['},
            ["--rank-table", "{d}/t.json"],
            "{d}/t.json: line 1",
        ),
        ({"t.json": "[1, 2]"}, ["--rank-table", "{d}/t.json"], "{d}/t.json"),
        (
            {"topo.json": "{not json"},
            ["--rank-table", "{rt}", "--topology", "{d}/topo.json"],
            "{d}/topo.json",
        ),
    ],
    ids=["missing-rank-table", "truncated-json", "not-a-rank-table", "bad-topology"],
)
def test_bad_input_is_one_line_exit_3_without_traceback(
    cluster_dir, tmp_path, files, argv, expected
):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name, text in files.items():
        (bad / name).write_text(text)
    fill = {"d": str(bad), "rt": str(cluster_dir / "jobstart_hccl.json")}
    result = plan_subprocess(*(arg.format(**fill) for arg in argv))
    assert result.returncode == 3, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"npu-job: error: {expected.format(**fill)}")
    missing = not files  # a file a newcomer does not have: the TIP says where to get some
    assert lines[1:] == ([f"npu-job: TIP: {MISSING_FILE_TIP}"] if missing else [])
    assert "Traceback" not in result.stderr


def test_a_missing_file_names_the_demo_option_that_writes_inputs(tmp_path, capsys):
    """The TIP's command exists and writes what plan then reads."""
    assert main(["plan", "--rank-table", "jobstart_hccl.json"]) == 3
    assert "npu-job demo --write-inputs DIR" in capsys.readouterr().err
    assert main(["demo", "--write-inputs", str(tmp_path / "inputs")]) == 0
    capsys.readouterr()
    assert main(["plan", "--rank-table", str(tmp_path / "inputs" / "jobstart_hccl.json")]) == 0


def test_plan_holds_the_rank_table_to_the_jobs_node_count(cluster_dir, capsys):
    """The pod's check, in plan: --nnodes is the job's node count (plan reads no MA_NUM_HOSTS)."""
    table = str(cluster_dir / "jobstart_hccl.json")
    assert main(["plan", "--rank-table", table, "--nnodes", "25"]) == 7
    assert capsys.readouterr().err.splitlines()[0] == (
        f"npu-job: error: {table}: server_count: 24 servers, but the job has 25 nodes (--nnodes)"
    )
    assert main(["plan", "--rank-table", table, "--nnodes", "24", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "success"


def test_plan_reads_no_node_count_from_the_environment(cluster_dir, capsys, monkeypatch):
    monkeypatch.setenv("MA_NUM_HOSTS", "25")
    assert main(["plan", "--rank-table", str(cluster_dir), "--json"]) == 0


def test_subprocess_json_and_usage_errors(cluster_dir):
    ok = plan_subprocess("--rank-table", str(cluster_dir), "--json", "--collective", "rhd")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["version"] == 1 and report["collective"] == Collective.RHD.value
    usage = plan_subprocess("--rank-table", str(cluster_dir), "--uplinks", "0")
    assert usage.returncode == 2 and "expected an integer >= 1, got '0'" in usage.stderr


def test_a_flow_style_yaml_topology_is_read_by_the_pod_and_by_plan(tmp_path, capsys, monkeypatch):
    """``{servers: {...}}`` starts like JSON and is YAML: every entry reads it as the file it is."""
    from tests.bootstrap.documents import v1_0
    from tests.cli.bad_input import V1_0_IDS, assert_planned, clean_environment, run_everywhere

    clean_environment(monkeypatch)
    rank_table = tmp_path / "jobstart_hccl.json"
    rank_table.write_text(json.dumps(v1_0()))
    topology = tmp_path / "topology.yaml"
    first, second, third = V1_0_IDS
    topology.write_text(
        f'{{servers: {{"{first}": tor-1, "{second}": tor-2, "{third}": [spine, tor-1]}}}}'
    )
    assert_planned(
        run_everywhere(rank_table, topology, V1_0_IDS[0], tmp_path / "out", capsys, "stdlib")
    )
