"""The exceptions npu-job raises for problems a user can fix, and their exit codes.

Every user-facing failure is one of these; the commands' edges (``npu-job``, ``npu-run``) turn
them into one ``<prog>: error: ...`` line (plus an optional ``<prog>: TIP: ...`` line, as the
bootstrap's fallback logs it) and the exit code
below, never a traceback, through :func:`report_error`. Library code raises them with a message that
names the file, the field and what was
expected; it never prints.

Exit codes (stable, documented in the README's "Exit codes"):

====  =====================  ==========================================================
code  exception              meaning
====  =====================  ==========================================================
0     --                     success
1     (anything else)        unexpected internal error (a bug: the traceback is shown)
2     --                     command-line usage error (argparse)
3     InputError             an input file or URL holds something other than expected
4     NotReadyError          an input did not become ready in time (e.g. rank table status)
5     SpecError              a job spec failed validation (all violations are listed)
6     RenderError            a template failed to render
7     InconsistentError      inputs contradict each other (e.g. this host not in the table)
8     LaunchError            the launcher could not start or lost its store
9     MissingExtraError      an optional feature needs an extra that is not installed
10    BundleError            the job's npu-job bundle is missing, truncated or altered
====  =====================  ==========================================================
"""

from __future__ import annotations

import reprlib
import sys
from typing import Callable, Optional, Sequence

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2


SHOWN_LIMIT = 80  # characters of an input value an error message may echo
LISTED_PROBLEMS = 20  # problems a SpecError message lists; the rest are counted


def shown(value: object, limit: int = SHOWN_LIMIT) -> str:
    """How an error message echoes a value taken from the input: quoted, on one line, bounded.

    Strings are shown with ``repr`` (so a newline, quote or control character cannot break the
    one-line promise) and cut in the middle to about ``limit`` characters, saying how long the
    whole was. Integers too long to print are described by their size (``repr`` of an int over
    4300 digits raises). Anything else is shown by its type name and, when short, its ``repr``.
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        half = max(limit // 2 - 2, 1)
        return f"{value[:half]!r}...{value[-half:]!r} ({len(value)} characters)"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > limit * 3:  # > ~limit decimal digits
            return f"an integer of {value.bit_length()} bits"
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (bytes, bytearray)):
        return shown(bytes(value).decode("utf-8", "backslashreplace"), limit)
    kind = type(value).__name__
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 8:
        return f"a {kind} of {len(value)} items"
    short = reprlib.Repr()
    short.maxstring = short.maxother = limit // 2
    try:
        text = short.repr(value)
    except ValueError:  # an integer too long to print, nested
        return f"a {kind}"
    return text if len(text) <= limit else f"a {kind}"


class NpuJobError(Exception):
    """Base class of every error a user can act on."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, *, tip: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.tip = tip


class InputError(NpuJobError):
    """An input (rank table, topology, spec file) is malformed.

    Its message always reads ``<source>: <field>: <expected>`` (just ``<source>: <expected>``
    when no single field is at fault).
    """

    exit_code = 3

    def __init__(
        self, source: str, field: str, expected: str, *, tip: Optional[str] = None
    ) -> None:
        self.source = source
        self.field = field
        self.expected = expected
        location = f"{source}: {field}" if field else source
        super().__init__(f"{location}: {expected}", tip=tip)


class NotReadyError(NpuJobError):
    """An input never became usable within the allowed time."""

    exit_code = 4


class SpecError(NpuJobError):
    """A job spec is invalid; ``problems`` lists every violation with its key path (the message
    lists the first :data:`LISTED_PROBLEMS` and counts the rest)."""

    exit_code = 5

    def __init__(self, source: str, problems: Sequence[str], *, tip: Optional[str] = None) -> None:
        self.source = source
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            message = f"{source}: {self.problems[0]}"
        else:
            listed = "".join(f"\n  - {p}" for p in self.problems[:LISTED_PROBLEMS])
            rest = len(self.problems) - LISTED_PROBLEMS
            more = f"\n  - and {rest} more" if rest > 0 else ""
            message = f"{source}: {len(self.problems)} problems:{listed}{more}"
        super().__init__(message, tip=tip)


class RenderError(NpuJobError):
    """A template failed to render; the message names the template and line."""

    exit_code = 6


class InconsistentError(NpuJobError):
    """Inputs disagree with each other or with the environment."""

    exit_code = 7


class LaunchError(NpuJobError):
    """The launcher could not start its store, proxy or workers."""

    exit_code = 8


class MissingExtraError(NpuJobError):
    """An optional feature needs a package of an extra that is not installed (the message says
    which ``pip install 'npu-job[EXTRA]'`` brings it)."""

    exit_code = 9


class BundleError(NpuJobError):
    """The job's bundle of the pod side (``npu-job.pyz``) is missing, unreadable, or holds other
    entries than its digest records (:mod:`npu_job.pod.bundled`)."""

    exit_code = 10


def print_error(message: str, prog: str) -> None:
    """The one shape of an error line on stderr: ``PROG: error: MESSAGE`` (as argparse's)."""
    print(f"{prog}: error: {message}", file=sys.stderr)


def report_error(error: NpuJobError, prog: str) -> int:
    """Print ``error`` as one line (plus ``PROG: TIP: ...``) on stderr and return its exit code."""
    print_error(error.message, prog)
    if error.tip:
        print(f"{prog}: TIP: {error.tip}", file=sys.stderr)
    return error.exit_code


def exit_code_of(command: Callable[[], int], prog: str) -> int:
    """Run a command's body and return its exit code: an :class:`NpuJobError` is one line
    (:func:`report_error`), Ctrl-C 130, a closed pipe (``| head``) 0, and anything else a bug,
    shown with its traceback (exit 1)."""
    try:
        return command()
    except NpuJobError as error:
        return report_error(error, prog)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `npu-job render ... | head`
        return 0
    except Exception:  # a bug: show it, it is ours to fix
        import logging

        logging.getLogger("npu_job").exception("internal error (please report it)")
        return EXIT_INTERNAL
