"""torch's elastic agent as npu-run runs it: torch's own, with the few changes faults need.

:func:`recorded_launch` runs torch's ``elastic_launch`` (under ``@record``, as torchrun's main is)
with two of torch's classes replaced for the launch:

* the agent (:func:`_watched_agent_class`) reports its workers' final failure to the
  ``parallel`` rendezvous before it stops them, so that every node names the same cause (see
  :mod:`.rendezvous.watch`); it dates each failure and leaves out the workers it stopped itself;
* the process failure (:func:`_readable_failure_class`) takes a half-written ``@record`` error
  file (a worker killed while writing it) for none, where torch's agent would fail parsing it.

What a failure says (:func:`failure_message`) is the worker's own ``@record`` error, else how it
ended.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import AbstractSet, Any, Callable, Iterator, Optional, Sequence, Set

logger = logging.getLogger(__name__)


def _launch(config: Any, entrypoint: Any, cmd_args: Sequence[str]) -> Any:
    from torch.distributed.elastic.multiprocessing import api as processes
    from torch.distributed.launcher import api

    with contextlib.ExitStack() as replaced:
        # the names launch_agent builds its agent from, and the process contexts their failures
        replaced.enter_context(_replaced(api, "LocalElasticAgent", _watched_agent_class()))
        replaced.enter_context(_replaced(processes, "ProcessFailure", _readable_failure_class()))
        return api.elastic_launch(config=config, entrypoint=entrypoint)(*cmd_args)


@contextlib.contextmanager
def _replaced(module: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def _readable_failure_class() -> type:
    """torch's ``ProcessFailure``, taking an unreadable error file for a missing one.

    ``@record`` writes a worker's error file in place: it opens it for writing, then dumps the
    JSON. A worker killed between the two (by the OOM killer, or by its agent stopping the group
    while it was failing too, as the peers of a failed worker do) leaves an empty file, and
    torch's ``ProcessFailure`` raises parsing it: the agent ends with a ``JSONDecodeError``
    instead of the failure. A failure whose file cannot be read is reported as one without a
    file: by its exit code or signal.
    """
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    class ReadableFailure(ProcessFailure):  # type: ignore[misc, valid-type]
        def __post_init__(self) -> None:
            if not _error_file_readable(self.error_file):
                logger.info(
                    "worker pid %s left an unreadable error file %s (stopped while writing it?)",
                    self.pid,
                    self.error_file,
                )
                self.error_file = ""  # no such file: torch takes the no-reply path
            super().__post_init__()

    return ReadableFailure


def _error_file_readable(path: str) -> bool:
    """False when ``path`` exists but holds no JSON (missing is torch's own, handled case)."""
    try:
        with open(path, encoding="utf-8") as handle:
            json.load(handle)
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return True


def _watched_agent_class() -> type:
    """torch's ``LocalElasticAgent``, reporting a final worker failure to the rendezvous first.

    When the workers failed for good, the ``parallel`` rendezvous learns which node caused the
    end before this agent goes on (it may be another node: then
    :class:`~.rendezvous.watch.JobStopped` unwinds this one, and only the culprit prints torch's
    failure summary). The report is made where torch stops the failed group, before it does:
    torch 2.4–2.6 shut the rendezvous down inside ``_stop_workers``, so after it there would be
    nobody left to report to.
    """
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class WatchedAgent(LocalElasticAgent):  # type: ignore[misc, valid-type]
        _npu_final: Any = None  # the failed result no restart is left for
        _npu_failed_at = 0.0
        _npu_stopped: AbstractSet[int] = frozenset()  # pids torch itself stopped, this attempt

        def _start_workers(self, *args: Any, **kwargs: Any) -> Any:
            assigned = super()._start_workers(*args, **kwargs)
            self._npu_stopped = _pids_running_at_close(self._pcontext)
            return assigned

        def _monitor_workers(self, *args: Any, **kwargs: Any) -> Any:
            result = super()._monitor_workers(*args, **kwargs)
            if result.is_failed():
                self._npu_failed_at = time.time()  # when this agent saw it (the last attempt's)
                if self._remaining_restarts <= 0:
                    self._npu_final = result
            return result

        def _stop_workers(self, *args: Any, **kwargs: Any) -> Any:
            final, self._npu_final = self._npu_final, None
            if final is not None:  # torch stops the group for good next: may raise JobStopped
                _settle_failure(
                    self._worker_group.spec.rdzv_handler,  # torch 2.1's agent: no _rdzv_handler
                    final,
                    self._npu_failed_at or time.time(),
                    float(self._worker_group.spec.monitor_interval),
                    self._npu_stopped,
                )
            return super()._stop_workers(*args, **kwargs)

        def _invoke_run(self, *args: Any, **kwargs: Any) -> Any:
            handler = self._worker_group.spec.rdzv_handler
            outcome = getattr(handler, "report_outcome", lambda outcome: None)
            outcome("running")
            result = super()._invoke_run(*args, **kwargs)
            if not result.is_failed():
                outcome("succeeded")
            return result

    return WatchedAgent


def _pids_running_at_close(pcontext: Any) -> Set[int]:
    """The pids of the workers still running when torch stops them, filled in as it does.

    Once one worker fails, torch's process context SIGTERMs the others, and torch 2.13+ counts
    them among the group's failures too. Without an error file they are dated like any worker a
    signal ended (the start of the monitor interval), so one of them could be named the cause;
    they are its consequence. Collected where the context closes, before it signals anyone.
    """
    running: Set[int] = set()
    close = pcontext.close

    def close_noting_the_running(*args: Any, **kwargs: Any) -> Any:
        running.update(pid for pid in pcontext.pids().values() if _running_child(pid))
        return close(*args, **kwargs)

    pcontext.close = close_noting_the_running
    return running


def _running_child(pid: int) -> bool:
    """Whether child ``pid`` has not ended (without reaping it: torch's ``Popen`` does that)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # reaped already: it ended
        return False


def _settle_failure(
    handler: Any, result: Any, failed_at: float, interval: float, stopped: AbstractSet[int]
) -> None:
    """Report this node's cause of the end: its earliest failure not stopped by torch itself."""
    from .rendezvous import handler as backend
    from .rendezvous.verdict import FailureReport

    if not isinstance(handler, backend.ParallelRendezvousHandler) or not result.failures:
        return
    failures = {
        rank: failure for rank, failure in result.failures.items() if failure.pid not in stopped
    } or result.failures
    when = {rank: _failed_when(failure, failed_at, interval) for rank, failure in failures.items()}
    rank = min(when, key=lambda worker: (when[worker], worker))
    failure = failures[rank]
    handler.settle_failure(
        FailureReport(
            node_rank=handler.node_rank,
            seen_at=when[rank],
            worker_rank=int(rank),
            local_rank=int(failure.local_rank),
            pid=int(failure.pid),
            exit_code=int(failure.exitcode),
            message=failure_message(failure),
            member=handler.member,
        )
    )


def _failed_when(failure: Any, seen_at: float, monitor_interval: float) -> float:
    """When the worker failed, as precisely as this node knows.

    The error file ``@record`` writes at the exception is stamped to the nanosecond (its
    modification time); a worker that failed because a peer died writes its own after the
    peer's process has ended, so the root cause of a cascade is the earliest file. A worker
    without one (a signal, ``os._exit``) died at some time within the agent's last monitor
    interval: taken at its start.
    """
    try:
        return os.stat(failure.error_file).st_mtime
    except (OSError, TypeError, ValueError):
        return seen_at - monitor_interval


NO_RECORD = "<NONE>"  # the message torch fills in for a worker that left no error file


def failure_message(failure: Any) -> str:
    """The worker's own error (``@record``), else how it ended."""
    recorded = recorded_error(failure.error_file_data)
    if recorded is not None:
        return recorded
    if failure.exitcode < 0:
        return f"killed by {failure.signal_name()}"
    return f"exited with code {failure.exitcode} (no @record error file; see its output)"


def recorded_error(error_file_data: Any) -> Optional[str]:
    """The error a worker's ``@record`` file holds, or None when it left none.

    ``@record`` writes ``{"message": {"message": "RuntimeError: ...", "extraInfo": ...}}`` (a bare
    string in place of the inner record is read alike, as torch does). Without a file, torch's
    ``ProcessFailure`` holds ``{"message": "<NONE>"}`` and makes up a message of its own (a link
    to its docs, from torch 2.x on), which says nothing about the worker.
    """
    message = error_file_data.get("message") if isinstance(error_file_data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str) or not message.strip() or message == NO_RECORD:
        return None
    return message


def recorded_launch() -> Callable[..., Any]:
    # @record, as on torchrun's main: with TORCHELASTIC_ERROR_FILE set (by a scheduler), the
    # first failed worker's error file becomes the launcher's.
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_launch)
