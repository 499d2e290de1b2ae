"""The pod side as one file: what the job's bundle (``npu-job.pyz``) is and how a pod runs it.

``npu-job render`` ships the bootstrap, npu-run and the shared core in the job's scripts ConfigMap
as one zipapp (built by :mod:`npu_job.bundle`), so that a stock image with ``python3`` (and torch,
for training) needs nothing installed. The bundle's ``__main__.py`` has checked the interpreter
against the floor and every byte of the file against its digest (:mod:`npu_job.bundle`); this
module is what runs next, the first of the bundle's modules a pod imports, on the image's own
interpreter (CPython 3.7 and later, standard library only): :func:`main` checks that the running
copy of ``npu_job`` is the bundle's, logs the identity line (version, the file's digest, path,
Python) and runs ``bootstrap``, ``run`` (npu-run) or ``version``.

Which copy runs is one rule, the same in every pod: a bundle given to a pod always wins over any
npu-job the image may hold, because every pod of a job must run the same planner. The pod's
scripts put the bundle first on ``sys.path``; :func:`main` refuses to go on if ``npu_job`` came from
elsewhere all the same (a :class:`~npu_job.errors.BundleError`). A bundle that is missing, cut
short or altered is one line and BundleError's exit code, 10, from the loader or ``__main__.py``:
the bootstrap then keeps the scheduler order, train.sh stops.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence

from npu_job import __version__
from npu_job.errors import EXIT_USAGE, BundleError, exit_code_of
from npu_job.logs import PROG, setup_logging
from npu_job.podfacts import SHOWN_DIGEST

log = logging.getLogger(__name__)

COMMANDS = ("bootstrap", "run", "version")
USAGE = "usage: python3 npu-job.pyz {bootstrap|run|version} [ARGS...]"


def check(path: str) -> None:
    """Raise BundleError unless ``npu_job`` was imported from the bundle at ``path``."""
    import npu_job

    package_file = os.path.abspath(getattr(npu_job, "__file__", None) or "?")
    if not package_file.startswith(os.path.join(os.path.abspath(path), "")):
        raise BundleError(
            f"{path}: npu_job was imported from {package_file}, not from the bundle "
            "(the bundle must be first on sys.path: run it as python3 npu-job.pyz COMMAND)"
        )


def identity(path: str, digest: str) -> str:
    """The pod's first log line: which npu-job runs, from where, on which Python."""
    return (
        f"running {__version__} from bundle {digest[:SHOWN_DIGEST]} ({path}) "
        f"on Python {sys.version.split()[0]} ({sys.executable})"
    )


def main(path: str, digest: str, argv: Optional[Sequence[str]] = None) -> int:
    """Run the bundle at ``path``, whose bytes have ``digest``: ``argv`` is COMMAND ARGS...."""
    args = list(sys.argv[1:] if argv is None else argv)
    setup_logging(0)
    if not args or args[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE

    def checked() -> int:
        check(path)
        return 0

    command, rest = args[0], args[1:]
    failed = exit_code_of(checked, PROG)
    if command == "bootstrap":
        return _bootstrap(path, digest, rest, failed)
    if failed:
        return failed
    if command == "version":
        print(f"npu-job {__version__} {digest}")
        return 0
    log.info("%s", identity(path, digest))
    from npu_job.launcher.run import main as run_main

    sys.argv[0] = f"{path} run"
    return run_main(rest)


def _bootstrap(path: str, digest: str, argv: Sequence[str], failed: int) -> int:
    """The bootstrap from the bundle (a bundle that failed its check: its exit code, 10)."""
    if failed:
        return failed  # bootstrap.sh keeps the scheduler order on it, unless --strict
    log.info("%s", identity(path, digest))
    from npu_job.bootstrap.command import pod_main

    pod_main(argv)
