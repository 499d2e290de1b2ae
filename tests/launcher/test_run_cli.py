"""``npu-run``'s command line: torchrun's flags and PET_* variables, npu-run's additions, its errors.

Bad command lines run ``main()`` in-process (they fail before anything starts); two cases run the
installed ``npu-run`` console script for real (single node, gloo workers).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from npu_job.bootstrap.nodereport import NodeReport, decode_report, encode_report
from npu_job.launcher import devices, noderank, run

from npu_job import parsing
from npu_job.errors import LaunchError

from .cluster import WORKERS, free_port

SCRIPT = str(WORKERS / "record_env.py")


pytestmark = pytest.mark.usefixtures("clean_launcher_env")


def parse(argv):
    parser = run.build_parser()
    return parser.parse_args(run.bare_probe(parser, argv))


def test_help_shows_torchrun_flags_and_the_additions(capsys):
    assert run.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in (
        "--nproc-per-node",
        "--nproc_per_node",
        "--rdzv-backend",
        "--max-restarts",
        "--standalone",
        "--node-rank N|auto",
        "--enable_tiered_parallel_tcpstore",
        "parallel",
        "npu",
    ):
        assert flag in text, flag


def test_dashed_and_underscored_spellings_mean_the_same():
    dashed = parse(
        [
            "--nproc-per-node=2",
            "--node-rank=1",
            "--master-port=1234",
            "--rdzv-conf=join_timeout=5",
            "--enable-tiered-parallel-tcpstore=true",
            "--max-restarts=2",
            "train.py",
            "--lr",
            "1",
        ]
    )
    underscored = parse(
        [
            "--nproc_per_node=2",
            "--node_rank=1",
            "--master_port=1234",
            "--rdzv_conf=join_timeout=5",
            "--enable_tiered_parallel_tcpstore=true",
            "--max_restarts=2",
            "train.py",
            "--lr",
            "1",
        ]
    )
    assert vars(dashed) == vars(underscored)
    assert dashed.training_script_args == ["--lr", "1"]


def test_pet_variables_stand_in_for_flags(monkeypatch):
    monkeypatch.setenv("PET_NNODES", "3")
    monkeypatch.setenv("PET_NODE_RANK", "auto")
    monkeypatch.setenv("PET_ENABLE_TIERED_PARALLEL_TCPSTORE", "true")
    monkeypatch.setenv("PET_MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("RANK_AFTER_ACC", "2")
    args = run.prepare(parse(["--nproc_per_node=2", "train.py"]), {"RANK_AFTER_ACC": "2"})
    assert (args.nnodes, args.node_rank, args.enable_tiered_parallel_tcpstore) == ("3", 2, True)
    assert args.rdzv_backend == "parallel"  # tiering implies the parallel backend
    assert args.rdzv_endpoint == "10.1.2.3:29500"  # torchrun's default port


def test_flags_win_over_pet_variables(monkeypatch):
    monkeypatch.setenv("PET_ENABLE_TIERED_PARALLEL_TCPSTORE", "true")
    args = parse(["--enable_tiered_parallel_tcpstore=false", "train.py"])
    assert run.prepare(args, {}).enable_tiered_parallel_tcpstore is False


def test_the_tiered_switch_takes_the_words_of_every_npu_job_switch():
    """One declaration of true and false (npu_job.parsing) for npu-run and the rest; an empty
    PET_* variable is the default, false."""
    for word in parsing.TRUE_WORDS:
        assert run.parse_bool(f" {word.upper()} ", "--x") is True
    for word in (*parsing.FALSE_WORDS, "", " "):
        assert run.parse_bool(word.title(), "--x") is False
    with pytest.raises(run.UsageError, match="--x: expected true or false, got 'maybe'"):
        run.parse_bool("maybe", "--x")


def test_parallel_launch_config_carries_node_rank_and_tiering():
    args = run.prepare(
        parse(
            [
                "--nnodes=4",
                "--node_rank=3",
                "--nproc_per_node=2",
                "--rdzv_backend=parallel",
                "--master_addr=127.0.0.1",
                "--master_port=29999",
                "--enable_tiered_parallel_tcpstore=true",
                "--rdzv_conf=join_timeout=7",
                "train.py",
                "--x",
            ]
        ),
        {},
    )
    config, command, command_args = run.launch_config(args)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (4, 4, 2)
    assert config.rdzv_backend == "parallel" and config.rdzv_endpoint == "127.0.0.1:29999"
    assert (
        config.rdzv_configs["rank"] == 3
        and config.rdzv_configs["enable_tiered_parallel_tcpstore"] is True
    )
    assert config.rdzv_configs["join_timeout"] == "7"
    assert command == sys.executable and command_args == ["-u", "train.py", "--x"]


ROUTE_PLAN = {"status": "success", "mapping_digest": "ab12", "node_rank": 1, "pod_index": 3}
PARALLEL_ARGV = [
    "--nnodes=4",
    "--nproc_per_node=1",
    "--rdzv_backend=parallel",
    "--master_addr=127.0.0.1",
    "train.py",
]


def node_order_of(node_rank_flag: str, env: dict) -> object:
    config, _, _ = run.launch_config(run.prepare(parse([node_rank_flag, *PARALLEL_ARGV]), env))
    return config.rdzv_configs.get("node_order")


def test_auto_node_rank_hands_the_rendezvous_the_order_it_belongs_to(tmp_path):
    (tmp_path / "RANK_AFTER_ACC").write_text("1")
    (tmp_path / "route_plan.json").write_text(json.dumps(ROUTE_PLAN))
    assert (
        node_order_of("--node_rank=auto", {"NPU_JOB_OUTPUT_DIR": str(tmp_path)})
        == "planned order ab12"
    )


@pytest.mark.parametrize(
    "node_rank, expected",
    [
        pytest.param(1, "planned order ab12", id="the-planned-rank"),
        pytest.param(3, noderank.SCHEDULER_ORDER, id="the-pod-index"),
        pytest.param(
            2,
            "order of no plan (--node_rank=2 is neither this pod's planned rank 1 nor its pod "
            "index 3)",
            id="neither",
        ),
    ],
)
def test_a_numeric_node_rank_is_held_to_the_bootstraps_order_too(tmp_path, node_rank, expected):
    """train.sh passes the bootstrap's rank as a number: the check must not depend on 'auto'."""
    (tmp_path / "route_plan.json").write_text(json.dumps(ROUTE_PLAN))
    assert (
        node_order_of(f"--node_rank={node_rank}", {"NPU_JOB_OUTPUT_DIR": str(tmp_path)}) == expected
    )


def test_a_numeric_node_rank_without_a_bootstrap_is_not_checked(tmp_path):
    assert node_order_of("--node_rank=1", {"NPU_JOB_OUTPUT_DIR": str(tmp_path)}) is None


@pytest.mark.parametrize(
    "route_plan, expected",
    [
        pytest.param(None, noderank.SCHEDULER_ORDER, id="no-bootstrap"),
        pytest.param(
            {"status": "failed", "mapping_digest": "ab"}, noderank.SCHEDULER_ORDER, id="fell-back"
        ),
        pytest.param(
            {"status": "success", "mapping_digest": "ab"}, "planned order ab", id="planned"
        ),
        pytest.param({"status": "success"}, None, id="no-digest"),
        pytest.param("{not json", None, id="unreadable"),
        pytest.param([1], None, id="not-an-object"),
    ],
)
def test_node_order_names_the_bootstraps_mapping_or_the_scheduler(tmp_path, route_plan, expected):
    if route_plan is not None:
        text = route_plan if isinstance(route_plan, str) else json.dumps(route_plan)
        (tmp_path / "route_plan.json").write_text(text)
    assert noderank.node_order({"NPU_JOB_OUTPUT_DIR": str(tmp_path)}) == expected


def parallel_settings(node_rank_flag: str, env: dict):
    """The parallel backend's settings npu-run's command line becomes (what the handler gets)."""
    config, _, _ = run.launch_config(run.prepare(parse([node_rank_flag, *PARALLEL_ARGV]), env))
    return run.parallel_settings(config)


def test_the_bootstraps_node_report_goes_to_the_rendezvous_with_its_pod_index(tmp_path):
    """The root plans from each node's report; its pod index (0 hosts the root) is the report's,
    whatever rank the node comes with."""
    mine = NodeReport(node_id="10.0.0.7", pod_index=0, pod_name="job-worker-0", device_count=1)
    (tmp_path / "npu_job_node.json").write_bytes(encode_report(mine))
    settings = parallel_settings("--node_rank=2", {"NPU_JOB_OUTPUT_DIR": str(tmp_path)})
    assert decode_report(settings.report, "sent") == mine
    assert (settings.node_rank, settings.pod_index, settings.hosts_root) == (2, 0, True)


@pytest.mark.parametrize(
    "env, pod_index",
    [
        pytest.param({}, None, id="by-hand"),
        pytest.param({"VC_TASK_INDEX": "3"}, 3, id="scheduler-index"),
    ],
)
def test_without_a_report_the_node_sends_an_unknown_one_at_its_rank(tmp_path, env, pod_index):
    """No bootstrap report: the root plans an unknown node at the pod index of its --node_rank
    (so ranks stay as given) with its worker count; the root's host is the pod of scheduler
    index 0, or without one, node rank 0."""
    settings = parallel_settings("--node_rank=1", {"NPU_JOB_OUTPUT_DIR": str(tmp_path), **env})
    assert decode_report(settings.report, "sent") == NodeReport(pod_index=1, device_count=1)
    assert settings.pod_index == pod_index and settings.hosts_root is False


def test_single_node_static_without_port_becomes_c10d_like_torchrun():
    args = run.prepare(parse(["--nproc_per_node=1", "train.py"]), {})
    if parse(["train.py"]).master_port is None:
        assert (args.rdzv_backend, args.rdzv_endpoint) == ("c10d", "localhost:0")
    else:  # torch < 2.3's torchrun defaults --master_port to 29500 and keeps static there too
        assert (args.rdzv_backend, args.rdzv_endpoint) == ("static", "")


USAGE = 2
LAUNCH = LaunchError.exit_code


@pytest.mark.parametrize(
    "argv, env, code, message",
    [
        pytest.param(
            ["--node_rank=first"],
            {},
            USAGE,
            "--node_rank: expected a non-negative integer or 'auto'",
            id="node-rank-word",
        ),
        pytest.param(
            ["--node_rank=-1"],
            {},
            USAGE,
            "--node_rank: expected a non-negative integer or 'auto'",
            id="node-rank-negative",
        ),
        pytest.param(
            ["--node_rank=\u00b2"],
            {},
            USAGE,
            "--node_rank: expected a non-negative integer or 'auto'",
            id="node-rank-superscript-digit",
        ),
        pytest.param(
            ["--nnodes=0"], {}, USAGE, "--nnodes: expected 0 < MIN <= MAX", id="zero-nodes"
        ),
        pytest.param(
            ["--nnodes=3:1"], {}, USAGE, "--nnodes: expected 0 < MIN <= MAX", id="min-above-max"
        ),
        pytest.param(
            ["--nnodes=a:b"], {}, USAGE, "--nnodes: expected N or MIN:MAX", id="nnodes-words"
        ),
        pytest.param(
            ["--max_restarts=-1"],
            {},
            USAGE,
            "--max_restarts: expected 0 or more",
            id="negative-restarts",
        ),
        pytest.param(
            ["--enable_tiered_parallel_tcpstore=maybe"],
            {},
            USAGE,
            "expected true or false",
            id="tiered-not-a-bool",
        ),
        pytest.param(
            ["--enable_tiered_parallel_tcpstore=true", "--rdzv_backend=c10d"],
            {},
            USAGE,
            "needs --rdzv_backend=parallel",
            id="tiered-with-c10d",
        ),
        pytest.param(
            ["--no-python", "--module"], {}, USAGE, "--no-python", id="no-python-and-module"
        ),
        pytest.param(
            ["--nnodes=3", "--node_rank=3", "--rdzv_backend=parallel"],
            {},
            LAUNCH,
            "node rank 3 is outside 0..2 for --nnodes=3",
            id="node-rank-too-big",
        ),
        pytest.param(
            ["--nnodes=2", "--node_rank=auto", "--rdzv_backend=parallel"],
            {"RANK_AFTER_ACC": "x1"},
            LAUNCH,
            "environment RANK_AFTER_ACC: node rank: expected a non-negative integer, got 'x1'",
            id="auto-bad-rank-after-acc",
        ),
        pytest.param(
            ["--nnodes=2", "--node_rank=auto", "--rdzv_backend=parallel"],
            {"RANK_AFTER_ACC": "5"},
            LAUNCH,
            "node rank 5 is outside 0..1",
            id="auto-rank-too-big",
        ),
        pytest.param(
            ["--nnodes=1:3", "--rdzv_backend=parallel", "--rdzv_conf=last_call_timeout=x"],
            {},
            LAUNCH,
            "last_call_timeout: expected a positive number of seconds",
            id="parallel-elastic-bad-last-call",
        ),
        pytest.param(
            ["--nnodes=2", "--rdzv_backend=parallel", "--rdzv_conf=join_timeout=later"],
            {},
            LAUNCH,
            "join_timeout: expected a positive number of seconds",
            id="bad-join-timeout",
        ),
        pytest.param(
            ["--nproc_per_node=npu"], {}, LAUNCH, "this node has no NPU", id="npu-without-torch-npu"
        ),
        pytest.param(
            ["--nproc_per_node=0"], {}, LAUNCH, "expected at least 1 worker", id="zero-workers"
        ),
        pytest.param(
            ["--nproc_per_node=lots"], {}, LAUNCH, "--nproc_per_node=lots", id="nproc-word"
        ),
    ],
)
def test_bad_command_lines_are_one_line_errors(capsys, monkeypatch, argv, env, code, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert run.main([*argv, "train.py"]) == code
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("npu-run: error:")] == [
        line for line in err.splitlines() if "error" in line
    ]


# -- --node_rank=auto ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, file_text, rank, source",
    [
        pytest.param(
            {"RANK_AFTER_ACC": "3", "VC_TASK_INDEX": "1"},
            "2",
            3,
            "environment RANK_AFTER_ACC",
            id="env-beats-file-and-scheduler",
        ),
        pytest.param({"VC_TASK_INDEX": "1"}, "2\n", 2, "bootstrap file", id="file-beats-scheduler"),
        pytest.param(
            {"RANK_AFTER_ACC": " ", "VC_TASK_INDEX": "1"},
            "",
            1,
            "environment VC_TASK_INDEX",
            id="empty-values-are-skipped",
        ),
        pytest.param({}, None, 0, "default", id="nothing-means-0"),
    ],
)
def test_auto_node_rank_sources_in_order(tmp_path, env, file_text, rank, source):
    if file_text is not None:
        (tmp_path / "RANK_AFTER_ACC").write_text(file_text)
    choice = noderank.resolve_node_rank({**env, "NPU_JOB_OUTPUT_DIR": str(tmp_path)})
    assert choice.rank == rank and choice.source.startswith(source)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", " ", "\n", "\r\n"]))
def test_any_written_node_rank_reads_back(rank, padding):
    assert noderank.parse_node_rank(f"{padding}{rank}{padding}", "file") == rank


@given(st.text().filter(lambda text: not noderank.is_count(text.strip())))
def test_anything_but_digits_is_refused(text):
    with pytest.raises(LaunchError):
        noderank.parse_node_rank(text, "file")


@given(st.integers(1, 64), st.integers(0, 64))
def test_nnodes_range_round_trips(low, extra):
    assert run.parse_nnodes(f"{low}:{low + extra}") == (low, low + extra)
    assert run.parse_nnodes(str(low)) == (low, low)


def test_auto_node_rank_reads_tmp_by_default():
    assert noderank.rank_file_path({}) == "/tmp/RANK_AFTER_ACC"
    assert noderank.rank_file_path({"NPU_JOB_OUTPUT_DIR": "/out"}) == "/out/RANK_AFTER_ACC"


@pytest.mark.parametrize(
    "env, file_text, named",
    [
        pytest.param(
            {"RANK_AFTER_ACC": "-1"}, None, "environment RANK_AFTER_ACC", id="negative-env"
        ),
        pytest.param({}, "two", "RANK_AFTER_ACC: node rank", id="word-in-file"),
        pytest.param(
            {"VC_TASK_INDEX": "1.5"}, None, "environment VC_TASK_INDEX", id="fraction-index"
        ),
    ],
)
def test_auto_node_rank_rejects_bad_values_naming_their_source(tmp_path, env, file_text, named):
    if file_text is not None:
        (tmp_path / "RANK_AFTER_ACC").write_text(file_text)
    with pytest.raises(LaunchError, match=named):
        noderank.resolve_node_rank({**env, "NPU_JOB_OUTPUT_DIR": str(tmp_path)})


# -- --nproc_per_node ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, counts, expected",
    [
        pytest.param(
            "auto", devices.DeviceCounts(npu=8, gpu=2, cpu=64), (8, "npu"), id="auto-prefers-npu"
        ),
        pytest.param(
            "auto", devices.DeviceCounts(npu=0, gpu=2, cpu=64), (2, "gpu"), id="auto-then-gpu"
        ),
        pytest.param(
            "auto", devices.DeviceCounts(npu=0, gpu=0, cpu=6), (6, "cpu"), id="auto-then-cpu"
        ),
        pytest.param("npu", devices.DeviceCounts(npu=16, gpu=0, cpu=6), (16, "npu"), id="npu"),
        pytest.param(
            "cpu", devices.DeviceCounts(npu=8, gpu=0, cpu=6), (6, "cpu"), id="cpu-even-with-npus"
        ),
        pytest.param("4", devices.DeviceCounts(npu=8, gpu=0, cpu=6), (4, "fixed"), id="number"),
    ],
)
def test_nproc_per_node_choice(value, counts, expected):
    assert devices.resolve_nproc_per_node(value, lambda: counts) == expected


def test_a_number_never_probes_devices():
    def probe():
        raise AssertionError("probed")

    assert devices.resolve_nproc_per_node("2", probe) == (2, "fixed")


def test_probe_counts_this_machine_without_torch_npu():
    found = devices.probe_devices()
    assert found.npu == 0 and found.cpu >= 1


# -- the real console script --------------------------------------------------------------------


def npu_run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    executable = shutil.which("npu-run")
    assert executable, "the npu-run console script is not installed (pip install -e .)"
    return subprocess.run([executable, *argv], capture_output=True, text=True, timeout=timeout)


def one_parallel_node(out: Path, *worker_args: str) -> subprocess.CompletedProcess:
    """One node of the ``parallel`` backend, two ``record_env.py`` workers writing to ``out``."""
    return npu_run(
        "--nnodes=1",
        "--nproc_per_node=2",
        "--rdzv_backend=parallel",
        f"--master_port={free_port()}",
        SCRIPT,
        str(out),
        *worker_args,
    )


def test_console_script_runs_unmodified_workers_standalone_with_torchs_log_options(tmp_path):
    logs = tmp_path / "logs"
    done = npu_run(
        "--standalone",
        "--nproc-per-node=2",
        f"--log-dir={logs}",
        "--redirects=3",
        SCRIPT,
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert [r["RANK"] for r in records] == ["0", "1"] and {r["sum"] for r in records} == {3.0}
    assert len(list(logs.glob("**/attempt_0/*/stderr.log"))) == 2  # torch's per-worker log files


def test_worker_failure_prints_torchruns_summary_with_the_root_cause(tmp_path):
    done = one_parallel_node(tmp_path, "--fail-rank", "1")
    assert done.returncode == run.EXIT_WORKERS_FAILED, done.stderr
    assert "npu-run: error: ChildFailedError:" in done.stderr
    assert "Root Cause (first observed failure)" in done.stderr
    assert (
        "RuntimeError: worker rank 1 fails on purpose" in done.stderr
    )  # the worker's @record traceback
    assert not Path(tmp_path, "0.json").exists()


def test_a_worker_killed_while_writing_its_error_file_is_reported_by_its_signal(tmp_path):
    """torch's ``@record`` writes the error file in place (open, then dump): a worker killed
    between the two leaves it empty, and torch's agent fails parsing it (a ``JSONDecodeError``
    in place of the failure). npu-run reports the worker as killed by its signal, and names it
    the cause: not worker rank 0, which torch's agent then stopped (torch 2.13+ lists it among
    the failures too, killed by SIGTERM, with no error file either)."""
    done = one_parallel_node(tmp_path, "--killed-recording", "1")
    assert done.returncode == run.EXIT_WORKERS_FAILED, done.stderr
    assert "JSONDecodeError" not in done.stderr and "internal error" not in done.stderr
    assert "Signal 9 (SIGKILL) received by PID" in done.stderr, done.stderr
    verdict = done.stderr.strip().splitlines()[-1]
    assert verdict.startswith("npu-run: error: the job stopped: node rank 0 "), verdict
    assert "worker rank 1 (local rank 1, pid " in verdict and "killed by signal 9" in verdict


@pytest.mark.parametrize(
    "flags, budget, margin",
    [
        (["--probe"], 60.0, 0.05),
        (["--probe=12.5"], 12.5, 0.05),
        (["--probe", "--probe_margin=-0.2"], 60.0, -0.2),
    ],
    ids=["bare", "seconds", "margin"],
)
def test_the_probe_reaches_the_parallel_backend_as_its_settings(
    tmp_path, monkeypatch, flags, budget, margin
):
    monkeypatch.setenv("NPU_JOB_OUTPUT_DIR", str(tmp_path))
    argv = [*PARALLEL_ARGV[:-1], "--node_rank=1", *flags, PARALLEL_ARGV[-1]]
    config, _, _ = run.launch_config(
        run.prepare(parse(argv), {"NPU_JOB_OUTPUT_DIR": str(tmp_path)})
    )
    probe = run.parallel_settings(config).probe
    assert probe is not None and probe.nproc == 1 and probe.output_dir == str(tmp_path)
    assert (probe.settings.budget, probe.settings.margin) == (budget, margin)


def test_without_the_probe_the_backend_gets_no_probe_option():
    config, _, _ = run.launch_config(run.prepare(parse(["--node_rank=1", *PARALLEL_ARGV]), {}))
    assert "probe" not in config.rdzv_configs and run.parallel_settings(config).probe is None


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--probe=soon"], "--probe: expected a positive number of seconds, got 'soon'"),
        (["--probe", "--probe_margin=1"], "--probe_margin: expected a fraction within (-1, 1)"),
    ],
)
def test_bad_probe_values_are_usage_errors_naming_the_flag(flags, message):
    argv = [*PARALLEL_ARGV[:-1], "--node_rank=1", *flags, PARALLEL_ARGV[-1]]
    with pytest.raises(run.UsageError, match=re.escape(message)):
        run.prepare(parse(argv), {})


def test_the_probe_needs_the_parallel_rendezvous():
    with pytest.raises(run.UsageError, match="--probe needs --rdzv_backend=parallel"):
        run.prepare(parse(["--nnodes=2", "--node_rank=0", "--probe", SCRIPT]), {})


def test_a_bare_probe_before_the_script_leaves_the_script_and_its_own_flags_alone():
    args = parse(["--nnodes=2", "--probe", "train.py", "--probe", "x"])
    assert args.probe == "60" and args.training_script == "train.py"
    assert args.training_script_args == ["--probe", "x"]
    assert parse(["--probe", "30", "train.py"]).probe == "30"
