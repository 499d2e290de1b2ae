"""Golden manifests of the example specs: any change to the rendered output shows up as a diff.

Regenerate after an intended change with ``NPU_JOB_UPDATE_GOLDEN=1 python -m pytest
tests/render/test_golden.py`` and review the diff of ``tests/golden/``. The bundled bootstrap.sh
and the job's bundle are replaced by stand-ins so that their own changes (owned by the bootstrap and
the bundle) don't churn these.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from npu_job.render.render import render
from npu_job.render.spec import validate
from npu_job.render.values import SpecInput, load_yaml_values, merge_values

from .conftest import BOOTSTRAP_STAND_IN, BUNDLE_STAND_IN, validate_as_pod

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = ["job-npu-1node", "job-npu-6node", "job-gpu", "job-cpu", "job-gpu-routed"]
UPDATE = os.environ.get("NPU_JOB_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_renders_to_its_golden_stream(example):
    source = f"examples/{example}.yaml"
    values = load_yaml_values((ROOT / source).read_text(), source)
    stream = render(
        validate(merge_values([SpecInput(source, values=values)])),
        bootstrap=BOOTSTRAP_STAND_IN,
        bundle=BUNDLE_STAND_IN,
    ).stream()
    golden = GOLDEN / f"{example}.yaml"
    if UPDATE:
        golden.write_text(stream)
    assert golden.exists(), f"no golden file {golden}; create it with NPU_JOB_UPDATE_GOLDEN=1"
    assert stream == golden.read_text(), (
        f"{golden} differs; if intended, rerun with NPU_JOB_UPDATE_GOLDEN=1"
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_manifests_pass_the_kubernetes_schema(example):
    """The examples users copy must be accepted: the ConfigMap and any RBAC objects as they are,
    the pod template as a Pod."""
    import kubernetes_validate
    import yaml

    source = f"examples/{example}.yaml"
    values = load_yaml_values((ROOT / source).read_text(), source)
    documents = list(
        yaml.safe_load_all(
            render(validate(merge_values([SpecInput(source, values=values)]))).stream()
        )
    )
    version = kubernetes_validate.latest_version()
    *others, job = documents
    assert job["kind"] == "Job" and others[0]["kind"] == "ConfigMap"
    for document in others:
        kubernetes_validate.validate(document, version, strict=True)
    template = job["spec"]["tasks"][0]["template"]
    validate_as_pod(template, version)
