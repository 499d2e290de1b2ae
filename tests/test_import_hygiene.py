"""The pod-side and render paths never import torch (they run before training, in any image), nor
matplotlib (the optional [picture] extra, loaded only when a picture is drawn)."""

import importlib.util
import pkgutil
import subprocess
import sys
from typing import List

import pytest


def _modules_of(package: str) -> List[str]:
    """Every module of ``package`` (sub-packages too), found on disk without importing any."""
    found = importlib.util.find_spec(package)
    assert found is not None and found.submodule_search_locations, package
    walked = pkgutil.walk_packages(list(found.submodule_search_locations), prefix=f"{package}.")
    return [package, *sorted(module.name for module in walked)]


POD_SIDE_MODULES = [
    # the pod side, render and the demo's orchestration (torch only inside the pods it starts):
    # every module, so that a new one is checked without being listed
    *_modules_of("npu_job.bootstrap"),
    *_modules_of("npu_job.render"),
    *_modules_of("npu_job.demo"),
    "npu_job.podfacts",
    "npu_job.parsing",
    "npu_job.cli",
    "npu_job.cli.plan",
    "npu_job.cli._args",
    "npu_job.cli.render",
    "npu_job.cli.demo",
    # npu-run's torch-free helpers (torch only inside the functions that need it)
    "npu_job.launcher.noderank",
    "npu_job.launcher.devices",
    # the store proxy runs in the agent but needs no torch (wire protocol only)
    *(f"npu_job.launcher.{name}" for name in ("protocol", "storeclient")),
    *_modules_of("npu_job.launcher.proxy"),
    # pictures: matplotlib only inside the drawing functions
    "npu_job.cli.picture",
]


def test_the_module_list_walks_sub_packages():
    assert "npu_job.bootstrap.kube.api" in POD_SIDE_MODULES
    assert "npu_job.demo.synthetic" in POD_SIDE_MODULES


@pytest.mark.parametrize("module", POD_SIDE_MODULES)
def test_module_does_not_import_torch(module):
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'matplotlib'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} pulled in {out.stdout.strip()}"


def test_the_hygiene_check_sees_matplotlib():
    code = (
        "import sys; import npu_job.cli.picture as p; p.require_matplotlib();"
        " print(any(m.split('.')[0] == 'matplotlib' for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
