"""npu_job.polling: the one poller every wait of npu-job runs on.

The clock, the sleep and the random source are injected (a fake clock that moves only when the
poller sleeps), so these tests take no time and say exactly when each attempt happens.
"""

from __future__ import annotations

import threading
from typing import List, Optional

import pytest

from npu_job.polling import Backoff, Every, poll, poll_until


class FakeTime:
    """A clock that stands still until the poller sleeps; counts how often it is read."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: List[float] = []
        self.reads = 0

    def clock(self) -> float:
        self.reads += 1
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def answers(*values):
    """An attempt that returns each value in turn, then the last again; records when it ran."""
    calls: List[int] = []

    def attempt():
        calls.append(1)
        return values[min(len(calls), len(values)) - 1]

    attempt.calls = calls
    return attempt


def no_jitter(low: float, high: float) -> float:
    raise AssertionError("a fixed backoff draws no random numbers")


# -- poll: when it attempts, sleeps and stops ------------------------------------------------


def test_an_answer_at_once_is_returned_without_sleeping_and_the_clock_is_read_once():
    time = FakeTime()
    attempt = answers("ready")
    found = poll(attempt, 30, Backoff.fixed(5), clock=time.clock, sleep=time.sleep)
    assert found == "ready" and len(attempt.calls) == 1
    assert time.sleeps == [] and time.reads == 1


def test_it_attempts_again_after_each_pause_until_an_answer_comes():
    time = FakeTime()
    attempt = answers(None, None, "ready")
    found = poll(attempt, 30, Backoff.fixed(5), clock=time.clock, sleep=time.sleep)
    assert found == "ready" and len(attempt.calls) == 3
    assert time.sleeps == [5, 5]
    assert time.reads == 3  # the start, then once after each unanswered attempt


@pytest.mark.parametrize("falsy", [0, "", False, []], ids=repr)
def test_only_none_means_not_yet_a_falsy_answer_is_an_answer(falsy):
    time = FakeTime()
    assert poll(answers(falsy), 30, Backoff.fixed(5), clock=time.clock, sleep=time.sleep) == falsy
    assert time.sleeps == []


def test_past_the_timeout_it_gives_up_with_none_and_the_last_pause_stops_at_the_deadline():
    time = FakeTime()
    attempt = answers(None)
    found = poll(attempt, 12, Backoff.fixed(5), clock=time.clock, sleep=time.sleep)
    assert found is None
    assert time.sleeps == [5, 5, 2]  # never sleeps past the deadline ...
    assert len(attempt.calls) == 4  # ... and the last attempt happens at it
    assert time.now == 1012.0


def test_a_timeout_of_zero_attempts_exactly_once():
    time = FakeTime()
    attempt = answers(None)
    ticks: List[float] = []
    found = poll(
        attempt, 0, Backoff.fixed(5), tick=ticks.append, clock=time.clock, sleep=time.sleep
    )
    assert found is None and len(attempt.calls) == 1
    assert time.sleeps == [] and ticks == []


def test_the_timeout_counts_from_the_call_including_slow_attempts():
    time = FakeTime()

    def slow() -> Optional[str]:
        time.now += 7  # each attempt takes 7 s (a slow server)
        return None

    assert poll(slow, 20, Backoff.fixed(5), clock=time.clock, sleep=time.sleep) is None
    # attempts end at 7 s, 19 s (after a 5 s pause) and 27 s (after a pause cut to the deadline)
    assert time.sleeps == [5, 1]


def test_the_tick_runs_between_attempts_with_the_seconds_elapsed_not_after_the_last():
    time = FakeTime()
    ticks: List[float] = []
    poll(
        answers(None, None, None, "ready"),
        60,
        Backoff.fixed(5),
        tick=ticks.append,
        clock=time.clock,
        sleep=time.sleep,
    )
    assert ticks == [0.0, 5.0, 10.0]
    ticks.clear()
    poll(answers(None), 10, Backoff.fixed(5), tick=ticks.append, clock=time.clock, sleep=time.sleep)
    assert ticks == [0.0, 5.0]  # the attempt at the deadline is not followed by a tick


def test_an_exception_from_the_attempt_or_the_tick_ends_the_poll():
    time = FakeTime()

    def broken() -> None:
        raise ValueError("a completed table that does not validate")

    with pytest.raises(ValueError, match="does not validate"):
        poll(broken, 60, Backoff.fixed(5), clock=time.clock, sleep=time.sleep)
    assert time.sleeps == []

    def stop(elapsed: float) -> None:
        if elapsed >= 10:
            raise RuntimeError("the job ended elsewhere")

    with pytest.raises(RuntimeError, match="ended elsewhere"):
        poll(answers(None), 60, Backoff.fixed(5), tick=stop, clock=time.clock, sleep=time.sleep)
    assert time.sleeps == [5, 5]


def test_poll_until_is_poll_for_a_yes_no_condition():
    time = FakeTime()
    assert poll_until(
        answers(False, True), 30, Backoff.fixed(1), clock=time.clock, sleep=time.sleep
    )
    assert time.sleeps == [1]
    assert not poll_until(answers(False), 3, Backoff.fixed(1), clock=time.clock, sleep=time.sleep)


def test_with_the_real_clock_it_sees_a_condition_another_thread_makes_true():
    ready = threading.Event()
    threading.Timer(0.05, ready.set).start()
    assert poll_until(ready.is_set, 30, Backoff.exponential(0.001, 0.01))


# -- Backoff: how long the pauses are ----------------------------------------------------------


def take(backoff: Backoff, count: int, uniform=no_jitter) -> List[float]:
    pauses = backoff.pauses(uniform)
    return [round(next(pauses), 6) for _ in range(count)]


def test_a_fixed_backoff_pauses_the_same_every_time_and_draws_no_random_numbers():
    assert take(Backoff.fixed(5), 4) == [5, 5, 5, 5]


def test_an_exponential_backoff_grows_by_its_factor_up_to_its_cap():
    middle = lambda low, high: (low + high) / 2  # noqa: E731  (no jitter in effect)
    assert take(Backoff.exponential(0.1, 1.0, factor=2.0), 6, middle) == [0.1, 0.2, 0.4, 0.8, 1, 1]
    assert take(Backoff.exponential(0.005, 0.25), 3, middle) == [0.005, 0.0075, 0.01125]


def test_jitter_scales_each_pause_within_its_fraction_of_the_nominal_one():
    seen = []

    def highest(low: float, high: float) -> float:
        seen.append((low, high))
        return high

    assert take(Backoff.exponential(1.0, 4.0, factor=2.0, jitter=0.2), 4, highest) == [
        1.2,
        2.4,
        4.8,
        4.8,
    ]
    assert seen == [(0.8, 1.2)] * 4
    # the nominal pause grows from the nominal one, not from the jittered one
    assert take(Backoff(0.01, 2.0, 1.0, jitter=(0.5, 1.0)), 3, lambda low, high: low) == [
        0.005,
        0.01,
        0.02,
    ]


def test_real_jitter_stays_within_its_bounds():
    pauses = Backoff.exponential(1.0, 1.0, jitter=0.2).pauses()
    drawn = [next(pauses) for _ in range(200)]
    assert all(0.8 <= pause <= 1.2 for pause in drawn)
    assert len(set(drawn)) > 1  # spread out, which is the point


def test_the_pauses_of_a_poll_follow_its_backoff_and_the_deadline():
    time = FakeTime()
    poll(
        answers(None),
        1.0,
        Backoff.exponential(0.125, 0.5, factor=2.0),
        clock=time.clock,
        sleep=time.sleep,
        uniform=lambda low, high: 1.0,
    )
    assert time.sleeps == [0.125, 0.25, 0.5, 0.125]  # the last one cut to the deadline


# -- Every: a tick that acts once per interval -----------------------------------------------


def test_every_acts_once_the_interval_has_passed_then_at_most_once_per_interval():
    acted: List[float] = []
    checks: List[int] = []
    tick = Every(30.0, acted.append, always=lambda: checks.append(1))
    for elapsed in (0.0, 10.0, 29.9, 30.0, 45.0, 59.0, 61.0, 200.0):
        tick(elapsed)
    assert acted == [30.0, 61.0, 200.0]
    assert len(checks) == 8  # the cheap check runs at every tick


def test_every_as_a_poll_tick_writes_progress_every_interval_of_the_wait():
    time = FakeTime()
    lines: List[str] = []
    progress = Every(30.0, lambda elapsed: lines.append(f"still waiting after {elapsed:.0f}s"))
    poll(answers(None), 100, Backoff.fixed(10), tick=progress, clock=time.clock, sleep=time.sleep)
    assert lines == [
        "still waiting after 30s",
        "still waiting after 60s",
        "still waiting after 90s",
    ]
