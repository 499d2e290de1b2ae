"""Running a test under each JSON engine of ``npu_job.bootstrap.base.payload``.

The bootstrap decodes with msgspec when it is installed and the input is big, and with the
standard library otherwise; both must mean the same. :func:`json_engine` switches between the two
for any input size, so that small test documents exercise the msgspec path too.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator

from npu_job.bootstrap.base.accelerator import MSGSPEC, Accelerator

ENGINES = ("msgspec", "stdlib")


def json_engine(name: str) -> ContextManager[None]:
    """``msgspec``: msgspec for every input, whatever its size; ``stdlib``: as if msgspec were not
    installed."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}")
    return _accelerated(MSGSPEC, name == "msgspec")


@contextlib.contextmanager
def _accelerated(accelerator: Accelerator, on: bool) -> Iterator[None]:
    saved = accelerator.from_bytes, accelerator.module
    try:
        if on:
            accelerator.from_bytes, accelerator.module = 0, False  # loaded afresh below
            assert accelerator.for_size(0) is not None, "a dependency: it must import"
        else:
            accelerator.module = None
        yield
    finally:
        accelerator.from_bytes, accelerator.module = saved
