"""`npu-job demo`: the whole pipeline on this machine, and the checks that make its exit status mean
something.

One real run (3 pods x 1 worker, loopback addresses, each pod in its own mount/UTS/PID namespace,
no network namespaces: what a user without root gets) proves the command end to end; the pure
checks are then fed doctored outcomes to show that every kind of inconsistency fails the run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from npu_job.bootstrap.base.model import Collective, Plan, PlanStatus
from npu_job.demo import podsim, podspec

from npu_job import demo
from npu_job.cli import main

UNSHARE = podsim.unshare_unavailable_reason()


def test_simulated_cluster_is_what_the_pods_will_read():
    options = demo.DemoOptions(nodes=6, tors=3, nproc_per_node=2)
    ips = demo.loopback_ips(6)
    cluster = demo.simulated_cluster(options, ips)
    assert [server.server_id for server in cluster.table.servers] == list(ips)
    assert all(len(server.devices) == 2 for server in cluster.table.servers)
    assert len(set(demo.tor_of_pod(cluster))) == 3
    plan = demo.expected_plan(cluster, options)
    score = demo.ring_score(cluster, plan)
    assert (
        str(plan.status) == "success" and plan.master_index != 0
    )  # the default demo moves the master
    assert score.cross_after == score.lower_bound == 3 < score.cross_before  # scattered, then fixed


def test_a_rank_table_that_lacks_a_pod_is_one_server_short_and_every_pod_keeps_its_order():
    options = demo.DemoOptions(nodes=6, tors=3, unlisted_pod=3)
    ips = demo.loopback_ips(6)
    cluster = demo.simulated_cluster(options, ips)
    listed = [server["server_id"] for server in json.loads(cluster.rank_table_json)["server_list"]]
    assert listed == [ip for index, ip in enumerate(ips) if index != 3]
    assert [server.server_id for server in cluster.table.servers] == list(ips)  # the pods' hosts
    plan = demo.expected_plan(cluster, options)
    assert str(plan.status) == "failed" and plan.pod_of_node_rank == tuple(range(6))
    assert not demo.expect_routing(options)
    with pytest.raises(ValueError, match="unlisted_pod must be a pod index below 6"):
        demo.DemoOptions(nodes=6, unlisted_pod=6)


def test_the_demo_renders_a_routed_cpu_job_that_brings_its_own_rank_table():
    """CCE delivers rank tables to NPU jobs only: the CPU job mounts its own where RANK_TABLE_FILE says."""
    options = demo.DemoOptions()
    rendered = demo.render_job(demo.demo_spec_values(options, 29500, "/srv/shared"))
    assert rendered.warnings == ()
    command = rendered.pod_command
    assert "bash bootstrap.sh" in command and "bash train.sh" in command
    documents = demo.manifest_documents(rendered)
    _, job = podspec.find_job(documents)
    template = job["spec"]["tasks"][0]["template"]
    assert "configmap1980" not in job["spec"]["plugins"] and "cabinet" not in rendered.job.text
    container = template["spec"]["containers"][0]
    assert "resources" not in container  # no accelerator requested
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["RANK_TABLE_FILE"] == "/user/config/jobstart_hccl.json"
    assert {"name": "ranktable", "configMap": {"name": demo.RANK_TABLE_CONFIGMAP}} in template[
        "spec"
    ]["volumes"]
    assert {"name": "ranktable", "mountPath": "/user/config", "readOnly": True} in container[
        "volumeMounts"
    ]
    cluster = demo.simulated_cluster(options, demo.loopback_ips(options.nodes))
    configmap = demo.user_configmaps(cluster)[demo.RANK_TABLE_CONFIGMAP]
    spec = podspec.pod_specs(documents + [configmap], demo.loopback_ips(options.nodes))[0]
    delivered = {mount.mount_path: dict(mount.files) for mount in spec.file_mounts}["/user/config"]
    assert delivered == {
        "jobstart_hccl.json": cluster.rank_table_json,
        "ranktable_tor.json": cluster.ranktable_tor_b64,
    }


@pytest.mark.parametrize(
    "deliver, routing", [(False, True), (True, False)], ids=["no-rank-table", "routing-off"]
)
def test_without_a_rank_table_to_use_the_cpu_job_mounts_none(deliver, routing):
    values = demo.demo_spec_values(
        demo.DemoOptions(deliver_rank_table=deliver, routing=routing), 29500, "/srv"
    )
    assert "RANK_TABLE_FILE" not in values["env"] and [v["name"] for v in values["volumes"]] == [
        "demo-shared"
    ]


def test_the_npu_variant_is_the_cce_job_with_nodes_of_the_simulated_size():
    options = demo.DemoOptions(device="npu", nproc_per_node=2)
    rendered = demo.render_job(demo.demo_spec_values(options, 29500, "/srv/shared"))
    assert "configmap1980" in rendered.job.text and '"cabinet"' in rendered.job.text
    assert rendered.spec.full_node_npus == 2 and rendered.warnings == ()


def plan_of(mapping):
    return Plan(PlanStatus.SUCCESS, tuple(mapping), Collective.RING)


def report(rank, pod, local, **extra):
    return {
        "rank": rank,
        "pod_index": pod,
        "local_rank": local,
        "world_size": 4,
        "param_digest": "d",
        "problems": [],
        "loss_decreased": True,
        **extra,
    }


def outcome(index, **extra):
    values = {
        "exit_code": 0,
        "restarts": 0,
        "route_plan": {"status": "success", "rank_mapping": "0-1,1-0"},
        "rank_after_acc": str(1 - index),
        "master_index": "1",
        **extra,
    }
    return demo.PodOutcome(index, **values)


GOOD_REPORTS = [report(0, 1, 0), report(1, 1, 1), report(2, 0, 0), report(3, 0, 1)]


@pytest.mark.parametrize(
    "pods, reports, expected",
    [
        ([outcome(0), outcome(1)], GOOD_REPORTS, None),
        ([outcome(0, exit_code=1), outcome(1)], GOOD_REPORTS, "pod 0: exited with 1"),
        (
            [outcome(0, rank_after_acc="0"), outcome(1)],
            GOOD_REPORTS,
            "pod 0: /tmp/RANK_AFTER_ACC is '0', expected 1",
        ),
        (
            [outcome(0, master_index="0"), outcome(1)],
            GOOD_REPORTS,
            "pod 0: /tmp/MASTER_INDEX is '0'",
        ),
        (
            [outcome(0, route_plan=None), outcome(1)],
            GOOD_REPORTS,
            "pod 0: the bootstrap wrote no route plan",
        ),
        (
            [outcome(0, route_plan={"status": "success", "rank_mapping": "0-0,1-1"}), outcome(1)],
            GOOD_REPORTS,
            "bootstrap mapping '0-0,1-1' != expected '0-1,1-0'",
        ),
        ([outcome(0), outcome(1)], GOOD_REPORTS[:3], "no report from rank(s) [3]"),
        (
            [outcome(0), outcome(1)],
            [report(0, 0, 0)] + GOOD_REPORTS[1:],
            "rank 0 runs on pod 0 local rank 0; the plan gives 2",
        ),
        (
            [outcome(0), outcome(1)],
            GOOD_REPORTS[:3] + [report(3, 0, 1, param_digest="e")],
            "disagree on the trained parameters",
        ),
        (
            [outcome(0), outcome(1)],
            GOOD_REPORTS[:3] + [report(3, 0, 1, loss_decreased=False)],
            "rank 3: the loss did not go down",
        ),
        (
            [outcome(0), outcome(1)],
            GOOD_REPORTS[:3] + [report(3, 0, 1, problems=["RANK env 3 != 2"])],
            "rank 3: RANK env 3 != 2",
        ),
    ],
    ids=[
        "consistent",
        "pod-failed",
        "wrong-rank-file",
        "wrong-master",
        "no-route-plan",
        "other-mapping",
        "missing-worker",
        "rank-off-plan",
        "parameters-differ",
        "loss-not-down",
        "worker-own-check",
    ],
)
def test_every_inconsistency_in_the_chain_is_reported(pods, reports, expected):
    options = demo.DemoOptions(nodes=2, nproc_per_node=2, tors=2)
    problems = demo.check_outcome(plan_of([1, 0]), options, pods, reports, expect_routing=True)
    if expected is None:
        assert problems == []
    else:
        assert any(expected in problem for problem in problems), problems


def test_a_fallback_that_still_wrote_rank_files_is_reported():
    options = demo.DemoOptions(nodes=2, nproc_per_node=2, tors=2)
    identity = Plan(PlanStatus.FAILED, (0, 1), Collective.RING)
    pods = [
        outcome(0, rank_after_acc="0", route_plan=None),
        outcome(1, rank_after_acc=None, route_plan=None),
    ]
    reports = [report(0, 0, 0), report(1, 0, 1), report(2, 1, 0), report(3, 1, 1)]
    problems = demo.check_outcome(identity, options, pods, reports, expect_routing=False)
    assert problems == ["pod 0: fallback expected, but /tmp/RANK_AFTER_ACC is '0'"]


def test_a_pod_whose_first_line_is_not_the_bundles_identity_is_reported():
    from npu_job.bundle import Bundle

    bundle = Bundle(b"", "sha256:" + "ab" * 32, "9.9", 0, 0)
    identity = demo.bundle_identity(bundle)
    assert identity == "npu-job: running 9.9 from bundle sha256:abababababab ("
    options = demo.DemoOptions(nodes=2, nproc_per_node=2, tors=2)
    good = f"{identity}./npu-job.pyz) on Python 3.7.16 (/usr/bin/python3)"
    pods = [
        outcome(0, first_line=good),
        outcome(1, first_line="npu-job: error: bootstrap.sh: ... not importable"),
    ]
    problems = demo.check_outcome(
        plan_of([1, 0]), options, pods, GOOD_REPORTS, expect_routing=True, identity=identity
    )
    assert len(problems) == 1 and problems[0].startswith(
        "pod 1: the bootstrap did not say it ran from the job's bundle"
    )


def test_a_pods_first_line_is_read_from_its_last_attempt():
    log = "--- p attempt 0\nold first\nmore\n--- p attempt 1\nnew first\nmore\n--- q attempt 0\n"
    assert demo.first_line(log, "p", 1) == "new first"
    assert demo.first_line(log, "p", 0) == "old first"
    assert demo.first_line(log, "q", 0) is None and demo.first_line(log, "p", 2) is None


def test_the_phases_add_up_to_the_one_total_as_printed():
    phases = demo.Phases(
        {
            "start": 100.0,
            "prepared": 100.04,
            "pods_started": 100.08,
            "bootstrap_done": 101.26,
            "training_started": 125.33,
            "training_done": 126.01,
            "pods_exited": 134.27,
            "finished": 134.3,
        }
    )
    printed = phases.durations(digits=1)
    total = printed.pop("total")
    assert list(printed) == [
        "cluster+render",
        "start pods",
        "bootstrap",
        "launch+rendezvous",
        "training",
        "shutdown",
        "checks+clean-up",
    ]
    assert f"{sum(printed.values()):.1f}" == f"{total:.1f}" == "34.3"
    assert phases.durations()["total"] == 34.3


def staged_job(tmp_path, **options):
    """A job rendered and staged as the demo does, its pods not started."""
    prepared = demo.prepare(
        demo.DemoOptions(**options), tmp_path, demo.loopback_ips(options["nodes"])
    )
    lines = []
    return demo.Supervisor(prepared, progress=lines.append), lines


def test_while_the_pods_start_the_supervisor_says_how_far_they_got(tmp_path):
    supervisor, lines = staged_job(tmp_path, nodes=3, tors=3, nproc_per_node=2)
    supervisor.phases.mark("start", 1000.0)
    supervisor.say("starting")
    for index, node_rank in enumerate((2, 0, 1)):
        supervisor._on_line(
            index, f"npu-job: node rank {node_rank} of 3, master demo-worker-1.demo:29500"
        )
    for index in (0, 1):
        supervisor._on_line(
            index, f"npu-run: node rank {index} joined round 0 of 'none'; waiting for 3 node(s)"
        )
    supervisor._on_line(
        1, "npu-run: round 0 complete: node rank 0 of 3; workers use the store at 127.0.0.1:1"
    )
    supervisor.heartbeat(supervisor._last_progress + 1)  # said something a moment ago: quiet
    assert not any(line.startswith("waiting") for line in lines)
    supervisor.heartbeat(supervisor._last_progress + demo.PROGRESS_EVERY)
    assert lines[-1].startswith("waiting (") and lines[-1].endswith(
        "3/3 pods bootstrapped, 2/3 joined the rendezvous, 1/3 through it, 0/6 workers running"
    )
    for index in (0, 2):
        supervisor._on_line(
            index, f"npu-run: round 0 complete: node rank {index} of 3; workers use the store"
        )
    assert lines[-1] == "rendezvous: all 3 nodes joined; starting 6 workers"
    supervisor._on_line(1, "train_ddp: step 3/20 loss 0.4")
    assert supervisor.status(1010.0) == "waiting (10 s): training step 3/20, 0/6 workers running"
    supervisor._on_line(
        1, "train_ddp: done: 6 ranks agree on parameters 0123, held-out loss 0.5 -> 0.3"
    )
    assert (
        supervisor.status(1020.0)
        == "waiting (20 s): training done, 0/6 workers still running, 0/3 pods exited"
    )
    assert not any(
        "held-out loss" in line for line in lines
    )  # the CLI's closing line says it, once


def _pods_running(supervisor, argv):
    """Each staged pod as a real process running ``argv`` (in its own session, as pods are)."""
    workspace = supervisor.prepared.workspace
    return [
        podsim.PodProcess(spec, workspace, subprocess.Popen(argv, start_new_session=True), 0)
        for spec in supervisor.prepared.specs
    ]


def test_the_supervisor_returns_once_every_pod_exited(tmp_path):
    supervisor, lines = staged_job(tmp_path, nodes=3, tors=3, nproc_per_node=1)
    supervisor.pods = _pods_running(supervisor, ["true"])
    supervisor.phases.mark("start")
    assert supervisor.wait() is True
    assert supervisor.exit_codes == [0, 0, 0]
    assert sorted(line.split(" at ")[0] for line in lines) == [
        f"pod {index}: exited 0" for index in range(3)
    ]
    assert "pods_exited" in supervisor.phases.marks


def test_the_supervisor_kills_every_pod_still_running_at_the_timeout_and_says_so(tmp_path):
    supervisor, lines = staged_job(tmp_path, nodes=3, tors=3, nproc_per_node=1, timeout=1.0)
    pods = supervisor.pods = _pods_running(supervisor, ["sleep", "60"])
    supervisor.phases.mark("start")
    assert supervisor.wait() is False
    assert lines[-1] == "timeout: the job did not finish within 1 s; killing every pod"
    assert [pod.process.wait(10) for pod in pods] == [-9, -9, -9]


def test_a_pods_first_error_line_is_what_went_wrong_not_a_warning(tmp_path):
    supervisor, _ = staged_job(tmp_path, nodes=3, tors=3, nproc_per_node=1)
    supervisor._on_line(0, "UserWarning: Failed to initialize NumPy: No module named 'numpy'")
    supervisor._on_line(0, "npu-run: node rank 2 joined round 0 of 'none'; waiting for 3 node(s)")
    supervisor._on_line(0, "RuntimeError: Connection reset by peer")
    supervisor._on_line(0, "train_ddp: rank 2: FAILED: RANK env 3 != 2")
    assert supervisor.first_errors == {0: "RuntimeError: Connection reset by peer"}


def test_a_run_without_routing_says_routing_is_off_not_that_a_plan_failed(tmp_path):
    supervisor, lines = staged_job(tmp_path, nodes=3, tors=3, nproc_per_node=1, routing=False)
    demo.describe_plan(supervisor.prepared, lines.append)
    assert lines == [
        "route plan: off (routing disabled): every pod keeps the scheduler's order "
        "(node rank = VC_TASK_INDEX)"
    ]


# -- the command ------------------------------------------------------------------------------
@pytest.mark.torch
@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_demo_runs_the_whole_chain_and_says_so(tmp_path, capsys, monkeypatch):
    """As a user without root runs it: the pods get user namespaces (``unshare --user``)."""
    monkeypatch.setattr(podsim.os, "geteuid", lambda: 1000)
    assert "--user" in podsim.unshare_prefix()
    keep = tmp_path / "demo"
    code = main(
        [
            "demo",
            "--nodes",
            "3",
            "--tors",
            "3",
            "--nproc-per-node",
            "1",
            "--steps",
            "4",
            "--seed",
            "0",
            "--keep",
            str(keep),
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "npu-job: image (stock): python3 " in err  # the default: torch, no npu-job
    summary = json.loads(out)
    assert summary["version"] == 1 and summary["ok"] is True and summary["problems"] == []
    node_rank = {pod["pod_index"]: pod["node_rank"] for pod in summary["plan"]["pods"]}
    assert sorted(node_rank.values()) == [0, 1, 2]
    assert [w["rank"] for w in summary["workers"]] == [0, 1, 2]
    assert all(w["rank"] == node_rank[w["pod_index"]] for w in summary["workers"])
    assert len({w["param_digest"] for w in summary["workers"]}) == 1
    assert summary["loss"]["eval_final"] < summary["loss"]["eval_initial"]
    assert summary["ring"]["cross_tor_edges_planned"] == summary["ring"]["lower_bound"]
    assert set(summary["phases_s"]) >= {
        "cluster+render",
        "bootstrap",
        "launch+rendezvous",
        "training",
        "total",
    }
    for line in (
        "route plan (success)",
        "cross-ToR ring edges",
        "train.sh: node rank",
        "rendezvous: all 3 nodes joined; starting 3 workers",
        "training: step 4/4",
        "ranks: 3/3 workers",
        "parameters: identical",
        "phases:",
        "OK: the whole chain is consistent",
    ):
        assert line in err
    assert err.count("held-out loss") == 1 and "total" not in err  # the result once, one total
    phases = [line for line in err.splitlines() if line.startswith("npu-job: phases: ")]
    seconds = [float(value) for value in re.findall(r" (\d+\.\d) s\b", phases[0])]
    assert f"{sum(seconds):.1f} s" == err.splitlines()[-1].rsplit(" in ", 1)[1]
    assert (keep / "rendered" / "config.yaml").is_file()
    assert podsim.processes_inside(keep) == []


PY37 = demo.find_interpreter((3, 7))


@pytest.mark.torch
@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
@pytest.mark.skipif(
    PY37 is None, reason="no CPython 3.7 (python3.7 on PATH or pyenv): no stock-py37"
)
def test_the_routed_pipeline_runs_where_python3_is_3_7_and_torch_is_elsewhere(tmp_path):
    """A CANN-like image: the bootstrap runs the bundle on python3 3.7, npu-run and the workers on
    the interpreter NPU_JOB_LAUNCHER_PYTHON names; every pod must still follow the plan."""
    options = demo.DemoOptions(
        nodes=3, tors=3, nproc_per_node=1, steps=2, image="stock-py37", timeout=200
    )
    result = demo.run(options, tmp_path / "w")
    assert result.ok, "\n".join(result.problems)
    assert all(" on Python 3.7." in pod.first_line for pod in result.pods)
    assert [pod.route_plan["rank_mapping"] for pod in result.pods] == [
        result.prepared.plan.rank_mapping
    ] * 3


CRON_PATH = "/usr/bin:/bin"  # what cron gives a job; CI runners and service managers are alike


def installed_command(name):
    """The console script ``name`` of the npu-job installation running these tests."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        pytest.skip(f"npu-job is not installed with console scripts beside {sys.executable}")
    return path


@pytest.mark.torch
@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
@pytest.mark.parametrize("layout", ["absolute-path", "pipx-links"])
def test_the_installed_demo_runs_whatever_the_callers_PATH(tmp_path, layout):
    """How installed tools are called: by the absolute path of the virtualenv's script from a shell
    whose PATH lacks the virtualenv (cron, CI), or through pipx's links to npu-job and npu-run in a
    directory on PATH, the virtualenv (and its python3) never on it. The pods' image is this
    installation either way: their bootstrap imports npu_job and train.sh finds npu-run."""
    import shutil
    import tempfile

    command = installed_command("npu-job")
    path = CRON_PATH
    links = None
    if layout == "pipx-links":
        # like pipx's ~/.local/bin: outside /tmp (a pod's /tmp is its own), beside the virtualenv
        links = Path(tempfile.mkdtemp(prefix="test-links-", dir=sys.prefix))
        for name in ("npu-job", "npu-run"):
            (links / name).symlink_to(installed_command(name))
        command, path = links / "npu-job", f"{links}:{CRON_PATH}"
    try:
        run = subprocess.run(
            [
                str(command),
                "demo",
                "--nodes",
                "3",
                "--tors",
                "3",
                "--nproc-per-node",
                "1",
                "--steps",
                "2",
                "--image",
                "installed",
                "--keep",
                str(tmp_path / "demo"),
                "--json",
            ],
            env={"PATH": path, "HOME": os.environ.get("HOME", "/")},
            capture_output=True,
            text=True,
            timeout=280,
        )
    finally:
        if links is not None:
            shutil.rmtree(links)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["ok"] is True
    assert [pod["route_plan_status"] for pod in summary["pods"]] == ["success"] * 3


def _without_the_bundle(rendered):
    """The rendered job's documents with the scripts ConfigMap's npu-job.pyz dropped."""
    documents = demo.manifest_documents(rendered)
    for document in documents:
        if document.get("kind") == "ConfigMap":
            document.pop("binaryData", None)
    return documents


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_stock_pods_fail_without_the_bundle_and_the_summary_names_the_first_error(
    tmp_path, monkeypatch, capsys
):
    """The stock image has no npu-job: a job whose ConfigMap lost its npu-job.pyz (as if render
    stopped shipping it) cannot bootstrap (npu_job is not importable) and train.sh stops (exit
    10); the one-line summary says what went wrong in the pods, not only what the checks missed
    afterwards."""
    from npu_job.demo import runner

    monkeypatch.setattr(runner, "manifest_documents", _without_the_bundle)
    monkeypatch.setenv("PATH", CRON_PATH)
    keep = tmp_path / "demo"
    argv = ["demo", "--nodes", "1", "--tors", "1", "--nproc-per-node", "1", "--keep", str(keep)]
    assert main(argv) == 7
    err = capsys.readouterr().err
    summary = [line for line in err.splitlines() if line.startswith("npu-job: error: demo:")]
    assert len(summary) == 1
    assert summary[0].startswith("npu-job: error: demo: first error: pod 0: ")
    assert "the npu_job package is not importable" in summary[0]
    assert "pod 0: exited with 10" in summary[0]
    pod_log = (keep / "pods" / "demo-worker-0" / "pod.log").read_text()
    assert "no readable npu-job bundle (npu-run is in it)" in pod_log


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_a_failed_run_without_keep_is_kept_and_its_error_says_where(tmp_path, monkeypatch, capsys):
    """A failure may not come back when rerun, so the temporary workspace of a failed demo stays
    (the bundle-less job of the test above) and the TIP names its pod logs."""
    import tempfile

    from npu_job.demo import runner

    monkeypatch.setattr(runner, "manifest_documents", _without_the_bundle)
    monkeypatch.setenv("PATH", CRON_PATH)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["demo", "--nodes", "1", "--tors", "1", "--nproc-per-node", "1"]) == 7
    (kept,) = tmp_path.iterdir()
    tip = capsys.readouterr().err.splitlines()[-1]
    assert tip == (
        f"npu-job: TIP: read {kept}/pods/*/pod.log (kept because the demo failed; delete it "
        "when done)"
    )
    assert "no readable npu-job bundle" in (kept / "pods" / "demo-worker-0" / "pod.log").read_text()


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (
            ["--nodes", "3", "--tors", "4"],
            2,
            "--tors 4: cannot spread 3 node(s) over more ToRs than nodes",
        ),
        (["--nodes", "0"], 2, "expected an integer >= 1, got '0'"),
        (["--steps", "x"], 2, "expected an integer >= 1, got 'x'"),
        (["--kind", "slurm"], 2, "argument --kind: invalid choice: 'slurm'"),
    ],
    ids=["more-tors-than-nodes", "no-nodes", "steps-not-a-number", "unknown-kind"],
)
def test_bad_options_are_usage_errors(argv, code, message, capsys):
    """Usage errors, whether argparse or the demo finds them: exit 2, argparse's own error line."""
    assert main(["demo", *argv]) == code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: npu-job demo ") and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("npu-job demo: error: ") and message in last


def test_a_non_empty_keep_directory_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "precious").write_text("x")
    assert main(["demo", "--keep", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        f"npu-job demo: error: --keep {tmp_path}: the directory is not empty" in err
        and "Traceback" not in err
    )
    assert (tmp_path / "precious").read_text() == "x"


def test_write_inputs_writes_the_simulated_clusters_cce_files_and_never_overwrites_them(
    tmp_path, capsys
):
    from npu_job.bootstrap.ranktable import parse_rank_table

    target = tmp_path / "cfg"
    assert main(["demo", "--write-inputs", str(target), "--nodes", "4", "--tors", "2"]) == 0
    assert sorted(os.listdir(target)) == ["jobstart_hccl.json", "ranktable_tor.json"]
    table = parse_rank_table((target / "jobstart_hccl.json").read_bytes(), "jobstart_hccl.json")
    assert [server.server_id for server in table.servers] == list(demo.loopback_ips(4))
    (target / "ranktable_tor.json").write_text("mine")
    capsys.readouterr()
    assert main(["demo", "--write-inputs", str(target)]) == 2
    assert "npu-job demo: error: --write-inputs" in capsys.readouterr().err
    assert (target / "ranktable_tor.json").read_text() == "mine"


def test_without_unshare_the_demo_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no unshare on PATH
    assert main(["demo"]) == 8
    err = capsys.readouterr().err
    assert "cannot give each pod its own mount namespace" in err and "TIP:" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_pods_that_cannot_get_namespaces_fail_fast_with_one_clear_error(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(
        podsim, "unshare_prefix", lambda user_namespace=None: []
    )  # pods without namespaces
    assert (
        main(["demo", "--nodes", "3", "--nproc-per-node", "1", "--keep", str(tmp_path / "d")]) == 8
    )
    err = capsys.readouterr().err
    assert (
        "cannot start the pods: pod " in err and "private mount namespace" in err and "TIP:" in err
    )
    assert "Traceback" not in err


# -- a job without a rank table: its pods from the Kubernetes API -------------------------------


def test_a_routed_cpu_job_without_a_rank_table_renders_to_the_api_and_stages_its_account(tmp_path):
    """The pods get what the kubelet gives them (KUBERNETES_SERVICE_*, the service account's
    files); the job gets NPU_JOB_PODS and its RBAC; the expected plan is the bootstrap's own."""
    from tests.bootstrap.https_server import make_self_signed

    cert, _ = make_self_signed(tmp_path)
    api = demo.ClusterAPI("127.0.0.1", 6443, "tok", cert.read_text())
    options = demo.DemoOptions(nodes=6, tors=3, nproc_per_node=1, routing_source="api")
    prepared = demo.prepare(options, tmp_path / "w", demo.loopback_ips(6), api)
    kinds = [doc.kind for doc in prepared.rendered.documents]
    assert "ServiceAccount" in kinds and "ClusterRole" in kinds
    env = prepared.specs[0].env_dict()
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    assert env["NPU_JOB_PODS"] == "k8s" and "RANK_TABLE_FILE" not in env
    mounted = {mount.mount_path for mount in prepared.specs[0].file_mounts}
    assert {
        f"{demo.scenario.SERVICE_ACCOUNT_DIR}/{name}" for name in ("token", "ca.crt", "namespace")
    } <= mounted
    assert prepared.plan.status.value == "success"
    # the same order as from the rank table and ranktable_tor.json of the same cluster
    by_rank_table = demo.expected_plan(
        prepared.cluster, demo.DemoOptions(nodes=6, tors=3, nproc_per_node=1)
    )
    assert prepared.plan.rank_mapping == by_rank_table.rank_mapping
    listed = json.loads((tmp_path / "w" / "cluster" / "cluster.json").read_text())
    assert {item["kind"] for item in listed["items"]} == {"HyperNode", "Node", "Pod"}


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_a_held_back_rank_table_is_initializing_until_the_kubelets_sync(tmp_path, device):
    """The CPU job mounts its ConfigMap as a directory, CCE's plugin gives one file each: either
    way the lagging pod sees an initializing table, and the completed one once synced."""
    options = demo.DemoOptions(
        nodes=3, tors=3, nproc_per_node=1, device=device, initializing_on=(1,)
    )
    prepared = demo.prepare(options, tmp_path / "w", demo.loopback_ips(3))
    path = f"{demo.RANK_TABLE_DIR}/jobstart_hccl.json"
    staged = [
        podsim.staged_file(spec, spec_file.parent, path)
        for spec, spec_file in zip(prepared.specs, prepared.spec_files)
    ]
    statuses = [json.loads(file.read_text())["status"] for file in staged]
    assert statuses == ["completed", "initializing", "completed"]
    demo.Supervisor(prepared).sync_volumes(1)
    assert staged[1].read_text() == prepared.cluster.rank_table_json
    with pytest.raises(ValueError, match="initializing_on must hold pod indices below 3"):
        demo.DemoOptions(nodes=3, initializing_on=(3,))


@pytest.mark.torch
@pytest.mark.skipif(UNSHARE is not None, reason=UNSHARE or "")
def test_a_cpu_job_routes_with_no_rank_table_by_the_api_on_loopback(tmp_path):
    """The pod simulator runs a CPU job with routing on and no rank table: every pod's bootstrap
    lists the job's pods, Nodes and HyperNodes from a Kubernetes API served on loopback (a real
    HTTPS server, the thin fake of the documented LIST endpoints in tests/bootstrap), plans,
    and npu-run trains under the planned ranks."""
    from tests.e2e.kind_runs import run_routed_by_the_api

    options = demo.DemoOptions(
        nodes=4, tors=2, nproc_per_node=1, steps=4, seed=1, routing_source="api", timeout=200
    )
    run = run_routed_by_the_api(options, tmp_path)
    result = run.result
    assert result.ok, run.explain()
    plan = result.prepared.plan
    assert plan.status.value == "success" and not plan.is_identity
    for pod in result.pods:
        assert pod.route_plan["pods"].endswith("/api/v1/namespaces/default/pods")
        assert pod.route_plan["topology"].endswith(
            "/apis/topology.volcano.sh/v1alpha1/hypernodes (volcano-hypernodes)"
        )
        assert pod.route_plan["rank_mapping"] == plan.rank_mapping
    assert sorted(r["rank"] for r in result.reports) == list(range(options.nodes))
    assert len(run.pod_lists) >= options.nodes  # every pod listed its job itself
    assert run.selectors == {"volcano.sh/job-name=demo,volcano.sh/task-spec=worker"}


@pytest.mark.parametrize("probe, flag", [(True, "--probe\n"), (30, "--probe=30\n"), (False, None)])
def test_the_demos_probe_reaches_the_rendered_train_sh(probe, flag):
    """``npu-job demo --probe[=SECONDS]`` renders the job with the spec key probe."""
    values = demo.demo_spec_values(demo.DemoOptions(probe=probe), 29500, "/srv/shared")
    assert values.get("probe", False) == probe
    script = dict(demo.render_job(values).scripts)["train.sh"]
    assert ("--probe" in script) == (flag is not None)
    if flag is not None:
        assert flag in script
