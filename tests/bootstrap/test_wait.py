"""Waiting for the rank table: poll until completed (re-reading everything), one progress line per
poll, not-yet-parsable is "not ready", and the timeout says what was last seen. Clock and sleep
are injected, so these tests take no time."""

import json
import logging

import pytest
from npu_job.bootstrap.sources import SourceUnavailable
from npu_job.bootstrap.wait import wait_for_rank_table

from npu_job.errors import InputError, NotReadyError

from .documents import v1_0

SOURCE = "/user/config/jobstart_hccl.json"
COMPLETED = json.dumps(v1_0()).encode()
INITIALIZING = b'{"status": "initializing"}'


class FakeTime:
    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def feed(*answers):
    """A fetch that returns (or raises) each answer in turn and then repeats the last."""
    calls = []

    def fetch():
        calls.append(1)
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    fetch.calls = calls
    return fetch


def test_polls_until_completed_and_logs_progress(caplog):
    time = FakeTime()
    fetch = feed(
        INITIALIZING, b'{"status": "initializing", "version": "1.0", "server_list": []}', COMPLETED
    )
    with caplog.at_level(logging.INFO, logger="npu_job.bootstrap.wait"):
        loaded = wait_for_rank_table(
            fetch, SOURCE, timeout=300, interval=5, clock=time.clock, sleep=time.sleep
        )
    assert loaded.table.is_completed and loaded.table.node_count == 3
    assert loaded.document == v1_0()
    assert len(fetch.calls) == 3 and time.sleeps == [5, 5]
    assert [r.getMessage() for r in caplog.records] == [
        "waiting for rank table: status='initializing', 0 s of 300 s",
        "waiting for rank table: status='initializing', 5 s of 300 s",
    ]


def test_half_written_file_is_not_ready_yet():
    time = FakeTime()
    fetch = feed(
        COMPLETED[:40],
        SourceUnavailable("u", "connection", "expected a reachable server"),
        COMPLETED,
    )
    loaded = wait_for_rank_table(
        fetch, SOURCE, timeout=60, interval=2, clock=time.clock, sleep=time.sleep
    )
    assert loaded.table.is_completed and len(fetch.calls) == 3


def test_stuck_at_initializing_times_out_with_what_was_seen():
    time = FakeTime()
    with pytest.raises(NotReadyError) as caught:
        wait_for_rank_table(
            feed(INITIALIZING), SOURCE, timeout=12, interval=5, clock=time.clock, sleep=time.sleep
        )
    assert caught.value.message == (
        f"{SOURCE}: status: expected \"completed\" within 12 s, last seen status='initializing'"
    )
    assert caught.value.exit_code == 4
    assert time.sleeps == [5, 5, 2]  # never sleeps past the deadline


def test_never_parsing_file_reports_what_is_wrong_with_it_at_the_timeout():
    time = FakeTime()
    with pytest.raises(InputError) as caught:
        wait_for_rank_table(
            feed(b'{"status": "compl'),
            SOURCE,
            timeout=10,
            interval=5,
            clock=time.clock,
            sleep=time.sleep,
        )
    assert caught.value.message.startswith(f"{SOURCE}: line 1 column 12: expected valid JSON")
    assert "10 s" in caught.value.tip


def test_completed_but_invalid_table_fails_at_once():
    time = FakeTime()
    bad = v1_0()
    bad["server_list"][1]["server_id"] = 7
    with pytest.raises(
        InputError, match=r"server_list\[1\].server_id: expected a string, got a number 7"
    ):
        wait_for_rank_table(
            feed(json.dumps(bad).encode()),
            SOURCE,
            timeout=300,
            interval=5,
            clock=time.clock,
            sleep=time.sleep,
        )
    assert time.sleeps == []


def test_missing_file_is_not_waited_for():
    time = FakeTime()
    missing = InputError(SOURCE, "file", "expected an existing file (not found)")
    with pytest.raises(InputError, match="not found"):
        wait_for_rank_table(
            feed(missing), SOURCE, timeout=300, interval=5, clock=time.clock, sleep=time.sleep
        )
    assert time.sleeps == []


def test_zero_timeout_reads_once():
    time = FakeTime()
    fetch = feed(INITIALIZING)
    with pytest.raises(NotReadyError):
        wait_for_rank_table(
            fetch, SOURCE, timeout=0, interval=5, clock=time.clock, sleep=time.sleep
        )
    assert len(fetch.calls) == 1 and time.sleeps == []
