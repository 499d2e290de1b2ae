"""Go's ``regexp`` matched in linear time (pure): the Thompson NFA compiled from a syntax tree and
simulated by a lazily built DFA over sets of its states."""

from __future__ import annotations

from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from .syntax import (
    BEGIN_LINE,
    BEGIN_TEXT,
    END_LINE,
    END_TEXT,
    NOT_WORD_BOUNDARY,
    WORD_BOUNDARY,
    WORD_CHARACTERS,
    Node,
    Unsupported,
    parse,
)

MAX_PROGRAM = 10000  # NFA instructions: bounds each step of the simulation (Go allows 3.3 M)
MAX_CACHED = 200000  # NFA states kept in one program's DFA cache before it is dropped (memory)


class BudgetExceeded(RuntimeError):
    """The matching work allowed (:class:`Budget`) ran out."""


class Budget:
    """Work shared by many searches: each text character costs one step, and each new DFA state
    the NFA states it takes to build."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise BudgetExceeded("the matching work allowed ran out")


# --- the program ----------------------------------------------------------------------------------

CHAR, SPLIT, JUMP, ASSERT, MATCH = range(5)


class _Compiler:
    def __init__(self) -> None:
        self.code: List[list] = []  # [op, argument, next, other next]

    def emit(self, op: int, argument: object = None) -> int:
        if len(self.code) >= MAX_PROGRAM:
            raise Unsupported(f"it compiles to over {MAX_PROGRAM} NFA states")
        self.code.append([op, argument, None, None])
        return len(self.code) - 1

    def fragment(self, node: Node) -> Tuple[int, List[Tuple[int, int]]]:
        """(entry, the holes to patch with what follows): holes are (instruction, slot)."""
        kind = node[0]
        if kind == "char" or kind == "assert":
            at = self.emit(CHAR if kind == "char" else ASSERT, node[1])
            return at, [(at, 2)]
        if kind == "cat":
            if not node[1]:
                at = self.emit(JUMP)
                return at, [(at, 2)]
            entry, holes = self.fragment(node[1][0])
            for sub in node[1][1:]:
                start, next_holes = self.fragment(sub)
                self.patch(holes, start)
                holes = next_holes
            return entry, holes
        if kind == "alt":
            entry, holes = self.fragment(node[1][0])
            for sub in node[1][1:]:
                split = self.emit(SPLIT)
                start, more = self.fragment(sub)
                self.code[split][2], self.code[split][3] = entry, start
                entry, holes = split, holes + more
            return entry, holes
        sub, low, high = node[1], node[2], node[3]
        parts: List[Tuple[int, List[Tuple[int, int]]]] = [self.fragment(sub) for _ in range(low)]
        if high < 0:  # x{n,}: n copies, then x*
            split = self.emit(SPLIT)
            start, holes = self.fragment(sub)
            self.patch(holes, split)
            self.code[split][2] = start
            parts.append((split, [(split, 3)]))
        else:  # x{n,m}: n copies, then m-n nested optional ones
            for _ in range(high - low):
                split = self.emit(SPLIT)
                start, holes = self.fragment(sub)
                self.code[split][2] = start
                parts.append((split, holes + [(split, 3)]))
        if not parts:
            at = self.emit(JUMP)
            return at, [(at, 2)]
        entry, holes = parts[0]
        for start, next_holes in parts[1:]:
            self.patch(holes, start)
            holes = next_holes
        return entry, holes

    def patch(self, holes: List[Tuple[int, int]], target: int) -> None:
        for at, slot in holes:
            self.code[at][slot] = target


class Program:
    """A compiled pattern: :meth:`search` answers Go's ``MatchString``."""

    def __init__(self, code: Sequence[list], start: int) -> None:
        self.code = code
        self.start = start
        self.asserts = any(op == ASSERT for op, *_ in code)
        # anchored (``^...``, ``\\A...``): once no thread is alive past the start, none will be
        self.anchored = not any(
            self.closure((), before, after, False, after is None)
            for before in ("\n", "a", "-")
            for after in (None, "\n", "a", "-")
        )
        self.states: Dict[FrozenSet[int], int] = {}
        self.sets: List[FrozenSet[int]] = []
        self.matching: List[bool] = []
        self.moves: Dict[Tuple[int, str, int], int] = {}
        self.cached = 0

    def search(self, text: str, budget: Optional[Budget] = None) -> bool:
        """Whether the pattern matches anywhere in ``text``; ``budget`` bounds the work."""
        spend = budget.spend if budget is not None else (lambda steps: None)
        if self.cached > MAX_CACHED:  # a pattern whose DFA keeps growing: start afresh
            self.states, self.sets, self.matching, self.moves = {}, [], [], {}
            self.cached = 0
        n = len(text)
        first = text[0] if n else None
        state = self.state(self.closure((), None, first, True, n == 0), spend)
        if self.matching[state]:
            return True
        moves = self.moves
        for i, c in enumerate(text):
            following = text[i + 1] if i + 1 < n else None
            context = self.context(following) if self.asserts else 0
            key = (state, c, context)
            next_state = moves.get(key)
            spend(1)
            if next_state is None:
                stepped = [
                    self.code[pc][2]
                    for pc in self.sets[state]
                    if self.code[pc][0] == CHAR and self.code[pc][1](c)
                ]
                spend(len(self.sets[state]))
                next_state = self.state(
                    self.closure(stepped, c, following, False, i + 1 == n), spend
                )
                moves[key] = next_state
            if self.matching[next_state]:
                return True
            if self.anchored and not self.sets[next_state]:
                return False
            state = next_state
        return False

    @staticmethod
    def context(following: Optional[str]) -> int:
        if following is None:
            return 1
        return 2 + (following == "\n") + 2 * (following in WORD_CHARACTERS)

    def state(self, members: FrozenSet[int], spend: Callable[[int], None]) -> int:
        known = self.states.get(members)
        if known is None:
            spend(len(members))
            known = self.states[members] = len(self.sets)
            self.sets.append(members)
            self.matching.append(any(self.code[pc][0] == MATCH for pc in members))
            self.cached += len(members) + 1
        return known

    def closure(
        self,
        pcs: Sequence[int],
        before: Optional[str],
        after: Optional[str],
        at_start: bool,
        at_end: bool,
    ) -> FrozenSet[int]:
        """The states reachable from ``pcs`` and from the start (the search is unanchored)
        without reading a character, between ``before`` and ``after``."""
        code = self.code
        seen = set()
        stack = [self.start] + list(reversed(pcs))
        word = (before in WORD_CHARACTERS) != (after in WORD_CHARACTERS)
        while stack:
            pc = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            op, argument, following, other = code[pc]
            if op == SPLIT:
                stack.append(other)
                stack.append(following)
            elif op == JUMP:
                stack.append(following)
            elif op == ASSERT:
                if (
                    (argument == BEGIN_TEXT and at_start)
                    or (argument == END_TEXT and at_end)
                    or (argument == BEGIN_LINE and (at_start or before == "\n"))
                    or (argument == END_LINE and (at_end or after == "\n"))
                    or (argument == WORD_BOUNDARY and word)
                    or (argument == NOT_WORD_BOUNDARY and not word)
                ):
                    stack.append(following)
        return frozenset(pc for pc in seen if code[pc][0] in (CHAR, MATCH))


def compile(pattern: str) -> Program:  # noqa: A001 - the name Go and re give it
    """The program for ``pattern``; :class:`~.syntax.RegexpError` where Go's ``regexp.Compile``
    fails, :class:`~.syntax.Unsupported` where Go compiles it but this package does not."""
    compiler = _Compiler()
    entry, holes = compiler.fragment(parse(pattern))
    compiler.patch(holes, compiler.emit(MATCH))
    return Program(compiler.code, entry)
