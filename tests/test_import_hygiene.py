"""The pod-side and render paths never import torch (they run before training, in any image), nor
matplotlib (the optional [picture] extra, loaded only when a picture is drawn)."""

import subprocess
import sys

import pytest

POD_SIDE_MODULES = [
    "npu_job.cli",
    "npu_job.podfacts",
    "npu_job.parsing",
    "npu_job.bootstrap",
    "npu_job.bootstrap.model",
    "npu_job.bootstrap.canonical",
    "npu_job.bootstrap.planner",
    "npu_job.bootstrap.scorer",
    "npu_job.bootstrap.synthetic",
    *(
        f"npu_job.bootstrap.{name}"
        for name in (
            "accelerator",
            "payload",
            "jsondecode",
            "fields",
            "ranktable",
            "topology",
            "sources",
            "inputs",
            "wait",
            "identity",
            "writers",
            "run",
            "__main__",
        )
    ),
    "npu_job.bootstrap.command",
    *(
        f"npu_job.bootstrap.{name}"
        for name in (
            "kubeobjects",
            "kubefacts",
            "podpage",
            "hypernode",
            "labels",
            "kubetopology",
            "jobpods",
            "kubeapi",
            "podrun",
        )
    ),
    "npu_job.cli.plan",
    "npu_job.cli._args",
    *(f"npu_job.render.{name}" for name in ("values", "checks", "lint", "keys", "spec", "render")),
    "npu_job.cli.render",
    # npu-run's torch-free helpers (torch only inside the functions that need it)
    "npu_job.launcher.noderank",
    "npu_job.launcher.devices",
    # the store proxy runs in the agent but needs no torch (wire protocol only)
    *(f"npu_job.launcher.{name}" for name in ("protocol", "storeclient")),
    "npu_job.launcher.proxy",
    *(
        f"npu_job.launcher.proxy.{name}"
        for name in ("coalescing", "upstream", "server", "storeproxy", "__main__")
    ),
    # the demo's pod simulator and orchestration (torch only inside the pods it starts)
    *(
        f"npu_job.demo.{name}"
        for name in ("podspec", "podsim", "scenario", "checks", "podlog", "runner", "images")
    ),
    "npu_job.demo",
    "npu_job.cli.demo",
    # pictures: matplotlib only inside the drawing functions
    "npu_job.cli.picture",
]


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
