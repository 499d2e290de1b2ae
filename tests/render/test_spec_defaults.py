"""The spec key table of docs/render.md says each key's type and default; these tests hold it to the code.

The rows are read from that page itself (tests/test_readme.py keeps them equal to what
``spec_keys_markdown`` generates from the key table). Every documented default (a literal in
backticks, ``none``, ``[]``/``{}``, and per device: `` `8` (`1` for cpu)``) is compared with what
validation gives a spec that leaves the key out, on each device; a default written in words is
checked by the cases listed for it here. Every documented integer range is the range validation
enforces, on the device it is documented for.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import pytest
import yaml
from npu_job.render.spec import JobSpec

from npu_job.errors import SpecError

from .conftest import spec_from, with_keys

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "render.md").read_text(encoding="utf-8")
DEVICES = ("npu", "gpu", "cpu")


class Row(NamedTuple):
    key: str
    type: str
    default: str


def readme_rows() -> List[Row]:
    table = PAGE.split("## Spec keys\n", 1)[1].strip().split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return [Row(cells[0].strip("| `"), cells[1], cells[2]) for cells in rows]


ROWS = readme_rows()
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
    ("workdir", "npu", 1): None,  # the image's: train.sh changes to no directory
    ("restart", "npu", 1): "job",  # the Volcano Job's (the default kind's); every kind's: its tests
}
REQUIRED = {row.key for row in ROWS if row.default == "required"}


def value_of(spec: JobSpec, key: str) -> Any:
    value: Any = spec
    for part in ATTRIBUTE.get(key, key).split("."):
        value = getattr(value, part)
    return value


def literal(text: str) -> Any:
    """The value ``none`` or a backticked literal names; NotImplemented for words."""
    if text == "none":
        return None
    match = re.fullmatch(r"`([^`]*)`", text)
    if match is None:
        return NotImplemented
    value = yaml.safe_load(match.group(1))
    return () if value in ([], {}) else value


def documented(default: str) -> Optional[Dict[str, Any]]:
    """The default on each device: ``X`` or ``X (Y for d1, d2; Z for d3)``; None for words."""
    match = re.fullmatch(r"(none|`[^`]*`)(?: \((.+)\))?", default)
    if match is None:
        return None
    usual = literal(match.group(1))
    values = {device: usual for device in DEVICES}
    for part in (match.group(2) or "").split("; ") if match.group(2) else ():
        other = re.fullmatch(r"(none|`[^`]*`) for ([a-z, ]+)", part)
        assert other is not None, f"unreadable per-device default {part!r}"
        for device in other.group(2).split(", "):
            assert device in DEVICES, device
            values[device] = literal(other.group(1))
    return values


def spec_without(key: str, device: str = "npu", nodes: int = 1) -> JobSpec:
    values: Dict[str, Any] = with_keys(device=device, nodes=nodes)
    values.pop(key, None)
    return spec_from(values)


def test_the_table_is_read():
    assert len(ROWS) > 30 and {"name", "image", "script"} == REQUIRED
    assert documented("`8` (`1` for cpu)") == {"npu": 8, "gpu": 8, "cpu": 1}
    assert documented("`8` (none for cpu)") == {"npu": 8, "gpu": 8, "cpu": None}
    assert documented("`nodes >= 3` on npu, else `false`") is None


@pytest.mark.parametrize("row", [r for r in ROWS if r.key not in REQUIRED], ids=lambda r: r.key)
def test_a_key_left_out_gets_its_documented_default(row):
    expected = documented(row.default)
    if expected is None:
        cases = {case: value for case, value in WORDED.items() if case[0] == row.key}
        assert cases, f"{row.key}: default {row.default!r} is words: list its cases in WORDED"
        for (_, device, nodes), value in cases.items():
            assert value_of(spec_without(row.key, device, nodes), row.key) == value, (device, nodes)
        return
    for device, value in expected.items():
        assert value_of(spec_without(row.key, device), row.key) == value, device


@pytest.mark.parametrize("case", list(WORDED), ids=lambda case: "-".join(map(str, case)))
def test_every_worded_case_holds(case):
    key, device, nodes = case
    assert value_of(spec_without(key, device, nodes), key) == WORDED[case]


def test_every_worded_case_is_a_documented_key():
    assert {key for key, _, _ in WORDED} <= {row.key for row in ROWS}


def integer_ranges() -> List[Tuple[str, str, int, int]]:
    """(key, device, low, high) of every documented ``integer L..H (L2..H2 for cpu)``."""
    ranges = []
    for row in ROWS:
        match = re.fullmatch(
            r"integer (\d+)\.\.(\d+)(?: \((\d+)\.\.(\d+) for ([a-z, ]+)\))?", row.type
        )
        if match is None:
            continue
        others = match.group(5).split(", ") if match.group(5) else []
        for device in DEVICES:
            if device in others:
                ranges.append((row.key, device, int(match.group(3)), int(match.group(4))))
            else:
                ranges.append((row.key, device, int(match.group(1)), int(match.group(2))))
    return ranges


def range_problems(key: str, device: str, value: int) -> List[str]:
    try:
        spec_from(with_keys(device=device), f"{key}={value}")
    except SpecError as error:
        return [problem for problem in error.problems if "expected an integer from" in problem]
    return []


@pytest.mark.parametrize("key, device, low, high", integer_ranges())
def test_a_documented_integer_range_is_the_one_enforced(key, device, low, high):
    assert range_problems(key, device, low) == range_problems(key, device, high) == []
    for outside in (low - 1, high + 1):
        assert range_problems(key, device, outside) == [
            f"{key} (from --set): expected an integer from {low} to {high}, got {outside}"
        ]


def test_every_integer_key_documents_its_range():
    assert {key for key, _, _, _ in integer_ranges()} >= {
        "nodes",
        "npus_per_node",
        "full_node_npus",
        "master_port",
        "max_retry",
        "hccl.connect_timeout",
        "hccl.base_port",
    }
