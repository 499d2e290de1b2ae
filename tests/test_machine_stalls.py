"""The fault tests' rerun rule (:mod:`tests.machine_stalls`): a failed attempt runs again only if
the machine stalled for at least the marked time while it ran. Stalls are real: a process is
stopped with SIGSTOP and woken with SIGCONT, as a stop of the whole virtual machine would stop it.
And the caps of waits, the suite's hang catcher among them, counted at the machine's pace: a slow
machine is set by ``NPU_JOB_TEST_SLOWNESS`` (the load average moves with whatever else runs).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.launcher.cluster import alive
from tests.machine_stalls import SLOWEST, SLOWNESS_VARIABLE, communicate, pace, wait_until

REPO = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=None)  # once a process: loading it registers nox's sessions
def noxfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("noxfile", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def junit_summary(report: Path) -> tuple:
    """The torch matrix's reading of a JUnit report (``noxfile._junit_summary``)."""
    return noxfile()._junit_summary(report)


WATCHER = """
import json, sys
from tests.machine_stalls import StallWatch
watch = StallWatch().start()
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps([length for _, length in watch.since(0.0)]), flush=True)
"""


def test_the_watch_sees_its_process_stopped_and_how_long():
    child = subprocess.Popen(
        [sys.executable, "-c", WATCHER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.3)
        child.stdin.write("report\n")
        child.stdin.flush()
        stalls = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait()
    assert max(stalls) >= 1.4, stalls  # stopped 1.5 s, less one step of the watch's sleep


SAMPLE = """
import os, subprocess, sys
from pathlib import Path
from tests.machine_stalls import rerun_after_machine_stall

ATTEMPTS = Path(__file__).with_name("attempts")

def stop_this_process(seconds):
    me = os.getpid()
    subprocess.run(["sh", "-c", "kill -STOP %d; sleep %s; kill -CONT %d" % (me, seconds, me)])

@rerun_after_machine_stall(longer_than=1.5)
def test_sample():
    attempt = len(ATTEMPTS.read_text()) if ATTEMPTS.exists() else 0
    ATTEMPTS.write_text("x" * (attempt + 1))
    if attempt == 0:
        stop_this_process({stall})
    assert attempt > 0 or {passes_first}, "the first attempt fails"
"""


def run_sample(tmp_path: Path, stall: float, passes_first: bool = False) -> tuple:
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(SAMPLE.format(stall=stall, passes_first=passes_first))
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.machine_stalls", "-p", "no:cacheprovider"]
        + ["-ra", "-p", "no:xdist", "--junitxml=junit.xml", "test_sample.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    attempts = len((tmp_path / "attempts").read_text())
    return done.returncode, done.stdout, attempts


def test_a_failure_during_a_long_enough_stall_runs_again_and_says_why(tmp_path):
    code, out, attempts = run_sample(tmp_path, stall=2.5)
    assert (code, attempts) == (0, 2), out
    assert "1 passed, 1 rerun" in out, out
    assert "the machine stalled for 2." in out, out
    # the torch matrix's summary of a release (the README's table) counts the rerun too
    assert junit_summary(tmp_path / "junit.xml") == ("1 passed, 0 skipped, 0 failed, 1 rerun", 0)


def test_a_failure_with_a_shorter_stall_fails_at_once_and_reports_the_stall(tmp_path):
    code, out, attempts = run_sample(tmp_path, stall=1.0)
    assert (code, attempts) == (1, 1), out
    assert "1 failed in" in out and "1 rerun" not in out, out
    assert "the machine stalled for" in out, out  # seen (over 0.5 s), but under the 1.5 s marked
    assert junit_summary(tmp_path / "junit.xml") == ("0 passed, 0 skipped, 1 failed", 1)


def test_a_stall_alone_does_not_fail_a_test(tmp_path):
    code, out, attempts = run_sample(tmp_path, stall=2.5, passes_first=True)
    assert (code, attempts) == (0, 1), out


def test_the_pace_is_the_load_per_cpu_from_one_to_the_slowest_allowed():
    assert pace(0.3, 2) == 1.0  # an idle machine is no faster than alone
    assert pace(7.0, 2) == 3.5
    assert pace(53.0, 2) == SLOWEST


CAPPED = """
import json, sys, time
from tests.machine_stalls import Cap, wait_until
began = time.monotonic()
try:
    wait_until(lambda: False, Cap(0.5, fixed=float(sys.argv[1])), "nothing")
except AssertionError as error:
    print(json.dumps([time.monotonic() - began, str(error)]))
"""


def capped_wait(fixed: float) -> tuple:
    """(wall seconds, the error) of a wait that never sees its event, on a machine 4 times slower,
    with a cap of 0.5 s after ``fixed`` wall seconds."""
    done = subprocess.run(
        [sys.executable, "-c", CAPPED, str(fixed)],
        cwd=REPO,
        env={**os.environ, SLOWNESS_VARIABLE: "4"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return tuple(json.loads(done.stdout))


def test_a_cap_gives_a_machine_four_times_slower_four_times_the_wall_time():
    waited, message = capped_wait(0)
    assert waited >= 4 * 0.5, waited
    assert message.startswith("timed out after 0.5 s at an idle machine's pace (2 s of wall "), (
        message
    )


def test_the_fixed_part_of_a_cap_is_wall_time_on_any_machine():
    """A timeout of the code under test (3 s here) is not stretched: 3 + 4 * 0.5 s, not 14."""
    waited, message = capped_wait(3)
    assert 3 + 4 * 0.5 <= waited < 4 * (3 + 0.5), waited
    assert message.startswith("timed out after 3 s + 0.5 s at an idle machine's pace"), message


HANGS = """
import time

def test_slower_than_its_timeout_on_an_idle_machine():
    time.sleep(2.5)

def test_hangs():
    time.sleep(600)
"""


@pytest.mark.parametrize("method", ["signal", "thread"])
def test_the_hang_catcher_gives_a_slower_machine_more_time_and_still_ends_a_hung_test(
    tmp_path, method
):
    """pytest-timeout's ``timeout`` of 1 s on a machine 4 times slower: a test of 2.5 s passes,
    one that hangs is ended after about 4 s, by either of pytest-timeout's methods (the signal
    fails the test and the run goes on; the thread ends the process)."""
    (tmp_path / "test_sample.py").write_text(HANGS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.machine_stalls", "-p", "no:cacheprovider"]
        + ["-p", "no:xdist", "-v", "--timeout=1", f"--timeout-method={method}", "test_sample.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), SLOWNESS_VARIABLE: "4"},
        capture_output=True,
        text=True,
        timeout=300,  # a hang not ended would take 600 s
    )
    assert "test_slower_than_its_timeout_on_an_idle_machine PASSED" in done.stdout, done.stdout
    if method == "signal":
        assert "FAILED test_sample.py::test_hangs - Failed: Timeout" in done.stdout, done.stdout
    else:
        assert done.returncode == 1 and "Timeout" in done.stderr + done.stdout, done


def test_a_process_that_reaches_its_cap_is_killed_with_every_process_of_its_session(tmp_path):
    """A grandchild that holds the output pipes open would keep ``communicate`` waiting for it
    (here for 120 s) if only the child were killed."""
    pid_file = tmp_path / "grandchild"
    process = subprocess.Popen(
        ["sh", "-c", f"sleep 120 & echo $! > {pid_file}; wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        communicate(process, 0.5)
    assert time.monotonic() - began < 60  # at most 0.5 s * SLOWEST, and the kill
    assert process.poll() is not None
    grandchild = int(pid_file.read_text())  # its pipes closed, it may take a moment to be gone
    assert wait_until(lambda: not alive(grandchild), 10, "the grandchild to die")
