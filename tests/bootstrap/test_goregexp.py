"""Go's regexp (RE2 syntax) in linear time: the same answers as Python's ``re`` where the two
syntaxes agree, Go's answers where they do not, Go's refusals, and bounded work on the patterns
that make a backtracking matcher run for minutes."""

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.bootstrap import goregexp
from npu_job.bootstrap.goregexp import Budget, BudgetExceeded, RegexpError, Unsupported


def matches(pattern: str, text: str) -> bool:
    return goregexp.compile(pattern).search(text)


# --- where Go and Python agree: a small grammar of both ------------------------------------------

ATOMS = st.sampled_from(["a", "b", "-", "1", ".", "[ab]", "[^a]", "[a-c1]", r"\d", r"\w", r"\W"])


def _quantified(inner: st.SearchStrategy) -> st.SearchStrategy:
    bounds = st.integers(0, 3).flatmap(lambda low: st.tuples(st.just(low), st.integers(low, 3)))
    return st.one_of(
        inner,
        st.tuples(inner, st.sampled_from(["*", "+", "?", "*?", "+?", "??"])).map("".join),
        st.tuples(inner, bounds).map(lambda t: f"{t[0]}{{{t[1][0]},{t[1][1]}}}"),
        st.tuples(inner, st.integers(0, 3)).map(lambda t: f"{t[0]}{{{t[1]}}}"),
    )


PATTERNS = st.recursive(
    _quantified(ATOMS),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=4).map("".join),
        st.lists(inner, min_size=2, max_size=3).map("|".join),
        _quantified(inner.map(lambda p: f"({p})")),
        _quantified(inner.map(lambda p: f"(?:{p})")),
    ),
    max_leaves=8,
)
ANCHORED = st.tuples(
    st.sampled_from(["", "^", r"\b"]), PATTERNS, st.sampled_from(["", "$", r"\b"])
).map("".join)
TEXTS = st.text(alphabet="ab-1 c", max_size=12)


@settings(max_examples=400, deadline=None)
@given(ANCHORED, TEXTS)
def test_agrees_with_python_re_where_the_syntaxes_agree(pattern, text):
    assert matches(pattern, text) == bool(re.search(pattern, text)), (pattern, text)


@settings(max_examples=100, deadline=None)
@given(ANCHORED, TEXTS)
def test_case_folding_agrees_with_python_on_ascii(pattern, text):
    pattern = "(?i)" + pattern
    assert matches(pattern, text.upper()) == bool(re.search(pattern, text.upper()))


# --- where Go reads a pattern otherwise than Python does ------------------------------------------


@pytest.mark.parametrize(
    "pattern, text, go, why",
    [
        ("node$", "node\n", False, "$ is the end of the text in Go without (?m)"),
        ("(?m)node$", "node\nx", True, "(?m) makes $ the end of a line"),
        ("^b", "a\nb", False, "^ is the start of the text without (?m)"),
        ("(?m)^b", "a\nb", True, "(?m) makes ^ the start of a line"),
        (r"\d", "\u0663", False, "\\d is ASCII only in Go"),
        (r"\w", "\u00e9", False, "\\w is ASCII only in Go"),
        (r"\s", "\v", False, "Go's \\s has no vertical tab"),
        (r"\bx", "\u00e9x", True, "\\b looks at ASCII word characters only"),
        ("x{,3}", "x{,3}", True, "{,3} is a literal in Go (Python: 0 to 3 x)"),
        ("x{,3}", "xx", False, "{,3} is a literal in Go (Python: 0 to 3 x)"),
        ("a{01}", "a{01}", True, "a count with a leading zero is a literal in Go"),
        ("(?i)k", "\u212a", True, "(?i) folds by Unicode simple folding (Kelvin sign)"),
        ("(?i)\u212a", "k", True, "(?i) folds by Unicode simple folding (Kelvin sign)"),
        ("(?i)[^k]", "K", False, "a folded negated class leaves out the whole orbit"),
        ("[[:alpha:]]+-[[:digit:]]", "node-1", True, "POSIX classes"),
        ("[[:^alpha:]]", "abc", False, "negated POSIX classes"),
        (r"\pL", "\u00e9", True, "Unicode general categories"),
        (r"\p{Nd}", "\u0663", True, "Unicode general categories"),
        (r"\PL", "abc", False, "negated Unicode categories"),
        (r"a\z", "a\n", False, "\\z: the end of the text"),
        ("(?s).", "\n", True, "(?s) lets . match a newline"),
        (".", "\n", False, ". does not match a newline"),
        ("[^a]", "\n", True, "negated classes match a newline (ClassNL)"),
        (r"\Qa.b\E", "axb", False, "\\Q...\\E quotes"),
        ("a(?i)*", "", True, "a repetition after a flag group repeats what came before"),
        ("(?i)a|b", "B", True, "flags set inside a group last to its end, over |"),
        ("(?:(?i)a)b", "AB", False, "... and no further"),
        (r"\x{41}\101\x42", "AAB", True, "hex and octal escapes"),
    ],
)
def test_reads_a_pattern_as_go_does(pattern, text, go, why):
    assert matches(pattern, text) is go, why


@pytest.mark.parametrize(
    "pattern, message",
    [
        (r"(a)\1", r"invalid escape sequence: `\1`"),
        ("(?=a)", "invalid or unsupported Perl syntax: `(?=`"),
        ("(?!a)", "invalid or unsupported Perl syntax: `(?!`"),
        ("(?<=a)b", "invalid named capture: `(?<=a)b`"),
        ("(?>a)", "invalid or unsupported Perl syntax: `(?>`"),
        ("a++", "invalid nested repetition operator: `++`"),
        ("a**", "invalid nested repetition operator: `**`"),
        ("a*?+", "invalid nested repetition operator: `*?+`"),
        ("a{2}{3}", "invalid nested repetition operator: `{2}{3}`"),
        (r"\Z", r"invalid escape sequence: `\Z`"),
        (r"\C", r"invalid escape sequence: `\C`"),
        ("a{1001}", "invalid repeat count: `{1001}`"),
        ("((a{10}){10}){11}", "invalid repeat count: `{11}`"),
        ("x{2,1}", "invalid repeat count: `{2,1}`"),
        ("*a", "missing argument to repetition operator: `*`"),
        ("a|*", "missing argument to repetition operator: `*`"),
        ("(a", "missing closing ): `(a`"),
        ("a)", "unexpected ): `a)`"),
        ("[a", "missing closing ]: `[a`"),
        ("[z-a]", "invalid character class range: `z-a`"),
        ("[[:foo:]]", "invalid character class range: `[:foo:]`"),
        ("(?P<a-b>x)", "invalid named capture: `(?P<a-b>`"),
        ("(?i-)", "invalid or unsupported Perl syntax: `(?i-)`"),
        ("a\\", "trailing backslash at end of expression: ``"),
    ],
)
def test_refuses_what_go_refuses(pattern, message):
    with pytest.raises(RegexpError) as caught:
        goregexp.compile(pattern)
    assert str(caught.value) == f"error parsing regexp: {message}"


def test_accepts_what_go_accepts_and_python_may_not():
    for pattern in ["^*", "(?)", "(?P<n>a)(?P<n>b)", "(?<n>a)", r"\_", "[]a]", r"[\d-z]", "a{,"]:
        goregexp.compile(pattern)


def test_script_classes_and_patterns_past_the_bounds_are_said_to_be_unread():
    with pytest.raises(Unsupported):
        goregexp.compile(r"\p{Greek}")
    with pytest.raises(Unsupported):
        goregexp.compile("a" * (goregexp.MAX_PATTERN_LENGTH + 1))
    with pytest.raises(Unsupported):
        goregexp.compile("(" * (goregexp.MAX_NESTING + 1) + ")" * (goregexp.MAX_NESTING + 1))
    with pytest.raises(Unsupported):
        goregexp.compile("(abcdefghijklmnopq){1000}")  # valid in Go: 17,000 instructions


# --- bounded work --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, text",
    [
        ("(a+)+$", "a" * 28 + "00"),
        (r"^gpu-node-(\d+)+x$", "gpu-node-" + "1" * 21),
        ("(.*){40}z", "a" * 30),
        ("(x+x+)+y", "x" * 253),
        ("(a|aa)*b", "a" * 253),
    ],
)
def test_patterns_that_backtrack_for_minutes_answer_at_once(pattern, text):
    started = time.perf_counter()
    assert matches(pattern, text) is False
    assert time.perf_counter() - started < 1.0


def test_the_work_is_linear_in_the_text_and_bounded_by_the_budget():
    program = goregexp.compile("(a|b)*a(a|b){12}c")  # its DFA has 2^13 states: built lazily
    text = "".join("ab"[(i * 7919) % 13 % 2] for i in range(4000))
    budget = Budget(10**9)
    assert program.search(text, budget) is False
    assert 10**9 - budget.left <= len(text) * (2 * len(program.code) + 1)
    with pytest.raises(BudgetExceeded):
        program.search(text, Budget(3999))
