"""Running a test under each JSON engine of ``npu_job.bootstrap.payload``.

The bootstrap decodes with msgspec when it is installed and the input is big, and with the
standard library otherwise; both must mean the same. :func:`json_engine` switches between the two
for any input size, so that small test documents exercise the msgspec path too.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from npu_job.bootstrap import jsondecode

ENGINES = ("msgspec", "stdlib")


@contextlib.contextmanager
def json_engine(name: str) -> Iterator[None]:
    """``msgspec``: msgspec for every input, whatever its size; ``stdlib``: as if msgspec were not
    installed."""
    saved = jsondecode.MSGSPEC_FROM_BYTES, jsondecode._msgspec
    try:
        if name == "msgspec":
            jsondecode.MSGSPEC_FROM_BYTES = 0
            jsondecode._msgspec = False  # loaded afresh below
            assert jsondecode.msgspec_for(0) is not None, "msgspec is a dependency: it must import"
        elif name == "stdlib":
            jsondecode._msgspec = None
        else:
            raise ValueError(f"unknown engine {name!r}")
        yield
    finally:
        jsondecode.MSGSPEC_FROM_BYTES, jsondecode._msgspec = saved
