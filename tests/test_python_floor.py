"""The oldest Python npu-job claims (setup.cfg ``python_requires``) really runs it.

Two sides have their own floor: the pod side (``bootstrap.sh`` in the training image's python3,
standard library only: pyyaml, requests and msgspec are optional there) and render on the
user's machine. Both are run here under the floor interpreter from a staged copy of the package,
laid out as an install puts it (setup.cfg's ``package_dir``, symlinks resolved), and must give
byte-for-byte what this interpreter gives. An interpreter of the floor version is looked up as
``python3.X`` on PATH or under pyenv; the tests skip, saying so, where there is none.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from npu_job.demo.images import find_interpreter

from tests.bootstrap.documents import write_cce_job

ROOT = Path(__file__).resolve().parents[1]


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def floor() -> Tuple[int, int]:
    """The (major, minor) of setup.cfg's ``python_requires = >=X.Y``."""
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", _setup_cfg()["options"]["python_requires"].strip())
    assert match, "python_requires is expected as >=X.Y"
    return int(match.group(1)), int(match.group(2))


@pytest.fixture(scope="module")
def floor_python() -> str:
    found = find_interpreter(floor())
    if found is None:
        pytest.skip(
            f"no Python {'.'.join(map(str, floor()))} interpreter (python3.X on PATH or pyenv) on this machine"
        )
    return found


def stage_package(target: Path) -> Path:
    """Copy the packages of setup.cfg under ``target`` as an install lays them out; return it."""
    options = _setup_cfg()["options"]
    mapped: Dict[str, str] = dict(
        (name.strip(), folder.strip())
        for name, folder in (
            line.split("=") for line in options["package_dir"].splitlines() if line.strip()
        )
    )
    for package in (line.strip() for line in options["packages"].splitlines() if line.strip()):
        # as setuptools does: the longest mapped prefix, then the rest of the name as folders
        parent = max(
            (name for name in mapped if package == name or package.startswith(name + ".")),
            key=len,
            default="",
        )
        folder = (
            mapped[parent] + package[len(parent) :].replace(".", "/")
            if parent
            else package.replace(".", "/")
        )
        source = ROOT / folder
        destination = target / package.replace(".", "/")
        destination.mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():  # a package's own files; its subpackages are listed too
            if entry.is_file() and "__pycache__" not in entry.parts:
                shutil.copyfile(
                    entry, destination / entry.name
                )  # follows symlinks, as a wheel does
    return target


def _pod_env(stage: Path, **extra: str) -> Dict[str, str]:
    """A pod's environment: no npu-job variables, the package importable, no user site-packages."""
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(stage),
        "PYTHONNOUSERSITE": "1",
        "HOME": str(stage),
    }
    env.update(extra)
    return env


def _outputs(directory: Path) -> Dict[str, bytes]:
    return {
        path.name: path.read_bytes().replace(str(directory).encode(), b"OUT")
        for path in sorted(directory.iterdir())
    }


def test_the_bootstrap_runs_on_the_floor_python_with_the_standard_library_only(
    tmp_path, floor_python
):
    stage = stage_package(tmp_path / "site")
    table, _, _ = write_cce_job(tmp_path / "config", 6, 2)
    flags = [
        "--rank-table",
        str(tmp_path / "config"),
        "--host-ip",
        table.servers[2].server_id,
        "--pod-index",
        "2",
        "--strict",
    ]
    runs: List[Dict[str, bytes]] = []
    for name, command in (
        ("this-python", [sys.executable, "-m", "npu_job.bootstrap"]),
        ("floor-python-m", [floor_python, "-m", "npu_job.bootstrap"]),
        ("floor-bootstrap-sh", ["bash", str(ROOT / "scripts" / "bootstrap.sh")]),
    ):
        out = tmp_path / name
        done = subprocess.run(
            [*command, *flags, "--output-dir", str(out)],
            env=_pod_env(stage, NPU_JOB_PYTHON=floor_python),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{name}: {done.stderr}"
        assert "node rank" in done.stderr and "error" not in done.stderr, done.stderr
        runs.append(_outputs(out))
    assert sorted(runs[0]) == [
        "MASTER_INDEX",
        "RANK_AFTER_ACC",
        "jobstart_hccl.reordered.json",
        "npu_job_env.sh",
        "npu_job_node.json",
        "route_plan.json",
    ]
    assert runs[1] == runs[0] and runs[2] == runs[0]


def _render_dependencies(target: Path, floor_python: str) -> Path:
    """This environment's jinja2, markupsafe and pyyaml (pure-Python parts), for the floor interpreter."""
    import jinja2
    import markupsafe
    import yaml

    for module in (jinja2, markupsafe, yaml):
        shutil.copytree(
            Path(module.__file__).parent,
            target / module.__name__,
            ignore=shutil.ignore_patterns("__pycache__", "*.so"),
        )
    probe = subprocess.run(
        [floor_python, "-c", "import jinja2, yaml"],
        env={"PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        pytest.skip(
            f"this environment's jinja2/pyyaml do not import on {floor_python}: {probe.stderr[-200:]}"
        )
    return target


def test_render_runs_on_the_floor_python(tmp_path, floor_python):
    stage = stage_package(tmp_path / "site")
    deps = _render_dependencies(tmp_path / "deps", floor_python)
    examples = sorted((ROOT / "examples").glob("job-*.yaml"))
    assert examples
    for example in examples:
        streams = []
        for python, path in ((sys.executable, stage), (floor_python, f"{stage}{os.pathsep}{deps}")):
            done = subprocess.run(
                [python, "-m", "npu_job", "render", str(example), "--set", "shm_size=null"],
                env=_pod_env(Path(path)),
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"{python} {example.name}: {done.stderr}"
            streams.append(done.stdout)
        assert streams[1] == streams[0], example.name


@pytest.mark.torch
def test_the_store_proxy_relays_torch_clients_on_the_floor_python(tmp_path, floor_python):
    """npu-run's store proxy runs on images whose python is the floor (torch 2.1-2.4 ship for
    3.8): under that interpreter, with no torch (the newest protocol), it relays this torch's
    clients to this torch's root."""
    pytest.importorskip("torch")
    from tests.launcher.proxy_support import ProxyProcess, tcp_store

    stage = stage_package(tmp_path / "site")
    root = tcp_store(0, master=True)
    proxy = ProxyProcess(
        root.port, python=floor_python, dialect="newest", env=_pod_env(stage), cwd=str(tmp_path)
    )
    try:
        client = tcp_store(proxy.port)
        client.set("key", "through a 3.8 proxy")
        assert root.get("key") == b"through a 3.8 proxy"
        assert client.add("counter", 2) == 2 and root.add("counter", 1) == 3
        client.wait(["key"])
        assert client.compare_set("key", "through a 3.8 proxy", "swapped") == b"swapped"
        del client
    finally:
        assert proxy.stop() == 0


def test_ruff_targets_the_floor():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^target-version = "py(\d)(\d+)"$', text, re.M).groups() == tuple(
        map(str, floor())
    )
