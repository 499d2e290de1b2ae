"""``npu-run``: torchrun's command line and elastic agent, plus the ``parallel`` tiered rendezvous.

Everything torchrun users know stays torch's own: the parser is ``torch.distributed.run``'s
``get_args_parser()`` (both spellings of every flag, ``PET_*`` environment fallbacks), the launch
config is built by torch's ``config_from_args``, and ``elastic_launch`` runs torch's
``LocalElasticAgent`` (process supervision, restarts, log redirection, the ``@record``
``ChildFailedError`` summary). ``npu-run`` adds only what torchrun lacks on Ascend clusters:

* ``--node_rank=auto`` (the bootstrap's routing-affine rank, see :mod:`.noderank`);
* ``--nproc_per_node=npu`` and an ``auto`` that finds NPUs (see :mod:`.devices`);
* ``--rdzv_backend=parallel`` and ``--enable_tiered_parallel_tcpstore=true|false`` (torch_npu_run's
  flags, see :mod:`.rendezvous.handler`);
* one-line errors with exit codes from :mod:`npu_job.errors` instead of bare ``AssertionError``
  tracebacks, and a clean exit on SIGTERM/SIGINT;
* faults named the same way on every node (the ``parallel`` backend's watch, see
  :mod:`.rendezvous.watch`): torch's agent is subclassed only to report its workers' final
  failure to that watch before it stops (:mod:`.agent`), and every worker starts behind
  :mod:`.pdeath`, so it dies with a SIGKILLed agent;
* a worker killed while ``@record`` wrote its error file is reported by its signal, where torch's
  agent would fail parsing the half-written file (:mod:`.agent`);
* ``--probe[=SECONDS]`` (``parallel`` only): before each round's workers start, time the job's
  collective under the plan's node order and the scheduler's, and start the workers in the one
  node rank 0 chooses (:mod:`.probe`).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import signal
import sys
import textwrap
import uuid
from contextlib import nullcontext
from typing import (
    Any,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from npu_job.errors import (
    EXIT_INTERNAL,
    EXIT_USAGE,
    LaunchError,
    MissingExtraError,
    NpuJobError,
    print_error,
    report_error,
)
from npu_job.logs import setup_logging
from npu_job.parsing import is_false, is_true, seconds_from_text
from npu_job.podfacts import LAUNCHER_PYTHON_ENV, OUTPUT_DIR, OUTPUT_DIR_ENV

from . import noderank

PROG = "npu-run"
DEFAULT_MASTER_PORT = 29500  # torchrun's
EXIT_WORKERS_FAILED = 1  # what torchrun exits with when a worker fails
DEFAULT_JOIN_TIMEOUT = 600  # seconds: torch's dynamic rendezvous's, and the parallel backend's
DEFAULT_PROBE_BUDGET = "60"  # seconds: a bare --probe

logger = logging.getLogger(__name__)


class UsageError(Exception):
    """A flag value argparse could not check by itself (reported as usage, exit 2)."""


def require_torch() -> None:
    """Raise :class:`MissingExtraError` (one line, exit 9) unless torch imports here.

    npu-run is torchrun's parser and agent, so even ``--help`` needs torch; the job's bundle runs
    on whatever python3 the image has, which may have none.
    """
    try:
        import torch  # noqa: F401
    except ImportError as error:
        raise MissingExtraError(
            f"npu-run needs torch, which Python {sys.version.split()[0]} ({sys.executable}) "
            f"cannot import ({error}): install it there (pip install 'npu-job[launcher]' brings "
            f"it), or run npu-run on a Python that has it (train.sh: {LAUNCHER_PYTHON_ENV})"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser, extended (build it per call: ``PET_*`` defaults are read here)."""
    from torch.distributed.argparse_util import env
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = PROG
    parser.description = textwrap.fill(
        "Launch PyTorch distributed workers like torchrun (same flags, same PET_* variables, same "
        "worker environment), plus --node_rank=auto, --nproc_per_node=npu and the tiered "
        "'parallel' rendezvous of torch_npu_run (--enable_tiered_parallel_tcpstore).",
        width=90,
    )
    parser.epilog = (
        "Examples:\n  npu-run --nnodes=4 --node_rank=auto --nproc_per_node=auto "
        "--master_addr=$MASTER_ADDR \\\n          --master_port=29500 --rdzv_backend=parallel "
        "--enable_tiered_parallel_tcpstore=true train.py\n  npu-run --standalone "
        "--nproc_per_node=2 train.py --epochs 3"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    options = parser._option_string_actions
    node_rank = options["--node-rank"]
    node_rank.type = str
    node_rank.metavar = "N|auto"
    node_rank.help = (
        "Rank of this node (static and parallel rendezvous). 'auto' reads the bootstrap's "
        "RANK_AFTER_ACC (environment, then $NPU_JOB_OUTPUT_DIR/RANK_AFTER_ACC, default /tmp), "
        "else the scheduler's index in the job kind's variable (VC_TASK_INDEX; $NPU_JOB_KIND "
        "names another kind), else 0."
    )
    options["--nproc-per-node"].help = (
        "Workers per node: N, or auto (NPUs if torch_npu sees any, else the devices of torch's "
        "accelerator: GPUs, XPUs, ..., else CPUs), npu, "
        "gpu, cpu (or torch's xpu / custom device names). CPUs are those this process may use: "
        "its affinity, capped by its cgroup's CPU quota (a pod's CPU limit)."
    )
    options["--rdzv-backend"].help = (
        "Rendezvous backend: static (default), c10d, etcd, etcd-v2, or parallel (static "
        "membership, root store on pod index 0, which plans each round's node ranks from every "
        "node's report; optional per-node store proxy)."
    )
    options["--rdzv-conf"].help += (
        " parallel understands timeout (store operations, s), join_timeout (all nodes per round, "
        "s, default 600), close_timeout (s, default 10) and watch_interval (s, default 1)."
    )
    parser.add_argument(
        "--enable-tiered-parallel-tcpstore",
        "--enable_tiered_parallel_tcpstore",
        action=env,
        type=str,
        default="false",
        metavar="true|false",
        help="Give each node a store proxy on 127.0.0.1 that its workers use as MASTER_ADDR/"
        "MASTER_PORT; the root store sees a few connections per node instead of one per worker. "
        "Implies --rdzv_backend=parallel. false (flat mode) on torch before 2.4, or with "
        "USE_LIBUV=0 before 2.10: the workers' store is torch's classic store server, on which "
        "one worker that stops reading a large reply (frozen in the middle of a GET of a few MiB) "
        "stalls every other worker's store calls past their timeout until it reads or its "
        "connection closes. true leaves that to node rank 0's own workers, the only ones that "
        "use that store directly there: each other node's proxy reads every reply for its "
        "workers.",
    )
    parser.add_argument(
        "--probe",
        action=env,
        nargs="?",
        const=DEFAULT_PROBE_BUDGET,
        default="",
        metavar="SECONDS",
        help="Parallel rendezvous only: before the workers start, time the job's collective "
        "(all_reduce) on this job's devices under the plan's node order and the scheduler's, "
        "within SECONDS from the first node's start (bare --probe: "
        f"{DEFAULT_PROBE_BUDGET}); node rank 0 keeps the plan unless it is slower by more than "
        "--probe_margin, and every node starts its workers in that order. Every node logs the "
        "same verdict line and writes probe.json beside route_plan.json. A probe that fails or "
        "runs out of time keeps the plan. Default: off.",
    )
    parser.add_argument(
        "--probe-margin",
        "--probe_margin",
        action=env,
        type=str,
        default="",
        metavar="FRACTION",
        help="How much slower than the scheduler's order the plan may measure and still be kept "
        "(default 0.05: 5%%); a negative fraction keeps it only where it is faster by more.",
    )
    return parser


def bare_probe(parser: argparse.ArgumentParser, argv: Sequence[str]) -> List[str]:
    """``argv`` with a bare ``--probe`` written ``--probe=60`` unless a number follows it, so that
    ``npu-run --probe train.py`` does not take the script for its seconds (argparse's ``nargs="?"``
    would). Only npu-run's own flags are looked at: the scan stops at the training script."""
    options = parser._option_string_actions
    words = list(argv)
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--":
            break
        if not word.startswith("-") or word == "-":
            break  # the training script
        if "=" in word or word not in options:
            index += 1
            continue
        if word == "--probe":
            following = words[index + 1] if index + 1 < len(words) else ""
            if seconds_from_text(following, zero_ok=True) is None:
                words[index] = f"--probe={DEFAULT_PROBE_BUDGET}"
            index += 1
            continue
        takes = options[word].nargs
        index += 1 if takes == 0 else 2
    return words


def probe_budget(value: Any) -> Optional[float]:
    """``--probe``'s seconds, or None when off (no flag, an empty ``PET_PROBE``)."""
    text = str(value or "").strip()
    if not text:
        return None
    budget = seconds_from_text(text, zero_ok=False)
    if budget is None:
        raise UsageError(f"--probe: expected a positive number of seconds, got {value!r}")
    return budget


def probe_margin(value: Any) -> Optional[float]:
    """``--probe_margin``, or None for the probe's default."""
    text = str(value or "").strip()
    if not text:
        return None
    try:
        margin = float(text)
    except ValueError:
        margin = float("nan")
    if not -1 < margin < 1:
        raise UsageError(f"--probe_margin: expected a fraction within (-1, 1), got {value!r}")
    return margin


def probe_request(args: argparse.Namespace, env: Mapping[str, str]) -> Any:
    """The :class:`~.probe.launch.ProbeRequest` of prepared ``args``: the workers' devices (NPUs
    with hccl where torch_npu sees them, else GPUs with nccl, else the CPU with gloo)."""
    from dataclasses import replace

    from .devices import probe_devices
    from .probe.launch import ProbeRequest
    from .probe.session import ProbeSettings

    nproc = int(args.nproc_per_node)
    found = probe_devices()
    if found.npu > 0:
        backend, devices = "hccl", tuple(f"npu:{local}" for local in range(nproc))
    elif found.gpu > 0:
        backend, devices = "nccl", tuple(f"cuda:{local}" for local in range(nproc))
    else:
        backend, devices = "gloo", ("cpu",) * nproc
    settings = ProbeSettings(budget=args.probe)
    if args.probe_margin is not None:
        settings = replace(settings, margin=args.probe_margin)
    output_dir = env.get(OUTPUT_DIR_ENV) or OUTPUT_DIR
    return ProbeRequest(settings, nproc, backend, devices, output_dir)


def parse_bool(value: Any, flag: str) -> bool:
    """A true/false flag in the words every npu-job switch takes; empty (a ``PET_*`` variable
    set to nothing) is the default, false."""
    text = str(value)
    if is_true(text):
        return True
    if is_false(text) or not text.strip():
        return False
    raise UsageError(f"{flag}: expected true or false, got {value!r}")


def parse_nnodes(value: str) -> Tuple[int, int]:
    """``N`` or ``MIN:MAX`` -> ``(min, max)``, checked (torch asserts; we explain)."""
    parts = str(value).split(":")
    if len(parts) not in (1, 2) or not all(noderank.is_count(part.strip()) for part in parts):
        raise UsageError(f"--nnodes: expected N or MIN:MAX with positive integers, got {value!r}")
    low, high = int(parts[0]), int(parts[-1])
    if not 0 < low <= high:
        raise UsageError(f"--nnodes: expected 0 < MIN <= MAX, got {value!r}")
    return low, high


def resolve_node_rank(value: Any, env: Mapping[str, str]) -> int:
    """``--node_rank``: an integer, or ``auto`` (logged with the source that won)."""
    text = str(value).strip()
    if text.lower() == noderank.AUTO:
        choice = noderank.resolve_node_rank(env)
        logger.info("node rank %d (--node_rank=auto: from %s)", choice.rank, choice.source)
        return choice.rank
    if not noderank.is_count(text):
        raise UsageError(f"--node_rank: expected a non-negative integer or 'auto', got {value!r}")
    return int(text)


def resolve_nproc(value: str) -> int:
    """``--nproc_per_node`` as a worker count (NPU-aware ``auto``)."""
    from . import devices

    text = str(value).strip()
    if noderank.is_count(text) or text.lower() in devices.DEVICE_KINDS:
        count, kind = devices.resolve_nproc_per_node(text, devices.probe_devices)
        if kind != "fixed":
            logger.info("--nproc_per_node=%s: %d worker(s), one per %s", text, count, kind)
        return count
    from torch.distributed.run import determine_local_world_size  # xpu, custom device names

    try:
        return determine_local_world_size(text)
    except ValueError as error:
        raise LaunchError(f"--nproc_per_node={text}: {error}") from None


def prepare(args: argparse.Namespace, env: Mapping[str, str]) -> argparse.Namespace:
    """Resolve and check npu-run's additions in place; returns ``args`` ready for torch.

    Mirrors ``torch.distributed.run.run`` (standalone, single-node static shortcut, default
    port) so the same command line means the same launch as under torchrun.
    """
    args.probe = probe_budget(getattr(args, "probe", ""))
    args.probe_margin = probe_margin(getattr(args, "probe_margin", ""))
    tiered = parse_bool(args.enable_tiered_parallel_tcpstore, "--enable_tiered_parallel_tcpstore")
    args.enable_tiered_parallel_tcpstore = tiered
    auto = str(args.node_rank).strip().lower() == noderank.AUTO
    args.node_rank = resolve_node_rank(args.node_rank, env)
    # Wherever a bootstrap left a route plan, the root compares the order this rank belongs to
    # with its plan, whether the rank came from --node_rank=auto or from train.sh's number.
    args.node_order = noderank.node_order(env, node_rank=None if auto else args.node_rank)
    _, max_nodes = parse_nnodes(args.nnodes)
    if args.max_restarts < 0:
        raise UsageError(f"--max_restarts: expected 0 or more, got {args.max_restarts}")
    if args.monitor_interval <= 0:
        raise UsageError(
            f"--monitor_interval: expected a positive number, got {args.monitor_interval}"
        )

    if tiered and args.standalone:
        raise UsageError(
            "--enable_tiered_parallel_tcpstore=true and --standalone exclude each other"
        )
    if tiered and args.rdzv_backend == "static":
        logger.info("--enable_tiered_parallel_tcpstore=true: using --rdzv_backend=parallel")
        args.rdzv_backend = "parallel"
    elif tiered and args.rdzv_backend != "parallel":
        raise UsageError(
            "--enable_tiered_parallel_tcpstore=true needs --rdzv_backend=parallel, got "
            f"{args.rdzv_backend!r}"
        )

    if args.standalone:  # torchrun's behaviour
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = (
            "c10d",
            "localhost:0",
            str(uuid.uuid4()),
        )
    elif (
        args.rdzv_backend == "static"
        and not args.rdzv_endpoint
        and args.master_port is None
        and max_nodes == 1
    ):
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = (
            "c10d",
            "localhost:0",
            str(uuid.uuid4()),
        )
    if args.master_port is None:
        args.master_port = DEFAULT_MASTER_PORT

    if args.rdzv_backend in ("static", "parallel") and not 0 <= args.node_rank < max_nodes:
        raise LaunchError(
            f"node rank {args.node_rank} is outside 0..{max_nodes - 1} for --nnodes={args.nnodes}",
            tip="--node_rank (or the bootstrap's RANK_AFTER_ACC) must be below the node count",
        )
    if args.rdzv_backend == "parallel" and not args.rdzv_endpoint:
        args.rdzv_endpoint = f"{args.master_addr}:{args.master_port}"
    if args.probe is not None and args.rdzv_backend != "parallel":
        raise UsageError(f"--probe needs --rdzv_backend=parallel, got {args.rdzv_backend!r}")
    args.nproc_per_node = str(resolve_nproc(args.nproc_per_node))
    args.probe_request = None if args.probe is None else probe_request(args, env)
    args.node_report = None
    if args.rdzv_backend in ("parallel", "c10d"):  # what plans the ranks: the nodes' reports
        args.node_report = noderank.node_report(env, args.node_rank, int(args.nproc_per_node))
        logger.info("node report: %s", args.node_report.source)
    return args


def launch_config(args: argparse.Namespace) -> Tuple[Any, Any, List[str]]:
    """torch's ``config_from_args`` on prepared args, plus the parallel backend's settings."""
    from torch.distributed.run import config_from_args

    from .rendezvous import c10d as ranked_c10d
    from .rendezvous import handler as backend

    torch_args = copy.copy(args)
    if args.rdzv_backend == "parallel":
        torch_args.node_rank = (
            0  # torch warns that node_rank is static-only; parallel uses it below
        )
    try:
        config, cmd, cmd_args = config_from_args(torch_args)
    except (ValueError, AssertionError, RuntimeError) as error:
        raise UsageError(str(error)) from None
    report = getattr(args, "node_report", None)  # set by prepare()
    if args.rdzv_backend == "c10d" and report is not None:
        config.rdzv_configs.update(ranked_c10d.report_options(report.data))
    if args.rdzv_backend == "parallel":
        config.rdzv_configs["rank"] = args.node_rank
        config.rdzv_configs[backend.TIERED_OPTION] = args.enable_tiered_parallel_tcpstore
        if args.node_order:  # set by prepare() where a bootstrap left a route plan
            config.rdzv_configs[backend.NODE_ORDER_OPTION] = args.node_order
        report = getattr(args, "node_report", None)  # set by prepare()
        if report is not None:
            # text: torch logs and records rdzv_configs (a report is JSON, so UTF-8)
            config.rdzv_configs[backend.NODE_REPORT_OPTION] = report.data.decode("utf-8", "replace")
            if report.pod_index is not None:
                config.rdzv_configs[backend.POD_INDEX_OPTION] = str(report.pod_index)
        request = getattr(args, "probe_request", None)  # set by prepare()
        if request is not None:
            config.rdzv_configs[backend.PROBE_OPTION] = request.to_text()
        parallel_settings(config)  # fail here, in one line, rather than inside the agent
    return config, cmd, cmd_args


def parallel_settings(config: Any) -> Any:
    """The ``parallel`` backend's settings of torch's launch ``config``, as its agent will make
    them (a :class:`~.rendezvous.config.ParallelSettings`; LaunchError if wrong)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from .rendezvous import handler as backend

    return backend.settings_from_params(
        RendezvousParameters(
            backend=config.rdzv_backend,
            endpoint=config.rdzv_endpoint,
            run_id=config.run_id,
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            **config.rdzv_configs,
        )
    )


def _terminate_on(signum: int, frame: Any) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException(
        f"{PROG} got signal {signal.Signals(signum).name}", sigval=signal.Signals(signum)
    )


def _install_early_signal_handler() -> Optional[Any]:
    """SIGTERM before the workers start (torch installs its handler only then) still unwinds.

    Returns the previous handler (None off the main thread, where signals cannot be handled).
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminate_on)


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Launch with parsed ``args``; returns the exit code (raises NpuJobError/UsageError)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    from . import agent, pdeath
    from .rendezvous import c10d as ranked_c10d
    from .rendezvous import handler as backend
    from .rendezvous import verdict
    from .rendezvous.watch import JobStopped

    prepare(args, env)
    config, cmd, cmd_args = launch_config(args)
    cmd, cmd_args = pdeath.wrap(cmd, cmd_args, os.getpid())
    backend.register()
    backend.forget_verdicts()  # an earlier launch of this process had its own cause
    previous_handler = _install_early_signal_handler()
    try:
        with ranked_c10d.ranked_c10d() if config.rdzv_backend == "c10d" else nullcontext():
            agent.recorded_launch()(config, cmd, cmd_args)
        return 0
    except ChildFailedError as failed:
        print_error(f"{type(failed).__name__}:{failed}", PROG)
        found = backend.last_verdict()
        if found is not None:
            print_error(verdict.line(found), PROG)
        return EXIT_WORKERS_FAILED
    except JobStopped as stopped:
        print_error(verdict.line(stopped.verdict), PROG)
        return LaunchError.exit_code
    except RendezvousError as error:
        found = backend.last_verdict()
        if found is not None:  # the watch knew why before the rendezvous failed
            logger.info("rendezvous failed: %s", error)
            print_error(verdict.line(found), PROG)
            return LaunchError.exit_code
        raise LaunchError(f"rendezvous failed: {rendezvous_failure(error, config)}") from None
    except SignalException as caught:
        backend.stop_all_for_signal(caught.sigval.name)
        logger.warning("received %s: stopped the workers and the store", caught.sigval.name)
        return 128 + int(caught.sigval)
    finally:
        backend.close_all()
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


def rendezvous_failure(error: BaseException, config: Any) -> str:
    """What failed, for a rendezvous error: its text, or where torch gives none (its c10d backend
    raises a bare ``RendezvousTimeoutError`` when the nodes do not all come), its type, the
    rendezvous that failed and what that type means."""
    name = type(error).__name__
    text = str(error).strip()
    if text:
        return text
    nodes = str(config.min_nodes)
    if config.max_nodes != config.min_nodes:
        nodes += f":{config.max_nodes}"
    where = f"the {config.rdzv_backend} rendezvous {config.run_id!r} at {config.rdzv_endpoint}"
    if name == "RendezvousTimeoutError":
        timeout = config.rdzv_configs.get("join_timeout", DEFAULT_JOIN_TIMEOUT)
        why = (
            f"fewer than the {config.min_nodes} node(s) of --nnodes={nodes} joined it within "
            f"join_timeout ({timeout}s)"
        )
    elif name == "RendezvousClosedError":
        why = "it was closed (another node finished or gave up)"
    else:
        why = "torch gave no reason"
    return f"{name}: {where}: {why}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``npu-run`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    setup_logging(0, prog=PROG)
    try:
        require_torch()
    except MissingExtraError as error:
        return report_error(error, PROG)
    parser = build_parser()
    try:
        args = parser.parse_args(bare_probe(parser, sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:  # --help exits 0, usage errors 2
        return int(exit_.code) if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        return run(args, os.environ)
    except UsageError as error:
        parser.print_usage(sys.stderr)
        print_error(str(error), PROG)
        return EXIT_USAGE
    except NpuJobError as error:
        return report_error(error, PROG)
    except KeyboardInterrupt:
        logger.warning("interrupted: workers stopped")
        return 130
    except Exception:  # a bug: show it, it is ours to fix
        logger.exception("internal error (please report it)")
        return EXIT_INTERNAL


def console_main() -> None:
    sys.exit(main())
