"""``npu-job demo --kind leaderworkerset``: the whole chain for a LeaderWorkerSet of one group.

The simulator makes the pods as kubernetes-sigs/lws and its StatefulSets do (the leader
``<lws>-0``, workers ``<lws>-0-<w>`` under the Service ``<lws>``, the pod webhook's labels and
``LWS_*`` variables: ``npu_job.kinds.leaderworkerset``); every pod's bootstrap lists them by the
set's name and group index from the API (``kind_runs``), plans, and npu-run trains under the
plan, rank 0 on the planned pod off LWS's leader, the root store on the leader.
"""

from __future__ import annotations

import pytest

from npu_job import demo
from tests.e2e.kind_runs import (
    UNSHARE,
    assert_planned_and_trained,
    routed_options,
    run_routed_by_the_api,
)

pytestmark = [pytest.mark.torch, pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")]


def test_the_leaderworkerset_plans_from_its_group_and_trains_with_rank_0_off_the_leader(tmp_path):
    options = routed_options("leaderworkerset")
    run = run_routed_by_the_api(options, tmp_path)
    assert_planned_and_trained(run, group="0")
    names = [spec.name for spec in run.result.prepared.specs]
    assert names == [f"{demo.JOB_NAME}-0"] + [f"{demo.JOB_NAME}-0-{w}" for w in range(1, 6)]
    leader = run.result.prepared.specs[0].env_dict()["LWS_LEADER_ADDRESS"]
    assert leader == f"{demo.JOB_NAME}-0.{demo.JOB_NAME}.default"
    # the plan moved rank 0 off the leader; the root store stays on the leader (pod index 0),
    # at the name LWS gives it, which survives the group's re-creation
    assert f"master {leader.split('.')[0]}." in run.pod_log(0)
