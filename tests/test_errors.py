"""npu_job.errors: the exit-code table, one-line reports, and echoed input quoted and bounded."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from npu_job import errors
from npu_job.errors import SHOWN_LIMIT, shown

REPO = Path(__file__).resolve().parents[1]


def _all_error_classes(base: type = errors.NpuJobError) -> list:
    return [base] + [c for sub in base.__subclasses__() for c in _all_error_classes(sub)]


def test_the_readme_and_the_module_list_exactly_the_exit_codes_the_errors_carry() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Exit codes") :]
    section = section[: section.index("\n## ", 4)] if "\n## " in section[4:] else section
    in_readme = {int(code) for code in re.findall(r"^\| (\d+) \|", section, re.M)}
    in_module = {int(code) for code in re.findall(r"^(\d+)\s{2,}", errors.__doc__ or "", re.M)}
    carried = {errors.EXIT_OK, errors.EXIT_INTERNAL, errors.EXIT_USAGE}
    carried |= {cls.exit_code for cls in _all_error_classes()}
    assert in_readme == in_module == carried


def test_an_error_is_reported_as_one_line_and_a_tip_with_its_exit_code(capsys) -> None:
    error = errors.InputError(
        "ranktable.json", "server_count", "expected an integer, got 'x'", tip="fix the file"
    )
    assert errors.report_error(error, "npu-run") == 3
    assert capsys.readouterr().err == (
        "npu-run: error: ranktable.json: server_count: expected an integer, got 'x'\n"
        "npu-run: TIP: fix the file\n"
    )


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
    assert lines[1:-1] == [
        f"  - args[{i}]: expected a string, got null" for i in range(LISTED_PROBLEMS)
    ]
    assert lines[-1] == f"  - and {1000 - LISTED_PROBLEMS} more"
    assert len(error.problems) == 1000
