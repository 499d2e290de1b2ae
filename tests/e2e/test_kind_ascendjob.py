"""``npu-job demo --kind ascendjob`` with every pod on its own simulated host: the AscendJob as
MindCluster's ascend-operator would run it trains, its ranks by the operator's RANK.

The pods are the operator's (``kinds/ascendjob.py``'s ``controller_pods``): ``demo-master-0`` and
``demo-worker-<i>`` on NPU nodes, ``RANK`` 0 for the Master and ``i + 1`` for Worker ``i``,
``WORLD_SIZE`` counting processes and ``LOCAL_RANK`` a list, ``MASTER_ADDR`` the Master's Service
(its ClusterIP on a cluster, its name here, resolving to the Master). No pod has a DNS name of its
own: routed by the API (``kind_runs``, on loopback), rank 0's pod is reached by the pod address
the bootstrap writes. As in ``test_pipeline.py``, nothing but the cluster is simulated: no
ascend-operator, no NPU (the workers fall back to gloo).
"""

from __future__ import annotations

import dataclasses

import pytest

from npu_job import demo
from tests.e2e.kind_runs import (
    UNSHARE,
    KindRun,
    assert_planned_and_trained,
    routed_options,
    run_routed_by_the_api,
)
from tests.e2e.test_pipeline import REASON, assert_trained_by_plan, explain, run_on_hosts

pytestmark = pytest.mark.torch


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_without_routing_the_ascendjob_trains_in_the_operators_rank_order(tmp_path):
    options = demo.DemoOptions(
        kind="ascendjob",
        device="npu",
        routing=False,
        nodes=3,
        nproc_per_node=1,
        steps=4,
        timeout=150,
    )
    result = run_on_hosts(options, tmp_path, "ka")
    assert result.ok, explain(result)
    for spec in result.prepared.specs:
        env = spec.env_dict()
        assert env["RANK"] == str(spec.index)  # the operator's rank: the pod's index
        assert env["LOCAL_RANK"] == "0" and env["WORLD_SIZE"] == "3"  # what train.sh unsets
        assert env["MASTER_ADDR"] == "demo-master-0" and env["NPU_JOB_KIND"] == "ascendjob"
        log = (result.prepared.spec_files[spec.index].parent / "pod.log").read_text()
        assert "master demo-master-0:" in log  # through the operator's Service
    assert [spec.name for spec in result.prepared.specs] == [
        "demo-master-0",
        "demo-worker-0",
        "demo-worker-1",
    ]
    assert_trained_by_plan(result, list(range(options.nodes)), 1)


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_routed_by_the_api_rank_0_is_on_the_planned_pod_reached_by_its_pod_address(tmp_path):
    options = dataclasses.replace(routed_options("ascendjob"), device="npu")
    run = run_routed_by_the_api(options, tmp_path)
    assert_planned_and_trained(run)  # the master by its pod address: the kind gives no DNS name
    plan = run.result.prepared.plan
    address = run.result.prepared.specs[plan.master_index].host_ip  # its pod IP, here its host's
    for pod in run.result.pods:
        assert pod.route_plan["master_addr"] == address  # every pod wrote the same address


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_the_demos_ascendjob_plans_from_the_rank_table_the_operator_fills(tmp_path):
    # what `npu-job demo --kind ascendjob` runs (tests/demo/test_kinds.py checks the options)
    options = dataclasses.replace(
        routed_options("ascendjob"),
        device=demo.demo_device("ascendjob"),
        routing_source="rank-table",
    )
    run = KindRun(demo.run(options, tmp_path / "w"), pod_lists=[])
    assert_planned_and_trained(run)
    plan = run.result.prepared.plan
    address = run.result.prepared.specs[plan.master_index].host_ip
    for pod in run.result.pods:
        assert pod.route_plan["rank_table"] == "/user/serverid/devindex/config/hccl.json"
        assert pod.route_plan["topology"].startswith(f"{demo.TOPOLOGY_DIR}/ranktable_tor.json")
        # the new rank 0's container_ip in the operator's table: its pod address
        assert pod.route_plan["master_addr"] == address
