"""The torch version matrix: npu-run's tests under every torch release images ship (nox).

``.ci/run`` runs ``nox`` after the main suite (which runs on the pinned torch 2.13.0). Each
session builds its venv once with one torch release from PyPI (CUDA builds, about 2.7 GB with
their nvidia-* packages; they import and run on a CPU-only machine) and keeps it under
``~/.cache/npu-job/nox`` (``NPU_JOB_NOX_ENVDIR`` overrides), outside the clone, so later runs
reuse it. A session runs the launcher tests and records which torch features it found; ``nox -s
supported`` turns those records into docs/launcher.md's "Supported torch" table.

The oldest and the newest release run every launcher test (:data:`EVERY_TEST`), and the
re-planning of a replaced pod on real hosts (:data:`REPLAN_TESTS`); the releases
between them run :data:`RELEASE_DEPENDENT`, the tests of what changes from one release to the
next (launcher/torchcompat.py's table: the store's opcodes, the rendezvous result, the libuv
server, list_keys, entry points, torch's own parser and agent), among them npu-run from the job's
bundle on a torch-only interpreter (``test_bundle_run.py``: a venv that sees the release's torch
but nothing of npu-job), so every release runs the tiered store, restarts and the ``parallel``
backend the way a pod with nothing installed does. The rest (the wire protocol's and the
coalescing rules' values, the proxy's own behaviour under load and its linearizability, the CPU
count) is npu-job's own code over whatever torch, and runs on the two ends and in the main suite.

Two sessions run at a time (nox's ``--parallel``; ``-j 1`` runs them one by one), each printing
its output when it ends. A launcher session keeps about 0.7 of a core busy on average (its tests
mostly wait on timeouts and on other processes), so on CI's 2 cores two side by side take 7 to 9
minutes each where one alone takes 6; three at once saturated the machine and took 12 minutes
each, no more done per minute than two.

    nox                        # the whole matrix
    nox -s "launcher(torch='2.1.0')"
    nox -s "launcher(torch='2.6.0')" -- --every-test   # a middle release, every launcher test
    nox -s supported           # the table, from the last matrix run
    nox -s lint                # mypy over the pure core, ruff (pinned tools, no torch)
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import nox

ENVDIR = Path(os.environ.get("NPU_JOB_NOX_ENVDIR", Path.home() / ".cache" / "npu-job" / "nox"))
RESULTS = ENVDIR / "results"
nox.options.envdir = str(ENVDIR)
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "launcher", "oldest_accelerators"]
nox.options.error_on_missing_interpreters = True
nox.options.parallel = min(2, os.cpu_count() or 1)
nox.options.allow_parallel = True  # every session but `supported`, which reads the others' results

# Releases of the matrix and what else each needs. torch built against NumPy 1.x (before 2.3)
# warns on every import beside NumPy 2. 2.13.0 is the main suite's own torch.
MATRIX = {
    "2.1.0": ["numpy<2"],
    "2.4.0": [],
    "2.6.0": [],
    "2.9.1": [],
    "2.14.1": [],
}
EVERY_TEST = ("2.1.0", "2.14.1")  # the oldest and the newest: every launcher test
LAUNCHER_TESTS = "tests/launcher"
# beside every launcher test on the oldest and the newest release: real agents on several hosts
# (network namespaces) re-planning the order when a pod is replaced under another switch
REPLAN_TESTS = "tests/e2e/test_replan.py"
# What the releases between run: the tests of each difference torchcompat owns, and the whole
# launcher on that release's agent, parser and store (docs/development.md, "The torch matrix")
RELEASE_DEPENDENT = [
    # the feature probes themselves: Store.check or npu-run's side channel, the store dialect
    # (VALIDATE, SET's number, PING, QUEUE_*, BARRIER) learned from the release's own client
    "tests/launcher/test_torchcompat.py",
    # the proxy against the release's own TCPStore root: every opcode its client sends
    "tests/launcher/proxy/test_proxy_differential.py",
    # which store server stalls whom: the classic one, libuv's (2.4) and a listen fd (2.8)
    "tests/launcher/proxy/test_unread_replies.py",
    # the deadline-bound root client against the release's root and its timeout errors
    "tests/launcher/rendezvous/test_liveness.py",
    # RendezvousInfo (2.4) or the tuple, list_keys (2.10) or a workers' store per round
    "tests/launcher/rendezvous/test_rendezvous.py",
    # torchrun.handlers entry points (after 2.4)
    "tests/launcher/rendezvous/test_torchrun_plugin.py",
    # c10d re-ranked: the tuple (before 2.4) or RendezvousInfo, and where each release's agent
    # puts the workers' store (MASTER_ADDR) once the ranks moved
    "tests/launcher/rendezvous/test_c10d.py",
    # torch's own torchrun parser, which gains flags from release to release
    "tests/launcher/test_run_cli.py",
    # real agents: node rank order, connections to the root, restarts, SIGTERM and SIGINT
    "tests/launcher/test_multinode.py",
    # npu-run from the bundle on the release's torch alone
    "tests/launcher/test_bundle_run.py",
    # 2.4 to 2.6 shut the rendezvous down while they stop a failed worker group: the failure
    # must still reach the other nodes first, named right
    "tests/launcher/rendezvous/test_faults.py::"
    "test_a_worker_failing_every_attempt_is_named_by_every_node_with_one_summary",
    "tests/launcher/rendezvous/test_faults.py::"
    "test_a_worker_failing_mid_training_is_named_although_its_peers_fail_too",
]
# The lint session's tools, pinned so that a new release never fails CI by itself; the stubs are
# those of the pure core's third-party imports.
LINT_TOOLS = ["ruff==0.17.6", "mypy==2.4.1", "types-PyYAML", "types-requests"]


@nox.session(python=False, allow_parallel=False)
def supported(session: nox.Session) -> None:
    """Print docs/launcher.md's "Supported torch" table from the matrix's last results."""
    rows = [json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))]
    if not rows:
        session.error(f"no results in {RESULTS}: run the matrix first (nox)")
    names = [name for name, _ in rows[0]["features"]]
    print("| torch | tests (CI) | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 2) + "|")
    for row in sorted(rows, key=lambda r: [int(p) for p in r["torch"].split("+")[0].split(".")]):
        marks = ["yes" if present else "—" for _, present in row["features"]]
        tests = row["summary"] + ("" if row.get("every_test", True) else " (release-dependent)")
        print(f"| {row['torch']} | {tests} | " + " | ".join(marks) + " |")


@nox.session
def lint(session: nox.Session) -> None:
    """mypy over the pure core (.ci/typecheck.py: settings in pyproject's [tool.mypy]), then
    ``ruff check`` and ``ruff format --check`` (pyproject's [tool.ruff]) over the repository.

    Only the tools are installed, not the project: mypy reads the sources through a link tree of
    setup.cfg's package_dir, and a third-party module without stubs counts as ``Any``.
    """
    session.install(*LINT_TOOLS)
    session.run("python", ".ci/typecheck.py", *session.posargs)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def oldest_accelerators(session: nox.Session) -> None:
    """The bootstrap and plan readers with the oldest msgspec setup.cfg admits (no torch needed).

    msgspec's DecodeError became a ValueError only in 0.21; the readers must fall back alike
    before.
    """
    with _one_build_at_a_time():
        session.install("msgspec==0.18.6", "-e", ".[test]")
    session.run(
        "python",
        "-m",
        "pytest",
        "tests/bootstrap",
        "tests/cli",
        "-q",
        "-p",
        "no:cacheprovider",
        *session.posargs,
    )


@nox.session
@nox.parametrize("torch", list(MATRIX))
def launcher(session: nox.Session, torch: str) -> None:
    """npu-run's tests (tiered and flat, restarts, proxy vs root, torchrun) on one torch: every
    one on the oldest and newest release, :data:`RELEASE_DEPENDENT` on those between (``--
    --every-test`` runs every one there too; other arguments after ``--`` go to pytest).

    The store proxy's cases run on uvloop, the loop it runs on wherever the launcher extra is
    installed; those on the standard library's loop (marked ``standard_loop``) are left to the
    main suite: the loop is the proxy's own code, the same under every torch, and running both on
    every release cost 43 s a release.
    """
    # torch first, outside the lock: the big download and unpacking touch only this venv, so two
    # sessions fetch theirs side by side; the project's editable build then takes its turn
    session.install(f"torch=={torch}", *MATRIX[torch])
    with _one_build_at_a_time():
        session.install("-e", ".[launcher,test]")
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = RESULTS / f"{torch}.junit.xml"
    features = session.run("python", "-m", "npu_job.launcher.torchcompat", "--json", silent=True)
    if features is None:  # nox --install-only
        return
    report.unlink(missing_ok=True)
    posargs = list(session.posargs)
    every_test = torch in EVERY_TEST or "--every-test" in posargs
    posargs = [arg for arg in posargs if arg != "--every-test"]
    session.run(
        "python",
        "-m",
        "pytest",
        *([LAUNCHER_TESTS, REPLAN_TESTS] if every_test else RELEASE_DEPENDENT),
        "-m",
        "not standard_loop",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
        *posargs,
        success_codes=[0, 1],
    )
    summary, failed = _junit_summary(report)
    (RESULTS / f"{torch}.json").write_text(
        json.dumps(
            {"torch": torch, "summary": summary, "every_test": every_test, **json.loads(features)}
        )
    )
    session.log(f"torch {torch}: {summary}")
    if failed:
        session.error(f"torch {torch}: {summary}")


@contextmanager
def _one_build_at_a_time() -> Iterator[None]:
    """Sessions running side by side take turns installing the project: pip builds an editable
    install in the shared source tree (its ``.egg-info``, ``build/``), which two builds at once
    could leave half-written. Each turn takes seconds (torch is installed before it)."""
    ENVDIR.mkdir(parents=True, exist_ok=True)
    with open(ENVDIR / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _junit_summary(report: Path) -> tuple[str, int]:
    """pytest's counts from its JUnit report: ``("N passed, N skipped, N failed", failed)``, and
    ``", N rerun"`` when a test ran again after the machine stalled (tests/machine_stalls.py):
    each attempt is a ``testcase`` of its own, while ``tests`` counts the test once."""
    import xml.etree.ElementTree as ElementTree

    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    total, failed = (
        int(suite.get("tests", 0)),
        int(suite.get("failures", 0)) + int(suite.get("errors", 0)),
    )
    skipped = int(suite.get("skipped", 0))
    reruns = len(suite.findall("testcase")) - total
    summary = f"{total - failed - skipped} passed, {skipped} skipped, {failed} failed"
    return summary + (f", {reruns} rerun" if reruns > 0 else ""), failed
