"""``npu-job render`` from the command line: inputs helm-style, outputs for kubectl, errors as one line."""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest
import yaml

from npu_job.cli import main

SPEC = "name: demo\nimage: registry.example.com/train:1\nscript: train.py\nnodes: 2\n"


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    return path


def run_cli(*argv: str, capsys) -> tuple:
    code = main(["render", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def the_job(stream: str) -> dict:
    return [doc for doc in yaml.safe_load_all(stream) if doc["kind"] == "Job"][0]


def test_stream_on_stdout_is_configmap_then_job(spec_file, capsys):
    code, out, err = run_cli(str(spec_file), capsys=capsys)
    assert code == 0, err
    assert [doc["kind"] for doc in yaml.safe_load_all(out)] == ["ConfigMap", "Job"]
    assert out.count("# Source: npu-job/templates/") == 2


def test_files_and_set_override_in_order(spec_file, tmp_path, capsys):
    more = tmp_path / "more.yaml"
    more.write_text("nodes: 4\nenv: {A: from-more}\n")
    code, out, err = run_cli(
        str(spec_file),
        "-f",
        str(more),
        "--set",
        "nodes=5,env.B=true",
        "--set-string",
        "env.C=007",
        "--set",
        "args={--lr,0.1}",
        capsys=capsys,
    )
    assert code == 0, err
    job = the_job(out)
    assert job["spec"]["minAvailable"] == 5
    env = {
        e["name"]: e.get("value")
        for e in job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]
    }
    assert (env["A"], env["B"], env["C"]) == ("from-more", "true", "007")
    train_sh = next(yaml.safe_load_all(out))["data"]["train.sh"]
    assert "  --lr\n  0.1\n" in train_sh


def test_set_wins_over_files_wherever_it_is_given(spec_file, tmp_path, capsys):
    """As helm: every -f file is merged first, then the --set values, whatever the argument order."""
    later = tmp_path / "later.yaml"
    later.write_text("nodes: 7\n")
    code, out, _ = run_cli(str(spec_file), "--set", "nodes=3", "-f", str(later), capsys=capsys)
    assert code == 0 and the_job(out)["spec"]["minAvailable"] == 3


def test_spec_from_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(SPEC))
    code, out, _ = run_cli("-", capsys=capsys)
    assert code == 0 and the_job(out)["metadata"]["name"] == "demo"


def test_output_dir_writes_files_and_says_so(spec_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, out, err = run_cli(
        str(spec_file), "--set", "nodes=3", "--output-dir", str(out_dir), capsys=capsys
    )
    assert code == 0, err
    assert out.splitlines() == [
        f"wrote {out_dir / name}"
        for name in ("config.yaml", "train.sh", "bootstrap.sh", "npu-job.pyz")
    ]
    stream = (out_dir / "config.yaml").read_text()
    assert (
        next(yaml.safe_load_all(stream))["data"]["train.sh"] == (out_dir / "train.sh").read_text()
    )
    assert os.access(out_dir / "train.sh", os.X_OK)
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "bootstrap.sh",
        "config.yaml",
        "npu-job.pyz",
        "train.sh",
    ], "no temp files left"
    shipped = base64.b64decode(next(yaml.safe_load_all(stream))["binaryData"]["npu-job.pyz"])
    assert (out_dir / "npu-job.pyz").read_bytes() == shipped


def test_bad_spec_writes_nothing(spec_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code, out, err = run_cli(
        str(spec_file), "--set", "nodes=0", "--output-dir", str(out_dir), capsys=capsys
    )
    assert code == 5 and out == "" and not out_dir.exists()


@pytest.mark.parametrize(
    "extra_args, spec_text, code, message",
    [
        pytest.param(
            [],
            SPEC + "nodez: 3\n",
            5,
            "npu-job: error: job.yaml: nodez: unknown key (did you mean 'nodes'?)",
            id="unknown-key",
        ),
        pytest.param(
            [],
            SPEC.replace("demo", "Demo_1"),
            5,
            "npu-job: error: job.yaml: name: 'Demo_1' is not a DNS-1123 label",
            id="bad-name",
        ),
        pytest.param(
            ["--set", "device=tpu"],
            SPEC,
            5,
            "device (from --set): expected one of npu, gpu, cpu",
            id="bad-set-value",
        ),
        pytest.param(
            [],
            "name: [x\n",
            3,
            "npu-job: error: job.yaml: line 2, column 1: not valid YAML",
            id="yaml-syntax",
        ),
        pytest.param([], SPEC + "nodes: 3\n", 3, "duplicate key 'nodes'", id="duplicate-key"),
        pytest.param(
            ["--set", "nodes"],
            SPEC,
            2,
            "argument --set: 'nodes': at character 6: expected '='",
            id="set-syntax",
        ),
        pytest.param(
            ["-f", "/nonexistent/more.yaml"],
            SPEC,
            3,
            "npu-job: error: /nonexistent/more.yaml: no such file",
            id="missing-file",
        ),
    ],
)
def test_errors_are_one_message_with_a_distinct_exit_code_and_no_traceback(
    tmp_path, extra_args, spec_text, code, message
):
    (tmp_path / "job.yaml").write_text(spec_text)
    done = subprocess.run(
        [sys.executable, "-m", "npu_job", "render", "job.yaml", *extra_args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_all_problems_are_listed_at_once(tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\nnodes: -1\nlauncher: mpirun\n")
    code, out, err = run_cli(str(spec), capsys=capsys)
    assert code == 5 and out == ""
    assert err.splitlines()[0].endswith("job.yaml: 4 problems:")
    assert len([line for line in err.splitlines() if line.startswith("  - ")]) == 4


def test_warnings_go_to_stderr_and_output_still_renders(spec_file, capsys):
    code, out, err = run_cli(
        str(spec_file), "--set", "routing=true", "--set", "npus_per_node=4", capsys=capsys
    )
    assert code == 0 and "kind: Job" in out
    assert "npu-job: warning: routing is on with 2 node(s)" in err
    assert (
        "npu-job: warning: npus_per_node is 4, below a full node (full_node_npus 8); each pod's bootstrap"
        in err
    )


def test_help_explains_the_set_syntax(capsys):
    assert main(["render", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--set" in out and "--output-dir" in out and "a={x,y}" in out


@pytest.mark.parametrize(
    "spec_extra, args",
    [
        pytest.param("shm_size: null\n", [], id="spec"),
        pytest.param("shm_size: 1Gi\n", ["-f", "NULL"], id="values-file"),
        pytest.param("shm_size: 1Gi\n", ["--set", "shm_size=null"], id="set"),
    ],
)
def test_shm_size_null_renders_no_shm_volume(tmp_path, capsys, spec_extra, args):
    """README: `shm_size: null` keeps the runtime's default /dev/shm, whichever input says it."""
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + spec_extra)
    (tmp_path / "null.yaml").write_text("shm_size: null\n")
    args = [str(tmp_path / "null.yaml") if arg == "NULL" else arg for arg in args]
    code, out, err = run_cli(str(spec), *args, capsys=capsys)
    assert code == 0, err
    pod = the_job(out)["spec"]["tasks"][0]["template"]["spec"]
    assert "/dev/shm" not in [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]]
    assert "dshm" not in [v["name"] for v in pod["volumes"]]


def _unprivileged(root: Path) -> Optional[List[str]]:
    """A command prefix under which file permissions apply (root ignores them unless it drops
    CAP_DAC_OVERRIDE); None when this machine cannot provide one."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def _read_only(root: Path) -> Optional[List[str]]:
    """A command prefix that runs in a private mount namespace where ``root/ro`` is read-only."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        return None
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, str(root / "ro")]


def _as_is(root: Path) -> List[str]:
    return []


def _a_file(root: Path) -> str:
    (root / "out").write_text("a file, not a directory\n")
    return "out"


def _under_a_file(root: Path) -> str:
    (root / "plain").write_text("x\n")
    return "plain/out"


def _unwritable_dir(root: Path) -> str:
    (root / "out").mkdir(mode=0o555)
    return "out"


def _under_an_unwritable_dir(root: Path) -> str:
    (root / "locked").mkdir(mode=0o555)
    return "locked/out"


def _script_name_taken_by_a_dir(root: Path) -> str:
    (root / "out" / "train.sh").mkdir(parents=True)
    return "out"


def _under_a_read_only_mount(root: Path) -> str:
    (root / "ro").mkdir()
    return "ro/out"


@pytest.mark.parametrize(
    "prepare, prefix, reason",
    [
        pytest.param(_a_file, _as_is, "it exists and is not a directory", id="existing-file"),
        pytest.param(_under_a_file, _as_is, "Not a directory", id="under-a-file"),
        pytest.param(_unwritable_dir, _unprivileged, "Permission denied", id="permission-denied"),
        pytest.param(
            _under_an_unwritable_dir, _unprivileged, "Permission denied", id="cannot-create"
        ),
        pytest.param(
            _script_name_taken_by_a_dir,
            _as_is,
            "out/train.sh: Is a directory",
            id="script-name-is-a-dir",
        ),
        pytest.param(_under_a_read_only_mount, _read_only, "Read-only file system", id="read-only"),
    ],
)
def test_unusable_output_dir_is_one_line_exit_3_and_nothing_is_written(
    tmp_path, prepare, prefix, reason
):
    (tmp_path / "job.yaml").write_text(
        SPEC.replace("nodes: 2", "nodes: 3")
    )  # routed: bootstrap.sh too
    target = prepare(tmp_path)
    command = prefix(tmp_path)
    if command is None:
        pytest.skip(
            "needs a non-root user, or root with setpriv/unshare, to make the directory unusable"
        )
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    done = subprocess.run(
        [*command, sys.executable, "-m", "npu_job", "render", "job.yaml", "--output-dir", target],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [
        f"npu-job: error: {target}: --output-dir: expected a directory to write config.yaml, train.sh, "
        f"bootstrap.sh and npu-job.pyz into ({reason})"
    ]
    assert done.stdout == ""
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before, (
        "nothing half-written"
    )


def test_a_huge_set_list_index_is_a_usage_error_naming_the_argument(spec_file):
    done = subprocess.run(
        [sys.executable, "-m", "npu_job", "render", str(spec_file), "--set", "args[30000000]=x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        "npu-job render: error: argument --set: 'args[30000000]=x': at character 6: expected a list index from 0 to 65536"
    )


def test_a_flood_of_problems_is_listed_briefly_and_blamed_on_the_set(spec_file, capsys):
    code, out, err = run_cli(str(spec_file), "--set", "args[60000]=x", capsys=capsys)
    assert code == 5 and out == ""
    lines = err.splitlines()
    assert lines[0].endswith(": 60000 problems:") and lines[-1] == "  - and 59980 more"
    assert lines[1] == "  - args[0] (from --set): expected a string, got null"
    assert len(lines) == 22
