"""The wheel users install carries what the commands need at run time, as real files.

`npu-job render` ships `scripts/bootstrap.sh` in the ConfigMap (package data of `npu_job.scripts`,
also installed on PATH), reads its templates from `templates/`, and `npu-job demo` runs
`examples/train_ddp.py` (`npu_job.examples`); without them both would break outside a source
checkout. The wheel is built from a copy of the tree exactly as a fresh clone has it (symlinks
kept as symlinks, so one would show).
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mapped_folders() -> tuple:
    """The top-level folders setup.cfg's ``package_dir`` maps into ``npu_job``."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["package_dir"].strip().splitlines()
    return tuple(sorted({line.split("=")[1].strip().split("/")[0] for line in lines}))


SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "npu_job", *_mapped_folders())
SHIPPED = {
    "npu_job/scripts/bootstrap.sh": "scripts/bootstrap.sh",
    "npu_job/examples/train_ddp.py": "examples/train_ddp.py",
    "npu_job/render/templates/job.yaml.j2": "templates/job.yaml.j2",
}


def test_the_wheel_ships_the_files_the_commands_read_and_the_console_scripts(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    links = [
        path
        for name in SOURCES
        for path in [source / name, *(source / name).rglob("*")]
        if path.is_symlink()
    ]
    assert links == [], "package data is real files in the folder of its package"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("npu_job-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for packaged, target in SHIPPED.items():
            info = archive.getinfo(packaged)
            assert (info.external_attr >> 16) & 0o170000 != 0o120000, (
                f"{packaged} is stored as a symlink"
            )
            assert archive.read(packaged) == (ROOT / target).read_bytes(), packaged
        packages = configparser.ConfigParser()
        packages.read(ROOT / "setup.cfg")
        for package in packages["options"]["packages"].split():
            assert f"{package.replace('.', '/')}/__init__.py" in names, package
        (script,) = [name for name in names if name.endswith(".data/scripts/bootstrap.sh")]
        assert archive.read(script) == (ROOT / "scripts" / "bootstrap.sh").read_bytes()
        (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        shipped = configparser.ConfigParser()
        shipped.read_string(archive.read(entry_points).decode())
    declared = configparser.ConfigParser()
    declared.read(ROOT / "setup.cfg")
    scripts = dict(
        line.split("=", 1)
        for line in declared["options.entry_points"]["console_scripts"].split("\n")
        if line
    )
    expected = {name.strip(): target.strip() for name, target in scripts.items()}
    assert dict(shipped["console_scripts"]) == expected and {"npu-job", "npu-run"} <= set(expected)


def test_the_demo_reads_its_workload_from_the_package():
    from npu_job import demo

    assert demo.example_script() == (ROOT / "examples" / "train_ddp.py").read_bytes()


def test_the_launcher_extra_brings_numpy_so_torch_imports_without_a_warning():
    """torch prints "Failed to initialize NumPy" on every import (each worker) without NumPy;
    the README's install (the launcher extra) must bring it."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    launcher = [
        line.split(";")[0].strip()
        for line in setup["options.extras_require"]["launcher"].splitlines()
    ]
    assert any(requirement.startswith("numpy") for requirement in launcher)
    result = subprocess.run(
        [sys.executable, "-c", "import torch"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "NumPy" not in result.stderr, result.stderr


def test_every_package_folder_is_declared_so_a_wheel_holds_it():
    """setup.cfg lists packages by hand (package_dir maps top-level folders into npu_job, which
    find_packages cannot follow): a sub-package left off that list is missing from every
    non-editable install, though an editable one still imports it."""
    from .test_layers import package_dirs

    declared = package_dirs()
    on_disk = {
        ".".join((name, *init.parent.relative_to(folder).parts))
        for name, folder in declared.items()
        for init in folder.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert sorted(on_disk - set(declared)) == []
