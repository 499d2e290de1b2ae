"""npu_job.errors.shown: every echoed input value stays quoted, on one line and bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from npu_job.errors import SHOWN_LIMIT, shown


@given(st.text())
def test_any_string_is_shown_on_one_line_and_bounded(text: str) -> None:
    echoed = shown(text)
    assert "\n" not in echoed and "\r" not in echoed
    assert len(echoed) <= 2 * SHOWN_LIMIT


def test_a_short_string_is_shown_whole_as_python_would_quote_it() -> None:
    assert shown("tor-1") == "'tor-1'"
    assert shown("a\nb") == "'a\\nb'"


def test_a_long_string_keeps_both_ends_and_says_how_long_it_was() -> None:
    echoed = shown("head" + "x" * 1_000_000 + "tail")
    assert echoed.startswith("'head") and "tail'" in echoed
    assert "(1000008 characters)" in echoed


def test_an_integer_too_long_to_print_is_described_by_its_size() -> None:
    assert shown(10**5000) == f"an integer of {(10**5000).bit_length()} bits"
    assert shown(12) == "12"


def test_containers_are_summarised_and_never_expanded_whole() -> None:
    assert shown(list(range(100))) == "a list of 100 items"
    assert shown([1, 2]) == "[1, 2]"
    assert len(shown({"a": "b" * 10_000})) <= SHOWN_LIMIT
    assert shown([10**5000]) == "a list"


def test_a_spec_error_lists_the_first_problems_and_counts_the_rest() -> None:
    from npu_job.errors import LISTED_PROBLEMS, SpecError

    error = SpecError("job.yaml", [f"args[{i}]: expected a string, got null" for i in range(1000)])
    lines = error.message.splitlines()
    assert lines[0] == "job.yaml: 1000 problems:"
    assert lines[1:-1] == [f"  - args[{i}]: expected a string, got null" for i in range(LISTED_PROBLEMS)]
    assert lines[-1] == f"  - and {1000 - LISTED_PROBLEMS} more"
    assert len(error.problems) == 1000
