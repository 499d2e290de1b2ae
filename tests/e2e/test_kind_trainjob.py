"""``npu-job demo --kind trainjob`` with every pod on its own simulated host: the TrainJob as
Kubeflow Trainer would run it on JobSet follows the bootstrap's plan, not the ``PET_*`` variables
the Trainer sets.

The pods are the Trainer's JobSet's (``kinds/trainjob.py``'s ``stream_pods``, from the
TrainingRuntime render emits before the TrainJob): ``demo-node-0-<k>-<random>`` with hostname
``demo-node-0-<k>``, ``PET_NODE_RANK`` their completion index and ``PET_MASTER_ADDR`` pod 0's
name, as the Trainer's torch plugin sets them. As in ``test_pipeline.py``, each pod runs in its
own network and mount namespace and nothing but the cluster is simulated; no Trainer or JobSet
controller runs here. The second case routes by the Kubernetes API (``kind_runs``): every pod's
bootstrap lists the TrainJob's pods by the JobSet's labels of the Trainer's node step.
"""

from __future__ import annotations

import re

import pytest
from npu_job.kinds import KINDS

from npu_job import demo
from tests.e2e.kind_runs import (
    UNSHARE,
    assert_planned_and_trained,
    routed_options,
    run_routed_by_the_api,
    trained_on_hosts,
)
from tests.e2e.test_pipeline import REASON, assert_planned_off_pod_0

pytestmark = pytest.mark.torch
KIND = KINDS["trainjob"]


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_the_trainjob_trains_by_the_plan_whatever_the_trainers_pet_variables_say(tmp_path):
    result = trained_on_hosts("trainjob", tmp_path, "tj")
    for spec in result.prepared.specs:
        assert re.fullmatch(rf"demo-node-0-{spec.index}-[a-z0-9]{{5}}", spec.name), spec.name
        env = spec.env_dict()
        # what the Trainer's torch plugin sets: the scheduler order, and pod 0 as the master
        assert env["PET_NODE_RANK"] == env["JOB_COMPLETION_INDEX"] == str(spec.index)
        assert env["PET_MASTER_ADDR"] == "demo-node-0-0.demo"
        assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("6", "1")
        assert env["MA_VJ_NAME"] == "demo" and "MA_TASK_NAME" not in env
    assert_planned_off_pod_0(result)  # not where PET_MASTER_ADDR points
    # rank 0 is where the plan put it; the root store stays on pod index 0, at its stable name
    master = KIND.dns_name(demo.JOB_NAME, "", 0)
    assert master == "demo-node-0-0.demo"
    root_log = (result.prepared.spec_files[0].parent / "pod.log").read_text()
    assert f"master {master}:" in root_log and "hosting the root store" in root_log
    for spec_file in result.prepared.spec_files:
        assert f"master {master}:" in (spec_file.parent / "pod.log").read_text()


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_the_trainjob_routed_by_the_api_lists_the_trainers_node_pods_and_trains_by_the_plan(
    tmp_path,
):
    run = run_routed_by_the_api(routed_options("trainjob"), tmp_path)
    assert_planned_and_trained(run)
