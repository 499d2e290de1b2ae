"""The bootstrap's command line: ``bash bootstrap.sh``, ``python -m npu_job.bootstrap`` and
``npu-job bootstrap`` (pod step 1).

Its flags (:func:`configure`, from the option table of :mod:`.options`; they override the
environment variables named in their help) and
:func:`main`, which parses them and runs the bootstrap without the rest of the ``npu-job``
command line: the pod's first step goes from ``bootstrap.sh`` to :func:`main` to
:func:`npu_job.bootstrap.run.bootstrap` (see there for the flow and the never-break-the-job
promise). ``npu-job bootstrap`` is the same parser as a subcommand (``HELP``, ``configure``,
``run``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Dict, NoReturn, Optional, Sequence

from npu_job.errors import EXIT_USAGE, exit_code_of
from npu_job.logs import PROG, add_log_options, setup_logging, verbosity
from npu_job.parsing import int_at_least, seconds

from .options import OPTIONS, Option, environment_names, help_text, underscore_alias

if TYPE_CHECKING:
    import argparse  # imported where a parser is built: the pod command passes no flag

HELP = "compute this pod's routing-affine node rank (pod step 1)"

_EPILOG = """\
The pod command runs it first and reads its files (a Volcano Job's; a pod of another kind
falls back to its kind's index variable, and NPU_JOB_KIND names the kind):
  bash bootstrap.sh; export RANK_AFTER_ACC=${VC_TASK_INDEX};
  rank_acc=$(cat /tmp/RANK_AFTER_ACC 2>/dev/null);
  [ -n "${rank_acc}" ] && export RANK_AFTER_ACC=${rank_acc};
  export MA_MASTER_INDEX=$(cat /tmp/MASTER_INDEX 2>/dev/null || echo 0); bash train.sh

Files written to the output directory: RANK_AFTER_ACC, MASTER_INDEX, jobstart_hccl.reordered.json,
npu_job_env.sh (NODE_RANK, MASTER_INDEX, RANK_TABLE_FILE) and route_plan.json. When no plan can be
used, only route_plan.json is written (status "failed"), stale rank files are removed, one
"npu-job: error: ..." line says why, and the exit status is 0 so the job runs in scheduler order
(--strict: exit with the error's code instead).

Without a rank table (NPU_JOB_PODS=k8s, what npu-job render sets on a routed GPU/CPU job), the
job's pods are the servers: the same files are written but the reordered rank table.
"""
SECONDS = seconds(zero_ok=True)
COUNT = int_at_least(1)


def epilog() -> str:
    """The help's closing text: the pod command, the files, and every variable read."""
    import textwrap

    names = ", ".join(environment_names())
    return _EPILOG + "\n" + textwrap.fill(f"Environment: {names}.", width=100) + "\n"


def configure(parser: argparse.ArgumentParser) -> None:
    """The bootstrap's flags, from :data:`~npu_job.bootstrap.options.OPTIONS`."""
    import argparse

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = epilog()
    groups: Dict[str, Any] = {}
    for option in OPTIONS:
        if option.flag is None:
            continue
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(option.group)
        add_flag(groups[option.group], option)


def add_flag(
    container: Any, option: Option, help: Optional[str] = None, metavar: Optional[str] = None
) -> None:
    """``option``'s flag (and its underscore spelling) on ``container``, a parser or a group of
    one, read as the bootstrap reads it; ``help`` and ``metavar`` where a command tells it
    otherwise (``npu-job plan``: the row's :class:`~npu_job.bootstrap.options.PlanFlag`)."""
    assert option.flag is not None, option
    alias = underscore_alias(option.flag)
    names = [option.flag] + ([alias] if alias else [])
    settings: Dict[str, Any] = {"dest": option.name, "help": help or help_text(option)}
    if option.is_switch:
        settings.update(action="store_true", default=None)
    else:
        settings.update(metavar=metavar or option.metavar)
        if option.choices:
            settings.update(choices=option.choices, metavar=None)
        types = {"seconds": SECONDS, "count": COUNT}
        if option.kind in types:
            settings["type"] = types[option.kind]
    container.add_argument(*names, **settings)


def run(args: argparse.Namespace) -> int:
    return _bootstrap(vars(args))


def _bootstrap(flags: Dict[str, Any]) -> int:
    from .run import bootstrap

    return bootstrap(flags).exit_code


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``npu-job bootstrap ARGV`` without the rest of ``npu-job``: the same options (-v/-q
    included), help, messages and exit codes. Returns the exit code."""
    if not (sys.argv[1:] if argv is None else argv):
        # The pod command passes no flag (the environment says it all), and every flag's default
        # is "not given" (None or false; a test keeps it so): no parser to build, which spares
        # every pod argparse itself and the imports it makes on its first parser (locale and
        # shutil).
        setup_logging(0)
        return exit_code_of(lambda: _bootstrap({}), PROG)
    import argparse

    parser = argparse.ArgumentParser(prog=f"{PROG} bootstrap", description=HELP)
    add_log_options(parser)
    configure(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: --help exits 0, usage errors exit 2
        return int(exit_.code) if isinstance(exit_.code, int) else EXIT_USAGE
    setup_logging(verbosity(args))
    return exit_code_of(lambda: run(args), PROG)


def pod_main(argv: Sequence[str]) -> NoReturn:
    """The bootstrap as a pod runs it (``bootstrap.sh``, the job's bundle): :func:`main`, then an
    exit that skips the interpreter's teardown.

    The run disables the cyclic GC (its objects are acyclic and the process is short). The outputs
    are on disk (closed and renamed) when :func:`main` returns; what the teardown would have
    flushed is flushed here.
    """
    import gc
    import os

    gc.disable()
    code = main(argv)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        sys.exit(code)  # e.g. a closed stdout: let the normal exit report it
    os._exit(code)
