"""The ``npu-job`` command: a thin argparse front over the bootstrap, planner, renderer and demo.

Each subcommand lives in its own module of this package and exposes ``HELP`` (one line),
``configure(parser)`` and ``run(args) -> int``. Only the chosen subcommand's module is imported,
so ``npu-job bootstrap`` never pays for Jinja or anything else it does not use.

This module is where an :class:`~npu_job.errors.NpuJobError` from a subcommand becomes an
``npu-job: error: ...`` line and an exit code (``npu_job.errors.report_error``; the table is there).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from npu_job import __version__
from npu_job.errors import EXIT_INTERNAL, EXIT_USAGE, NpuJobError, report_error
from npu_job.logs import PROG, setup_logging

# name -> (module, one-line help); the order is the order of `npu-job --help`.
SUBCOMMANDS: Dict[str, Tuple[str, str]] = {
    "bootstrap": ("npu_job.cli.bootstrap", "compute this pod's routing-affine node rank (pod step 1)"),
    "plan": ("npu_job.cli.plan", "show the routing-affine order for a rank table and how it scores"),
    "render": ("npu_job.cli.render", "render a job spec into a Volcano Job and train.sh"),
    "demo": ("npu_job.cli.demo", "run the whole pipeline on a simulated cluster on this machine"),
}


def _log_options(parser: argparse.ArgumentParser, suffix: str = "") -> None:
    """-v/-q, on ``npu-job`` itself and (``suffix`` "_after") on every subcommand.

    A subcommand's copies have their own destinations and no defaults, so that ``npu-job -v
    bootstrap`` is not undone by the subcommand's default and ``-v`` counts on both sides.
    """
    parser.add_argument("-v", "--verbose", dest="verbose" + suffix, action="count",
                        default=argparse.SUPPRESS if suffix else 0, help="more log output (repeatable)")
    parser.add_argument("-q", "--quiet", dest="quiet" + suffix, action="store_true",
                        default=argparse.SUPPRESS if suffix else False, help="only warnings and errors on stderr")


def verbosity(args: argparse.Namespace) -> int:
    """The log verbosity -v/-q asked for on either side of the subcommand: -1 quiet, 0, 1+."""
    if args.quiet or getattr(args, "quiet_after", False):
        return -1
    return int(args.verbose) + int(getattr(args, "verbose_after", 0))


def build_parser(chosen: Optional[str] = None) -> argparse.ArgumentParser:
    """The top-level parser; only ``chosen``'s options are configured (all when None)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Routing-affine PyTorch training on Volcano-scheduled Ascend NPU clusters.",
        epilog="Run 'npu-job COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _log_options(parser)
    shared = argparse.ArgumentParser(add_help=False)
    _log_options(shared, "_after")
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
    try:
        return run(args)
    except NpuJobError as error:
        return report_error(error, PROG)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `npu-job render ... | head`
        return 0
    except Exception:  # a bug: show it, it is ours to fix
        logging.getLogger(__name__).exception("internal error (please report it)")
        return EXIT_INTERNAL


def console_main() -> None:
    sys.exit(main())
