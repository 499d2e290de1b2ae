"""The ``npu-job`` command: a thin argparse front over the bootstrap, planner, renderer and demo.

Each subcommand lives in its own module and exposes ``HELP`` (one line), ``configure(parser)``
and ``run(args) -> int``: the modules of this package, and the bootstrap's own command line
(``npu_job.bootstrap.command``, which ``bash bootstrap.sh`` runs without this package). Only the
chosen subcommand's module is imported, so ``npu-job bootstrap`` never pays for Jinja or anything
else it does not use.

An :class:`~npu_job.errors.NpuJobError` from a subcommand becomes an ``npu-job: error: ...`` line
and an exit code here (``npu_job.errors.exit_code_of``; the table is in ``npu_job.errors``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from npu_job import __version__
from npu_job.errors import EXIT_USAGE, exit_code_of
from npu_job.logs import PROG, add_log_options, setup_logging, verbosity

# name -> (module, one-line help); the order is the order of `npu-job --help`.
SUBCOMMANDS: Dict[str, Tuple[str, str]] = {
    "bootstrap": (
        "npu_job.bootstrap.command",
        "compute this pod's routing-affine node rank (pod step 1)",
    ),
    "plan": (
        "npu_job.cli.plan",
        "show the routing-affine order for a rank table or a job's pods, and how it scores",
    ),
    "render": ("npu_job.cli.render", "render a job spec into a Volcano Job and train.sh"),
    "bundle": (
        "npu_job.cli.bundle",
        "write the pod side of npu-job (bootstrap, npu-run) as one file, for hosting it yourself",
    ),
    "demo": ("npu_job.cli.demo", "run the whole pipeline on a simulated cluster on this machine"),
}


def build_parser(chosen: Optional[str] = None) -> argparse.ArgumentParser:
    """The top-level parser; only ``chosen``'s options are configured (all when None)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Routing-affine PyTorch training on Volcano-scheduled Ascend NPU clusters.",
        epilog="Run 'npu-job COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_log_options(parser)
    shared = argparse.ArgumentParser(add_help=False)
    add_log_options(shared, "_after")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text, parents=[shared])
        if chosen is None or name == chosen:
            module = importlib.import_module(module_name)
            module.configure(sub)
            sub.set_defaults(_run=module.run)
    return parser


def _chosen_command(argv: Sequence[str]) -> Optional[str]:
    for arg in argv:
        if arg in SUBCOMMANDS:
            return arg
        if not arg.startswith("-"):
            return None
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``npu-job`` with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    args_list: List[str] = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_chosen_command(args_list))
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exit_:  # argparse: --help/--version exit 0, usage errors exit 2
        return int(exit_.code) if isinstance(exit_.code, int) else EXIT_USAGE
    setup_logging(verbosity(args))
    run: Callable[[argparse.Namespace], int] = args._run
    return exit_code_of(lambda: run(args), PROG)


def console_main() -> None:
    sys.exit(main())
