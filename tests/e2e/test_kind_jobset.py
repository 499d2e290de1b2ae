"""``npu-job demo --kind jobset`` with every pod on its own simulated host: the JobSet as its
controller and the Job controller would run it follows the bootstrap's plan.

The pods are the controllers' (``kinds/jobset.py``'s ``controller_pods``): one Job
``demo-worker-0`` whose pod ``k`` is ``demo-worker-0-<k>-<random>`` with hostname
``demo-worker-0-<k>``, ``JOB_COMPLETION_INDEX`` its index, the JobSet's labels, reachable as
``demo-worker-0-<k>.demo`` under the JobSet's headless Service. As in ``test_pipeline.py``, each
pod runs in its own network and mount namespace and nothing but the cluster is simulated; no
JobSet controller runs here. The second case routes by the Kubernetes API (``kind_runs``): every
pod's bootstrap lists the JobSet's pods by its labels, pods of a previous attempt of a restarted
JobSet among them.
"""

from __future__ import annotations

import json
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
KIND = KINDS["jobset"]
ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_the_jobset_trains_by_the_plan_with_rank_0_on_the_planned_pods_dns_name(tmp_path):
    result = trained_on_hosts("jobset", tmp_path, "js")
    for spec in result.prepared.specs:
        assert re.fullmatch(rf"demo-worker-0-{spec.index}-[a-z0-9]{{5}}", spec.name), spec.name
        assert spec.hostname == f"demo-worker-0-{spec.index}"
        env = spec.env_dict()
        assert env["JOB_COMPLETION_INDEX"] == str(spec.index)  # the Job controller's
        assert (env["MA_VJ_NAME"], env["MA_TASK_NAME"]) == ("demo", "worker")  # its labels
        assert env["NPU_JOB_KIND"] == "jobset"
    assert_planned_off_pod_0(result)
    # rank 0 is where the plan put it; the root store stays on pod index 0, under the JobSet's
    # headless Service, which a replaced pod keeps
    master = KIND.dns_name(demo.JOB_NAME, demo.TASK_NAME, 0)
    assert master == "demo-worker-0-0.demo"
    root_log = (result.prepared.spec_files[0].parent / "pod.log").read_text()
    assert f"master {master}:" in root_log and "hosting the root store" in root_log
    for spec_file in result.prepared.spec_files:
        assert f"master {master}:" in (spec_file.parent / "pod.log").read_text()


def restarted(objects):
    """The JobSet restarted once: its pods carry restart-attempt 1, and two pods of attempt 0,
    not yet deleted, are listed too, at indexes the new pods hold, on nodes of their own."""
    pods = objects["pods"]
    for pod in pods:
        pod["metadata"]["labels"][ATTEMPT] = "1"
    for index in (0, 2):
        old = json.loads(json.dumps(pods[index]))
        old["metadata"]["name"] = old["metadata"]["name"][:-5] + "bcdfg"
        old["metadata"]["labels"][ATTEMPT] = "0"
        old["spec"]["nodeName"] = objects["nodes"][index + 1]["metadata"]["name"]
        old["status"]["hostIP"] = old["status"]["podIP"] = "10.99.0.9"
        pods.insert(0, old)


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_a_restarted_jobset_routed_by_the_api_plans_its_new_pods_not_those_left_behind(tmp_path):
    run = run_routed_by_the_api(routed_options("jobset"), tmp_path, served=restarted)
    assert_planned_and_trained(run, demo.TASK_NAME)
