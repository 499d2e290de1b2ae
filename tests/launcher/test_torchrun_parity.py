"""npu-run is a drop-in for torchrun: the cases of torch's own launcher tests
(``test/distributed/launcher/test_run.py``), each as a launch of ``npu-run``.

Each test names the torch tests it stands for. The launches are real: the installed ``npu-run``
console script (or ``run.main`` in this process, where the case is a second launch of one
process), real workers (``workers/parity.py``, ``workers/touch_rank.sh``), read from outside
through the files they write. One launch checks what several torch tests check where the
settings allow it: a launch costs seconds. Where npu-run answers differently on purpose (its exit
codes, docs/launcher.md), the test holds that choice.

torch's tests that only check torch's internals through mocks
(test_launch_elastic_agent_raise_exception, test_launch_shutdown, the ``events.record`` calls)
have no behaviour of npu-run to compare, test_is_not_torchelastic_launched runs no launcher, and
test_virtual_local_rank needs two GPUs. For ``--nproc-per-node=auto`` on CPUs npu-run counts the CPUs this process may use, where
torchrun counts the host's (docs/launcher.md): the choice is tested in test_cpus.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

import pytest
from npu_job.launcher import devices, run, torchcompat

from npu_job.errors import LaunchError

from .cluster import WORKERS, alive, free_port, wait_for

SCRIPT = str(WORKERS / "parity.py")
SHELL_SCRIPT = str(WORKERS / "touch_rank.sh")
SENTINEL = "FOOBAR"  # set in the launcher's environment; every worker must see it
LAUNCH_TIMEOUT = 120
USAGE = 2


@pytest.fixture(autouse=True)
def launcher_env(clean_launcher_env, monkeypatch):
    """torch's tests set a sentinel in the launcher's environment that every worker must see."""
    monkeypatch.setenv("TEST_SENTINEL_PARENT", SENTINEL)


def launcher(name: str) -> str:
    executable = shutil.which(name)
    assert executable, f"the {name} console script is not installed"
    return executable


def launch(*argv: str, program: str = "npu-run", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [launcher(program), *argv],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        env={**os.environ, **env},
    )


def records(out: Path) -> Dict[int, dict]:
    return {int(path.stem): json.loads(path.read_text()) for path in out.glob("*.json")}


def touched(out: Path) -> List[str]:
    return sorted(path.name for path in out.iterdir())


def has_flag(flag: str) -> bool:
    return flag in run.build_parser()._option_string_actions


def has_prefix_template() -> bool:
    """torch reads TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (its LaunchConfig has the field)."""
    from torch.distributed.launcher.api import LaunchConfig

    return "log_line_prefix_template" in {field.name for field in dataclasses.fields(LaunchConfig)}


# -- --run-path: the script runs in the worker's interpreter (runpy.run_path), as in torchrun ---


def test_run_path_runs_the_script_in_each_worker_like_torchrun(tmp_path):
    """torch's test_launch_run_path, test_is_torchelastic_launched,
    test_init_method_tcp_with_torchelastic and test_launch_user_script_python_caffe2_bc: static
    rendezvous on a given master address and port, the workers' gloo group through tcp:// on
    that port (the agent's store), and side by side with torchrun: the same workers."""
    seen = {}
    for program in ("npu-run", "torchrun"):
        out = tmp_path / program
        out.mkdir()
        port = free_port()
        done = launch(
            "--run-path",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--node-rank=0",
            "--master-addr=localhost",
            f"--master-port={port}",
            "--monitor-interval=1",
            SCRIPT,
            str(out),
            f"--init-method=tcp://localhost:{port}",
            program=program,
        )
        assert done.returncode == 0, done.stderr
        found = records(out)
        assert sorted(found) == [0, 1], done.stderr
        for record in found.values():
            assert record["name"] == "__main__" and record["argv"][0] == SCRIPT
            assert record["argv"][1:] == [str(out), f"--init-method=tcp://localhost:{port}"]
            assert record["elastic"] is True and record["sum"] == 3.0
            assert record["env"]["MASTER_PORT"] == str(port)
            assert record["env"]["TEST_SENTINEL_PARENT"] == SENTINEL
        seen[program] = found
    for rank in (0, 1):
        ours, theirs = seen["npu-run"][rank], seen["torchrun"][rank]
        assert ours["executable"] == theirs["executable"]
        same = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
        assert {name: ours["env"][name] for name in same} == {
            name: theirs["env"][name] for name in same
        }


def test_run_path_with_env_init_a_logs_spec_and_prefixed_tee(tmp_path, monkeypatch):
    """torch's test_init_method_env_with_torchelastic,
    test_is_torchelastic_launched_with_logs_spec_defined and
    test_capture_logs_using_default_logs_specs (there with --no-python): env:// through
    torchrun's variables, --logs-specs=default, and the workers' output teed with the
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE prefix."""
    optional = ["--logs-specs=default"] if has_flag("--logs-specs") else []
    done = launch(
        "--run-path",
        "--nnodes=1",
        "--nproc-per-node=2",
        f"--master-port={free_port()}",
        "--monitor-interval=1",
        "--redirects=3",
        "--tee=3",
        *optional,
        SCRIPT,
        str(tmp_path),
        "--init-method=env://",
        TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: ",
    )
    assert done.returncode == 0, done.stderr
    found = records(tmp_path)
    assert sorted(found) == [0, 1]
    assert all(record["elastic"] is True and record["sum"] == 3.0 for record in found.values())
    for rank in (0, 1):
        prefix = f"[rank{rank}]: " if has_prefix_template() else f"[default{rank}]:"  # 2.2+
        assert f"{prefix}worker {rank} ran" in done.stdout, done.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_run_path_workers_die_with_a_sigkilled_agent(tmp_path):
    """The parent-death signal holds for --run-path's workers too (torch starts them with its
    start method, not as a command): a SIGKILLed npu-run leaves none of them running. torch
    sets SIGINT as their parent-death signal, which a worker stuck in C code never acts on
    (here: one that ignores SIGINT); npu-run's is SIGKILL, as for its command workers."""
    agent = subprocess.Popen(
        [
            launcher("npu-run"),
            "--run-path",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--monitor-interval=1",
            SCRIPT,
            str(tmp_path),
            "--hold",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        found = wait_for(lambda: len(records(tmp_path)) == 2 and records(tmp_path), 60, "workers")
        workers = [record["pid"] for record in found.values()]
        assert all(record["ppid"] == agent.pid for record in found.values())
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in workers), 10, "the workers to die")
    finally:
        agent.kill()
        for record in records(tmp_path).values():
            try:
                os.kill(record["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- commands, PET_* variables, c10d --------------------------------------------------------


def test_no_python_workers_configured_by_pet_variables(tmp_path):
    """torch's test_launch_with_env_vars and test_launch_user_script_bash: every setting from
    PET_* (--no-python: the training script is a program of its own)."""
    done = launch(
        SHELL_SCRIPT,
        str(tmp_path),
        PET_NNODES="1",
        PET_NPROC_PER_NODE="3",
        PET_RDZV_ID="parity",
        PET_MONITOR_INTERVAL="1",
        PET_START_METHOD="spawn",
        PET_NO_PYTHON="1",
        PET_MODULE="0",
    )
    assert done.returncode == 0, done.stderr
    assert touched(tmp_path) == ["0", "1", "2"]


def test_standalone_defaults_to_one_worker(tmp_path):
    """torch's test_launch_standalone and test_launch_user_script_default_nproc."""
    done = launch(
        "--standalone", "--monitor-interval=1", "--no-python", SHELL_SCRIPT, str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert touched(tmp_path) == ["0"]


def test_two_agents_meet_in_an_elastic_c10d_rendezvous(tmp_path):
    """torch's test_launch_elastic_multiple_agents and test_launch_elastic: --nnodes=1:2 with two
    agents, the --rdzv-conf value in quotes as torch's test writes it; the round completes as
    soon as both came (max nodes), whatever the last-call time."""
    argv = [
        "--nnodes=1:2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=localhost:{free_port()}",
        "--rdzv-conf='join_timeout=60,last_call_timeout=60,timeout=60'",
        "--rdzv-id=parity",
        "--monitor-interval=1",
        SCRIPT,
        str(tmp_path),
    ]
    agents = [
        subprocess.Popen(
            [launcher("npu-run"), *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for agent in agents:
            _, err = agent.communicate(timeout=LAUNCH_TIMEOUT)
            assert agent.returncode == 0, err
    finally:
        for agent in agents:
            agent.kill()
    found = records(tmp_path)
    assert sorted(found) == [0, 1, 2, 3]
    assert {record["env"]["WORLD_SIZE"] for record in found.values()} == {"4"}


def test_a_c10d_rendezvous_that_times_out_says_what_failed(tmp_path):
    """One of two nodes, c10d: torch raises a RendezvousTimeoutError with no text; npu-run's
    line names it, the rendezvous, and the wait (exit 8, where torchrun ends on the traceback)."""
    endpoint = f"localhost:{free_port()}"
    done = launch(
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        "--rdzv-id=lonely",
        "--rdzv-conf=join_timeout=2",
        SCRIPT,
        str(tmp_path),
    )
    assert done.returncode == LaunchError.exit_code, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "npu-run: error: rendezvous failed: RendezvousTimeoutError: the c10d rendezvous "
        f"'lonely' at {endpoint}: fewer than the 2 node(s) of --nnodes=2 joined it within "
        "join_timeout (2s)"
    )


def test_a_failing_rendezvous_keeps_its_own_text_or_names_its_type():
    config = SimpleNamespace(
        min_nodes=1,
        max_nodes=3,
        rdzv_backend="c10d",
        run_id="r",
        rdzv_endpoint="h:1",
        rdzv_configs={},
    )
    from torch.distributed.elastic.rendezvous import (
        RendezvousClosedError,
        RendezvousError,
        RendezvousTimeoutError,
    )

    assert run.rendezvous_failure(RendezvousError("node rank 1 lost it"), config) == (
        "node rank 1 lost it"
    )
    assert run.rendezvous_failure(RendezvousTimeoutError(), config).endswith(
        "fewer than the 1 node(s) of --nnodes=1:3 joined it within join_timeout (600s)"
    )
    assert run.rendezvous_failure(RendezvousClosedError(), config) == (
        "RendezvousClosedError: the c10d rendezvous 'r' at h:1: it was closed (another node "
        "finished or gave up)"
    )
    assert run.rendezvous_failure(RendezvousError(" "), config).endswith("torch gave no reason")


# -- a worker's failure, twice in one process -----------------------------------------------


def test_each_launch_names_its_own_failure_with_or_without_record(tmp_path, capfd):
    """torch's test_launch_elastic_worker_raise_exception (a failing worker ends the launch with
    torch's ChildFailedError summary; npu-run exits 1 and adds the cause line). The first worker
    has no @record: torch's placeholder (a link to its docs) is no cause, npu-run says how it
    ended. The second launch, in the same process, names its own failure, not the first's."""

    def failing_launch(out: Path, *worker_args: str) -> str:
        out.mkdir()
        argv = [
            "--nnodes=1",
            "--nproc-per-node=2",
            "--rdzv-backend=parallel",
            f"--master-port={free_port()}",
            "--monitor-interval=1",
            "--max-restarts=0",
            SCRIPT,
            str(out),
            *worker_args,
        ]
        assert run.main(argv) == run.EXIT_WORKERS_FAILED
        err = capfd.readouterr().err
        assert "npu-run: error: ChildFailedError:" in err
        return err.strip().splitlines()[-1]

    first = failing_launch(tmp_path / "first", "--fail-rank", "1")
    assert "worker rank 1 (local rank 1, pid " in first, first
    assert first.endswith(
        "failed with exit code 1: exited with code 1 (no @record error file; see its output)"
    ), first
    assert "To enable traceback" not in first

    second = failing_launch(tmp_path / "second", "--fail-rank", "0", "--record")
    assert "worker rank 0 (local rank 0, pid " in second, second
    assert second.endswith("RuntimeError: worker rank 0 fails on purpose"), second


def test_torchs_placeholder_for_a_missing_error_file_is_no_recorded_error():
    from npu_job.launcher import agent

    assert agent.recorded_error({"message": "<NONE>"}) is None
    assert agent.recorded_error({"message": "<NONE>", "errorTraits": {}}) is None
    assert agent.recorded_error({}) is None
    recorded = {"message": {"message": "RuntimeError: boom", "extraInfo": {"timestamp": "1"}}}
    assert agent.recorded_error(recorded) == "RuntimeError: boom"
    assert agent.recorded_error({"message": "ValueError: bare"}) == "ValueError: bare"


# -- command lines torch refuses ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, env, code, message",
    [
        pytest.param(
            ["--no-python", "--module"],
            {},
            USAGE,
            "--no-python' flag and the '--module' flag",
            id="test_launch_user_script_bash-no-python-and-module",
        ),
        pytest.param(
            [],
            {"PET_NO_PYTHON": "1", "PET_MODULE": "1"},
            USAGE,
            "--no-python' flag and the '--module' flag",
            id="test_launch_with_env_vars-no-python-and-module",
        ),
        pytest.param(
            ["--nnodes=2:20:30"],
            {},
            USAGE,
            "--nnodes: expected N or MIN:MAX",
            id="test_min_max_nodes_parse",
        ),
        pytest.param(
            ["--nproc-per-node=unknown"],
            {},
            LaunchError.exit_code,
            "--nproc_per_node=unknown: Unsupported nproc_per_node value",
            id="test_nproc_launch_unknown_configurations",
        ),
    ],
)
def test_what_torchrun_refuses_with_a_traceback_is_one_line_and_an_exit_code(
    capsys, monkeypatch, argv, env, code, message
):
    """torchrun raises (ValueError, RuntimeError) and exits 1 with a traceback; npu-run says it in
    one line, 2 for a command line that contradicts itself, 8 for a worker count this node
    cannot give (as for --nproc-per-node=gpu without a GPU)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert run.main([*argv, "train.py"]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(not has_flag("--logs-specs"), reason="this torch has no --logs-specs")
def test_an_unknown_logs_spec_is_a_usage_error(capsys):
    """torch's test_logs_logs_spec_entrypoint_must_be_defined."""
    assert run.main(["--run-path", "--logs-specs=DOESNOT_EXIST", "train.py"]) == USAGE
    assert "DOESNOT_EXIST" in capsys.readouterr().err


# -- --nproc-per-node=auto: torchrun's precedence, after NPUs -----------------------------------


@pytest.mark.parametrize(
    "counts, expected",
    [
        pytest.param(
            devices.DeviceCounts(npu=0, gpu=0, cpu=64, accelerator=("xpu", 3)),
            (3, "xpu"),
            id="test_nproc_xpu_launch_configurations",
        ),
        pytest.param(
            devices.DeviceCounts(npu=0, gpu=3, cpu=64, accelerator=("cuda", 3)),
            (3, "gpu"),
            id="test_nproc_gpu_launch_configurations",
        ),
        pytest.param(
            devices.DeviceCounts(npu=0, gpu=0, cpu=6, accelerator=("", 0)),
            (6, "cpu"),
            id="test_nproc_launch_auto_configurations",
        ),
        pytest.param(
            devices.DeviceCounts(npu=8, gpu=0, cpu=6, accelerator=("npu", 8)),
            (8, "npu"),
            id="npus-first",
        ),
        pytest.param(
            devices.DeviceCounts(npu=0, gpu=2, cpu=6), (2, "gpu"), id="torch-without-accelerator"
        ),
    ],
)
def test_auto_counts_the_accelerator_torch_reports(counts, expected):
    """torchrun's auto is torch.accelerator's device count, else the CPUs; npu-run looks for NPUs
    first (torch_npu registers only once imported). No test machine has an XPU: the values are
    what torch.accelerator would answer there."""
    assert devices.resolve_nproc_per_node("auto", lambda: counts) == expected


def test_the_accelerator_is_read_from_torch_accelerator(monkeypatch):
    """``torchcompat.accelerator_devices`` against a stand-in with torch.accelerator's three
    documented calls (a thin fake: no XPU here), a failing driver, and a torch without it."""
    import torch

    xpu = SimpleNamespace(
        is_available=lambda: True,
        current_accelerator=lambda: SimpleNamespace(type="xpu"),
        device_count=lambda: 3,
    )
    monkeypatch.setattr(torch, "accelerator", xpu, raising=False)
    assert torchcompat.accelerator_devices() == ("xpu", 3)
    monkeypatch.setattr(xpu, "is_available", lambda: False)
    assert torchcompat.accelerator_devices() == ("", 0)

    def broken() -> int:
        raise RuntimeError("driver")

    monkeypatch.setattr(xpu, "is_available", lambda: True)
    monkeypatch.setattr(xpu, "device_count", broken)
    assert torchcompat.accelerator_devices() == ("", 0)
    monkeypatch.delattr(torch, "accelerator")
    assert torchcompat.accelerator_devices() == ("", 0)
