"""Running a test under each JSON engine and each inflater of ``npu_job.bootstrap.payload``.

The bootstrap decodes with msgspec when it is installed and the input is big, and with the
standard library otherwise; both must mean the same. :func:`json_engine` switches between the two
for any input size, so that small test documents exercise the msgspec path too. Gzip streams are
inflated by zlib-ng or the standard library's zlib alike: :func:`inflater`.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator

from npu_job.bootstrap.accelerator import MSGSPEC, ZLIB_NG, Accelerator

ENGINES = ("msgspec", "stdlib")
INFLATERS = ("zlib-ng", "stdlib")


def json_engine(name: str) -> ContextManager[None]:
    """``msgspec``: msgspec for every input, whatever its size; ``stdlib``: as if msgspec were not
    installed."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}")
    return _accelerated(MSGSPEC, name == "msgspec")


def inflater(name: str) -> ContextManager[None]:
    """``zlib-ng``: zlib-ng inflates every gzip stream, whatever its size; ``stdlib``: as if
    zlib-ng were not installed."""
    if name not in INFLATERS:
        raise ValueError(f"unknown inflater {name!r}")
    return _accelerated(ZLIB_NG, name == "zlib-ng")


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
