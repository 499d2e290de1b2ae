"""The one input loader a pod and ``npu-job plan`` share, and what it refuses in both.

Its reading is tested through its two callers (tests/bootstrap/test_run.py, the pod;
tests/cli/test_plan_cli.py, plan; tests/test_layers.py holds it free of import cycles); here:
the job's node count it holds a rank table to, and the address it gives of a server.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Dict, Tuple

import pytest
from npu_job.bootstrap.base.model import RankTable
from npu_job.bootstrap.identity import check_job_nodes
from npu_job.bootstrap.ranktable import rank_table_document
from npu_job.bootstrap.run import bootstrap
from npu_job.demo.synthetic import synthetic_cluster

from npu_job.errors import InconsistentError
from npu_job.podfacts import NODE_REPORT_FILE, ROUTE_PLAN_FILE

from .documents import write_cce_job

# --- the job's node count -----------------------------------------------------------------------


def five_of_six(directory: Path, missing: int = 3) -> Tuple[RankTable, Path]:
    """A 6-node CCE job whose rank table lists five servers: pod ``missing``'s host is not in it.

    Returns the whole job's table (every pod's host) and the mounted directory."""
    table, _, rank_table = write_cce_job(directory, 6, 3)
    listed = replace(table, servers=tuple(s for s in table.servers if s.pod_index != missing))
    rank_table.write_text(json.dumps(rank_table_document(listed)))
    return table, directory


def pod_env(table: RankTable, directory: Path, index: int, **extra: str) -> Dict[str, str]:
    return {
        "RANK_TABLE_FILE": str(directory),
        "MA_CURRENT_HOST_IP": table.servers[index].server_id,
        "VC_TASK_INDEX": str(index),
        "NPU_JOB_OUTPUT_DIR": str(directory.parent / f"out-{index}"),
        "NPU_JOB_K8S_TOPOLOGY": "0",
        **extra,
    }


def test_a_table_of_the_jobs_size_passes_and_no_count_checks_nothing():
    table, _ = synthetic_cluster(6, 3)
    check_job_nodes(table, 6, "t")
    check_job_nodes(table, None, "t")


@pytest.mark.parametrize("nnodes", [5, 7])
def test_a_table_of_another_size_is_refused_naming_both_counts(nnodes):
    table, _ = synthetic_cluster(6, 3)
    with pytest.raises(InconsistentError) as caught:
        check_job_nodes(table, nnodes, "/user/config/jobstart_hccl.json")
    assert caught.value.message == (
        "/user/config/jobstart_hccl.json: server_count: 6 servers, but the job has "
        f"{nnodes} nodes (MA_NUM_HOSTS)"
    )
    assert caught.value.exit_code == 7 and caught.value.tip


def test_every_pod_refuses_a_table_that_lacks_one_pods_host_alike(tmp_path, logs):
    """Without the count, pods 0-2 would plan for 5 nodes and pods 3-5 fall back (their host is
    missing, or at another index): mixed orders. With it, every pod decides the same."""
    table, directory = five_of_six(tmp_path / "config")
    line = f"{directory / 'jobstart_hccl.json'}: server_count: 5 servers, but the job has 6 nodes"
    for index in range(6):
        env = pod_env(table, directory, index, MA_NUM_HOSTS="6")
        result = bootstrap({}, env)
        assert result.exit_code == 0
        plan = result.route_plan
        assert plan["status"] == "failed" and plan["reason"] == f"{line} (MA_NUM_HOSTS)"
        assert sorted(os.listdir(env["NPU_JOB_OUTPUT_DIR"])) == [NODE_REPORT_FILE, ROUTE_PLAN_FILE]
        with pytest.raises(InconsistentError):
            bootstrap({"strict": True}, env)
    errors = logs(logging.ERROR)
    assert errors == [f"{line} (MA_NUM_HOSTS)"] * 6


def test_without_the_jobs_node_count_the_pods_decide_as_before(tmp_path):
    """No MA_NUM_HOSTS (a job npu-job did not render, outside ModelArts): nothing to compare; the
    pods whose host is listed at their index plan, the others fall back (npu-run names it)."""
    table, directory = five_of_six(tmp_path / "config")
    statuses = [
        bootstrap({}, pod_env(table, directory, index)).route_plan["status"] for index in range(6)
    ]
    assert statuses == ["success"] * 3 + ["failed"] * 3


def test_the_flag_names_itself_in_the_refusal(tmp_path):
    table, directory = five_of_six(tmp_path / "config")
    env = pod_env(table, directory, 0, MA_NUM_HOSTS="5")
    reason = bootstrap({"nnodes": 6}, env).route_plan["reason"]
    assert reason.endswith("5 servers, but the job has 6 nodes (--nnodes)")
    assert bootstrap({}, env).route_plan["status"] == "success"  # 5 of 5: the variable's count


def test_a_bad_node_count_is_one_line_on_every_pod(tmp_path, logs):
    table, directory = five_of_six(tmp_path / "config")
    result = bootstrap({}, pod_env(table, directory, 0, MA_NUM_HOSTS="six"))
    assert result.route_plan["status"] == "failed"
    assert logs(logging.ERROR) == [
        "environment: MA_NUM_HOSTS: expected a whole number >= 1, got 'six'"
    ]


# --- a server's address -------------------------------------------------------------------------


def test_a_servers_address_is_its_pod_ip_else_its_rank_table_pod_or_host_address():
    """What train.sh reaches the new rank 0 at: a listed pod's IP (none while it has none), a
    rank table entry's container_ip (the pod's, in the tables MindCluster's ascend-operator
    writes), else its host_ip, else its server_id (which is the host's IP in CCE's tables)."""
    from npu_job.bootstrap.base.model import Server
    from npu_job.bootstrap.inputs import Inputs

    servers = (
        Server("node_0", 0, (), host_ip="10.0.0.3"),
        Server("10.0.0.4", 1, ()),
        Server("10.0.0.5", 2, (), host_ip="10.0.0.5", container_ip="172.16.0.2"),
    )
    ranked = Inputs(RankTable("1.2", "completed", servers), "t.json", None, "none", None)
    assert [ranked.address_of(index) for index in range(3)] == [
        "10.0.0.3",
        "10.0.0.4",
        "172.16.0.2",  # not its host's: a pod outside the host network listens on its own
    ]
    pods = ranked._replace(node_names=("n0", "n1"), pod_ips=("172.20.0.1", ""))
    assert (pods.address_of(0), pods.address_of(1)) == ("172.20.0.1", None)
