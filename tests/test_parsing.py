"""npu_job.parsing: the one reader of counts and durations that every part uses."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_job.parsing import COUNT_LIMIT, count_from_text, is_count, seconds_from_text


@given(st.integers(min_value=0, max_value=COUNT_LIMIT - 1), st.integers(min_value=0, max_value=3))
def test_a_count_is_read_back_with_or_without_leading_zeros(value: int, zeros: int) -> None:
    assert count_from_text("0" * zeros + str(value)) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 5",
        "5 ",
        "+5",
        "-1",
        "1_000",
        "1e3",
        "0x10",
        "²",
        "٣",
        "5\n",
        str(COUNT_LIMIT),
        "9" * 5000,
    ],
)
def test_anything_but_ascii_digits_below_the_limit_is_not_a_count(text: str) -> None:
    assert count_from_text(text) is None and not is_count(text)


@given(st.text())
def test_a_count_is_exactly_what_spells_one(text: str) -> None:
    spelled = text.isascii() and text.isdigit() and int(text) < COUNT_LIMIT
    assert (count_from_text(text) is not None) == spelled


@pytest.mark.parametrize(
    "text, zero_ok, expected",
    [
        ("1.5", False, 1.5),
        ("0", True, 0.0),
        ("1e2", False, 100.0),
        (" 3 ", False, 3.0),
        ("0", False, None),
        ("-1", True, None),
        ("nan", True, None),
        ("soon", True, None),
        ("", True, None),
    ],
)
def test_seconds_are_what_float_reads_within_the_bound_and_never_nan(
    text, zero_ok, expected
) -> None:
    assert seconds_from_text(text, zero_ok=zero_ok) == expected


def test_infinite_seconds_mean_no_limit() -> None:
    assert seconds_from_text("inf", zero_ok=False) == math.inf


@pytest.mark.parametrize(
    "text, expected", [("8", 8), ("008", 8), ("999999999", 999999999), ("1000000000", None)]
)
def test_a_narrower_count_takes_fewer_digits(text: str, expected) -> None:
    """A device quantity is read by the same reader, below 10**9."""
    assert count_from_text(text, max_digits=9) == expected
