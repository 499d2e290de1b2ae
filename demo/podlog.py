"""What a line of a pod's log says (pure): :func:`read_pod_line`, for the demo's supervisor.

The supervisor (``runner``) follows every pod's log to say how far the pods got and to name the
first error; each line is read here into a :class:`PodLine`: podsim's setup failure, an error
line, and at most one event (train.sh's node rank, npu-run's rendezvous, a training step, the
end of training, a worker's failure). A pod's log holds every attempt of its container, each
after its :func:`attempt_header`; :func:`first_line` is what one attempt printed first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from .podspec import SETUP_FAILED

_STEP = re.compile(r"train_ddp: step (\d+)/(\d+) loss ([0-9.]+)")
_JOINED = re.compile(r"npu-run: node rank \d+ joined round")
_ROUND_COMPLETE = re.compile(r"npu-run: round \d+ complete")
# A line that says what went wrong in a pod: "npu-job: error: ...", "RuntimeError: ...", a shell's
# "npu-run: not found", a worker's "FAILED", podsim's "cannot run" (not torch's "Failed to ..."
# warnings).
_ERROR_LINE = re.compile(r"(?i:error:)|not found|FAILED|cannot run")
_NODE_RANK = re.compile(r"npu-job: node rank (\d+) of (\d+), master (\S+)")


def attempt_header(pod: str, attempt: int) -> str:
    """The line podsim writes to a pod's log before it starts ``attempt`` of its container."""
    return f"--- {pod} attempt {attempt}\n"


def first_line(log: str, pod: str, attempt: int) -> Optional[str]:
    """The first line that ``attempt`` of ``pod``'s container printed in ``log`` (None: none)."""
    header = attempt_header(pod, attempt)
    at = log.rfind(header)
    if at < 0:
        return None
    line, newline, _ = log[at + len(header) :].partition("\n")
    return line if line or newline else None


@dataclass(frozen=True)
class PodLine:
    """What one line of a pod's log says (:func:`read_pod_line`): two flags, at most one event."""

    setup_failed: Optional[str] = None  # podsim could not set the pod up: why
    error: bool = False  # the line says what went wrong (not a warning)
    node_rank: Optional[Tuple[str, str, str]] = None  # train.sh: (node rank, nodes, master)
    joined: bool = False  # npu-run joined the rendezvous
    round_complete: bool = False  # npu-run's rendezvous round completed
    step: Optional[Tuple[int, int, float]] = None  # train_ddp: (step, steps, loss)
    done: bool = False  # train_ddp's closing line
    failed: bool = False  # a worker's FAILED line


def read_pod_line(line: str) -> PodLine:
    """What ``line`` of a pod's log says, for the supervisor's progress and first error."""
    flags: Dict[str, Any] = {
        "setup_failed": line[len(SETUP_FAILED) :].strip()
        if line.startswith(SETUP_FAILED)
        else None,
        "error": bool(_ERROR_LINE.search(line)),
    }
    match = _NODE_RANK.search(line)
    if match:
        return PodLine(**flags, node_rank=(match.group(1), match.group(2), match.group(3)))
    if _JOINED.search(line):
        return PodLine(**flags, joined=True)
    if _ROUND_COMPLETE.search(line):
        return PodLine(**flags, round_complete=True)
    match = _STEP.search(line)
    if match:
        step = (int(match.group(1)), int(match.group(2)), float(match.group(3)))
        return PodLine(**flags, step=step)
    done = "train_ddp: done" in line
    return PodLine(
        **flags, done=done, failed=not done and "train_ddp:" in line and "FAILED" in line
    )
