"""argparse value types shared by the subcommands (one message per kind of bad value)."""

from __future__ import annotations

import argparse
from typing import Callable

from npu_job.parsing import count_from_text, seconds_from_text


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for whole numbers >= ``minimum`` ("expected an integer >= 1, got 'x'")."""

    def parse(text: str) -> int:
        value = count_from_text(text.strip())
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


def seconds(*, zero_ok: bool) -> Callable[[str], float]:
    """An argparse ``type`` for a duration in seconds, > 0 (or >= 0 with ``zero_ok``); rejects nan."""
    bound = ">= 0" if zero_ok else "> 0"

    def parse(text: str) -> float:
        value = seconds_from_text(text, zero_ok=zero_ok)
        if value is None:
            raise argparse.ArgumentTypeError(f"expected a number of seconds {bound}, got {text!r}")
        return value

    return parse


def picture_file(text: str) -> str:
    """An argparse ``type`` for ``--picture FILE``: a name ending in .png or .svg."""
    from npu_job.picture import picture_format

    if picture_format(text) is None:
        raise argparse.ArgumentTypeError(
            f"expected a file name ending in .png or .svg, got {text!r}")
    return text


def write_picture(path: str, table: object, topology: object, plan: object, title: str) -> None:
    """Draw ``plan``'s picture to ``path`` (``--picture``); an unwritable path is one line,
    exit 3."""
    import logging

    from npu_job.errors import InputError
    from npu_job.picture import draw, layout

    try:
        written = draw(layout(table, topology, plan, title=title), path)
    except OSError as error:
        raise InputError(path, "", f"cannot write the picture: {error.strerror or error}") from None
    logging.getLogger("npu_job").info("wrote %s", written)
