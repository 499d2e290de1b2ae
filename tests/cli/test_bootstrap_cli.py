"""``npu-job bootstrap``, ``python -m npu_job.bootstrap`` and ``bash bootstrap.sh``: one set of
options, one error line, exit 0 in the fallback and the error's code with --strict."""

import argparse
import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from npu_job.bootstrap.command import configure

from npu_job.cli import main
from npu_job.logs import add_log_options
from tests.bootstrap.documents import write_cce_job

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bootstrap.sh"


def _clean_env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NPU_JOB_", "KUBERNETES_", "MA_", "VC_", "RANK_TABLE"))
    }
    env.update(extra)
    return env


@pytest.fixture
def job(tmp_path):
    table, _, _ = write_cce_job(tmp_path / "config", 5, 2)
    flags = [
        "--rank-table",
        str(tmp_path / "config"),
        "--host-ip",
        table.servers[2].server_id,
        "--pod-index",
        "2",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    return flags, tmp_path / "out"


def test_help_explains_flags_files_and_environment(capsys):
    assert main(["bootstrap", "--help"]) == 0
    text = capsys.readouterr().out
    for word in (
        "--rank-table",
        "--topology",
        "--host-ip",
        "--pod-index",
        "--collective",
        "--output-dir",
        "--wait-timeout",
        "--poll-interval",
        "--strict",
        "--json",
        "RANK_AFTER_ACC",
        "MASTER_INDEX",
        "route_plan.json",
        "NPU_JOB_WAIT_TIMEOUT",
        "MA_CURRENT_HOST_IP",
        "HCCL_ALGO",
    ):
        assert word in text, word


@pytest.mark.parametrize(
    "argv",
    [
        ["--collective", "tree"],
        ["--wait-timeout", "soon"],
        ["--poll-interval", "-1"],
        ["--topology-format", "xml"],
    ],
    ids=["bad-collective", "bad-timeout", "negative-interval", "bad-format"],
)
def test_bad_flags_are_usage_errors(argv, capsys):
    assert main(["bootstrap", *argv]) == 2
    assert "npu-job bootstrap: error:" in capsys.readouterr().err


def test_success_in_process_with_json_output(job, capsys):
    flags, out = job
    assert main(["bootstrap", *flags, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"] == "success" and printed["pod_index"] == 2
    assert (out / "RANK_AFTER_ACC").read_text() == str(printed["node_rank"])


def test_fallback_exits_0_and_strict_exits_with_the_error_code(tmp_path, capsys, monkeypatch):
    for name in list(os.environ):
        if name.startswith(("RANK_TABLE", "NPU_JOB_")):
            monkeypatch.delenv(name)
    missing = ["--rank-table", str(tmp_path / "nope.json"), "--output-dir", str(tmp_path / "out")]
    assert main(["bootstrap", *missing]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "error" in line] == [
        f"npu-job: error: {tmp_path / 'nope.json'}: file: expected an existing file (not found)"
    ]
    assert main(["bootstrap", *missing, "--strict"]) == 3
    strict_err = capsys.readouterr().err
    assert (
        strict_err.startswith(f"npu-job: error: {tmp_path / 'nope.json'}: file:")
        and "Traceback" not in strict_err
    )


def test_the_tip_reads_the_same_whether_the_bootstrap_falls_back_or_not(job, capsys):
    flags, _ = job
    refused = [*flags, "--host-ip", "10.99.99.99"]  # not in the table: an error with a TIP
    assert main(["bootstrap", *refused]) == 0
    tips = [line for line in capsys.readouterr().err.splitlines() if "TIP:" in line]
    assert main(["bootstrap", *refused, "--strict"]) == 7
    strict_tips = [line for line in capsys.readouterr().err.splitlines() if "TIP:" in line]
    assert len(tips) == 1 and tips[0].startswith("npu-job: TIP: ") and strict_tips == tips


def test_a_rank_table_of_another_size_than_the_job_is_exit_7_with_strict(job, tmp_path, capsys):
    flags, out = job
    flags = [*flags, "--nnodes", "6"]
    line = (
        f"npu-job: error: {tmp_path / 'config' / 'jobstart_hccl.json'}: server_count: 5 servers,"
        " but the job has 6 nodes (--nnodes)"
    )
    assert main(["bootstrap", *flags]) == 0
    assert [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln] == [line]
    route_plan = json.loads((out / "route_plan.json").read_text())
    assert route_plan["status"] == "failed" and route_plan["reason"] == line[16:]
    assert main(["bootstrap", *flags, "--strict"]) == 7
    assert capsys.readouterr().err.splitlines()[0] == line


def test_python_dash_m_takes_the_same_options_and_verbosity(job):
    flags, out = job
    done = subprocess.run(
        [sys.executable, "-m", "npu_job.bootstrap", "-v", *flags],
        env=_clean_env(),
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    assert "npu-job: debug: rank table:" in done.stderr
    assert (out / "MASTER_INDEX").exists()


def test_no_flags_mean_every_flag_at_its_default_without_building_the_parser(job):
    """The pod command passes no flag: the bootstrap then builds no parser, which is the same run
    because every default means "not given", and loads neither argparse (nor the locale its
    first parser imports) nor tempfile (nor the shutil, bz2 and lzma that loads): start-up time
    every pod of a job pays before training.

    Only what the bootstrap itself loads counts: an interpreter's site may import some of these
    before any of our code runs (a ``.pth`` file that imports certifi loads tempfile), and that
    is the image's cost, not ours."""
    parser = argparse.ArgumentParser()
    add_log_options(parser)
    configure(parser)
    defaults = vars(parser.parse_args([]))
    assert defaults and not any(defaults.values()), defaults
    flags, out = job
    env = dict(zip(["RANK_TABLE_FILE", "MA_CURRENT_HOST_IP", "VC_TASK_INDEX"], flags[1:6:2]))
    code = (
        "import sys; at_start = set(sys.modules); "
        "from npu_job.bootstrap.command import main; code = main([]); "
        "print(sorted({'argparse', 'locale', 'tempfile', 'shutil', 'bz2', 'lzma'}"
        " & (set(sys.modules) - at_start))); sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_clean_env(**env, NPU_JOB_OUTPUT_DIR=str(out)),
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "npu-job: node rank" in done.stderr and (out / "RANK_AFTER_ACC").exists()


def test_bootstrap_sh_works_from_any_directory(job, tmp_path):
    flags, out = job
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    done = subprocess.run(
        ["bash", str(SCRIPT), *flags],
        env=_clean_env(),
        capture_output=True,
        text=True,
        cwd=elsewhere,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "RANK_AFTER_ACC").exists()


def _no_npu_job_python(tmp_path):
    wrapper = tmp_path / "bare-python3"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.mark.parametrize(
    "python, message",
    [
        (_no_npu_job_python, "the npu_job package is not importable"),
        (lambda tmp: "no-such-python3", "no-such-python3: not found"),
    ],
    ids=["npu-job-not-installed", "no-python"],
)
def test_bootstrap_sh_without_npu_job_says_so_and_keeps_the_job_alive(tmp_path, python, message):
    env = _clean_env(NPU_JOB_PYTHON=python(tmp_path))
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0
    assert done.stderr.startswith("npu-job: error: bootstrap.sh: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    strict = subprocess.run(
        ["bash", str(SCRIPT), "--strict"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert strict.returncode == 3


@pytest.mark.parametrize(
    "value, code", [(" TRUE ", 3), ("On", 3), ("1", 3), ("0", 0), ("off", 0), ("", 0)]
)
def test_bootstrap_sh_reads_npu_job_strict_as_the_bootstrap_does(tmp_path, value, code):
    """Before any Python runs (here: none is found), bootstrap.sh decides --strict from
    NPU_JOB_STRICT itself: any case, blanks ignored, as npu_job.parsing.is_true."""
    env = _clean_env(NPU_JOB_PYTHON="no-such-python3", NPU_JOB_STRICT=value)
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert done.returncode == code, done.stderr


def test_installed_script_and_packaged_one_are_this_script():
    from importlib import resources

    packaged = resources.files("npu_job.scripts").joinpath("bootstrap.sh")
    assert Path(str(packaged)).resolve() == SCRIPT.resolve(), "render ships this very file"
    installed = Path(sys.executable).parent / "bootstrap.sh"
    if not installed.exists():
        pytest.skip("npu-job is not installed into this interpreter's bin directory")
    assert filecmp.cmp(installed, SCRIPT, shallow=False), "stale copy: re-run pip install -e ."


def test_script_passes_shellcheck():
    done = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_verbose_and_quiet_after_the_subcommand_as_the_flag_table_says(job, capsys):
    """README's bootstrap flag table lists -v/-q; `npu-job bootstrap -v` used to exit 2."""
    flags, _ = job
    assert main(["bootstrap", *flags, "-v"]) == 0
    err = capsys.readouterr().err
    assert "npu-job: debug: rank table:" in err and "npu-job: node rank" in err
    assert main(["bootstrap", *flags, "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_an_unknown_option_of_bootstrap_sh_shows_the_bootstraps_usage(tmp_path):
    """bootstrap.sh parses its own options (npu_job.bootstrap.command), without npu-job's other
    subcommands: an option it does not know is a usage error against its own usage, exit 2."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "--no-such-option"],
        env=_clean_env(),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("usage: npu-job bootstrap [-h] [-v] [-q] ")
    assert (
        done.stderr.splitlines()[-1]
        == "npu-job bootstrap: error: unrecognized arguments: --no-such-option"
    )


def test_bootstrap_without_a_rank_table_from_a_pods_file(tmp_path, capsys):
    """`npu-job bootstrap --pods cluster.json`: the dry run of a pod of a job with no rank table."""
    from pathlib import Path

    cluster = (
        Path(__file__).resolve().parents[1] / "bootstrap" / "fixtures" / "kube" / "cluster.json"
    )
    code = main(
        [
            "bootstrap",
            "--pods",
            str(cluster),
            "--job",
            "llama",
            "--task",
            "worker",
            "--host-ip",
            "10.1.9.18",
            "--pod-index",
            "0",
            "--output-dir",
            str(tmp_path),
            "--json",
        ]
    )
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "success" and plan["pods"] == str(cluster) and plan["pod_index"] == 0
    assert (tmp_path / "RANK_AFTER_ACC").read_text() == str(plan["node_rank"])
    assert not (tmp_path / "jobstart_hccl.reordered.json").exists()
