"""A stalled machine, seen from the test process: the one reason a fault test runs again.

The fault tests give their npu-run nodes a liveness window of a few seconds, so that a fault is
found in seconds. On a shared virtual machine the whole machine sometimes stops: in one CI run it
stopped for about 4.5 s, every process at once (each agent logged "this agent was stalled for
3.7-4.8s"). After such a stop node rank 0 finds nodes silent for longer than the window, or
itself stalled, and ends the job as it must when one host freezes: the test fails, though no
part of npu-run did wrong.

:class:`StallWatch` is a thread that sleeps in short steps and keeps every step that overran by
more than :data:`NOTED`: a stop of the machine (or of this process) that it saw.
:func:`rerun_after_machine_stall` is the marker for such a test: pytest-rerunfailures' ``flaky``
with a condition that allows a rerun only when, during the failed attempt, the machine stopped
for at least ``longer_than`` seconds (for a liveness test, the window less one interval: a stop
that long can hide a live node's beats). A failure without such a stop fails at once, like any
other. The module is also a pytest plugin (``tests/conftest.py`` takes its hooks): it starts each
marked attempt's record, and writes the stalls seen into the report of a failed attempt, so that a
rerun always shows why it happened, at the end of the run.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Deque, Generator, List, Optional, Tuple

import pytest

STEP = 0.05  # the watch sleeps this long between looks
NOTED = 0.5  # an overrun of a step longer than this is a stall worth keeping
KEPT = 1000  # the most recent stalls kept
MARKER_STALL = "longer_than"  # the flaky marker's keyword this module adds, read back by the hooks
SECTION = "machine stalls"  # the failed attempt's report section


class StallWatch:
    """Every stop of this process longer than ``noted`` seconds since :meth:`start`, by when it
    began (monotonic) and how long it lasted."""

    def __init__(self, step: float = STEP, noted: float = NOTED) -> None:
        self._step = step
        self._noted = noted
        self._stalls: Deque[Tuple[float, float]] = collections.deque(maxlen=KEPT)
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> StallWatch:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="machine-stall-watch", daemon=True
                )
                self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            before = time.monotonic()
            time.sleep(self._step)
            overrun = time.monotonic() - before - self._step
            if overrun > self._noted:
                with self._lock:
                    self._stalls.append((before, overrun))

    def since(self, moment: float) -> List[Tuple[float, float]]:
        """The stalls that ended after ``moment`` (monotonic): ``(began, seconds)`` each."""
        with self._lock:
            return [(began, length) for began, length in self._stalls if began + length > moment]


WATCH = StallWatch()
_attempt_began = time.monotonic()


def begin_attempt() -> None:
    """A test attempt starts now (its setup included): stalls before it are not its own."""
    global _attempt_began
    WATCH.start()
    _attempt_began = time.monotonic()


def stalls_of_this_attempt() -> List[Tuple[float, float]]:
    return WATCH.since(_attempt_began)


def longest_stall_of_this_attempt() -> float:
    return max((length for _, length in stalls_of_this_attempt()), default=0.0)


def describe_stalls() -> str:
    """One line per stall of this attempt, for the failure report."""
    return "\n".join(
        f"the machine stalled for {length:.1f}s, {max(0.0, began - _attempt_began):.1f}s into the attempt"
        for began, length in stalls_of_this_attempt()
    )


def machine_stalled(longer_than: float) -> Callable[[], bool]:
    """The rerun condition: did the machine stall at least ``longer_than`` s in this attempt?"""

    def condition() -> bool:
        return longest_stall_of_this_attempt() >= longer_than

    return condition


def rerun_after_machine_stall(longer_than: float, reruns: int = 2) -> pytest.MarkDecorator:
    """Mark a timing test to run again (up to ``reruns`` times) only after a failed attempt in
    which the machine stalled for ``longer_than`` seconds or more."""
    return pytest.mark.flaky(
        reruns=reruns,
        condition=machine_stalled(longer_than),
        **{MARKER_STALL: longer_than},
    )


def _watches_stalls(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("flaky")
    return marker is not None and MARKER_STALL in marker.kwargs


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _watches_stalls(item):
        begin_attempt()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _watches_stalls(item):
        report.sections.append((SECTION, describe_stalls() or "none seen"))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each rerun and the stalls that allowed it, at the end of the run (pytest-rerunfailures
    itself lists reruns only under ``-rR``, and without their reason)."""
    lines = [
        f"{report.nodeid} ({report.when}): {text}"
        for report in terminalreporter.stats.get("rerun", [])
        for name, text in report.sections
        if name == SECTION
    ]
    if lines:
        terminalreporter.write_sep("=", "runs again after the machine stalled")
        for line in lines:
            terminalreporter.write_line(line)
