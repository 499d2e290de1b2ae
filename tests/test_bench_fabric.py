"""The fabric benchmark's pure parts (benchmarks/_fabric_model.py): shapes, the send/recv
schedules of halving-doubling and NHR, the link model, the bandwidth formulas, the counters.

The schedules are checked by running them on contributor counts (an exact allreduce leaves every
rank's contribution once in every block of every rank) and against the scorer's phases, which
are what the planner optimises: the benchmark measures the traffic the planner reasons about.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from npu_job.bootstrap import planner, scorer
from npu_job.bootstrap.base.model import Collective
from npu_job.demo.synthetic import synthetic_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _fabric_model as model  # noqa: E402


# -- shapes ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, sizes, spines, over",
    [
        ("12x4", (3, 3, 3, 3), 0, 1.0),
        ("10x4", (3, 3, 2, 2), 0, 1.0),
        ("16:6,4,4,2", (6, 4, 4, 2), 0, 1.0),
        ("16x4/2", (4, 4, 4, 4), 2, 1.0),
        ("16x4/2@2", (4, 4, 4, 4), 2, 2.0),
        ("16:6,4,4,2/2@1.5", (6, 4, 4, 2), 2, 1.5),
        (" 6x3 ", (2, 2, 2), 0, 1.0),
    ],
)
def test_shapes_parse(text, sizes, spines, over):
    shape = model.parse_shape(text)
    assert (shape.tor_sizes, shape.spines, shape.oversubscription) == (sizes, spines, over)
    assert shape.nodes == sum(sizes) and shape.tors == len(sizes)


@pytest.mark.parametrize(
    "text, says",
    [
        ("12", "expected NODESxTORS"),
        ("12x0", "expected 1 to 12 ToRs"),
        ("4x5", "expected 1 to 4 ToRs"),
        ("16:6,4,4", "add up to 14, not 16"),
        ("4:4,0", "at least one node"),
        ("2x1", "expected 3 to 64 nodes"),
        ("100x4", "expected 3 to 64 nodes"),
        ("16x4/1", "expected 2 to 4 spine groups"),
        ("16x4/5", "expected 2 to 4 spine groups"),
        ("16x4/2@0.5", "at least 1"),
        ("16x4/2@", "expected NODESxTORS"),
        ("12x4x2", "expected NODESxTORS"),
    ],
)
def test_bad_shapes_say_what_was_expected(text, says):
    with pytest.raises(ValueError, match=says) as caught:
        model.parse_shape(text)
    assert repr(text) in str(caught.value)


def test_spine_groups_split_tors_as_the_synthetic_generator_does():
    shape = model.parse_shape("16:6,4,4,2/2@2")
    table, topology = synthetic_cluster(
        16, 4, tor_sizes=shape.tor_sizes, spine_groups=2, scatter=False
    )
    spine_by_tor = {p.tors[0]: p.tiers[0] for p in topology.placements.values()}
    ordered = sorted(spine_by_tor, key=lambda ip: tuple(map(int, ip.split("."))))
    assert [int(spine_by_tor[t].split("-")[1]) for t in ordered] == [
        shape.spine_of_tor(t) for t in range(4)
    ]
    assert [shape.tors_under_spine(g) for g in range(2)] == [2, 2]


# -- schedules ---------------------------------------------------------------------------------
def _allreduced(plan: model.Schedule) -> bool:
    everyone = {rank: 1 for rank in range(plan.nodes)}
    return all(block == everyone for rank in model.simulate(plan) for block in rank)


@pytest.mark.parametrize("nodes", range(2, 34))
def test_rhd_is_an_exact_allreduce_for_any_node_count(nodes):
    plan = model.rhd_schedule(nodes)
    assert plan.exact and _allreduced(plan)


@pytest.mark.parametrize("nodes", [2, 4, 8, 16, 32, 64])
def test_nhr_is_an_exact_allreduce_on_powers_of_two(nodes):
    plan = model.nhr_schedule(nodes)
    assert plan.exact and _allreduced(plan)


@pytest.mark.parametrize("nodes", [3, 5, 6, 12, 16 + 4])
def test_nhr_on_other_counts_is_marked_as_a_pattern_not_a_sum(nodes):
    plan = model.nhr_schedule(nodes)
    assert not plan.exact and not _allreduced(plan)


def test_a_broken_schedule_is_caught_by_the_simulation():
    plan = model.rhd_schedule(8)
    first = plan.steps[0]
    dropped = model.Step(first.label, first.distance, first.transfers[1:])
    broken = model.Schedule(
        plan.collective, plan.nodes, plan.blocks, True, (dropped,) + plan.steps[1:]
    )
    assert not _allreduced(broken)


def _flows_by_distance(plan: model.Schedule):
    """(distance or fold label) -> Counter of (source, target) -> share of the buffer."""
    flows = {}
    for step in plan.steps:
        key = step.distance or step.label
        for transfer in step.transfers:
            counter = flows.setdefault(key, Counter())
            counter[(transfer.source, transfer.target)] += len(transfer.blocks) / plan.blocks
    return flows


@pytest.mark.parametrize("collective", [Collective.RHD, Collective.NHR])
@pytest.mark.parametrize("nodes", [3, 4, 6, 8, 12, 16, 20])
def test_schedules_move_the_scorers_volumes_between_the_scorers_pairs(collective, nodes):
    """Per distance, the reduce-scatter and allgather steps together are the scorer's phase:
    the same flows, each carrying the phase's volume (fold/unfold: the whole buffer)."""
    flows = _flows_by_distance(model.schedule(collective, nodes))
    phases = scorer.phases(nodes, collective)
    folds = [p for p in phases if "fold" in p.label]
    for phase in folds:
        key = "fold" if phase.label.endswith(" fold") else "unfold"
        assert flows.pop(key) == Counter({flow: phase.volume for flow in phase.flows})
    for phase in phases:
        if phase in folds:
            continue
        distance = int(phase.label.split("d=")[1])
        measured = flows.pop(distance)
        expected = Counter({flow: phase.volume for flow in phase.flows})  # rhd: both directions
        assert set(measured) == set(expected)
        for flow, volume in measured.items():
            assert volume == pytest.approx(expected[flow])
    assert not flows


def test_rhd_goes_far_first_and_nhr_near_first():
    rhd = [s.distance for s in model.rhd_schedule(16).steps]
    nhr = [s.distance for s in model.nhr_schedule(16).steps]
    assert rhd == [8, 4, 2, 1, 1, 2, 4, 8]
    assert nhr == [1, 2, 4, 8, 8, 4, 2, 1]
    first = model.nhr_schedule(16).steps[0]
    assert {(t.source - t.target) % 16 for t in first.transfers} == {1}
    assert {len(t.blocks) for t in first.transfers} == {8}  # half the buffer at distance 1


# -- the link model ----------------------------------------------------------------------------
def _placed(text: str, seed: int = 0):
    shape = model.parse_shape(text)
    table, topology = synthetic_cluster(
        shape.nodes, shape.tors, tor_sizes=shape.tor_sizes, spine_groups=shape.spines, seed=seed
    )
    tors = sorted(
        {p.tors[0] for p in topology.placements.values()},
        key=lambda ip: tuple(map(int, ip.split("."))),
    )
    tor_of_pod = [tors.index(topology.placement_of(s.server_id).tors[0]) for s in table.servers]
    return shape, table, topology, tor_of_pod


def test_a_flow_crosses_the_links_of_its_path():
    shape = model.parse_shape("8x4/2@2")
    tor_of_pod = [0, 0, 1, 1, 2, 2, 3, 3]
    assert model.path(shape, tor_of_pod, 0, 0) == ()
    assert model.path(shape, tor_of_pod, 0, 1) == (("node-up", 0), ("node-down", 1))
    assert model.path(shape, tor_of_pod, 0, 2) == (
        ("node-up", 0),
        ("tor-up", 0),
        ("tor-down", 1),
        ("node-down", 2),
    )
    assert model.path(shape, tor_of_pod, 0, 7) == (
        ("node-up", 0),
        ("tor-up", 0),
        ("spine-up", 0),
        ("spine-down", 1),
        ("tor-down", 3),
        ("node-down", 7),
    )
    assert model.link_rate(shape, ("spine-up", 0), 100.0) == 100.0  # 2 ToRs at 100 / 2
    assert model.link_rate(shape, ("tor-up", 3), 100.0) == 100.0


@pytest.mark.parametrize("text", ["6x3", "12x4", "16:6,4,4,2", "20:9,5,3,2,1"])
@pytest.mark.parametrize("collective", list(Collective))
def test_without_spines_the_link_model_is_the_scorer_with_one_uplink(text, collective):
    shape, table, topology, tor_of_pod = _placed(text)
    keys = scorer.switch_keys(table, topology)
    for order in (
        tuple(range(shape.nodes)),
        planner.plan(table, topology, collective).pod_of_node_rank,
    ):
        predicted = model.predict(shape, tor_of_pod, order, collective, 1.0, 1.0)
        score = scorer.score_order(order, keys, collective, uplinks=1, samples=0)
        ideal = sum(p.volume for p in scorer.phases(shape.nodes, collective))
        assert ideal / predicted.seconds == pytest.approx(score.best_busbw_fraction)


def test_the_ring_link_bytes_are_the_flows_on_each_uplink():
    shape = model.parse_shape("6x3")
    tor_of_pod = [0, 1, 2, 0, 1, 2]  # scheduler order alternates: every ring edge crosses
    predicted = model.predict(shape, tor_of_pod, tuple(range(6)), Collective.RING, 600.0, 1.0)
    per_flow = 2 * 5 / 6 * 600.0
    for tor in range(3):
        assert predicted.link_bytes[("tor-up", tor)] == pytest.approx(2 * per_flow)
        assert predicted.link_bytes[("tor-down", tor)] == pytest.approx(2 * per_flow)
    assert predicted.seconds == pytest.approx(2 * per_flow)  # two flows share every uplink
    contiguous = model.predict(shape, tor_of_pod, (0, 3, 1, 4, 2, 5), Collective.RING, 600.0, 1.0)
    assert contiguous.seconds == pytest.approx(per_flow)


def test_an_oversubscribed_spine_slows_the_flows_that_cross_it():
    shape = model.parse_shape("8x4/2@4")
    tor_of_pod = [0, 0, 1, 1, 2, 2, 3, 3]
    order = tuple(range(8))  # ToR-contiguous: 2 ring edges cross the spines, one each way
    fast = model.predict(model.parse_shape("8x4/2"), tor_of_pod, order, Collective.RING, 1.0, 1.0)
    slow = model.predict(shape, tor_of_pod, order, Collective.RING, 1.0, 1.0)
    assert slow.seconds == pytest.approx(2 * fast.seconds)  # spine uplink at 2 ToRs / 4


# -- formulas and counters ---------------------------------------------------------------------
def test_bandwidths_follow_nccl_tests():
    assert model.algbw(8e6, 2.0) == 4e6
    assert model.allreduce_busbw(4e6, 8) == pytest.approx(4e6 * 2 * 7 / 8)
    assert model.allreduce_busbw(1.0, 2) == 1.0


SS_SAMPLE = """\
0      0      198.18.0.10:41234 198.18.0.11:53100
\t bbr wscale:10,10 rto:204 mss:8948 bytes_sent:1200 bytes_acked:1000 bytes_received:70
0      0      198.18.0.10:29400 198.18.0.12:40000
\t cubic bytes_acked:5 bytes_received:900
ESTAB 0 0 [::ffff:198.18.0.10]:41236 [::ffff:198.18.0.13]:53102
\t reno bytes_acked:7
"""


def test_ss_output_is_read_with_or_without_the_state_column():
    sockets = model.parse_ss(SS_SAMPLE)
    seen = [(s.local_port, s.peer, s.peer_port, s.bytes_acked, s.bytes_received) for s in sockets]
    assert seen == [
        (41234, "198.18.0.11", 53100, 1000, 70),
        (29400, "198.18.0.12", 40000, 5, 900),
        (41236, "::ffff:198.18.0.13", 53102, 7, 0),
    ]


def test_bytes_sent_by_peer_are_deltas_and_skip_the_store():
    before = model.parse_ss(SS_SAMPLE)
    after = [
        model.Socket(
            s.local, s.local_port, s.peer, s.peer_port, s.bytes_acked + 100, s.bytes_received
        )
        for s in before
    ]
    after.append(model.Socket("198.18.0.10", 5000, "198.18.0.11", 6000, 50, 0))  # a new socket
    assert model.sent_by_peer(before, after, ignore_ports=(29400,)) == {
        "198.18.0.11": 150,
        "::ffff:198.18.0.13": 100,
    }


def test_ring_check_finds_the_direction_and_the_worst_share():
    order = (2, 0, 1, 3)  # rank -> pod
    to_previous = {2: {3: 98, 0: 2}, 0: {2: 100}, 1: {0: 99, 3: 1}, 3: {1: 100}}
    check = model.ring_check(to_previous, order)
    assert check.direction == -1 and check.worst_share == pytest.approx(0.98)
    assert check.bytes_per_rank == 100
    spread = {pod: {peer: 10 for peer in range(4) if peer != pod} for pod in range(4)}
    assert model.ring_check(spread, order).direction == 0


def test_link_counters_come_from_ip_json():
    text = '[{"ifname":"t0u","stats64":{"tx":{"bytes":123},"rx":{"bytes":1}}},{"ifname":"lo"}]'
    assert model.link_tx_bytes(text) == {"t0u": 123}


def test_median():
    assert model.median([3.0, 1.0, 2.0]) == 2.0
    assert model.median([4.0, 1.0, 2.0, 3.0]) == 2.5


# -- placement and the result table (bench_fabric.py's pure parts) ----------------------------
import argparse  # noqa: E402

import bench_fabric  # noqa: E402
from npu_job.bootstrap.base.model import PlanStatus  # noqa: E402


@pytest.mark.parametrize("text", ["12x4", "16:6,4,4,2", "16x4/2@2"])
def test_the_job_is_placed_as_the_shape_says_from_cce_inputs(text):
    shape = model.parse_shape(text)
    job = bench_fabric.make_job(shape, seed=0)
    table = job.cluster.table
    ips = [f"198.18.0.{10 + i}" for i in range(shape.nodes)]
    assert [s.server_id for s in table.servers] == ips
    assert tuple(job.tor_of_pod.count(t) for t in range(shape.tors)) == shape.tor_sizes
    assert job.tor_of_pod != tuple(sorted(job.tor_of_pod))  # the scheduler scattered the pods
    assert all(plan.status is PlanStatus.SUCCESS for plan in job.plans.values())
    assert '"tor_ip"' not in job.cluster.rank_table_json
    if shape.spines:  # CCE's file has no spine tier: it comes in a plain topology file
        placements = job.topology.placements
        assert {p.tiers for p in placements.values()} == {("spine-0",), ("spine-1",)}
        for server, tor in zip(table.servers, job.tor_of_pod):
            assert placements[server.server_id].tiers == (f"spine-{shape.spine_of_tor(tor)}",)
    else:
        assert job.topology_file is None


def _result(text: str, seconds, ring_share: float = 1.0, exact=True):
    """A ShapeResult as measure_shape would return it, with the given times per order."""
    shape = model.parse_shape(text)
    job = bench_fabric.make_job(shape, seed=0)
    orders = {
        "scheduler": tuple(range(shape.nodes)),
        "random": bench_fabric.random_order(shape.nodes, 0),
    }
    cells = {}
    for collective in bench_fabric.COLLECTIVES:
        for name in bench_fabric.ORDERS:
            order = job.plans[collective].pod_of_node_rank if name == "planned" else orders[name]
            cell = bench_fabric.Cell(collective, name, order)
            cell.seconds = [seconds[(collective, name)]] * 3
            cell.cpu = [1.0] * 3
            cell.exact = [exact] * 3
            predicted = model.predict(shape, job.tor_of_pod, order, collective, 1 << 20, 12.5e6)
            cell.uplink_bytes = [
                {link: int(predicted.link_bytes.get(link, 0)) for link in model.uplinks(shape)}
            ] * 3
            if collective is Collective.RING:
                cell.ring = model.RingCheck(-1, ring_share, 1.0)
            cells[(collective, name)] = cell
    return bench_fabric.ShapeResult(
        job, 12.5e6, 1 << 20, cells, "1.0 1.0 1.0", "2.0 1.0 1.0", 0.5, 60.0
    )


def _args():
    return argparse.Namespace(rate=100.0, size=1 << 20, rounds=3)


def test_the_table_reports_the_measured_and_the_predicted_ratios():
    times = {(c, n): 3.0 for c in bench_fabric.COLLECTIVES for n in bench_fabric.ORDERS}
    times[(Collective.RING, "planned")] = 1.0
    result = _result("12x4", times)
    rows = {(r.collective, r.order_name): r for r in bench_fabric.rows_of(result)}
    ring = rows[(Collective.RING, "planned")]
    assert ring.ratio_measured == pytest.approx(3.0)
    assert ring.ratio_links == pytest.approx(3.0) and ring.ratio_scorer == pytest.approx(3.0)
    assert ring.busbw == pytest.approx((1 << 20) * 2 * 11 / 12)
    assert ring.ring_edges == ring.ring_bound == 4
    assert ring.uplink_total_ratio == pytest.approx(1.0, abs=1e-3)
    lines = bench_fabric.table_lines([result], _args())
    assert any(line.startswith("| 12x4 | ring | planned | 4 (4) | 1.00 |") for line in lines)
    assert any(line.startswith("| 12x4 | rhd | planned | - |") for line in lines)
    assert "12x4: load average 1.0 1.0 1.0 -> 2.0 1.0 1.0; machine CPU busy 50%" in "\n".join(lines)
    verdicts, correct = bench_fabric.verdict_lines([result], 100.0, default_run=True)
    text = "\n".join(verdicts)
    assert correct
    assert "12x4 ring: planned at the ring lower bound: yes" in text
    assert "measured x3.00 vs predicted x3.00 (+0%, target within 15%): met" in text
    assert "planned/scheduler x3.00, target >= x2.5: met" in text
    assert "12x4 rhd: planner's order x1.00 of the scheduler's busbw" in text
    assert "the default shapes ran in 100 s, target under 300 s: met" in text


def test_missed_targets_and_failed_checks_are_said_and_fail_the_run():
    times = {(c, n): 3.0 for c in bench_fabric.COLLECTIVES for n in bench_fabric.ORDERS}
    times[(Collective.RING, "planned")] = 2.0  # x1.5 where x3.0 is predicted
    times[(Collective.RHD, "planned")] = 4.0  # slower than the scheduler
    verdicts, correct = bench_fabric.verdict_lines([_result("12x4", times)], 400.0, True)
    text = "\n".join(verdicts)
    assert correct  # targets are reported, not enforced
    assert "(-50%, target within 15%): MISSED" in text
    assert "target >= x2.5: MISSED" in text
    assert "12x4 rhd: planner's order x0.75" in text and "never slower: MISSED" in text
    assert "target under 300 s: MISSED" in text
    _, correct = bench_fabric.verdict_lines([_result("12x4", times, ring_share=0.6)], 1.0, False)
    assert not correct
    wrong = _result("12x4", times, exact=False)
    verdicts, correct = bench_fabric.verdict_lines([wrong], 1.0, False)
    assert not correct and "WRONG allreduce result" in "\n".join(verdicts)


@pytest.mark.parametrize(
    "text, value", [("4MiB", 4 << 20), ("512KiB", 512 << 10), ("1MB", 10**6), ("65536", 65536)]
)
def test_buffer_sizes(text, value):
    assert bench_fabric.size_bytes(text) == value


@pytest.mark.parametrize("text", ["4 parsecs", "1000", "4098", "-4MiB", ""])
def test_bad_buffer_sizes_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        bench_fabric.size_bytes(text)
