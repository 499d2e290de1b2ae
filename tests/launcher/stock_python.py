"""Test helper: a "stock image" Python, with torch and without any trace of npu-job.

A training image holds python3 and torch, and npu-job arrives only as the job's bundle. To run
the bundle as a pod would, :func:`make_stock_python` takes the python of the demo's stock image
(:func:`npu_job.demo.images.python_without_npu_job`: a venv whose site-packages links every entry
of this interpreter's but npu-job's own) and checks what the tests rely on: torch imports in it;
``npu_job`` does not, and neither does npu-job's metadata (so torch finds no
``torchrun.handlers`` entry point of it).

:func:`make_bare_python` makes a venv of the standard library alone: a python3 with no torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
from npu_job.demo.images import python_without_npu_job

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
    python = Path(python_without_npu_job(directory / "venv"))
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
