"""The README's spec key table says what each key defaults to; these tests hold it to the code.

Every documented default is read (a literal in backticks, ``none``, ``[]``/``{}``) and compared
with what validation gives a spec that leaves the key out, for each device where the default
says it differs. A default written in words is checked by the cases listed for it here.
"""

from __future__ import annotations

import re
from typing import Any, Dict

import pytest
import yaml

from npu_job.render.spec import SPEC_KEYS, JobSpec

from .conftest import spec_from, with_keys

# key -> the JobSpec attribute it fills (the rest are their own names)
ATTRIBUTE = {"bootstrap.url": "bootstrap_url"}
# defaults in words: {(key, device, nodes): expected value}
WORDED = {
    ("routing", "npu", 3): True,
    ("routing", "npu", 2): False,
    ("routing", "gpu", 3): False,
    ("routing", "cpu", 3): False,
    ("tiered_store", "npu", 1): True,
    ("npus_per_node", "npu", 1): 8,
    ("npus_per_node", "cpu", 1): 1,
    ("full_node_npus", "npu", 1): 8,
    ("full_node_npus", "gpu", 1): 8,
    ("full_node_npus", "cpu", 1): None,
    ("anti_affinity", "npu", 1): True,
    ("anti_affinity", "cpu", 1): False,
    ("workdir", "npu", 1): None,  # "image's": train.sh changes to no directory
}
REQUIRED = {doc.key for doc in SPEC_KEYS if doc.default == "required"}


def value_of(spec: JobSpec, key: str) -> Any:
    value: Any = spec
    for part in ATTRIBUTE.get(key, key).split("."):
        value = getattr(value, part)
    return value


def documented(default: str) -> Any:
    """The value a documented default names, or a marker when it is words."""
    if default == "none":
        return None
    literal = re.fullmatch(r"`([^`]*)`", default)
    if literal is None:
        return NotImplemented
    value = yaml.safe_load(literal.group(1))
    return () if value in ([], {}) else value


def spec_without(key: str, device: str = "npu", nodes: int = 1) -> JobSpec:
    values: Dict[str, Any] = with_keys(device=device, nodes=nodes)
    values.pop(key, None)
    return spec_from(values)


@pytest.mark.parametrize("doc", [doc for doc in SPEC_KEYS if doc.key not in REQUIRED], ids=lambda d: d.key)
def test_a_key_left_out_gets_its_documented_default(doc):
    expected = documented(doc.default)
    if expected is NotImplemented:
        cases = {case: value for case, value in WORDED.items() if case[0] == doc.key}
        assert cases, f"{doc.key}: default {doc.default!r} is words: list its cases in WORDED"
        for (_, device, nodes), value in cases.items():
            assert value_of(spec_without(doc.key, device, nodes), doc.key) == value, (device, nodes)
        return
    assert value_of(spec_without(doc.key), doc.key) == expected


def test_every_worded_case_is_a_documented_key():
    assert {key for key, _, _ in WORDED} <= {doc.key for doc in SPEC_KEYS}
