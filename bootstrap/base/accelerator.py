"""Optional C accelerators of the bootstrap (msgspec): loaded by the first input big
enough to pay for its import, then serving every input.

Both are shortcuts only: without them the standard library does the same work with the same
results, only slower, so an image without them runs the bootstrap unchanged. Importing one costs
milliseconds, more than it saves on a small job, hence the size below which it is not even tried.
Once loaded it serves every input, however small: the import was the cost (the last page of a big
LIST, a small list after it).
"""

from __future__ import annotations

import sys
from typing import Any


class Accelerator:
    """One optional module: :meth:`for_size` gives it, when installed, to an input of ``size``
    bytes from ``from_bytes`` on (or of any size once loaded), None otherwise."""

    def __init__(self, name: str, from_bytes: int) -> None:
        self.name = name  # of the module, dotted
        self.from_bytes = from_bytes
        self.module: Any = False  # False: not tried yet; None: not installed; else the module

    def for_size(self, size: int) -> Any:
        if self.module is False:
            if size < self.from_bytes:
                return None
            try:
                __import__(self.name)  # the top package, loading the module named
            except ImportError:  # the standard library does everything, only slower
                self.module = None
            else:
                self.module = sys.modules[self.name]
        return self.module


# Decodes JSON ~2x faster than json, 5x into typed structs, encodes 10x faster; its ~10 ms import
# pays for itself from ~1000 nodes of rank table.
MSGSPEC = Accelerator("msgspec", from_bytes=512 * 1024)  # msgspec.json comes with it
