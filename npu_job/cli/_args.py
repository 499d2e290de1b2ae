"""argparse value types shared by the subcommands (one message per kind of bad value).

The number types are :mod:`npu_job.parsing`'s (the bootstrap's own command line uses them too).
"""

from __future__ import annotations

from npu_job.parsing import int_at_least, seconds

__all__ = ["int_at_least", "seconds"]
