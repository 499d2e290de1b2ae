"""argparse value types shared by the subcommands (one message per kind of bad value).

The number types are :mod:`npu_job.parsing`'s (the bootstrap's own command line uses them too).
"""

from __future__ import annotations

import argparse

from npu_job.parsing import int_at_least, seconds

__all__ = ["int_at_least", "picture_file", "seconds", "write_picture"]


def picture_file(text: str) -> str:
    """An argparse ``type`` for ``--picture FILE``: a name ending in .png or .svg."""
    from .picture import picture_format

    if picture_format(text) is None:
        raise argparse.ArgumentTypeError(
            f"expected a file name ending in .png or .svg, got {text!r}"
        )
    return text


def write_picture(path: str, table: object, topology: object, plan: object, title: str) -> None:
    """Draw ``plan``'s picture to ``path`` (``--picture``); an unwritable path is one line,
    exit 3."""
    import logging

    from npu_job.errors import InputError

    from .picture import draw, layout

    try:
        written = draw(layout(table, topology, plan, title=title), path)
    except OSError as error:
        raise InputError(path, "", f"cannot write the picture: {error.strerror or error}") from None
    logging.getLogger("npu_job").info("wrote %s", written)
