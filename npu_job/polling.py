"""The one poller: ask until an answer comes or a deadline passes, pausing between attempts.

Every wait of npu-job (the bootstrap for its rank table or the job's pods, an agent for the root
store, a round, a verdict, a key) is the same loop::

    start = clock()
    until attempt() answers:
        elapsed = clock() - start
        past the timeout?  give up (the caller says what was last seen)
        tick(elapsed)      progress lines, a check that may raise
        sleep(the next pause of the backoff, never past the deadline)

:func:`poll` is that loop; :class:`Backoff` says how long the pauses are (fixed, or growing by a
factor up to a cap, each one jittered so that many pods polling one server spread out), and
:class:`Every` turns an action into a tick that runs at most once per interval. The clock, the
sleep and the random source are parameters, so a test drives the loop without waiting. The clock
is read once at the start and once after each unanswered attempt, nowhere else.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Tuple, TypeVar

T = TypeVar("T")
if TYPE_CHECKING:  # (annotations only: a typing subscript costs time at import)
    Uniform = Callable[[float, float], float]  # random.uniform's shape: a number in [low, high]


class Backoff:
    """Pauses between attempts: ``first``, then each ``factor`` times the last, at most ``cap``
    (0: ``first``); each pause is multiplied by a number drawn from ``jitter`` (low, high).

    A value: nothing changes it after it is made. A plain class with slots rather than a frozen
    dataclass, whose class takes about a millisecond to make: every pod's bootstrap imports this.
    """

    __slots__ = ("first", "factor", "cap", "jitter")

    def __init__(
        self,
        first: float,
        factor: float = 1.0,
        cap: float = 0.0,
        jitter: Tuple[float, float] = (1.0, 1.0),
    ) -> None:
        self.first = first
        self.factor = factor
        self.cap = cap
        self.jitter = jitter

    def __repr__(self) -> str:
        return f"Backoff({self.first!r}, {self.factor!r}, {self.cap!r}, {self.jitter!r})"

    @classmethod
    def fixed(cls, seconds: float) -> Backoff:
        """The same pause every time, no jitter (the bootstrap's poll interval)."""
        return cls(seconds)

    @classmethod
    def exponential(
        cls, first: float, cap: float, factor: float = 1.5, jitter: float = 0.2
    ) -> Backoff:
        """Growing pauses, each within ``jitter`` (a fraction) of its nominal length."""
        return cls(first, factor, cap, (1.0 - jitter, 1.0 + jitter))

    def pauses(self, uniform: Uniform = random.uniform) -> Iterator[float]:
        """The pauses, one per unanswered attempt, without end."""
        low, high = self.jitter
        cap = self.cap or self.first
        delay = self.first
        while True:
            yield delay if low == high == 1.0 else delay * uniform(low, high)
            delay = min(delay * self.factor, cap)


def poll(
    attempt: Callable[[], Optional[T]],
    timeout: float,
    backoff: Backoff,
    *,
    tick: Optional[Callable[[float], object]] = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
    uniform: Uniform = random.uniform,
) -> Optional[T]:
    """Call ``attempt`` until it returns something other than None, and return that; None once
    ``timeout`` seconds have passed since the call (see the module docstring for the order).

    ``attempt`` is always called at least once, also with a timeout of 0; an exception it (or
    ``tick``, which gets the seconds elapsed) raises ends the poll. A pause never reaches past the
    deadline: the last attempt happens at it.
    """
    start = clock()
    pauses = backoff.pauses(uniform)
    while True:
        answer = attempt()
        if answer is not None:
            return answer
        elapsed = clock() - start
        if elapsed >= timeout:
            return None
        if tick is not None:
            tick(elapsed)
        sleep(min(next(pauses), timeout - elapsed))


def poll_until(
    condition: Callable[[], bool],
    timeout: float,
    backoff: Backoff,
    *,
    tick: Optional[Callable[[float], object]] = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
    uniform: Uniform = random.uniform,
) -> bool:
    """:func:`poll` for a yes/no ``condition``: True once it holds, False at the timeout."""
    return (
        poll(
            lambda: True if condition() else None,
            timeout,
            backoff,
            tick=tick,
            clock=clock,
            sleep=sleep,
            uniform=uniform,
        )
        is not None
    )


class Every:
    """A tick that runs ``action`` at most once per ``interval`` seconds of the poll, the first
    time once ``interval`` has passed; ``always`` (a cheap check) runs at every tick before it."""

    def __init__(
        self,
        interval: float,
        action: Callable[[float], object],
        always: Optional[Callable[[], object]] = None,
    ) -> None:
        self._interval = interval
        self._action = action
        self._always = always
        self._next = interval

    def __call__(self, elapsed: float) -> None:
        if self._always is not None:
            self._always()
        if elapsed >= self._next:
            self._next = elapsed + self._interval
            self._action(elapsed)
