"""Liveness rules, verdict wording, the deadline-bound root client and the parent-death wrapper.

The pure parts (liveness.py, verdict.py) take values; the client is driven against a real stock
``TCPStore`` root and real sockets (a squatter that never answers, a closed port); the wrapper
runs as a real child process whose parent is SIGKILLed. No timing is asserted beyond "the
deadline held" with generous slack.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from npu_job.launcher import pdeath, torchcompat
from npu_job.launcher.rendezvous import verdict
from npu_job.launcher.rendezvous.liveness import DEPARTED, BeatTracker, Pending, settled
from npu_job.launcher.rendezvous.rootclient import RootClient, RootGone, RootReplaced, RootSilent
from npu_job.launcher.rendezvous.verdict import FailureReport, Identity

from ..cluster import alive, free_port, wait_for


def test_a_node_whose_counter_stops_is_silent_after_the_window_and_a_departed_one_never():
    tracker = BeatTracker([1, 2, 3], now=0.0, now_wall=1000.0)
    for second in range(1, 5):
        tracker.observe({1: second, 2: second, 3: 1}, now=float(second), now_wall=1000.0 + second)
    assert [rank for rank, _ in tracker.silent(now=4.0, window=3.0)] == [3]
    assert tracker.seen(3).moved_at_wall == 1001.0
    tracker.observe({3: 1 + DEPARTED}, now=5.0, now_wall=1005.0)
    assert tracker.silent(now=100.0, window=3.0) == [(1, tracker.seen(1)), (2, tracker.seen(2))]
    tracker.restart_clock(now=100.0, now_wall=1100.0)
    assert tracker.silent(now=101.0, window=3.0) == []


def test_failure_reports_settle_once_every_node_is_accounted_for():
    tracker = BeatTracker([1, 2], now=0.0, now_wall=0.0)
    tracker.observe({1: 5, 2: 5}, now=1.0, now_wall=1.0)
    pending = Pending(since=1.0, counts_then=tracker.counts())
    assert settled(pending, tracker, reported={1}, now=1.5, window=3.0) == (False, None)
    tracker.observe({1: 5, 2: 6}, now=2.0, now_wall=2.0)  # node 2 beat since: alive
    assert settled(pending, tracker, reported={1}, now=2.0, window=3.0) == (True, None)


def test_a_silent_node_outranks_the_failures_it_caused():
    tracker = BeatTracker([1, 2], now=0.0, now_wall=0.0)
    tracker.observe({1: 5, 2: 5}, now=1.0, now_wall=1.0)
    pending = Pending(since=1.0, counts_then=tracker.counts())
    assert settled(pending, tracker, reported={2}, now=3.9, window=3.0) == (False, None)
    assert settled(pending, tracker, reported={2}, now=4.0, window=3.0) == (True, 1)


def report(node_rank: int, seen_at: float, message: str = "RuntimeError: boom") -> FailureReport:
    return FailureReport(
        node_rank=node_rank,
        seen_at=seen_at,
        worker_rank=node_rank * 2,
        local_rank=0,
        pid=100 + node_rank,
        exit_code=1,
        message=message,
    )


def test_the_earliest_failure_is_the_cause_and_reports_round_trip():
    reports = [report(2, 10.5), report(1, 10.2), report(0, 10.2)]
    blob = "".join(r.to_json() + "\n" for r in reports).encode() + b"not json\n"
    assert verdict.parse_reports(blob) == reports
    assert verdict.first_failure(reports) == reports[2]  # a tie goes to the lowest node rank
    assert verdict.first_failure([]) is None


def test_verdict_lines_name_the_node_its_pod_host_and_cause():
    who = Identity(pod="job-worker-1", host="10.0.0.2")
    line = verdict.line(
        verdict.workers_failed(report(1, 0.0, "Traceback ...\nValueError: bad lr"), who)
    )
    assert line == (
        "the job stopped: node rank 1 (pod job-worker-1, host 10.0.0.2): worker rank 2 "
        "(local rank 0, pid 101) failed with exit code 1: ValueError: bad lr"
    )
    dead = verdict.dead_node(1, who, 15.24, last_seen=0.0, poll_interval=5.0)
    assert dead.text == (
        "node rank 1 (pod job-worker-1, host 10.0.0.2) stopped: no heartbeat for 15.2s (its "
        f"heartbeat counter last seen moving at {verdict.clock(0.0)} by node rank 0's poll, "
        "every 5s)"
    )
    assert verdict.Verdict.from_json(dead.to_json()) == dead
    assert len(verdict.short("x" * 1000)) == verdict.MESSAGE_LIMIT


def client(port: int, call_timeout: float = 1.0) -> RootClient:
    return RootClient(
        "127.0.0.1",
        port,
        timeout=5.0,
        call_timeout=call_timeout,
        dialect=torchcompat.store_dialect(),
    )


@pytest.fixture
def root():
    store = torchcompat.host_tcpstore("127.0.0.1", 0, 10, None)
    yield store
    del store


def test_the_client_speaks_to_a_stock_root_like_torchs_own(root):
    ours = client(root.port)
    ours.set("a", "1")
    assert root.get("a") == b"1" and ours.get("a") == b"1"
    assert ours.add("n", 2) == 2 and ours.check(["a", "n"]) and not ours.check(["missing"])
    ours.multi_set(["b", "c"], [b"x", "y"])
    assert ours.multi_get(["b", "c"]) == [b"x", b"y"]
    ours.append("b", "z")
    assert root.get("b") == b"xz"
    assert ours.delete_key("c") and not ours.delete_key("c")
    with pytest.raises(torchcompat.StoreTimeoutError, match="wait timeout"):
        ours.wait(["never"], __import__("datetime").timedelta(seconds=0.2))
    ours.close()


def test_a_squatter_that_never_answers_fails_the_call_at_its_deadline():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(8)
        ours = client(squatter.getsockname()[1], call_timeout=0.5)
        started = time.monotonic()
        with pytest.raises(RootSilent, match=r"has not answered for 0\.\ds"):
            ours.check(["x"])
        assert time.monotonic() - started < 5


def test_a_refused_connection_is_final_and_a_replaced_root_is_refused(root):
    port = root.port
    ours = client(port)
    ours.set("id", "first")
    ours.expect_identity("id", "first")
    assert ours.check(["id"])
    ours._drop()  # a blip: the next call opens a new connection and finds the same root
    assert ours.check(["id"])
    root.set("id", "second")  # as if another root now answered on that address
    ours._drop()
    with pytest.raises(RootReplaced, match="not the one this node joined"):
        ours.check(["id"])
    with pytest.raises(RootGone, match="refused the connection"):
        client(free_port()).check(["x"])


def test_a_call_waiting_behind_another_counts_that_wait_in_its_deadline():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(8)
        ours = client(squatter.getsockname()[1], call_timeout=1.0)
        first = threading.Thread(target=lambda: pytest.raises(RootSilent, ours.check, ["x"]))
        first.start()
        time.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(RootSilent):
            ours.check(["y"])
        first.join()
        assert time.monotonic() - started < 5


def test_the_wrapper_keeps_torchs_name_for_the_script():
    entry, args = pdeath.wrap(sys.executable, ["-u", "train.py", "--lr", "1"], parent_pid=42)
    assert entry == sys.executable
    assert args == [*pdeath.launch(), "--parent=42", "-u", "train.py", "--lr", "1"]
    assert next(arg for arg in args if not arg.startswith("-")) == "train.py"  # torch's rule
    _, args = pdeath.wrap("/bin/train", ["x"], parent_pid=42)
    assert next(arg for arg in args if not arg.startswith("-")) == "x"
    assert pdeath.parse(args[len(pdeath.launch()) :]) == (
        42,
        "/bin/train",
        ["x"],
    )  # as sys.argv[1:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_wrapped_worker_dies_with_its_sigkilled_parent(tmp_path):
    """A parent (standing in for the agent) starts a worker through the wrapper in a session of
    its own, as torch does; SIGKILL to the parent kills the worker too."""
    pid_file = tmp_path / "worker.pid"
    parent_code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from npu_job.launcher import pdeath
        entry, args = pdeath.wrap(sys.executable, ["-c", "import os, time; "
            "open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"], os.getpid())
        subprocess.Popen([entry, *args], start_new_session=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the wrapped worker")
        worker = int(pid_file.read_text())
        assert alive(worker)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: not alive(worker), 5, "the worker to die with its parent")
    finally:
        parent.kill()
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
