"""The field checkers of the readers: a value that is not what a field expects is described in
JSON's terms (a string, a number, null, an array, an object, a boolean)."""

import pytest
from npu_job.bootstrap.base.fields import describe

from npu_job.errors import shown


@pytest.mark.parametrize(
    "value, shown",
    [
        ("x", "a string 'x'"),
        (3, "a number 3"),
        (None, "null"),
        ([1], "an array"),
        ({}, "an object"),
        (True, "a boolean"),
        ("y" * 100, "a string " + shown("y" * 100)),
    ],
    ids=["string", "number", "null", "array", "object", "boolean", "long-string"],
)
def test_values_are_described_in_json_terms(value, shown):
    assert describe(value) == shown
