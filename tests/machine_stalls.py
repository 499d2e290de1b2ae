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

A busy machine, not stopped but slow, is the other thing the tests see of it: with a second test
suite beside it, start-ups that take 10 s alone took over 90 s. A cap on a wait is therefore
counted in :func:`machine_seconds`, which run at ``1 /`` :func:`slowness` of the wall clock's pace
(the watch's thread adds them up at every step): a :class:`Cap` (:func:`wait_until`,
:func:`wait_process`, :func:`communicate`, :func:`run` wait within one) gives a test on a machine
three times slower three times the wall time, and so does the suite's hang catcher
(pytest-timeout's ``timeout``, whose timer this plugin keeps). A wait still ends at its event;
only a wait that never sees it runs into its cap.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from typing import Callable, Deque, Generator, List, Optional, Sequence, Tuple, Union

import pytest

STEP = 0.05  # the watch sleeps this long between looks
NOTED = 0.5  # an overrun of a step longer than this is a stall worth keeping
KEPT = 1000  # the most recent stalls kept
MARKER_STALL = "longer_than"  # the flaky marker's keyword this module adds, read back by the hooks
SECTION = "machine stalls"  # the failed attempt's report section
# The slowest pace a cap allows for: a cap is at most this many times its seconds of wall time, so
# that a hung test still ends (pytest-timeout's 300 s: within 50 minutes on the busiest machine)
SLOWEST = 10.0
SLOWNESS_VARIABLE = "NPU_JOB_TEST_SLOWNESS"


class StallWatch:
    """Every stop of this process longer than ``noted`` seconds since :meth:`start`, by when it
    began (monotonic) and how long it lasted; and the :func:`machine_seconds` since then."""

    def __init__(self, step: float = STEP, noted: float = NOTED) -> None:
        self._step = step
        self._noted = noted
        self._stalls: Deque[Tuple[float, float]] = collections.deque(maxlen=KEPT)
        self._machine_seconds = 0.0
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
            after = time.monotonic()
            overrun = after - before - self._step
            with self._lock:
                self._machine_seconds += (after - before) / slowness()
                if overrun > self._noted:
                    self._stalls.append((before, overrun))

    def machine_seconds(self) -> float:
        """Wall seconds since :meth:`start`, each divided by the machine's :func:`slowness` then
        (at the watch's step)."""
        with self._lock:
            return self._machine_seconds

    def since(self, moment: float) -> List[Tuple[float, float]]:
        """The stalls that ended after ``moment`` (monotonic): ``(began, seconds)`` each."""
        with self._lock:
            return [(began, length) for began, length in self._stalls if began + length > moment]


def pace(load: float, cpus: int) -> float:
    """The slowness of a machine with ``load`` runnable tasks (its load average) on ``cpus``: how
    many times its time alone a CPU-bound process needs there, from 1 to :data:`SLOWEST`."""
    return min(SLOWEST, max(1.0, load / max(1, cpus)))


def slowness() -> float:
    """This machine's :func:`pace` now, from its 1-minute load average (other suites and users,
    and this suite's own processes) and the CPUs this process may run on; or ``SLOWNESS_VARIABLE``,
    where set, for a machine whose load does not show it (a CPU quota, a busy host under a VM)."""
    fixed = os.environ.get(SLOWNESS_VARIABLE)
    if fixed:
        return pace(float(fixed), 1)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return pace(os.getloadavg()[0], cpus)


WATCH = StallWatch()
_attempt_began = time.monotonic()


def machine_seconds() -> float:
    """A clock (from an arbitrary start) that runs at ``1 / slowness()`` of the wall clock's pace:
    the seconds the machine's work would have taken alone."""
    return WATCH.start().machine_seconds()


class Cap:
    """The most a wait may take: ``seconds`` as an idle machine counts them (machine seconds), so
    as many more wall seconds as the machine is slower while the wait runs; after ``fixed`` wall
    seconds that no machine shortens or stretches (a timeout of the code under test, which counts
    wall time: a liveness window, a join timeout). A cap of ``(25, fixed=4)`` is reached after 29
    s on an idle machine, after 79 s on one that runs everything three times slower."""

    def __init__(self, seconds: float, fixed: float = 0.0) -> None:
        self.seconds = seconds
        self.fixed = fixed
        self.began = time.monotonic()
        self._clock = machine_seconds()

    def reached(self) -> bool:
        wall = time.monotonic() - self.began
        if wall < self.fixed or wall <= 0:
            return False
        # the machine seconds since the start, less the share of them the fixed part took
        machine = machine_seconds() - self._clock
        return machine * (1.0 - self.fixed / wall) >= self.seconds

    def wall_step(self, longest: float = 1.0) -> float:
        """How long to sleep before looking again: at most ``longest``, at most what is left at
        the machine's pace now."""
        left = self.fixed + self.seconds * slowness() - (time.monotonic() - self.began)
        return max(0.01, min(longest, left))

    def __str__(self) -> str:
        wall = time.monotonic() - self.began
        fixed = f"{self.fixed:g} s + " if self.fixed else ""
        return f"{fixed}{self.seconds:g} s at an idle machine's pace ({wall:.0f} s of wall time)"


def capped(timeout: Union[float, Cap]) -> Cap:
    """``timeout`` as a :class:`Cap`: a cap as it is, seconds as a cap of that many from now."""
    return timeout if isinstance(timeout, Cap) else Cap(timeout)


def wait_until(
    predicate: Callable[[], object], seconds: Union[float, Cap], what: str, interval: float = 0.05
):
    """``predicate()``'s first true value, looked at every ``interval`` s; an ``AssertionError``
    naming ``what`` after a :class:`Cap` of ``seconds``."""
    cap = capped(seconds)
    while True:
        value = predicate()
        if value:
            return value
        if cap.reached():
            raise AssertionError(f"timed out after {cap} waiting for {what}")
        time.sleep(cap.wall_step(interval))


def wait_process(process: subprocess.Popen, seconds: Union[float, Cap]) -> int:
    """``process``'s exit code; ``subprocess.TimeoutExpired`` after a :class:`Cap` of ``seconds``
    (its ``timeout`` the wall seconds waited)."""
    cap = capped(seconds)
    while True:
        try:
            return process.wait(timeout=cap.wall_step())
        except subprocess.TimeoutExpired as still_running:
            if cap.reached():
                still_running.timeout = time.monotonic() - cap.began
                raise


def communicate(process: subprocess.Popen, seconds: Union[float, Cap]) -> Tuple[str, str]:
    """``process.communicate()`` within a :class:`Cap` of ``seconds``: once reached, the process
    (with every process of its session, if it leads one: ``start_new_session=True``) is killed
    and ``subprocess.TimeoutExpired`` raised."""
    cap = capped(seconds)
    while True:
        try:
            return process.communicate(timeout=cap.wall_step())
        except subprocess.TimeoutExpired:
            if not cap.reached():
                continue  # communicate may be called again: no output is lost
            try:
                if os.getpgid(process.pid) == process.pid:
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.kill()
            except ProcessLookupError:
                pass
            process.communicate()
            raise subprocess.TimeoutExpired(process.args, time.monotonic() - cap.began) from None


def run(
    command: Sequence[str], seconds: Union[float, Cap], **options
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, **options)`` within a
    :class:`Cap` of ``seconds`` (:func:`communicate`)."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options
    )
    stdout, stderr = communicate(process, seconds)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


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


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # pytest-timeout's hook
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> bool:
    """pytest-timeout's timer (``timeout`` in pyproject.toml: the hang catcher of every test) as a
    :class:`Cap`: a test on a slow machine gets as much more time as its own caps do. The method
    stays pytest-timeout's: its SIGALRM handler (which fails the test) or its thread (which ends
    the process), called once the cap is reached."""
    import pytest_timeout

    cap = Cap(settings.timeout)  # type: ignore[attr-defined]
    method = settings.method  # type: ignore[attr-defined]
    if method == "signal" and threading.current_thread() is threading.main_thread():

        def alarm(signum: int, frame: object) -> None:
            __tracebackhide__ = True
            if cap.reached():
                pytest_timeout.timeout_sigalrm(item, settings)
            else:  # slower than the wall clock: look again when it may be reached
                signal.setitimer(signal.ITIMER_REAL, cap.wall_step(cap.seconds))

        def cancel() -> None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, cap.seconds)  # never reached before: slowness >= 1
    else:
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(cap.wall_step(5.0)):
                if cap.reached():
                    pytest_timeout.timeout_timer(item, settings)
                    return

        timer = threading.Thread(target=watch, name=f"timeout {item.nodeid}", daemon=True)

        def cancel() -> None:
            stop.set()
            timer.join()

        timer.start()
    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest-timeout's cancel calls
    return True


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
