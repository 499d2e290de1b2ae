"""Pod level: the platform's documented pod command, exactly, runs ``bash bootstrap.sh`` (found on PATH, as
in an image with npu-job installed) for every pod of a generated 6-node job, each pod with the
environment the platform gives it and its own /tmp, and the command ends with the node rank and
master index the planner decided — or, when anything is wrong, with the scheduler's order.

Each pod runs in its own mount namespace with a private /tmp (``unshare --mount`` + a bind mount;
needs root, as CI has), so the command's literal ``/tmp/RANK_AFTER_ACC`` is per pod, exactly as in
separate containers. Without root (or with the checkout itself under /tmp, which the bind mount
would hide) the test falls back to running the same command text with
``/tmp/`` pointed at the pod's directory (and says so in the test id)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from npu_job.bootstrap import planner

import npu_job

from .documents import write_cce_job

SEED_POD_COMMAND = (
    "bash bootstrap.sh; export RANK_AFTER_ACC=${VC_TASK_INDEX}; "
    'rank_acc=$(cat /tmp/RANK_AFTER_ACC 2>/dev/null); [ -n "${rank_acc}" ] && export RANK_AFTER_ACC=${rank_acc}; '
    "export MA_MASTER_INDEX=$(cat /tmp/MASTER_INDEX 2>/dev/null || echo 0); bash train.sh"
)
TRAIN_SH = (
    'echo "train.sh sees RANK_AFTER_ACC=${RANK_AFTER_ACC} MA_MASTER_INDEX=${MA_MASTER_INDEX}"\n'
)
REPORT = '; echo "RESULT ${RANK_AFTER_ACC} ${MA_MASTER_INDEX}"'


def _private_tmp_works():
    """A pod's own /tmp (a bind mount in a private mount namespace) works here, and hides
    nothing the pod needs: a checkout under /tmp (its editable install) would vanish under it."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    package = Path(npu_job.__file__).resolve()
    if Path("/tmp") in package.parents or Path("/tmp") in Path(sys.executable).resolve().parents:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "true"], capture_output=True
    )
    return probe.returncode == 0


PRIVATE_TMP = _private_tmp_works()


def _pod_env(pod_dir, index, host_ip, rank_table_dir):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NPU_JOB_", "KUBERNETES_", "MA_", "VC_"))
    }
    env.pop("RANK_TABLE_FILE", None)
    env.update(VC_TASK_INDEX=str(index), MA_CURRENT_HOST_IP=host_ip, NPU_JOB_WAIT_TIMEOUT="0")
    if rank_table_dir is not None:
        env["RANK_TABLE_FILE"] = rank_table_dir
    env["NPU_JOB_OUTPUT_DIR"] = "/tmp" if PRIVATE_TMP else str(pod_dir)
    return env


def run_pod(
    pod_dir: Path,
    index: int,
    host_ip: str,
    *,
    with_rank_table: bool = True,
    command: str = SEED_POD_COMMAND,
):
    """Run ``command`` as pod ``index`` whose /tmp is ``pod_dir`` (holding config/ and train.sh)."""
    (pod_dir / "train.sh").write_text(TRAIN_SH)
    if PRIVATE_TMP:
        env = _pod_env(pod_dir, index, host_ip, "/tmp/config" if with_rank_table else None)
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            'mount --bind "$0" /tmp && cd /tmp && exec "$@"',
            str(pod_dir),
            "bash",
            "-c",
            command + REPORT,
        ]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    else:
        env = _pod_env(
            pod_dir, index, host_ip, str(pod_dir / "config") if with_rank_table else None
        )
        text = (command + REPORT).replace("/tmp/", f"{pod_dir}/")
        done = subprocess.run(
            ["bash", "-c", text], env=env, cwd=pod_dir, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stdout.strip().splitlines()[-1].split()
    assert last[0] == "RESULT", done.stdout
    assert f"train.sh sees RANK_AFTER_ACC={last[1]} MA_MASTER_INDEX={last[2]}" in done.stdout
    return int(last[1]), int(last[2]), done.stderr


def _job(tmp_path, nodes, tors):
    """One directory per pod, each with its own copy of the mounted ConfigMaps (as separate pods)."""
    table, topology, _ = write_cce_job(tmp_path / "source", nodes, tors, seed=11)
    pods = []
    for server in table.servers:
        pod_dir = tmp_path / f"pod-{server.pod_index}"
        shutil.copytree(tmp_path / "source", pod_dir / "config")
        pod_dir.chmod(0o1777)
        pods.append((pod_dir, server))
    return table, topology, pods


MODE = "private-tmp" if PRIVATE_TMP else "substituted-tmp"


@pytest.mark.parametrize("mode", [MODE])
def test_every_pod_of_a_6_node_job_gets_its_planned_rank(tmp_path, mode):
    table, topology, pods = _job(tmp_path, 6, 3)
    expected = planner.plan(table, topology)
    assert not expected.is_identity, (
        "a scattered job must actually be reordered, or the test proves nothing"
    )
    results = [run_pod(pod_dir, server.pod_index, server.server_id) for pod_dir, server in pods]
    assert [rank for rank, _, _ in results] == list(expected.node_rank_of_pod)
    assert {master for _, master, _ in results} == {expected.master_index}
    assert sorted(rank for rank, _, _ in results) == list(range(6))
    assert all("npu-job: error" not in stderr for _, _, stderr in results)


def _no_rank_table(tmp_path):
    table, _, pods = _job(tmp_path, 6, 3)
    return [
        (pod_dir, server, False) for pod_dir, server in pods
    ], "rank table: location: expected $RANK_TABLE_FILE"


def _two_nodes(tmp_path):
    _, _, pods = _job(tmp_path, 2, 1)
    return [(pod_dir, server, True) for pod_dir, server in pods], "plan: only 2 node(s)"


def _bad_json(tmp_path):
    _, _, pods = _job(tmp_path, 6, 3)
    for pod_dir, _ in pods:
        (pod_dir / "config" / "jobstart_hccl.json").write_text(
            '{"status": "completed", "server_list": ['
        )
    return [
        (pod_dir, server, True) for pod_dir, server in pods
    ], "jobstart_hccl.json: line 1 column 41: expected valid JSON"


@pytest.mark.parametrize(
    "make",
    [_no_rank_table, _two_nodes, _bad_json],
    ids=[f"no-rank-table-{MODE}", f"two-nodes-{MODE}", f"bad-json-{MODE}"],
)
def test_failures_leave_the_job_in_scheduler_order(tmp_path, make):
    pods, message = make(tmp_path)
    for pod_dir, server, with_table in pods[::2]:  # every other pod: each one behaves alike
        rank, master, stderr = run_pod(
            pod_dir, server.pod_index, server.server_id, with_rank_table=with_table
        )
        assert (rank, master) == (server.pod_index, 0)
        errors = [line for line in stderr.splitlines() if line.startswith("npu-job: error: ")]
        assert len(errors) == 1 and message in errors[0], stderr
        assert not (pod_dir / "RANK_AFTER_ACC").exists()


def test_set_e_pod_commands_survive_a_failed_bootstrap(tmp_path):
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir()
    rank, master, stderr = run_pod(
        pod_dir,
        4,
        "10.0.0.4",
        with_rank_table=False,
        command="set -e; bash bootstrap.sh; export RANK_AFTER_ACC=4 MA_MASTER_INDEX=0; bash train.sh",
    )
    assert (rank, master) == (4, 0) and "npu-job: error: rank table: location" in stderr


SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bootstrap.sh"


def test_bootstrap_sh_ends_without_losing_output_or_exit_code(tmp_path):
    """bootstrap.sh skips the interpreter's teardown (os._exit): stdout and stderr must still be
    flushed whole, through a pipe too, and --strict's exit code must survive."""
    table, _, rank_table = write_cce_job(tmp_path / "config", 8, 2)
    me = table.servers[3]
    env = _pod_env(tmp_path, me.pod_index, me.server_id, str(rank_table))
    env["NPU_JOB_OUTPUT_DIR"] = str(tmp_path / "out")
    env.pop("PYTHONUNBUFFERED", None)  # buffered, as in a pod
    done = subprocess.run(
        f"bash {SCRIPT} --json | cat",
        shell=True,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads((tmp_path / "out" / "route_plan.json").read_text())
    assert printed["status"] == "success" and printed["pod_index"] == 3
    assert "npu-job: node rank" in done.stderr  # the last log line made it out
    env["MA_CURRENT_HOST_IP"] = "192.0.2.1"
    strict = subprocess.run(
        ["bash", str(SCRIPT), "--strict"], env=env, capture_output=True, text=True, timeout=60
    )
    assert strict.returncode == 7, strict.stderr
    assert strict.stderr.startswith("npu-job: error: ") and "192.0.2.1" in strict.stderr
