"""``python -m npu_job.bootstrap [options]``: the same as ``npu-job bootstrap [options]``."""

from __future__ import annotations

import sys

from .command import main

if __name__ == "__main__":
    sys.exit(main())
