"""The scorer on small fabrics whose numbers are worked out by hand in each test."""

from __future__ import annotations

import pytest
from npu_job.bootstrap import scorer
from npu_job.bootstrap.base.model import Collective, Device, Placement, RankTable, Server, Topology


def keys_of(*labels: str):
    """Switch keys for pods 0..n-1, one ToR label each (no outer tiers)."""
    return tuple((label,) for label in labels)


def test_contiguous_ring_crosses_once_per_tor_and_never_collides():
    keys = keys_of("A", "A", "B", "B", "C", "C")
    score = scorer.score_order(range(6), keys, uplinks=2, samples=4)
    # A A | B B | C C | (back to A): 3 cross edges, the lower bound for 3 ToRs
    assert (score.ring_cross_edges, score.ring_lower_bound, score.switches) == (3, 3, 3)
    # each ToR sends one flow out and takes one in: nothing to collide with
    assert (score.max_flows_out, score.best_max_link_load, score.expected_collisions) == (1, 1, 0.0)
    assert score.busbw_fraction == 1.0 and score.best_busbw_fraction == 1.0
    assert score.phases[0].volume == pytest.approx(2 * 5 / 6)  # nccl-tests busbw factor 2(n-1)/n


def test_alternating_ring_counts_flows_collisions_and_best_load_by_hand():
    keys = keys_of("A", "B", "A", "B")  # every ring edge crosses: A->B, B->A, A->B, B->A
    score = scorer.score_order(range(4), keys, uplinks=2, samples=0)
    assert (score.ring_cross_edges, score.ring_lower_bound) == (4, 2)
    assert score.max_flows_out == 2
    # out_A = out_B = in_A = in_B = 2, m_AB = m_BA = 2:
    # (C(2,2) + C(2,2) + C(2,2) + C(2,2) - C(2,2) - C(2,2)) / U = 2 / 2
    assert score.expected_collisions == pytest.approx(1.0)
    assert score.best_max_link_load == 1  # ceil(2 / 2)
    assert score.busbw_fraction is None  # no sampling asked


def test_one_uplink_makes_every_pair_collide_and_halves_busbw():
    keys = keys_of("A", "B", "A", "B")
    score = scorer.score_order(range(4), keys, uplinks=1, samples=3)
    assert score.expected_collisions == pytest.approx(2.0)
    assert score.best_max_link_load == 2
    # two flows share the only uplink in every draw: each phase takes twice as long
    assert score.busbw_fraction == pytest.approx(
        0.5
    ) and score.best_busbw_fraction == pytest.approx(0.5)


def test_monte_carlo_is_seeded_and_between_worst_and_best():
    keys = keys_of(*("ABCD" * 4))
    first = scorer.score_order(range(16), keys, uplinks=4, samples=32, seed=5)
    again = scorer.score_order(range(16), keys, uplinks=4, samples=32, seed=5)
    assert first.busbw_fraction == again.busbw_fraction
    # 4 flows out of each ToR over 4 uplinks: perfect placement has load 1, hashing does worse
    assert first.best_busbw_fraction == 1.0
    assert 0.25 <= first.busbw_fraction < 1.0


def test_single_tor_job_has_a_zero_lower_bound():
    score = scorer.score_order(range(3), keys_of("A", "A", "A"), samples=2)
    assert (score.ring_cross_edges, score.ring_lower_bound, score.expected_collisions) == (
        0,
        0,
        0.0,
    )
    assert score.busbw_fraction == 1.0


def test_outer_tiers_are_counted_separately():
    keys = (("S1", "A"), ("S1", "B"), ("S2", "C"), ("S1", "A"))
    score = scorer.score_order(range(4), keys, samples=0)
    # ring A->B->C->A->A: ToR level crosses 3 times, spine level S1->S2->S1 twice
    assert score.ring_cross_edges_by_tier == (2, 3)
    assert score.ring_lower_bound_by_tier == (2, 3)


def test_ring_phase_is_r_to_r_plus_one():
    (phase,) = scorer.phases(3, Collective.RING)
    assert phase.flows == ((0, 1), (1, 2), (2, 0))


def test_nhr_phases_step_by_powers_of_two_nearest_first_with_halving_volume():
    result = scorer.phases(5, Collective.NHR)
    assert [p.label for p in result] == ["nhr d=1", "nhr d=2", "nhr d=4"]
    assert [p.volume for p in result] == [1.0, 0.5, 0.25]
    assert result[1].flows == ((0, 3), (1, 4), (2, 0), (3, 1), (4, 2))


def test_rhd_power_of_two_goes_far_first():
    result = scorer.phases(4, Collective.RHD)
    assert [(p.label, p.volume) for p in result] == [("rhd d=2", 1.0), ("rhd d=1", 0.5)]
    assert result[0].flows == ((0, 2), (1, 3), (2, 0), (3, 1))


def test_rhd_folds_the_extra_ranks_of_a_non_power_of_two():
    result = scorer.phases(6, Collective.RHD)
    # p = 4 survivors: virtual 0,1 are real 1,3 (even partners 0,2 fold in); virtual 2,3 are 4,5
    assert [p.label for p in result] == ["rhd fold", "rhd d=2", "rhd d=1", "rhd unfold"]
    assert result[0].flows == ((0, 1), (2, 3))
    assert result[1].flows == ((1, 4), (3, 5), (4, 1), (5, 3))
    assert result[2].flows == ((1, 3), (3, 1), (4, 5), (5, 4))
    assert result[3].flows == ((1, 0), (3, 2))


def test_cross_switch_volume_weights_crossing_flows_by_their_data():
    keys = keys_of("A", "A", "B", "B")
    # RHD on 4: d=2 (volume 1) pairs 0-2, 1-3: all 4 flows cross; d=1 (volume 0.5) stays inside
    assert scorer.cross_switch_volume(range(4), keys, Collective.RHD) == (4.0, 2 * 1.0 + 1 * 0.5)
    # interleaved A B A B: d=2 stays inside, d=1 crosses
    assert scorer.cross_switch_volume((0, 2, 1, 3), keys, Collective.RHD) == (2.0, 1.0 + 2 * 0.5)


def test_switch_keys_give_multi_tor_and_unplaced_nodes_their_own_switch():
    servers = tuple(Server(sid, i, (Device("0"),)) for i, sid in enumerate(["a", "b", "c"]))
    table = RankTable("1.0", "completed", servers)
    topology = Topology(
        {"a": Placement(tiers=("s",), tors=("t2", "t1")), "b": Placement(tors=("t1",))}
    )
    keys = scorer.switch_keys(table, topology)
    assert keys[0] == ("s", "t1+t2") and keys[1] == ("t1",)
    assert len(set(keys)) == 3 and keys[2] != ("c",)


def test_uplinks_must_be_positive():
    with pytest.raises(ValueError, match="uplinks must be >= 1"):
        scorer.score_order(range(3), keys_of("A", "B", "C"), uplinks=0)
