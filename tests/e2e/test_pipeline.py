"""The whole pipeline with every pod on its own simulated host: render -> bootstrap -> npu-run -> DDP.

Each pod runs in its own network namespace (its own IP on a bridge; the pod DNS names of Volcano's
svc plugin resolve through the pod's /etc/hosts) and its own mount namespace (private /tmp, the
rank table at /user/config: for the demo's CPU job from the ConfigMap the job mounts there, for the
NPU job as CCE's configmap1980 plugin mounts it), so the root store, the
per-node store proxies and gloo's connections really cross "hosts". The pod command is exactly the
one in the rendered Volcano Job. Nothing is mocked: the only stand-ins are the cluster itself
(``npu_job.demo.podspec`` does what the Volcano controller and the kubelet would do before the
container starts) and the fabric (ToRs exist only in the generated ranktable_tor.json).

Every case asserts the final global ranks against the plan the bootstrap had to compute, that all
ranks ended with identical parameters and a lower loss (the example script's per-rank reports),
and that no process, namespace or bridge is left behind. Every case runs with the PATH cron gives
a job (no virtualenv, no Python of this installation on it) and the demo's default stock image
(python3 with torch, no npu-job: the pods run npu-job from the job's bundle, and each pod's first
line must say so); one NPU case runs a CANN-like image whose python3 is CPython 3.7.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

import pytest
from npu_job.bootstrap.nodereport import plan_round
from npu_job.demo import podsim
from npu_job.demo.podlog import attempt_header

from npu_job import demo
from npu_job.podfacts import NODE_REPORT_FILE, ROUND_PLAN_FILE
from tests.e2e.netns import NetnsCluster, leftovers, netns_unavailable_reason

REASON = netns_unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.torch,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]


def namespace_pids(cluster: NetnsCluster) -> List[str]:
    """Processes still running in any of the cluster's hosts (after the run's own clean-up)."""
    deadline = time.monotonic() + 5
    while True:
        pids = [
            pid
            for host in cluster.hosts
            for pid in subprocess.run(
                ["ip", "netns", "pids", host.namespace], capture_output=True, text=True
            ).stdout.split()
        ]
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


CRON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@contextmanager
def callers_path(path: str) -> Iterator[None]:
    """Run as a caller whose PATH is ``path`` (e.g. cron's, without this installation on it)."""
    saved = os.environ.get("PATH")
    os.environ["PATH"] = path
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PATH"]
        else:
            os.environ["PATH"] = saved


def run_on_hosts(
    options: demo.DemoOptions, workspace: Path, case: str, fault=None
) -> demo.DemoResult:
    tag = f"{case}{os.getpid() % 10000}"  # unique per run: names must not collide with a crashed run's
    # the names the kind's controller gives pod i (a Volcano pod's <job>-<task>-<i>.<job>)
    hostnames = {
        name: index for index, pod in enumerate(demo.job_pods(options)) for name in pod.dns_names
    }
    lines: List[str] = []
    with callers_path(CRON_PATH), NetnsCluster(
        options.nodes, hostnames=hostnames, tag=tag
    ) as cluster:
        result = demo.run(
            options,
            workspace,
            host_ips=[host.ip for host in cluster.hosts],
            prefix_of=cluster.prefix,
            progress=lines.append,
            fault=fault,
        )
        assert namespace_pids(cluster) == [], "the run left processes on its hosts"
    result.progress = lines  # for failure messages
    assert leftovers(tag) == []
    assert podsim.processes_inside(workspace) == []
    return result


def explain(result: demo.DemoResult) -> str:
    logs = []
    for spec_file in result.prepared.spec_files:
        text = (spec_file.parent / "pod.log").read_text(errors="replace")
        logs.append(f"== {spec_file.parent.name}\n{text[-3000:]}")
    return "\n".join(result.problems + getattr(result, "progress", []) + logs)


def assert_trained_by_plan(result: demo.DemoResult, node_rank_of_pod, nproc: int) -> None:
    """Every worker sits at node_rank(pod) * nproc + local_rank; one model; loss down."""
    options = result.options
    hostnames = [pod.hostname for pod in demo.job_pods(options)]  # what each pod's kubelet gives it
    reports = sorted(result.reports, key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == list(range(options.nodes * nproc))
    for report in reports:
        assert (
            report["rank"] == node_rank_of_pod[report["pod_index"]] * nproc + report["local_rank"]
        )
        assert report["host"] == hostnames[report["pod_index"]]
        assert report["eval_loss_final"] < report["eval_loss_initial"]
        assert report["problems"] == []
    assert len({r["param_digest"] for r in reports}) == 1


def assert_planned_off_pod_0(result: demo.DemoResult):
    """Every pod used the one plan, at the lower bound, with rank 0 off pod 0, and every worker
    trained at the rank it gives (one worker a pod); the plan."""
    plan = result.prepared.plan
    assert str(plan.status) == "success"
    assert plan.master_index != 0, "pick a seed whose plan moves rank 0 off pod 0"
    assert result.score.cross_after == result.score.lower_bound < result.score.cross_before
    for pod in result.pods:
        assert pod.rank_after_acc == str(plan.node_rank_of_pod[pod.index])
        assert pod.master_index == str(plan.master_index)
        assert pod.route_plan["rank_mapping"] == plan.rank_mapping
    assert_trained_by_plan(result, plan.node_rank_of_pod, 1)
    return plan


def test_routing_moves_rank_zero_to_another_pod_and_the_root_stays_on_pod_0(tmp_path):
    """The plan puts rank 0 on another pod; npu-run's root stays on pod 0, at the address every
    pod's train.sh names, and plans the bootstraps' ranks there: one digest on every pod."""
    options = demo.DemoOptions(nodes=6, nproc_per_node=1, tors=3, seed=0, steps=8, timeout=150)
    result = run_on_hosts(options, tmp_path, "pr")
    assert result.ok, explain(result)
    assert result.options.image == "stock" and result.prepared.image.env["PATH"].startswith(
        str(tmp_path)
    )
    plan = assert_planned_off_pod_0(result)
    root = f"{demo.JOB_NAME}-{demo.TASK_NAME}-0.{demo.JOB_NAME}"
    logs = [(spec_file.parent / "pod.log").read_text() for spec_file in result.prepared.spec_files]
    assert all(f"master {root}:" in log for log in logs)
    assert "hosting the root store" in logs[0]
    assert not any("hosting the root store" in log for log in logs[1:])
    for pod, log in enumerate(logs):
        line = f"round 0 plan {plan.mapping_digest}: node rank {plan.node_rank_of_pod[pod]} of 6"
        assert line in log, (pod, log)
    rank0_pod = result.prepared.specs[plan.master_index]
    assert rank0_pod.host_ip != result.prepared.specs[0].host_ip


def test_the_npu_job_gets_its_rank_table_from_cce_and_follows_the_same_plan(tmp_path):
    """The job as an NPU cluster runs it: no rank table volume of its own, configmap1980 delivers it."""
    options = demo.DemoOptions(
        nodes=3, nproc_per_node=1, tors=3, seed=0, steps=4, device="npu", timeout=150
    )
    result = run_on_hosts(options, tmp_path, "pn")
    assert result.ok, explain(result)
    spec = result.prepared.specs[0]
    assert "RANK_TABLE_FILE" not in spec.env_dict()
    assert {m.mount_path for m in spec.file_mounts} >= {
        "/user/config/jobstart_hccl.json",
        "/user/config/ranktable_tor.json",
    }
    plan = result.prepared.plan
    assert str(plan.status) == "success"
    assert [pod.route_plan["rank_mapping"] for pod in result.pods] == [plan.rank_mapping] * 3
    assert_trained_by_plan(result, plan.node_rank_of_pod, 1)


@pytest.mark.skipif(
    demo.find_interpreter((3, 7)) is None,
    reason="no CPython 3.7 (python3.7 on PATH or pyenv): no stock-py37 image",
)
def test_a_cann_like_image_bootstraps_on_python_3_7_and_trains_on_the_launchers_python(tmp_path):
    options = demo.DemoOptions(
        nodes=3,
        nproc_per_node=1,
        tors=3,
        seed=0,
        steps=4,
        device="npu",
        image="stock-py37",
        timeout=150,
    )
    result = run_on_hosts(options, tmp_path, "p7")
    assert result.ok, explain(result)
    assert all(" on Python 3.7." in pod.first_line for pod in result.pods)
    assert_trained_by_plan(result, result.prepared.plan.node_rank_of_pod, 1)


def test_routing_off_keeps_the_scheduler_order(tmp_path):
    options = demo.DemoOptions(
        nodes=3, nproc_per_node=2, tors=3, routing=False, steps=6, timeout=150
    )
    result = run_on_hosts(options, tmp_path, "po")
    assert result.ok, explain(result)
    assert "bootstrap.sh" not in result.prepared.specs[0].argv[-1]
    assert all(pod.route_plan is None and pod.rank_after_acc is None for pod in result.pods)
    assert_trained_by_plan(result, list(range(3)), 2)


def test_fewer_than_three_pods_fall_back_and_still_train(tmp_path):
    options = demo.DemoOptions(nodes=2, nproc_per_node=1, tors=2, steps=6, timeout=150)
    result = run_on_hosts(options, tmp_path, "pf")
    assert result.ok, explain(result)
    for pod in result.pods:
        assert pod.route_plan["status"] == "failed"
        assert any("at least 3" in reason for reason in pod.route_plan["reasons"]), pod.route_plan
        assert pod.rank_after_acc is None and pod.master_index is None
    assert_trained_by_plan(result, [0, 1], 1)


def test_missing_bootstrap_inputs_fall_back_to_scheduler_order(tmp_path):
    options = demo.DemoOptions(
        nodes=3, nproc_per_node=1, tors=3, deliver_rank_table=False, steps=6, timeout=150
    )
    result = run_on_hosts(options, tmp_path, "pm")
    assert result.ok, explain(result)
    for pod, spec_file in zip(result.pods, result.prepared.spec_files):
        assert pod.rank_after_acc is None and pod.master_index is None
        assert "bootstrap.sh" in result.prepared.specs[pod.index].argv[-1]
        pod_log = (spec_file.parent / "pod.log").read_text()
        assert "npu-job: error:" in pod_log and "Traceback" not in pod_log.split("train_ddp")[0]
    assert_trained_by_plan(result, [0, 1, 2], 1)


def test_the_master_pod_killed_mid_training_restarts_and_the_job_resumes(tmp_path):
    options = demo.DemoOptions(
        nodes=3,
        nproc_per_node=1,
        tors=3,
        seed=0,
        steps=14,
        checkpoint_every=2,
        step_delay=0.4,
        timeout=200,
        max_restarts=3,
    )
    checkpoint = tmp_path / "shared" / "output" / "checkpoint" / "checkpoint.pt"
    killed: List[int] = []

    def kill_the_master_pod(supervisor: demo.Supervisor) -> None:
        """The hardest pod to lose: it hosts rank 0 and the root store every node talks to."""
        assert supervisor.wait(until=checkpoint.exists), "no checkpoint before the deadline"
        killed.append(supervisor.prepared.plan.master_index)
        supervisor.kill(killed[0])

    started = time.monotonic()
    result = run_on_hosts(options, tmp_path, "pk", fault=kill_the_master_pod)
    assert result.ok, explain(result)
    assert killed and result.pods[killed[0]].restarts >= 1
    assert all(pod.restarts >= 1 for pod in result.pods), (
        "the surviving pods should fail (no hang) and restart"
    )
    assert all(report["start_step"] > 0 for report in result.reports), (
        "the restarted job did not resume"
    )
    assert_trained_by_plan(result, result.prepared.plan.node_rank_of_pod, 1)
    assert time.monotonic() - started < options.timeout


def test_a_rank_table_one_host_short_is_refused_alike_by_every_pod_and_the_job_trains(tmp_path):
    """Six pods, a rank table of five servers (pod 3's host missing). Left to its own host's
    match, pods 0-2 would plan for five nodes while 3-5 fall back, and npu-run would refuse the
    mix. Every pod compares the table with the job's node count instead (MA_NUM_HOSTS, which the
    rendered Job gives every pod), refuses it with the same line, and the job trains in scheduler
    order."""
    options = demo.DemoOptions(
        nodes=6, nproc_per_node=1, tors=3, seed=0, steps=4, unlisted_pod=3, timeout=150
    )
    result = run_on_hosts(options, tmp_path, "pu")
    assert result.ok, explain(result)
    line = (
        f"{demo.RANK_TABLE_DIR}/jobstart_hccl.json: server_count: 5 servers, but the job has "
        "6 nodes (MA_NUM_HOSTS)"
    )
    for pod, spec_file in zip(result.pods, result.prepared.spec_files):
        assert pod.route_plan["status"] == "failed" and pod.route_plan["reason"] == line
        assert pod.rank_after_acc is None and pod.master_index is None and pod.restarts == 0
        errors = [
            text
            for text in (spec_file.parent / "pod.log").read_text().splitlines()
            if text.startswith("npu-job: error:")
        ]
        assert errors == [f"npu-job: error: {line}"]
    assert_trained_by_plan(result, list(range(6)), 1)


def test_a_rank_table_still_initializing_on_two_pods_meets_at_one_root_which_names_them(
    tmp_path,
):
    """Pods 4 and 5 still see the rank table ``initializing`` at their deadline (the kubelet had
    not synced the ConfigMap to their nodes) while pods 0-3 saw it completed: 0-3 plan, 4 and 5
    keep the scheduler order and report no placement. Every node still meets at pod 0's root,
    which plans one order over the pods' reports (4 and 5 placed last) and names pods 4 and 5 in
    one line; no node is refused. Each node leaves that round's plan for its workers, and the
    example script holds every worker to it, so the job trains on its first attempt, in the
    root's order."""
    lagging = (4, 5)
    options = demo.DemoOptions(
        nodes=6, nproc_per_node=1, tors=3, seed=2, steps=4, initializing_on=lagging, timeout=150
    )

    def sync_once_they_gave_up(supervisor: demo.Supervisor) -> None:
        def gave_up(index: int) -> bool:
            plan = supervisor.prepared.spec_files[index].parent / "tmp" / "route_plan.json"
            return plan.exists() and json.loads(plan.read_text())["status"] == "failed"

        assert supervisor.wait(until=lambda: all(map(gave_up, lagging))), "they did not fall back"
        for index in lagging:
            supervisor.sync_volumes(index)

    result = run_on_hosts(options, tmp_path, "pi", fault=sync_once_they_gave_up)
    assert result.finished, explain(result)
    pod_dirs = [spec_file.parent for spec_file in result.prepared.spec_files]
    reports = {
        str(index): (pod_dir / "tmp" / NODE_REPORT_FILE).read_bytes()
        for index, pod_dir in enumerate(pod_dirs)
    }
    root_plan = plan_round(reports)
    bootstrap_plan = result.prepared.plan
    assert root_plan.mapping_digest != bootstrap_plan.mapping_digest
    assert [root_plan.node_rank[str(index)] for index in lagging] == [4, 5]  # placed last
    digests = set()
    for pod, pod_dir in zip(result.pods, pod_dirs):
        log = (pod_dir / "pod.log").read_text()
        name = result.prepared.specs[pod.index].name
        assert attempt_header(name, 1) not in log  # no restart was needed
        assert "bootstraps decided different node orders" not in log
        digests |= set(re.findall(r"npu-run: round 0 plan ([0-9a-f]+): ", log))
        if pod.index == 0:
            (named,) = [line for line in log.splitlines() if "re-ranked" in line]
            for index in lagging:
                assert f"pod demo-worker-{index} (its bootstrap did not plan" in named, named
        left = json.loads((pod_dir / "tmp" / ROUND_PLAN_FILE).read_text())
        assert (left["round"], left["node_rank"]) == (0, root_plan.node_rank[str(pod.index)])
    assert digests == {root_plan.mapping_digest}
    assert {r["plan_source"] for r in result.reports} == {
        f"npu-run's round 0 plan {root_plan.mapping_digest}"
    }
    node_rank_of_pod = {index: root_plan.node_rank[str(index)] for index in range(options.nodes)}
    assert_trained_by_plan(result, node_rank_of_pod, 1)
