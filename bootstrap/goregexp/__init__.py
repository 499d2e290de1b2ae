"""Go's ``regexp`` (RE2 syntax) matched in linear time, in pure Python (pure).

Volcano selects a HyperNode's ``regexMatch`` members with Go's ``regexp.Compile(pattern)`` and
``MatchString(node.Name)`` (unanchored: the pattern may match anywhere), and a pattern that does
not compile matches no node (volcano-sh/volcano ``pkg/util/hypernode/member_selector.go``,
``GetMembers``). Python's ``re`` backtracks: ``(a+)+$`` against a 30-character node name runs for
minutes. This module reads the syntax Go's ``regexp/syntax`` parses with its ``Perl`` flags
(https://github.com/google/re2/wiki/Syntax; golang/go ``src/regexp/syntax/parse.go``) and
answers :meth:`Program.search` by simulating the Thompson NFA (a lazily built DFA over sets of
its states), so the time is linear in the text: at most ``len(text) x len(program)`` steps.

What it reads, as Go does: literals and escapes (``\\x41``, ``\\x{263a}``, octal ``\\123``,
``\\Q...\\E``, punctuation), ``.``, classes with ranges, negation, ``\\d \\s \\w`` (ASCII),
``[[:alpha:]]`` and ``[[:^alpha:]]``, ``\\pL``/``\\p{Lu}`` (general categories, ``Any``,
``Assigned``, ``ASCII``); anchors ``^ $`` (text, or lines with ``(?m)``), ``\\A \\z``, ``\\b \\B``
(ASCII words); alternation; capturing, named and ``(?:)`` groups; flags ``i m s U`` (set, clear,
scoped); ``* + ? {n} {n,} {n,m}`` and their lazy forms (which cannot change whether a match
exists). Go's refusals are refusals here: backreferences, lookaround, ``\\Z``, ``\\C``,
possessive and stacked repetition (``a**``, ``a++``), a repeat count over 1000 alone or
multiplied through nested repetitions.

Where Go and Python's ``re`` differ (each pinned by a test): ``$`` is the end of the text (not
before a final newline) unless ``(?m)``; ``\\d \\w \\s \\b`` are ASCII only and ``\\s`` has no
``\\v``; ``x{,3}`` is a literal; ``(?i)`` folds by Unicode's simple folding (``k`` matches the
Kelvin sign).

Not read here, said as such (the caller then matches nothing and reports it): Unicode script
names (``\\p{Greek}``; Python's standard library has no script table), and patterns past the
bounds below, which Go would run but no node name needs.
"""

from .program import MAX_CACHED, MAX_PROGRAM, Budget, BudgetExceeded, Program, compile
from .syntax import MAX_NESTING, MAX_PATTERN_LENGTH, MAX_REPEAT, RegexpError, Unsupported

__all__ = [
    "MAX_CACHED",
    "MAX_NESTING",
    "MAX_PATTERN_LENGTH",
    "MAX_PROGRAM",
    "MAX_REPEAT",
    "Budget",
    "BudgetExceeded",
    "Program",
    "RegexpError",
    "Unsupported",
    "compile",
]
