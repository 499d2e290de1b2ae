"""argparse value types shared by the subcommands (one message per kind of bad value)."""

from __future__ import annotations

import argparse
from typing import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for whole numbers >= ``minimum`` ("expected an integer >= 1, got 'x'")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse
