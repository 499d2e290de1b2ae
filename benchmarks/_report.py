"""What every benchmark does with its table: print it, and with ``--output FILE`` also save it."""

from __future__ import annotations

import sys
from typing import Optional

from npu_job.fileio import write_atomic


def publish(text: str, output: Optional[str]) -> None:
    """Write ``text`` to stdout and, if ``output`` is given, atomically to that file."""
    sys.stdout.write(text)
    sys.stdout.flush()
    if output:
        write_atomic(output, text.encode())
