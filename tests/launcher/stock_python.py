"""Test helper: a "stock image" Python, with torch and without any trace of npu-job.

A training image holds python3 and torch, and npu-job arrives only as the job's bundle. To run
the bundle as a pod would, :func:`make_stock_python` makes a venv (``--without-pip``: a
fraction of a second) whose one link to the outside is a ``.pth`` file naming a view of this
interpreter's site-packages: a directory of symlinks to every entry there except npu-job's own.
torch imports in it; ``npu_job`` does not, and neither does npu-job's metadata (so torch finds
no ``torchrun.handlers`` entry point of it). The editable install's finder is a ``.pth`` file
too, and ``.pth`` files inside a path a ``.pth`` file adds are not processed, but npu-job's
dist-info would still be found there, hence the view rather than the directory itself.

:func:`make_bare_python` makes the same venv without the link: a python3 with no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List

import pytest

# what an install of npu-job leaves in site-packages (a wheel, an editable install of either kind)
NPU_JOB_ENTRIES = ("npu_job", "npu-job", "__editable__", "easy-install.pth")

# Run in the new venv: which of the facts the fixture promises hold there.
_FACTS = """\
import importlib.metadata, importlib.util, json
names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in importlib.metadata.distributions()}
facts = {"npu_job": importlib.util.find_spec("npu_job") is not None, "npu-job dist": "npu-job" in names}
try:
    import torch
    facts["torch"] = torch.__version__
except ImportError as error:
    facts["torch"] = None
    facts["torch error"] = str(error)
print(json.dumps(facts))
"""


def _make_venv(directory: Path) -> Path:
    """A venv of this interpreter's base Python at ``directory``; returns its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(directory)],
        check=True,
        capture_output=True,
    )
    return directory / "bin" / "python"


def _site_packages(python: Path) -> Path:
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(found.stdout.strip())


def _view_without_npu_job(sources: List[Path], view: Path) -> None:
    """Symlinks in ``view`` to every entry of ``sources`` that is not npu-job's (first wins)."""
    view.mkdir()
    for source in sources:
        for entry in sorted(source.iterdir()):
            name = entry.name.lower()
            if name.startswith(NPU_JOB_ENTRIES) or name.endswith(".egg-link"):
                continue
            link = view / entry.name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(entry)


def facts(python: Path, cwd: Path) -> Dict[str, object]:
    """What ``python`` can import: ``{"npu_job": bool, "npu-job dist": bool, "torch": version}``."""
    found = subprocess.run(
        [str(python), "-c", _FACTS],
        check=True,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(),
    )
    return json.loads(found.stdout)


def clean_env() -> Dict[str, str]:
    """This environment without what would lead a Python to this one's packages."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH",)}


def make_stock_python(directory: Path) -> Path:
    """A python with this interpreter's packages but npu-job's (skips where torch is missing).

    Run it with ``cwd`` outside the repository, whose ``npu_job`` package and ``.egg-info`` a
    ``-c`` run would find through its current directory.
    """
    python = _make_venv(directory / "venv")
    own = sysconfig.get_paths()
    sources = [Path(own["purelib"])]
    if Path(own["platlib"]) != sources[0]:
        sources.append(Path(own["platlib"]))
    view = directory / "site-packages-without-npu-job"
    _view_without_npu_job(sources, view)
    (_site_packages(python) / "stock-image.pth").write_text(f"{view}\n", encoding="utf-8")
    found = facts(python, directory)
    if found["torch"] is None:
        pytest.skip(f"torch does not import in this interpreter: {found['torch error']}")
    assert not found["npu_job"], "the stock python imports npu_job"
    assert not found["npu-job dist"], "the stock python sees npu-job's metadata"
    return python


def make_bare_python(directory: Path) -> Path:
    """A python with the standard library only: an image without torch."""
    python = _make_venv(directory / "bare-venv")
    found = facts(python, directory)
    assert found["torch"] is None and not found["npu_job"], found
    return python
