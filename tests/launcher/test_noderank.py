"""``--node_rank=auto``'s scheduler-order fallback (launcher/noderank.py): this pod's index in the
variable its job kind's controller sets (``$NPU_JOB_KIND``, default ``volcano``: VC_TASK_INDEX),
named in the log and in every refusal; a kind npu-job does not know is one line listing those it
knows. The order of the sources is tests/launcher/test_run_cli.py's."""

from __future__ import annotations

import json

import pytest
from npu_job.kinds.base import JobKind
from npu_job.launcher import noderank, run
from npu_job.launcher.noderank import NodeRankChoice

from npu_job import kinds
from npu_job.errors import LaunchError


class _Completions(JobKind):
    """A kind of the tests' own, whose controller sets the index as TEST_COMPLETION_INDEX."""

    name = "completions"
    index_env = "TEST_COMPLETION_INDEX"


@pytest.fixture
def completions(monkeypatch):
    monkeypatch.setitem(kinds.KINDS, "completions", _Completions())


def test_the_scheduler_order_is_the_index_variable_of_the_jobs_kind(tmp_path, completions):
    env = {"NPU_JOB_OUTPUT_DIR": str(tmp_path), "VC_TASK_INDEX": "1", "TEST_COMPLETION_INDEX": "3"}
    assert noderank.resolve_node_rank(env) == NodeRankChoice(
        1, "environment VC_TASK_INDEX (scheduler order)"
    )
    assert noderank.resolve_node_rank({**env, "NPU_JOB_KIND": " "}).rank == 1  # blank: unset
    kind = {**env, "NPU_JOB_KIND": "completions"}
    assert noderank.resolve_node_rank(kind) == NodeRankChoice(
        3, "environment TEST_COMPLETION_INDEX (scheduler order)"
    )
    del kind["TEST_COMPLETION_INDEX"]  # Volcano's variable means nothing on this kind's pod
    assert noderank.resolve_node_rank(kind) == NodeRankChoice(
        0, "default (no RANK_AFTER_ACC, bootstrap file or TEST_COMPLETION_INDEX)"
    )
    with pytest.raises(LaunchError) as raised:
        noderank.resolve_node_rank({**kind, "TEST_COMPLETION_INDEX": "x"})
    assert raised.value.message == (
        "environment TEST_COMPLETION_INDEX: node rank: expected a non-negative integer, got 'x'"
    )


def test_an_unknown_kind_is_one_line_listing_the_known_where_its_index_is_needed(tmp_path):
    env = {"NPU_JOB_OUTPUT_DIR": str(tmp_path), "NPU_JOB_KIND": "slurm", "VC_TASK_INDEX": "1"}
    with pytest.raises(LaunchError) as raised:
        noderank.resolve_node_rank(env)
    known = ", ".join(sorted(kinds.KINDS))
    assert raised.value.message == (
        f"environment: NPU_JOB_KIND: expected a job kind, one of {known}; got 'slurm'"
    )
    # the bootstrap's rank needs no kind
    assert noderank.resolve_node_rank({**env, "RANK_AFTER_ACC": "2"}).rank == 2
    (tmp_path / "RANK_AFTER_ACC").write_text("4")
    assert noderank.resolve_node_rank(env).rank == 4


def test_npu_run_says_it_in_one_line(clean_launcher_env, monkeypatch, capsys):
    monkeypatch.setenv("NPU_JOB_KIND", "slurm")
    monkeypatch.setenv("VC_TASK_INDEX", "5")  # outside the job: read, it would stop npu-run too
    argv = ["--nnodes=2", "--node_rank=auto", "--rdzv_backend=parallel", "train.py"]
    assert run.main(argv) == LaunchError.exit_code
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "npu-run: error: environment: NPU_JOB_KIND: expected a job kind, one of "
    )


def test_the_round_plan_is_left_only_where_a_bootstrap_ran(tmp_path):
    """npu-run started by hand (no bootstrap's file in the output directory) writes nothing;
    in a pod it replaces the last round's file whole."""
    env = {"NPU_JOB_OUTPUT_DIR": str(tmp_path)}
    first = noderank.round_plan_document("parallel", 0, "a" * 64, 2, 4)
    assert noderank.write_round_plan(env, first) is None
    assert list(tmp_path.iterdir()) == []

    (tmp_path / "npu_job_node.json").write_text("{}")
    assert noderank.write_round_plan(env, first) == str(tmp_path / "npu_job_round.json")
    later = noderank.round_plan_document("parallel", 1, "b" * 64, 0, 4)
    noderank.write_round_plan(env, later)
    assert json.loads((tmp_path / "npu_job_round.json").read_text()) == {
        "version": 1,
        "rendezvous": "parallel",
        "round": 1,
        "mapping_digest": "b" * 64,
        "node_rank": 0,
        "nnodes": 4,
    }
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "npu_job_node.json",
        "npu_job_round.json",
    ]


def test_a_round_plan_that_cannot_be_written_never_stops_the_round(tmp_path, caplog):
    (tmp_path / "route_plan.json").write_text("{}")
    (tmp_path / "npu_job_round.json").mkdir()  # a directory where the file goes
    env = {"NPU_JOB_OUTPUT_DIR": str(tmp_path)}
    document = noderank.round_plan_document("c10d", 0, "a" * 64, 0, 2)
    assert noderank.write_round_plan(env, document) is None
    assert "cannot write" in caplog.text and "the round goes on" in caplog.text
