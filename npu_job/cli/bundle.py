"""``npu-job bundle -o FILE``: the job's bundle of the pod side, for users who host it themselves.

``npu-job render`` ships the same file in every job's scripts ConfigMap; this writes it alone, for
``bootstrap.url`` and the platform guide's pattern of a script fetched from object storage
(``OPEN_SCRIPT_ADDRESS``): the fetched file is self-contained (:mod:`npu_job.bundle`).
"""

from __future__ import annotations

import argparse
import json
import sys

from npu_job import __version__

HELP = "write the pod side of npu-job (bootstrap, npu-run) as one file, for hosting it yourself"

DESCRIPTION = """\
Write the job's bundle of npu-job: the bootstrap, npu-run and the code they share in one
self-contained file that runs on the image's own python3 (3.7 and later, standard library only).
`npu-job render` ships the same file in each job's scripts ConfigMap; write it yourself to host it
(spec key bootstrap.url, or the platform guide's OPEN_SCRIPT_ADDRESS/bootstrap.sh). The same
npu-job writes the same bytes."""

EPILOG = """\
examples:
  npu-job bundle -o npu-job.pyz
  bash npu-job.pyz --rank-table /user/config/jobstart_hccl.json   # the bootstrap
  bash npu-job.pyz run --nnodes 2 --nproc_per_node 8 train.py     # npu-run
  python3 npu-job.pyz version                                     # version and digest
  npu-job bundle -o - | sha256sum"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="where to write the bundle, atomically (- for stdout)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="describe what was written as JSON on stdout (not with -o -)",
    )


def run(args: argparse.Namespace) -> int:
    from npu_job.bundle import installed_bundle
    from npu_job.errors import EXIT_USAGE, InputError, print_error
    from npu_job.fileio import write_atomic
    from npu_job.logs import PROG

    if args.output == "-" and args.json:
        print_error("bundle: --json describes a written file: not with -o -", PROG)
        return EXIT_USAGE
    bundle = installed_bundle()
    if args.output == "-":
        sys.stdout.buffer.write(bundle.data)
        sys.stdout.buffer.flush()
        return 0
    try:
        path = write_atomic(args.output, bundle.data, mode=0o755)
    except OSError as error:
        raise InputError(
            args.output, "--output", f"expected a file that can be written ({error.strerror})"
        ) from None
    if args.json:
        print(
            json.dumps(
                {
                    "version": __version__,
                    "path": str(path),
                    "digest": bundle.digest,
                    "bytes": len(bundle.data),
                    "entries": bundle.entries,
                },
                indent=2,
            )
        )
    else:
        print(f"wrote {path} ({len(bundle.data)} bytes, npu-job {__version__}, {bundle.digest})")
    return 0
