"""Logging set-up for the command-line edges (``npu-job``, ``bootstrap.sh``, ``npu-run``).

Library code only calls ``logging.getLogger(__name__)``; this module decides what reaches stderr:
``npu-job: <message>`` for progress, ``npu-job: warning: <message>`` for warnings, so pod logs read
like the rest of the tool's output. stdout stays free for data.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Optional, TextIO

if TYPE_CHECKING:
    import argparse  # only for the option helpers: the bootstrap's pod command builds no parser

PROG = "npu-job"


class _Formatter(logging.Formatter):
    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and record.levelno >= logging.ERROR:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        if record.levelno >= logging.ERROR:
            return f"{self.prog}: error: {message}"
        if record.levelno >= logging.WARNING:
            return f"{self.prog}: warning: {message}"
        if record.levelno <= logging.DEBUG:
            return f"{self.prog}: debug: {message}"
        return f"{self.prog}: {message}"


def setup_logging(verbosity: int = 0, *, prog: str = PROG, stream: Optional[TextIO] = None) -> None:
    """Send the ``npu_job`` loggers to ``stream`` (stderr): -1 quiet, 0 info, 1+ debug."""
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_Formatter(prog))
    logger = logging.getLogger("npu_job")
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


def add_log_options(parser: argparse.ArgumentParser, suffix: str = "") -> None:
    """-v/-q: on ``npu-job`` itself and the bootstrap's command line, and (``suffix`` "_after")
    on every subcommand of ``npu-job``.

    A subcommand's copies have their own destinations and no defaults, so that ``npu-job -v
    bootstrap`` is not undone by the subcommand's default and ``-v`` counts on both sides.
    """
    import argparse

    parser.add_argument(
        "-v",
        "--verbose",
        dest="verbose" + suffix,
        action="count",
        default=argparse.SUPPRESS if suffix else 0,
        help="more log output (repeatable)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        dest="quiet" + suffix,
        action="store_true",
        default=argparse.SUPPRESS if suffix else False,
        help="only warnings and errors on stderr",
    )


def verbosity(args: argparse.Namespace) -> int:
    """The log verbosity -v/-q asked for on either side of a subcommand: -1 quiet, 0, 1+."""
    if args.quiet or getattr(args, "quiet_after", False):
        return -1
    return int(args.verbose) + int(getattr(args, "verbose_after", 0))
