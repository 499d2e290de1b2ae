"""Helpers of the render tests: specs as dicts, rendered and parsed back."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest
import yaml
from npu_job.kinds import KINDS
from npu_job.kinds.base import JobKind
from npu_job.render.keys import SPEC_KEYS
from npu_job.render.render import RenderedJob, render
from npu_job.render.spec import JobSpec, validate
from npu_job.render.values import SpecInput, load_yaml_values, merge_values, parse_set

from npu_job.bundle import Bundle

#: stands in for the bundled bootstrap.sh (owned and tested by the bootstrap part) where a test
#: only needs to know that the ConfigMap carries it
BOOTSTRAP_STAND_IN = "#!/usr/bin/env bash\n# bootstrap.sh stand-in of the render tests\nexit 0\n"

#: stands in for the job's bundle of the pod side (built and tested in tests/test_bundle.py)
BUNDLE_STAND_IN = Bundle(
    data=b"#!/bin/sh\n# npu-job.pyz stand-in of the render tests\nexit 0\n",
    digest="sha256:" + "0" * 64,
    version="0.0.0",
    entries=0,
    source_bytes=0,
)

MINIMAL = {"name": "demo", "image": "registry.example.com/train:1", "script": "train.py"}

#: the keys whose null means something other than their default (``KeySpec.null``)
NULL_MEANINGS = [doc for doc in SPEC_KEYS if doc.null]


def spec_from(values: Dict[str, Any], *sets: str) -> JobSpec:
    inputs = [SpecInput("job.yaml", values=values)]
    inputs += [SpecInput("--set", assignments=parse_set(text)) for text in sets]
    return validate(merge_values(inputs))


def render_values(
    values: Dict[str, Any], *sets: str, bootstrap: str = BOOTSTRAP_STAND_IN
) -> RenderedJob:
    return render(spec_from(values, *sets), bootstrap=bootstrap, bundle=BUNDLE_STAND_IN)


def parsed(rendered: RenderedJob) -> List[Dict[str, Any]]:
    return list(yaml.safe_load_all(rendered.stream()))


def job_of(rendered: RenderedJob) -> Dict[str, Any]:
    return next(doc for doc in parsed(rendered) if doc["kind"] == "Job")


def pod_spec(job: Dict[str, Any]) -> Dict[str, Any]:
    return job["spec"]["tasks"][0]["template"]["spec"]


def container(job: Dict[str, Any]) -> Dict[str, Any]:
    return pod_spec(job)["containers"][0]


def env_of(job: Dict[str, Any]) -> Dict[str, Any]:
    return {
        item["name"]: item.get("value", item.get("valueFrom")) for item in container(job)["env"]
    }


@pytest.fixture
def minimal() -> Dict[str, Any]:
    return dict(MINIMAL)


def with_keys(**extra: Any) -> Dict[str, Any]:
    values = dict(MINIMAL)
    values.update(extra)
    return values


def names(items: Sequence[Dict[str, Any]]) -> List[str]:
    return [item["name"] for item in items]


ROOT = Path(__file__).resolve().parents[2]
#: the example specs users copy (``examples/job-*.yaml``), by file name
EXAMPLES = tuple(sorted(path.name for path in (ROOT / "examples").glob("job-*.yaml")))


def example(name: str) -> Dict[str, Any]:
    """The values of ``examples/<name>``, as render reads the file."""
    source = f"examples/{name}"
    return load_yaml_values((ROOT / source).read_text(), source)


def refused_given(values: Dict[str, Any], kind: JobKind) -> List[str]:
    """The keys of ``values`` that ``kind`` refuses (an example written for another kind may give
    some), sorted."""
    refused = {key for key, _ in kind.refused_keys}
    return sorted(key for key in values if key in refused)


def as_kind(name: str, kind: str) -> RenderedJob:
    """Example ``name`` rendered as ``kind``, less the keys it refuses (``--set key=null``, as a
    user would run it)."""
    values = example(name)
    unset = [f"{key}=null" for key in refused_given(values, KINDS[kind])]
    return render_values(values, f"kind={kind}", *unset)


def kind_object(rendered: RenderedJob) -> Dict[str, Any]:
    """The rendered stream's job object, found as its kind's record finds it."""
    return dict(rendered.spec.job_kind.job_object(parsed(rendered), "stream"))


def validate_as_pod(template: Dict[str, Any], version: str) -> None:
    """Kubernetes' own schema of a Pod (kubernetes-validate, strict: unknown fields fail) over a
    job object's pod template, named so that it is a whole Pod."""
    import kubernetes_validate

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": dict(template["metadata"], name="p"),
        "spec": template["spec"],
    }
    kubernetes_validate.validate(pod, version, strict=True)


def object_of_kind(rendered: RenderedJob, kind: Any) -> Dict[str, Any]:
    """The one document of ``kind``'s apiVersion and kind (its record) in the rendered stream."""
    found = [
        doc
        for doc in parsed(rendered)
        if (doc["apiVersion"], doc["kind"]) == (kind.api_version, kind.kind)
    ]
    assert len(found) == 1, [(doc["apiVersion"], doc["kind"]) for doc in parsed(rendered)]
    return found[0]
