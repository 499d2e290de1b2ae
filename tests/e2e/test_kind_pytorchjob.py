"""``npu-job demo --kind pytorchjob`` with every pod on its own simulated host: the PyTorchJob as
training-operator would run it follows the bootstrap's plan.

The pods are the operator's (``kinds/pytorchjob.py``'s ``controller_pods``): ``demo-master-0`` and
``demo-worker-<i>``, ``PET_NODE_RANK``/``RANK`` 0 for the Master and ``i + 1`` for Worker ``i``,
``MASTER_ADDR``/``PET_*`` as the operator injects them, each reachable by its per-replica
Service's name. As in ``test_pipeline.py``, each pod runs in its own network and mount namespace
(or, routed by the API, on its own loopback address, ``kind_runs``) and nothing but the cluster is
simulated; no training-operator runs here.
"""

from __future__ import annotations

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

pytestmark = [
    pytest.mark.netns,
    pytest.mark.torch,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]
KIND = KINDS["pytorchjob"]


def test_the_pytorchjob_trains_by_the_plan_with_rank_0_on_the_planned_pods_service(tmp_path):
    result = trained_on_hosts("pytorchjob", tmp_path, "kp")
    names = [spec.name for spec in result.prepared.specs]
    assert names == ["demo-master-0", *(f"demo-worker-{i}" for i in range(5))]
    for spec in result.prepared.specs:
        env = spec.env_dict()
        assert env["PET_NODE_RANK"] == env["RANK"] == str(spec.index)  # the operator's rank
        assert env["PET_MASTER_ADDR"] == "demo-master-0" and env["NPU_JOB_KIND"] == "pytorchjob"
    assert_planned_off_pod_0(result)  # the Master's
    # rank 0 is where the plan put it; the root store stays on pod index 0, the Master, at its
    # Service's name
    master = KIND.dns_name(demo.JOB_NAME, "", 0)
    assert master.startswith(f"{demo.JOB_NAME}-master-0")
    root_log = (result.prepared.spec_files[0].parent / "pod.log").read_text()
    assert f"master {master}:" in root_log and "hosting the root store" in root_log
    for spec_file in result.prepared.spec_files:
        log = (spec_file.parent / "pod.log").read_text()
        assert f"master {master}:" in log


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_routed_by_the_api_every_pod_lists_the_operators_pods_and_trains_by_the_plan(tmp_path):
    run = run_routed_by_the_api(routed_options("pytorchjob"), tmp_path)
    assert_planned_and_trained(run)  # by the selector of the job name and the operator's name
    specs = run.result.prepared.specs
    assert [spec.name for spec in specs] == [
        "demo-master-0",
        *(f"demo-worker-{i}" for i in range(len(specs) - 1)),
    ]
    for spec in specs:
        assert spec.env_dict()["PET_NODE_RANK"] == str(spec.index)
