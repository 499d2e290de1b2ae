"""Go's ``regexp`` syntax (RE2, with Go's ``Perl`` flags) read into a tree (pure).

What :func:`parse` accepts and refuses is told in the package's docstring
(:mod:`npu_job.bootstrap.goregexp`)."""

from __future__ import annotations

import unicodedata
from typing import Callable, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Tuple

MAX_PATTERN_LENGTH = 4096  # a long alternation of node names fits; the parse stays cheap
MAX_NESTING = 100  # groups inside groups; Go allows ~1000, the compile here recurses per level
MAX_REPEAT = 1000  # Go's maxRepeat: one count, and the product of nested counts


class RegexpError(ValueError):
    """The pattern does not compile in Go (Volcano's member then selects nothing)."""


class Unsupported(ValueError):
    """Go compiles the pattern, but it is not read here (a script class, or past a bound)."""


# --- characters -----------------------------------------------------------------------------------

Predicate = Callable[[str], bool]

_PERL = {"d": "0-9", "s": "\t\n\f\r ", "w": "0-9A-Za-z_"}
_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\x00-\x7f",
    "blank": "\t ",
    "cntrl": "\x00-\x1f\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@[-`{-~",
    "space": "\t\n\v\f\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_CATEGORIES = frozenset(
    "C Cc Cf Cn Co Cs L Ll Lm Lo Lt Lu M Mc Me Mn N Nd Nl No P Pc Pd Pe Pf Pi Po Ps "
    "S Sc Sk Sm So Z Zl Zp Zs".split()
)
WORD_CHARACTERS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_ESCAPES = {"a": "\a", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_FOLD_LOW, _FOLD_HIGH = 0x41, 0x1E943  # Go's minFold and maxFold: no folding outside
_orbits: Dict[str, FrozenSet[str]] = {}


def _ranges(spec: str) -> Tuple[Tuple[int, int], ...]:
    """``"0-9A-Z_"`` as code point ranges."""
    found: List[Tuple[int, int]] = []
    i = 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            found.append((ord(spec[i]), ord(spec[i + 2])))
            i += 3
        else:
            found.append((ord(spec[i]), ord(spec[i])))
            i += 1
    return tuple(found)


def _in_ranges(ranges: Sequence[Tuple[int, int]]) -> Predicate:
    return lambda c: any(lo <= ord(c) <= hi for lo, hi in ranges)


def _category(name: str) -> Predicate:
    if name == "Any":
        return lambda c: True
    if name == "Assigned":
        return lambda c: unicodedata.category(c) != "Cn"
    if name == "Ascii":
        return lambda c: ord(c) < 0x80
    if name == "Lc":
        return lambda c: unicodedata.category(c) in ("Lu", "Ll", "Lt")
    if len(name) == 1:
        return lambda c: unicodedata.category(c)[0] == name
    return lambda c: unicodedata.category(c) == name


def _orbit(c: str) -> FrozenSet[str]:
    """The characters Unicode's simple case folding makes equal to ``c`` (Go's SimpleFold orbit),
    from ``str.lower``/``str.upper`` and the orbits they miss (Kelvin sign, long s, ...)."""
    if not _orbits:
        _build_orbits()
    return _orbits.get(c) or frozenset(c)


def _build_orbits() -> None:
    group: Dict[str, str] = {}

    def root(c: str) -> str:
        while group.get(c, c) != c:
            c = group[c]
        return c

    def join(a: str, b: str) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            group[max(ra, rb)] = min(ra, rb)

    for point in range(_FOLD_LOW, _FOLD_HIGH + 1):
        c = chr(point)
        for other in (c.lower(), c.upper(), c.casefold()):
            if len(other) == 1 and other != c:
                join(c, other)
    members: Dict[str, List[str]] = {}
    for c in group:
        members.setdefault(root(c), []).append(c)
    for head, listed in members.items():
        orbit = frozenset(listed + [head])
        for c in orbit:
            _orbits[c] = orbit
    _orbits.setdefault("", frozenset())  # built, even where nothing folds


class _Class(NamedTuple):
    """A character class: the union of ``items`` (each a predicate, negated when its flag is
    set), negated when ``negated``; with ``fold``, a character is in an item when any member of
    its case-folding orbit is (Go folds each part, then negates it)."""

    items: Tuple[Tuple[Predicate, bool], ...]
    negated: bool
    fold: bool

    def __call__(self, c: str) -> bool:
        chars = _orbit(c) if self.fold and _FOLD_LOW <= ord(c) <= _FOLD_HIGH else (c,)
        hit = any(any(map(test, chars)) != negated for test, negated in self.items)
        return hit != self.negated


# --- the syntax tree ------------------------------------------------------------------------------

# nodes: ("char", predicate) ("assert", kind) ("cat", subs) ("alt", subs) ("rep", sub, lo, hi)
# (hi -1: no bound); captures are their contents (a boolean match has no use for them)
Node = tuple
_EMPTY: Node = ("cat", ())
BEGIN_TEXT, END_TEXT, BEGIN_LINE, END_LINE, WORD_BOUNDARY, NOT_WORD_BOUNDARY = range(6)

FOLD, MULTILINE, DOTNL = 1, 2, 4  # the flags that change a match (U changes only which one)


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.at = 0
        self.flags = 0
        self.depth = 0

    def error(self, code: str, expr: str) -> RegexpError:
        return RegexpError(f"error parsing regexp: {code}: `{expr}`")

    def parse(self) -> Node:
        node = self.alternation()
        if self.at < len(self.text):  # only a ")" stops an alternation early
            raise self.error("unexpected )", self.text)
        return node

    def alternation(self) -> Node:
        branches = [self.concatenation()]
        while self.at < len(self.text) and self.text[self.at] == "|":
            self.at += 1
            branches.append(self.concatenation())
        return branches[0] if len(branches) == 1 else ("alt", tuple(branches))

    def concatenation(self) -> Node:
        items: List[Node] = []
        text = self.text
        last_repeat = -1  # where the repetition just before started, or -1
        while self.at < len(text) and text[self.at] not in "|)":
            start = self.at
            c = text[start]
            if c in "*+?" or (c == "{" and self.counts() is not None):
                items, last_repeat = self.repeat(items, last_repeat), start
                continue
            last_repeat = -1
            if c == "(":
                node = self.group()
                if node is not None:
                    items.append(node)
            elif c == "[":
                items.append(("char", self.char_class()))
            elif c == "\\":
                items.extend(self.escape())
            else:
                self.at += 1
                items.append(self.simple(c))
        return items[0] if len(items) == 1 else ("cat", tuple(items))

    def simple(self, c: str) -> Node:
        if c == ".":
            if self.flags & DOTNL:
                return ("char", lambda x: True)
            return ("char", lambda x: x != "\n")
        if c == "^":
            return ("assert", BEGIN_LINE if self.flags & MULTILINE else BEGIN_TEXT)
        if c == "$":
            return ("assert", END_LINE if self.flags & MULTILINE else END_TEXT)
        return self.literal(c)

    def literal(self, c: str) -> Node:
        if self.flags & FOLD and _FOLD_LOW <= ord(c) <= _FOLD_HIGH:
            orbit = _orbit(c)
            return ("char", orbit.__contains__)
        return ("char", c.__eq__)

    def counts(self) -> Optional[Tuple[int, int, int]]:
        """``{n}``, ``{n,}`` or ``{n,m}`` here as (n, m or -1, its end); None: ``{`` is a
        literal. Counts Go's parseInt refuses (a leading zero) leave it a literal too."""
        text, i = self.text, self.at + 1

        def number(i: int) -> Tuple[Optional[int], int]:
            j = i
            while j < len(text) and "0" <= text[j] <= "9":
                j += 1
            if j == i or (text[i] == "0" and j - i > 1):
                return None, i
            return (int(text[i:j]) if j - i <= 8 else MAX_REPEAT + 1), j

        low, i = number(i)
        if low is None or i >= len(text):
            return None
        high = low
        if text[i] == ",":
            i += 1
            if i < len(text) and text[i] == "}":
                high = -1
            else:
                upper, i = number(i)
                if upper is None:
                    return None
                high = upper
        if i >= len(text) or text[i] != "}":
            return None
        return low, high, i + 1

    def repeat(self, items: List[Node], last_repeat: int) -> List[Node]:
        start, c = self.at, self.text[self.at]
        if c == "{":
            counts = self.counts()
            assert counts is not None  # the caller saw it
            low, high, self.at = counts
            if low > MAX_REPEAT or high > MAX_REPEAT or (high >= 0 and low > high):
                raise self.error("invalid repeat count", self.text[start : self.at])
        else:
            low, high = {"*": (0, -1), "+": (1, -1), "?": (0, 1)}[c]
            self.at += 1
        if self.at < len(self.text) and self.text[self.at] == "?":
            self.at += 1  # lazy: the same set of matches
        if last_repeat >= 0:
            raise self.error("invalid nested repetition operator", self.text[last_repeat : self.at])
        if not items:
            raise self.error("missing argument to repetition operator", self.text[start : self.at])
        node: Node = ("rep", items[-1], low, high)
        if c == "{" and (low >= 2 or high >= 2) and not _repeat_valid(node, MAX_REPEAT):
            raise self.error("invalid repeat count", self.text[start : self.at])
        return items[:-1] + [node]

    def group(self) -> Optional[Node]:
        """A group, or None for a flags-only ``(?i)`` (it changes the flags from here to the
        end of the enclosing group)."""
        text, start, saved = self.text, self.at, self.flags
        self.at += 1
        if text.startswith("?P<", self.at) or text.startswith("?<", self.at):
            end = text.find(">", self.at)
            if end < 0:
                raise self.error("invalid named capture", text[start:])
            name = text[self.at + (3 if text[self.at + 1] == "P" else 2) : end]
            if not name or any(c != "_" and not _isalnum(c) for c in name):
                raise self.error("invalid named capture", text[start : end + 1])
            self.at = end + 1
        elif text.startswith("?", self.at) and self.perl_flags(start):
            return None
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise Unsupported(f"groups nested deeper than {MAX_NESTING}")
        node = self.alternation()
        if self.at >= len(text):
            raise self.error("missing closing )", text)
        self.at += 1  # the ")"
        self.depth -= 1
        self.flags = saved
        return node

    def perl_flags(self, start: int) -> bool:
        """Read ``(?flags)`` (True: no group opens) or ``(?flags:`` (False) and set the flags."""
        text = self.text
        i = self.at + 1
        flags, negate, saw = self.flags, False, False
        while i < len(text):
            c = text[i]
            i += 1
            bit = {"i": FOLD, "m": MULTILINE, "s": DOTNL, "U": 0}.get(c)
            if bit is not None:
                flags = flags & ~bit if negate else flags | bit
                saw = True
            elif c == "-" and not negate:
                negate, saw = True, False
            elif c in ":)" and (saw or not negate):
                self.at = i
                self.flags = flags
                return c == ")"
            else:
                break
        raise self.error("invalid or unsupported Perl syntax", text[start:i])

    def escape(self) -> List[Node]:
        text, start = self.text, self.at
        if start + 1 >= len(text):
            raise self.error("trailing backslash at end of expression", "")
        c = text[start + 1]
        anchors = {"A": BEGIN_TEXT, "z": END_TEXT, "b": WORD_BOUNDARY, "B": NOT_WORD_BOUNDARY}
        if c in anchors:
            self.at += 2
            return [("assert", anchors[c])]
        if c == "Q":
            end = text.find("\\E", start + 2)
            literal = text[start + 2 :] if end < 0 else text[start + 2 : end]
            self.at = len(text) if end < 0 else end + 2
            return [self.literal(x) for x in literal]
        group = self.class_escape()
        if group is not None:
            test, negated = group
            return [("char", _Class(((test, negated),), False, bool(self.flags & FOLD)))]
        return [self.literal(self.single_escape())]

    def class_escape(self) -> Optional[Tuple[Predicate, bool]]:
        """``\\d``-style or ``\\p``-style escape here, consumed, as (predicate, negated)."""
        text, start = self.text, self.at
        c = text[start + 1] if start + 1 < len(text) else ""
        if c.lower() in _PERL:
            self.at += 2
            return _in_ranges(_ranges(_PERL[c.lower()])), c.isupper()
        if c not in ("p", "P"):
            return None
        negated = c == "P"
        if start + 2 >= len(text):
            raise self.error("invalid character class range", text[start:])
        if text[start + 2] == "{":
            end = text.find("}", start)
            if end < 0:
                raise self.error("invalid character class range", text[start:])
            name, self.at = text[start + 3 : end], end + 1
        else:
            name, self.at = text[start + 2], start + 3
        if name.startswith("^"):
            negated, name = not negated, name[1:]
        canonical = _canonical(name)
        if canonical in ("Any", "Assigned", "Ascii", "Lc") or canonical in _CATEGORIES:
            return _category(canonical), negated
        if canonical and all(x.isalnum() or x in "_- " for x in name):
            raise Unsupported(f"the Unicode class {text[start : self.at]} (a script?)")
        raise self.error("invalid character class range", text[start : self.at])

    def single_escape(self) -> str:
        text, start = self.text, self.at
        c = text[start + 1]
        self.at = start + 2
        if ord(c) < 0x80 and not _isalnum(c):
            return c
        if c in _ESCAPES:
            return _ESCAPES[c]
        if "0" <= c <= "7":
            digits = c
            if c != "0" and not (self.at < len(text) and "0" <= text[self.at] <= "7"):
                raise self.error("invalid escape sequence", text[start : self.at])
            while len(digits) < 3 and self.at < len(text) and "0" <= text[self.at] <= "7":
                digits += text[self.at]
                self.at += 1
            return chr(int(digits, 8))
        if c == "x" and self.at < len(text):
            if text[self.at] == "{":
                end = text.find("}", self.at)
                digits = text[self.at + 1 : end] if end >= 0 else ""
                if digits and all(x in "0123456789abcdefABCDEF" for x in digits):
                    value = int(digits, 16) if len(digits) <= 8 else 0x110000
                    if value <= 0x10FFFF:
                        self.at = end + 1
                        return chr(value)
            elif self.at + 1 < len(text) and all(
                x in "0123456789abcdefABCDEF" for x in text[self.at : self.at + 2]
            ):
                self.at += 2
                return chr(int(text[self.at - 2 : self.at], 16))
        raise self.error("invalid escape sequence", text[start : self.at + 1])

    def char_class(self) -> _Class:
        text, start = self.text, self.at
        self.at += 1
        negated = text.startswith("^", self.at)
        if negated:
            self.at += 1
        fold = bool(self.flags & FOLD)
        items: List[Tuple[Predicate, bool]] = []
        ranges: List[Tuple[int, int]] = []
        first = True
        while first or self.at >= len(text) or text[self.at] != "]":
            first = False
            if self.at >= len(text):
                raise self.error("missing closing ]", text[start:])
            if text.startswith("[:", self.at):
                end = text.find(":]", self.at + 2)
                if end >= 0:
                    name = text[self.at + 2 : end]
                    spec = _POSIX.get(name[1:] if name.startswith("^") else name)
                    if spec is None:
                        raise self.error("invalid character class range", text[self.at : end + 2])
                    items.append((_in_ranges(_ranges(spec)), name.startswith("^")))
                    self.at = end + 2
                    continue
            if text[self.at] == "\\":
                group = self.class_escape()
                if group is not None:
                    items.append(group)
                    continue
            low_at = self.at
            low = self.class_char(start)
            high = low
            if (
                text.startswith("-", self.at)
                and self.at + 1 < len(text)
                and text[self.at + 1] != "]"
            ):
                self.at += 1
                high = self.class_char(start)
                if high < low:
                    raise self.error("invalid character class range", text[low_at : self.at])
            ranges.append((ord(low), ord(high)))
        self.at += 1
        if ranges:
            items.append((_in_ranges(tuple(ranges)), False))
        return _Class(tuple(items), negated, fold)

    def class_char(self, start: int) -> str:
        if self.at >= len(self.text):
            raise self.error("missing closing ]", self.text[start:])
        if self.text[self.at] == "\\":
            if self.at + 1 >= len(self.text):
                raise self.error("trailing backslash at end of expression", "")
            return self.single_escape()
        self.at += 1
        return self.text[self.at - 1]


def _isalnum(c: str) -> bool:
    return "0" <= c <= "9" or "A" <= c <= "Z" or "a" <= c <= "z"


def _canonical(name: str) -> str:
    """Go's canonicalName: first letter upper, the rest lower, no ``_``, ``-`` or space."""
    kept = "".join(c for c in name if c not in "_- ")
    return kept[:1].upper() + kept[1:].lower()


def _repeat_valid(node: Node, n: int) -> bool:
    """Go's repeatIsValid: the product of the nested repetition counts stays within ``n``."""
    if node[0] == "rep":
        count = node[3] if node[3] >= 0 else node[2]
        if count == 0 and node[3] == 0:
            return True
        if count > n:
            return False
        if count > 0:
            n //= count
        return _repeat_valid(node[1], n)
    if node[0] in ("cat", "alt"):
        return all(_repeat_valid(sub, n) for sub in node[1])
    return True


def parse(pattern: str) -> Node:
    """The syntax tree of ``pattern``; :class:`RegexpError` where Go's parser fails,
    :class:`Unsupported` where Go reads it but this package does not."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise Unsupported(f"a pattern of {len(pattern)} characters (at most {MAX_PATTERN_LENGTH})")
    return _Parser(pattern).parse()
