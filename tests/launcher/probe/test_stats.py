"""What a probe's timings mean: nccl-tests' bandwidths, the interleaved schedule, and the decision
every node follows (keep the plan unless it is slower than the scheduler's order by more than the
margin), its verdict line and probe.json."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from npu_job.launcher.probe import stats
from npu_job.launcher.probe.stats import PLANNED, SCHEDULER


def test_bus_bandwidth_factors_are_nccl_tests():
    assert stats.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert stats.bus_factor("all_gather", 8) == stats.bus_factor("reduce_scatter", 8) == 7 / 8
    assert stats.bus_factor("broadcast", 8) == 1.0
    assert stats.bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError, match="one of all_reduce"):
        stats.bus_factor("alltoall", 8)


def test_the_schedule_warms_up_then_alternates_the_orders_per_size():
    steps = stats.schedule([1024, 4096], iterations=3, warmup=1)
    assert steps[:2] == ((PLANNED, 1024, False), (SCHEDULER, 1024, False))
    timed = [step for step in steps if step[2]]
    assert [order for order, _, _ in timed[:6]] == [PLANNED, SCHEDULER] * 3
    assert len(timed) == 2 * 3 * 2 and len(steps) == 2 * 4 * 2
    assert [size for _, size, _ in steps] == sorted(size for _, size, _ in steps)


def samples(planned: float, scheduler: float, sizes=(1 << 20, 1 << 24), runs=5):
    return [
        (order, size, seconds * size / (1 << 20))
        for size in sizes
        for _ in range(runs)
        for order, seconds in ((PLANNED, planned), (SCHEDULER, scheduler))
    ]


def test_medians_give_busbw_per_order_and_their_ratio():
    results = stats.size_results(samples(0.001, 0.003), "all_reduce", 4)
    largest = results[-1]
    assert largest.size == 1 << 24
    expected = (1 << 24) / (0.001 * 16) * 1.5
    assert largest.busbw[PLANNED] == pytest.approx(expected)
    assert largest.ratio == pytest.approx(3.0)


def test_a_faster_plan_is_kept_and_a_slower_one_beyond_the_margin_is_not():
    faster = stats.decide(stats.size_results(samples(0.001, 0.003), "all_reduce", 4))
    assert faster.keeps_plan and faster.reason == "keeping the plan"
    within = stats.decide(stats.size_results(samples(0.00104, 0.001), "all_reduce", 4))
    assert within.keeps_plan  # 4% slower: within the 5% margin
    slower = stats.decide(stats.size_results(samples(0.0012, 0.001), "all_reduce", 4))
    assert slower.order == SCHEDULER and "slower by more than 5%" in slower.reason
    strict = stats.decide(stats.size_results(samples(0.00104, 0.001), "all_reduce", 4), 0.0)
    assert strict.order == SCHEDULER


@given(
    planned=st.floats(1e-5, 1.0),
    scheduler=st.floats(1e-5, 1.0),
    margin=st.floats(0.0, 0.5),
)
def test_the_decision_is_the_scheduler_order_exactly_when_the_plan_loses_by_the_margin(
    planned, scheduler, margin
):
    decision = stats.decide(
        stats.size_results(samples(planned, scheduler), "all_reduce", 8), margin
    )
    ratio = scheduler / planned  # busbw ratio: inverse of the times
    assert decision.keeps_plan == (ratio >= 1 - margin)


def test_a_size_without_both_orders_is_refused():
    with pytest.raises(ValueError, match="no sample of the scheduler order"):
        stats.size_results([(PLANNED, 8, 0.1)], "all_reduce", 2)


def test_the_verdict_line_and_probe_json_carry_both_orders_and_the_prediction():
    decision = stats.decide(
        stats.size_results(samples(0.001, 0.003), "all_reduce", 4),
        predicted=3.0,
        digests={PLANNED: "aa", SCHEDULER: "bb"},
    )
    line = stats.verdict_line(decision, "all_reduce")
    assert line.startswith("probe: ring all_reduce busbw planned ")
    assert "(×3.00, predicted ×3.00)" in line and line.endswith(": keeping the plan")
    document = stats.probe_document(decision, "all_reduce", 4, "gloo", 1.5)
    assert json.loads(json.dumps(document)) == document
    assert document["mapping_digests"] == {PLANNED: "aa", SCHEDULER: "bb"}
    assert [size["bytes"] for size in document["sizes"]] == [1 << 20, 1 << 24]
    assert document["order"] == PLANNED and document["predicted_ratio"] == 3.0


def test_a_probe_that_could_not_finish_keeps_the_plan_and_says_why():
    decision = stats.failed("did not finish within 60 s")
    assert decision.keeps_plan and decision.results == ()
    assert stats.verdict_line(decision, "all_reduce") == (
        "probe: did not finish within 60 s: keeping the plan"
    )
