"""The root's line about the pods its plan re-ranked (``rounds.disagreements``, pure)."""

from __future__ import annotations

from typing import Optional

import pytest
from npu_job.bootstrap.base.model import Placement
from npu_job.bootstrap.nodereport import NodeReport, encode_report, plan_round
from npu_job.launcher.rendezvous.rounds import Claim, disagreements

# members 1..3 are pods 0..2; pod 0 sits alone on the ToR that sorts last: ranks 2, 0, 1
PLAN = plan_round(
    {
        str(pod + 1): encode_report(
            NodeReport(
                node_id=f"10.0.0.{pod + 1}",
                pod_index=pod,
                device_count=1,
                placement=Placement(tors=(tor,), slot=slot),
            )
        )
        for pod, (tor, slot) in enumerate((("tor-b", 0), ("tor-a", 0), ("tor-a", 1)))
    }
)
AGREES = f"planned order {PLAN.mapping_digest}"


def claims(order_of_pod_0: Optional[str], hint_of_pod_0: int) -> dict:
    agreeing = {
        member: Claim(PLAN.node_rank[str(member)], AGREES, f"pod-{member - 1}") for member in (2, 3)
    }
    return {1: Claim(hint_of_pod_0, order_of_pod_0, "pod-0"), **agreeing}


def test_pods_that_follow_the_plan_are_not_named():
    assert PLAN.node_rank["1"] == 2
    assert disagreements(0, PLAN, claims(AGREES, 2)) is None
    assert disagreements(0, PLAN, claims(None, 2)) is None  # no bootstrap, and the rank it had


@pytest.mark.parametrize(
    "order, hint, said",
    [
        pytest.param(
            "planned order 0123456789abcdef",
            2,
            "its bootstrap planned 0123456789ab",
            id="other-digest",
        ),
        pytest.param(
            AGREES, 0, f"its bootstrap planned {PLAN.mapping_digest[:12]}", id="other-rank"
        ),
        pytest.param(
            "scheduler order", 2, "its bootstrap did not plan: scheduler order", id="fell-back"
        ),
        pytest.param(None, 0, "no bootstrap", id="by-hand"),
    ],
)
def test_a_pod_whose_bootstrap_decided_otherwise_is_named_with_its_rank_before_and_after(
    order, hint, said
):
    line = disagreements(4, PLAN, claims(order, hint))
    assert line == (
        f"round 4: the root's plan {PLAN.mapping_digest[:12]} re-ranked 1 node(s) whose "
        f"bootstrap decided otherwise: pod pod-0 ({said}; came as node rank {hint}, now 2)"
    )
