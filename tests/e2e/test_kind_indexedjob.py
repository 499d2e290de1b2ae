"""``npu-job demo --kind indexedjob``: the whole chain for Kubernetes' Indexed Job.

The simulator makes the pods as the Job controller and the API server do (``<job>-<i>-<random>``,
hostnames ``<job>-<i>`` under the headless Service the render emits, ``JOB_COMPLETION_INDEX``,
``batch.kubernetes.io/job-name``: ``npu_job.kinds.indexedjob``); every pod's bootstrap lists them
by that label from the API (``kind_runs``), plans, and npu-run trains under the plan.
"""

from __future__ import annotations

import re

import pytest

from npu_job import demo
from tests.e2e.kind_runs import (
    UNSHARE,
    assert_planned_and_trained,
    routed_options,
    run_routed_by_the_api,
)

pytestmark = [pytest.mark.torch, pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")]


def test_the_indexed_job_plans_from_its_pods_and_trains_with_rank_0_on_the_planned_pod(tmp_path):
    options = routed_options("indexedjob")
    run = run_routed_by_the_api(options, tmp_path)
    assert_planned_and_trained(run)
    for spec in run.result.prepared.specs:  # the controller's names, not Volcano's
        assert re.fullmatch(f"{demo.JOB_NAME}-{spec.index}-[a-z0-9]{{5}}", spec.name), spec.name
        assert spec.hostname == f"{demo.JOB_NAME}-{spec.index}"
