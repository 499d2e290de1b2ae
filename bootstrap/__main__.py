"""``python -m npu_job.bootstrap [options]``: the same as ``npu-job bootstrap [options]``.

``-v``/``--verbose`` and ``-q``/``--quiet`` may be given here too (they are options of ``npu-job``
itself, so they are moved in front of the subcommand).
"""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence

_GLOBAL_FLAGS = ("-v", "--verbose", "-q", "--quiet", "-vv", "-vvv")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from npu_job.cli import main as cli_main

    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    global_flags = [arg for arg in args if arg in _GLOBAL_FLAGS]
    rest = [arg for arg in args if arg not in _GLOBAL_FLAGS]
    return cli_main([*global_flags, "bootstrap", *rest])


if __name__ == "__main__":
    sys.exit(main())
