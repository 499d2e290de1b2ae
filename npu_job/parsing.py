"""How text from a user or an input file becomes a number: one reader for each kind, for every part.

Counts, indices and ranks are ASCII digits only: ``int()`` would also read ``"²"``-like digits of
other scripts, signs, underscores and surrounding space, and raise past 4300 digits. Durations are
seconds as ``float()`` reads them, with NaN refused. Each reader answers ``None`` for text it does
not accept and leaves the error message, which names where the text came from, to its caller;
:func:`int_at_least` and :func:`seconds` are the same readers as argparse types, for every
command line (``npu-job``'s subcommands and the bootstrap's own).
"""

from __future__ import annotations

from typing import Callable, Optional

MAX_COUNT_DIGITS = 18  # every count and index npu-job reads is far below 10**18 (an int64)
COUNT_LIMIT = 10**MAX_COUNT_DIGITS


def count_from_text(text: str, max_digits: int = MAX_COUNT_DIGITS) -> Optional[int]:
    """The value of ``text`` if it is a count: ASCII digits spelling a number below
    ``10**max_digits`` (:data:`COUNT_LIMIT` by default; leading zeros allowed); else None."""
    significant = text.lstrip("0")
    if len(significant) <= max_digits and text.isdigit() and text.isascii():
        return int(significant or "0")
    return None


def is_count(text: str) -> bool:
    """``text`` is a count (:func:`count_from_text`)."""
    return count_from_text(text) is not None


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def is_true(text: str) -> bool:
    """``text`` turns a switch on (``NPU_JOB_STRICT=1``): one of :data:`TRUE_WORDS`, any case."""
    return text.strip().lower() in TRUE_WORDS


def is_false(text: str) -> bool:
    """``text`` turns a switch that is on by default off (``NPU_JOB_K8S_TOPOLOGY=0``): one of
    :data:`FALSE_WORDS`, any case."""
    return text.strip().lower() in FALSE_WORDS


def seconds_from_text(text: str, *, zero_ok: bool) -> Optional[float]:
    """``text`` as seconds, > 0 (or >= 0 with ``zero_ok``); None otherwise (NaN too)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if (value >= 0 if zero_ok else value > 0) else None


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for whole numbers >= ``minimum`` ("expected an integer >= 1, got
    'x'")."""

    def parse(text: str) -> int:
        value = count_from_text(text.strip())
        if value is None or value < minimum:
            from argparse import ArgumentTypeError  # only a command line gets here

            raise ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


def seconds(*, zero_ok: bool) -> Callable[[str], float]:
    """An argparse ``type`` for a duration in seconds, > 0 (or >= 0 with ``zero_ok``); not nan."""
    bound = ">= 0" if zero_ok else "> 0"

    def parse(text: str) -> float:
        value = seconds_from_text(text, zero_ok=zero_ok)
        if value is None:
            from argparse import ArgumentTypeError  # only a command line gets here

            raise ArgumentTypeError(f"expected a number of seconds {bound}, got {text!r}")
        return value

    return parse
