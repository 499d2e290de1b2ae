"""Node reports and the round plan: what every pod's bootstrap says about itself, and the root's
plan over the reports of the nodes present, which is the bootstrap's own plan when they are the
pods every bootstrap saw."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from hypothesis import given
from hypothesis import strategies as st
from npu_job.bootstrap import planner
from npu_job.bootstrap.base.model import Collective, Placement, PlanStatus
from npu_job.bootstrap.nodereport import (
    MAX_REPORT_BYTES,
    NodeReport,
    RoundPlan,
    decode_report,
    encode_report,
    plan_round,
    report_of,
)
from npu_job.demo.images import find_interpreter
from npu_job.demo.synthetic import synthetic_cluster

from npu_job.bundle import BUNDLE_NAME, installed_bundle
from npu_job.errors import InputError

from .test_planner import PROPERTY_SETTINGS, clusters

FULL = NodeReport(
    node_id="10.0.0.7",
    pod_index=3,
    pod_name="job-worker-3",
    device_count=8,
    placement=Placement(tiers=("superpod-0", "spine-1"), tors=("172.16.0.2",), slot=5),
    super_pod_id="sp-0",
    topology_source="/user/config/ranktable_tor.json (cce-ranktable-tor)",
    collective="rhd",
    full_node_devices=8,
)


def placed(node_id: str, pod_index: int, tor: str, slot: int, **fields) -> bytes:
    report = NodeReport(
        node_id=node_id,
        pod_index=pod_index,
        device_count=8,
        placement=Placement(tors=(tor,), slot=slot),
        **fields,
    )
    return encode_report(report)


def four_nodes() -> Dict[str, bytes]:
    """Two ToRs, two nodes each, pods scattered over them."""
    return {
        "a": placed("10.0.0.1", 0, "tor-2", 0),
        "b": placed("10.0.0.2", 1, "tor-1", 1),
        "c": placed("10.0.0.3", 2, "tor-2", 1),
        "d": placed("10.0.0.4", 3, "tor-1", 0),
    }


# --- the report -----------------------------------------------------------------------------------


@pytest.mark.parametrize("report", [FULL, NodeReport()], ids=["full", "unknown"])
def test_a_report_reads_back_equal_and_is_small(report):
    data = encode_report(report)
    assert decode_report(data, "x") == report
    assert json.loads(data)["version"] == 1 and len(data) < 512


def test_a_report_of_unknown_fields_only_is_all_unknown_and_new_fields_are_ignored():
    assert decode_report(b'{"version": 1, "added_later": [1]}', "x") == NodeReport()


def test_a_pods_report_is_what_the_planner_reads_of_it():
    table, topology = synthetic_cluster(6, 2, seed=4, super_pods=0)
    report = report_of(table, 4, topology, "synthetic", Collective.NHR, 8)
    server = table.servers[4]
    assert (report.node_id, report.pod_index, report.pod_name) == (
        server.server_id,
        4,
        server.pod_name,
    )
    assert report.placement == topology.placement_of(server.server_id)
    assert (report.device_count, report.collective, report.full_node_devices) == (8, "nhr", 8)


def test_an_oversized_report_is_refused_on_both_sides():
    huge = NodeReport(node_id="x" * MAX_REPORT_BYTES)
    with pytest.raises(InputError, match=f"node report: size: expected at most {MAX_REPORT_BYTES}"):
        encode_report(huge)
    with pytest.raises(InputError, match=f"who: size: expected at most {MAX_REPORT_BYTES} bytes"):
        decode_report(b" " * (MAX_REPORT_BYTES + 1), "who")


BAD_REPORTS = [
    (b"{not json", "content: expected JSON"),
    (b"\xff\xfe", "content: expected JSON"),
    (b"[1, 2]", "document: expected an object, got an array"),
    (b'{"version": 2}', "version: expected 1 (a node report), got a number 2"),
    (b'{"node_id": "a"}', "version: expected 1 (a node report), got null"),
    (b'{"version": 1, "pod_index": "3"}', "pod_index: expected an integer from -1 (unknown) up"),
    (b'{"version": 1, "pod_index": -2}', "pod_index: expected an integer from -1"),
    (b'{"version": 1, "device_count": true}', "device_count: expected an integer from 0"),
    (b'{"version": 1, "node_id": 7}', "node_id: expected a string, got a number 7"),
    (b'{"version": 1, "placement": []}', "placement: expected an object, got an array"),
    (b'{"version": 1, "placement": {"tors": "t"}}', "placement.tors: expected an array"),
    (b'{"version": 1, "placement": {"tors": [""]}}', "placement.tors[0]: expected a non-empty"),
    (b'{"version": 1, "placement": {"slot": -1}}', "placement.slot: expected a non-negative"),
    (b'{"version": 1, "collective": "tree"}', "collective: expected one of ring, nhr, rhd"),
    (b'{"version": 1, "full_node_devices": 0}', "full_node_devices: expected a positive integer"),
    (b'{"version": 1, "super_pod_id": ""}', "super_pod_id: expected a non-empty string"),
    (b" " * (MAX_REPORT_BYTES + 1), f"size: expected at most {MAX_REPORT_BYTES} bytes"),
]


@pytest.mark.parametrize(
    "data, expected",
    BAD_REPORTS,
    ids=[expected.split(":")[0] + f"-{index}" for index, (_, expected) in enumerate(BAD_REPORTS)],
)
def test_a_bad_report_is_one_problem_line_naming_the_member_and_the_node_goes_last(data, expected):
    with pytest.raises(InputError, match="^" + re.escape(f"member 'bad': {expected}")):
        decode_report(data, "member 'bad'")
    reports = dict(four_nodes(), bad=data)
    result = plan_round(reports)
    (problem,) = result.problems
    assert problem.startswith("member bad: ") and problem.endswith("; planned without placement")
    assert "\n" not in problem and len(problem) < 300
    assert result.plan.status is PlanStatus.SUCCESS
    assert result.order[-1] == "bad" and result.order[:4] == plan_round(four_nodes()).order


# --- the round ------------------------------------------------------------------------------------


def test_the_round_orders_switch_by_switch_then_slot_as_the_planner_does():
    result = plan_round(four_nodes())
    assert result.order == ("d", "b", "a", "c")  # tor-1 slots 0, 1; then tor-2's
    assert result.node_rank == {"d": 0, "b": 1, "a": 2, "c": 3}
    assert result.problems == () and result.plan.collective is Collective.RING


def test_the_round_names_its_nodes_in_rank_order_for_the_rank_table():
    """What npu-run reorders HCCL's rank table by: the node ids, node rank 0 first; "" where a
    member reported none."""
    result = plan_round(dict(four_nodes(), bad=b"junk"))
    assert result.node_ids_in_rank_order == ("10.0.0.4", "10.0.0.2", "10.0.0.1", "10.0.0.3", "")
    assert RoundPlan.decode(result.encode()).node_ids_in_rank_order == (
        result.node_ids_in_rank_order
    )


def test_the_round_plan_reads_back_equal_through_the_store():
    result = plan_round(dict(four_nodes(), bad=b"junk"), collective="rhd")
    again = RoundPlan.decode(result.encode())
    assert again == result and again.order == result.order and again.node_rank == result.node_rank


def test_the_predicted_ratio_reads_back_equal_and_a_plan_without_one_still_decodes():
    result = plan_round(four_nodes(), collective="ring", predict=True)
    assert result.predicted is not None and result.predicted > 1  # the scheduler's crosses 4 times
    assert RoundPlan.decode(result.encode()) == result
    document = json.loads(result.encode())
    del document["predicted"]  # an older root's plan
    assert RoundPlan.decode(json.dumps(document).encode()).predicted is None


def test_the_round_predicts_only_when_asked_and_only_what_the_planner_planned():
    assert plan_round(four_nodes()).predicted is None
    unplaced = {
        key: encode_report(NodeReport(node_id=key, pod_index=i, device_count=8))
        for i, key in enumerate("abcd")
    }
    result = plan_round(unplaced, predict=True)
    assert result.plan.status is PlanStatus.FAILED and result.predicted is None


@pytest.mark.parametrize("collective", list(Collective), ids=str)
def test_the_rounds_predicted_ratio_is_what_npu_job_plan_reports_for_the_same_input(
    collective, tmp_path, capsys
):
    """The pods' reports of a cluster, and ``npu-job plan --json`` over its rank table and ToR
    file: the round predicts the busbw ratio of plan's "ours" over its "scheduler" column."""
    from npu_job.bootstrap.ranktable import rank_table_document
    from npu_job.bootstrap.topology import encode_ranktable_tor

    from npu_job.cli import main

    table, topology = synthetic_cluster(
        24, 4, seed=3, missing_topology=1, multi_tor=1, spine_groups=2
    )
    (tmp_path / "hccl.json").write_text(json.dumps(rank_table_document(table)))
    (tmp_path / "tor.json").write_bytes(encode_ranktable_tor(table, topology))
    argv = ["plan", "--rank-table", str(tmp_path / "hccl.json")]
    argv += ["--topology", str(tmp_path / "tor.json"), "--collective", collective.value, "--json"]
    assert main(argv) == 0
    scores = json.loads(capsys.readouterr().out)["scores"]
    reports = {
        f"member-{pod}": encode_report(report_of(table, pod, topology, "synthetic", collective))
        for pod in range(table.node_count)
    }
    result = plan_round(reports, predict=True)
    assert result.plan.status is PlanStatus.SUCCESS
    expected = scores["ours"]["busbw_fraction"] / scores["scheduler"]["busbw_fraction"]
    assert result.predicted == expected and expected != 1.0


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda d: d.update(version=9), "version: expected 1 (a round plan)"),
        (lambda d: d.update(members=["a", "a", "b", "c"]), "members: expected distinct"),
        (lambda d: d.update(node_rank_of_pod=[0, 1]), "node_rank_of_pod: expected 4 integers"),
        (lambda d: d.update(node_rank_of_pod=[0, 0, 1, 2]), "node_rank_of_pod: expected a perm"),
        (lambda d: d.update(node_rank_of_pod=[0, 1, 2, 3]), "mapping_digest: expected the sha256"),
        (lambda d: d.update(status="maybe"), "status: expected one of success, failed"),
        (lambda d: d.update(collective=None), "collective: expected one of ring, nhr, rhd"),
        (lambda d: d.update(node_ids=["x"]), "node_ids: expected 4 node ids, one per member"),
        (lambda d: d.update(node_ids=[1, 2, 3, 4]), "node_ids[0]: expected a string"),
        (lambda d: d.update(predicted="x3"), "predicted: expected a positive number or null"),
        (lambda d: d.update(predicted=0), "predicted: expected a positive number or null"),
        (lambda d: d.update(predicted=True), "predicted: expected a positive number or null"),
    ],
    ids=[
        *("version", "members", "short", "not-a-permutation", "digest", "status", "collective"),
        *("node-ids-short", "node-id-not-text", "predicted-text", "predicted-0", "predicted-bool"),
    ],
)
def test_a_round_plan_that_is_not_one_is_an_input_error_naming_the_field(change, expected):
    document = json.loads(plan_round(four_nodes()).encode())
    change(document)
    with pytest.raises(InputError, match="^" + re.escape(f"round 3: {expected}")):
        RoundPlan.decode(json.dumps(document).encode(), "round 3")


def test_two_nodes_in_one_slot_are_named_together_and_the_later_goes_last():
    reports = dict(four_nodes(), e=placed("10.0.0.5", 4, "tor-1", 1))
    result = plan_round(reports)
    assert result.problems == (
        "member b and member e both report slot 1 under tor-1; member e planned without placement",
    )
    assert result.order == ("d", "b", "a", "c", "e")


def test_problem_lines_name_the_pods_the_caller_or_the_reports_give():
    """The caller's names (the agents' claims) come first, then each report's pod name; a member
    neither names, or whose name another member gives too, is named by its key as well."""
    reports = dict(four_nodes(), e=placed("10.0.0.5", 4, "tor-1", 1, pod_name="job-worker-4"))
    assert plan_round(reports, pods={"b": "job-worker-1"}).problems == (
        "pod job-worker-1 and pod job-worker-4 both report slot 1 under tor-1; pod job-worker-4 "
        "planned without placement",
    )
    assert plan_round(reports, pods={"e": "x"}).problems[0].startswith("member b and pod x ")
    same = {"b": "job-worker-1", "e": "job-worker-1"}
    assert (
        plan_round(reports, pods=same)
        .problems[0]
        .startswith(
            "pod job-worker-1 (member b) and pod job-worker-1 (member e) both report slot 1"
        )
    )
    malformed = plan_round(dict(four_nodes(), bad=b"{"), pods={"bad": "job-worker-9"})
    assert malformed.problems[0].startswith("pod job-worker-9: content: expected JSON")


def test_one_node_id_twice_is_named_together_and_the_later_loses_its_placement():
    reports = dict(four_nodes(), e=placed("10.0.0.2", 4, "tor-2", 7))
    result = plan_round(reports)
    assert result.problems == (
        "member b and member e both report node_id '10.0.0.2'; member e planned without placement",
    )
    assert result.order == ("d", "b", "a", "c", "e")
    assert result.plan.status is PlanStatus.SUCCESS


def test_reports_that_disagree_on_the_collective_follow_the_first_member():
    reports = four_nodes()
    reports["c"] = placed("10.0.0.3", 2, "tor-2", 1, collective="rhd")
    reports["d"] = placed("10.0.0.4", 3, "tor-1", 0, collective="nhr")
    result = plan_round(reports)
    assert result.plan.collective is Collective.RHD
    assert result.problems == (
        "1 member(s) report another collective (member d); the round plans with 'rhd', as "
        "member c reports",
    )
    assert plan_round(reports, collective=Collective.RING).plan.collective is Collective.RING


def test_an_unknown_device_count_counts_as_full_and_a_short_node_still_stops_the_plan():
    reports = four_nodes()
    reports["e"] = encode_report(NodeReport(pod_index=4))
    assert plan_round(reports).plan.status is PlanStatus.SUCCESS
    reports["e"] = encode_report(NodeReport(pod_index=4, device_count=4))
    failed = plan_round(reports).plan
    assert failed.status is PlanStatus.FAILED and failed.is_identity
    assert any("partial nodes" in reason for reason in failed.reasons)


# --- the key property: the round over every bootstrap's report is the bootstrap's plan -------


member_keys = st.lists(
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12),
    min_size=48,
    max_size=48,
    unique=True,
)


@PROPERTY_SETTINGS
@given(cluster=clusters, collective=st.sampled_from(list(Collective)), keys=member_keys)
def test_the_round_over_every_pods_report_gives_each_pod_its_bootstraps_rank_and_digest(
    cluster, collective, keys
):
    table, topology = cluster
    expected = planner.plan(table, topology, collective)
    reports = {
        keys[pod]: encode_report(report_of(table, pod, topology, "synthetic", collective))
        for pod in range(table.node_count)
    }
    result = plan_round(reports)
    assert result.problems == ()
    assert result.mapping_digest == expected.mapping_digest
    assert result.plan.input_digest == expected.input_digest
    assert [result.node_rank[keys[pod]] for pod in range(table.node_count)] == list(
        expected.node_rank_of_pod
    )


@PROPERTY_SETTINGS
@given(
    cluster=clusters,
    indices=st.lists(st.integers(-1, 10**6), min_size=48, max_size=48),
    shuffle_seed=st.integers(0, 2**16),
    unknown=st.integers(0, 3),
)
def test_any_pod_indices_give_a_permutation_whatever_the_reports_order(
    cluster, indices, shuffle_seed, unknown
):
    """A replaced pod, elastic joiners, nodes without a bootstrap: any pod indices (repeated,
    gaps, unknown) and node ids missing still give ranks 0..n-1, the same in any mapping order."""
    table, topology = cluster
    count = table.node_count
    reports: Dict[str, bytes] = {}
    for pod in range(count):
        report = report_of(table, pod, topology, "synthetic")
        if pod < unknown:  # no bootstrap: a pod index and a device count only
            report = NodeReport(pod_index=indices[pod], device_count=report.device_count)
        else:
            report = NodeReport(**dict(vars(report), pod_index=indices[pod]))
        reports[f"agent-{pod}"] = encode_report(report)
    result = plan_round(reports)
    assert sorted(result.node_rank.values()) == list(range(count))
    assert sorted(result.order) == sorted(reports)
    shuffled: List[str] = list(reports)
    random.Random(shuffle_seed).shuffle(shuffled)
    again = plan_round({key: reports[key] for key in shuffled})
    assert again == result


def test_positions_follow_pod_index_with_unknown_ones_last():
    reports = {
        "z": encode_report(NodeReport(pod_index=7, device_count=8)),
        "y": encode_report(NodeReport(pod_index=-1, device_count=8)),
        "x": encode_report(NodeReport(pod_index=2, device_count=8)),
        "w": encode_report(NodeReport(pod_index=-1, device_count=8)),
    }
    result = plan_round(reports)
    assert result.members == ("x", "z", "w", "y")
    # no topology at all: the identity over the positions, with the planner's reason
    assert result.order == result.members and result.plan.status is PlanStatus.FAILED


# --- on the pod side's oldest Python --------------------------------------------------------------

_ROUND_ON_ANOTHER_PYTHON = """\
import json, sys
sys.path.insert(0, sys.argv[1])  # the job's bundle, as a pod imports it
from npu_job.bootstrap.nodereport import decode_report, encode_report, plan_round
reports = {key: text.encode("latin-1") for key, text in json.load(open(sys.argv[2])).items()}
again = {}
for key, data in reports.items():
    try:
        again[key] = encode_report(decode_report(data, key)).decode()
    except Exception as error:
        again[key] = type(error).__name__
print(json.dumps({"reports": again, "round": plan_round(reports).encode().decode()}))
"""


def _round_on(python: str, bundle: Path, reports: Path) -> str:
    done = subprocess.run(
        [python, "-I", "-c", _ROUND_ON_ANOTHER_PYTHON, str(bundle), str(reports)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_bundles_round_plan_is_the_same_on_python_3_7(tmp_path):
    """The module ships in the job's bundle, which runs on 3.7 (the platform's routing images)."""
    python37 = find_interpreter((3, 7))
    if python37 is None:
        pytest.skip("no CPython 3.7 (python3.7 on PATH or under pyenv) on this machine")
    bundle = tmp_path / BUNDLE_NAME
    bundle.write_bytes(installed_bundle().data)
    table, topology = synthetic_cluster(24, 5, seed=2, multi_tor=2, missing_topology=1)
    reports = {
        f"agent-{(pod * 7) % 24}": encode_report(report_of(table, pod, topology, "t", "rhd"))
        for pod in range(24)
    }
    reports["bad"] = b'{"version": 1, "pod_index": "x"}'
    reports["twice"] = reports["agent-0"]  # one node id twice
    path = tmp_path / "reports.json"
    path.write_text(json.dumps({key: data.decode("latin-1") for key, data in reports.items()}))
    here, there = _round_on(sys.executable, bundle, path), _round_on(python37, bundle, path)
    assert there == here
    round_plan = RoundPlan.decode(json.loads(there)["round"].encode())
    assert len(round_plan.problems) == 2 and round_plan.plan.status is PlanStatus.SUCCESS
