"""examples/train_ddp.py holds the launch to the plan: a rank that contradicts the bootstrap's route
plan fails the run, so the demo and the e2e tests (where the consistent case runs) cannot pass with
wrong ranks. Real torchrun, one gloo worker (the rank check is per worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp.py"


def torchrun_example(
    env: Dict[str, str], reports: Path, *, nproc: int, steps: int
) -> subprocess.CompletedProcess[str]:
    """Plain torchrun (``--standalone``) running the example with ``nproc`` workers for
    ``steps``, its reports into ``reports``."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            str(EXAMPLE),
            "--steps",
            str(steps),
            "--report-dir",
            str(reports),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.torch
@pytest.mark.parametrize(
    "rank_mapping, rank_file, task_index, problem",
    [
        ("0-1,1-0", "1", "0", "rank 0 but the plan (route-plan) gives node rank 1"),
        ("0-0,1-1", "1", "0", "RANK_AFTER_ACC says 1 but the route plan says 0"),
        # a job kind whose index variable train.sh unsets: the pod index is the route plan's
        ("0-1,1-0", "0", None, "rank 0 but the plan (route-plan) gives node rank 1"),
    ],
    ids=["pod-should-be-node-1", "rank-file-contradicts-plan", "pod-index-of-the-route-plan"],
)
def test_a_rank_off_the_route_plan_fails_the_run(
    tmp_path, rank_mapping, rank_file, task_index, problem
):
    from npu_job.podfacts import RANK_FILE, ROUTE_PLAN_FILE

    (tmp_path / ROUTE_PLAN_FILE).write_text(
        json.dumps({"status": "success", "rank_mapping": rank_mapping, "pod_index": 0})
    )
    (tmp_path / RANK_FILE).write_text(rank_file)
    env = {**os.environ, "NPU_JOB_OUTPUT_DIR": str(tmp_path)}
    env.pop("VC_TASK_INDEX", None)
    if task_index is not None:
        env["VC_TASK_INDEX"] = task_index
    reports = tmp_path / "reports"
    run = torchrun_example(env, reports, nproc=1, steps=6)
    assert run.returncode != 0
    report = json.loads((reports / "rank-0.json").read_text())
    assert report["rank_ok"] is False and report["ok"] is False
    assert any(problem in line for line in report["problems"]), report["problems"]
    assert f"FAILED: {report['problems'][0]}" in run.stderr
    assert (
        report["eval_loss_final"] < report["eval_loss_initial"]
    )  # it trained; only the rank is wrong


@pytest.mark.torch
@pytest.mark.parametrize(
    "round_rank, passes",
    [(0, True), (1, False)],
    ids=["round-moved-the-rank-here", "rank-off-the-round"],
)
def test_npu_runs_round_plan_is_the_rank_to_hold_once_it_moved_from_the_bootstraps(
    tmp_path, round_rank, passes
):
    """A replaced pod: the bootstrap planned this pod to node rank 1, the rendezvous round
    re-planned it to node rank 0 and said so in npu_job_round.json. The worker holds its rank to
    the round's plan: rank 0 passes (the bootstrap's plan would fail it), rank 1 fails."""
    from npu_job.launcher.noderank import round_plan_document

    from npu_job.podfacts import RANK_FILE, ROUND_PLAN_FILE, ROUTE_PLAN_FILE

    (tmp_path / ROUTE_PLAN_FILE).write_text(
        json.dumps({"status": "success", "rank_mapping": "0-1,1-0", "pod_index": 0})
    )
    (tmp_path / RANK_FILE).write_text("1")
    (tmp_path / ROUND_PLAN_FILE).write_text(
        round_plan_document("parallel", 3, "ab" * 32, round_rank, 2)
    )
    env = {**os.environ, "NPU_JOB_OUTPUT_DIR": str(tmp_path), "VC_TASK_INDEX": "0"}
    reports = tmp_path / "reports"
    run = torchrun_example(env, reports, nproc=1, steps=2)
    report = json.loads((reports / "rank-0.json").read_text())
    assert report["plan_source"] == f"npu-run's round 3 plan {'ab' * 32}"
    assert (run.returncode == 0) is passes and report["rank_ok"] is passes, report["problems"]
    if not passes:
        assert any(
            line.startswith(f"rank 0 but the plan (npu-run's round 3 plan {'ab' * 32}) gives")
            for line in report["problems"]
        ), report["problems"]


@pytest.mark.torch
def test_without_a_plan_or_the_volcano_index_the_pod_index_is_what_the_pod_command_exported(
    tmp_path,
):
    """Routing off on a kind whose index variable train.sh unsets: the pod command's
    RANK_AFTER_ACC is the pod's index (scheduler order), and a rank off it fails the run."""
    env = {**os.environ, "NPU_JOB_OUTPUT_DIR": str(tmp_path), "RANK_AFTER_ACC": "1"}
    env.pop("VC_TASK_INDEX", None)
    reports = tmp_path / "reports"
    run = torchrun_example(env, reports, nproc=1, steps=2)
    report = json.loads((reports / "rank-0.json").read_text())
    assert run.returncode != 0 and report["pod_index"] == 1
    assert any(
        line.startswith("rank 0 but the plan (the pod index (scheduler order)) gives node rank 1")
        for line in report["problems"]
    ), report["problems"]


@pytest.mark.torch
def test_the_example_needs_torch_alone_not_numpy(tmp_path):
    """torch does not depend on numpy, so a training image may lack it: shadow numpy with a
    package that refuses to import and the example must still train and report."""
    hidden = tmp_path / "no-numpy" / "numpy"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        'raise ModuleNotFoundError("numpy is hidden by the test", name="numpy")\n'
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(hidden.parent),
        "VC_TASK_INDEX": "0",
        "NPU_JOB_OUTPUT_DIR": str(tmp_path),
    }
    reports = tmp_path / "reports"
    run = torchrun_example(
        env, reports, nproc=2, steps=4
    )  # 2 ranks: torch's *_object collectives need numpy only with peers
    # every rank warns about the missing numpy at each import: leave those out, so that a failure
    # shows what happened
    noise = ("Failed to initialize NumPy", "_conversion_method_template")
    told = [line for line in run.stderr.splitlines() if not any(word in line for word in noise)]
    assert run.returncode == 0, "\n".join(told)[-5000:]
    ranks = [json.loads((reports / f"rank-{r}.json").read_text()) for r in range(2)]
    assert all(report["ok"] and report["digests_agree"] for report in ranks)
    assert ranks[0]["param_digest"] == ranks[1]["param_digest"]


@pytest.mark.torch
def test_the_example_ends_without_the_interpreters_shutdown(tmp_path):
    """DDP keeps gloo's worker threads alive to the end of the process, and one of them letting go
    of the last collective's tensors during the interpreter's shutdown aborts a run that trained
    (SIGABRT after the report): the example leaves once its report is written, and no exit
    handler of the interpreter runs after that (one that a sitecustomize registers in the worker, here)."""
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "interpreter-shut-down"
    (site / "sitecustomize.py").write_text(
        "import atexit, os, pathlib\n"
        "if 'RANK' in os.environ:  # the worker (torchrun's agent, which exits as usual, has none)\n"
        f"    atexit.register(pathlib.Path({str(marker)!r}).write_text, 'atexit ran')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "NPU_JOB_OUTPUT_DIR": str(tmp_path),
    }
    reports = tmp_path / "reports"
    run = torchrun_example(env, reports, nproc=1, steps=2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((reports / "rank-0.json").read_text())["ok"] is True
    assert "train_ddp: done:" in run.stdout
    assert not marker.exists(), "the worker ran the interpreter's shutdown (its exit handlers)"
