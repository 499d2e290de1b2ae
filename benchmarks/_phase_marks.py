"""Phase boundaries for callgrind: how ``bench_bootstrap_api.py --callgrind`` cuts a run apart.

A script run under ``valgrind --tool=callgrind --dump-before=zlib_adler32`` calls
:meth:`Phases.begin` where each phase begins: ``zlib.adler32`` (which neither the bootstrap nor
a raw inflate calls) makes callgrind write the instructions of the phase that ends to a profile of
its own. At the end :meth:`Phases.write` prints the phases' names, one per boundary, in order: the
profile written at boundary ``k`` holds the instructions run under the ``k``-th name. Standard
library only, so that the scripts that mark their phases load nothing they would not otherwise.
"""

from __future__ import annotations

import sys
import zlib
from typing import List

MARK = "zlib_adler32"  # the C function called at every boundary, as callgrind names it
ENV = "NPU_JOB_BENCH_PHASES"  # "1": the least pod reader marks its phases


class Phases:
    """The phases a run has begun, its first (``first``) from the interpreter's start."""

    def __init__(self, first: str, marking: bool = True) -> None:
        self.names: List[str] = [first]
        self.marking = marking  # False: begin() does nothing (a run not under callgrind)

    def begin(self, name: str) -> None:
        """Where ``name`` begins and the running phase ends."""
        if self.marking:
            zlib.adler32(b"")  # callgrind dumps the phase that ends here
            self.names.append(name)

    def write(self) -> None:
        """The names on stdout, one per line, for the benchmark to pair with the profiles."""
        if self.marking:
            sys.stdout.write("\n".join(self.names) + "\n")
