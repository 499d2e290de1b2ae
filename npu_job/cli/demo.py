"""``npu-job demo``: the whole pipeline on a cluster simulated on this machine (npu_job.demo)."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys

from ._args import int_at_least, picture_file, seconds

HELP = "run the whole pipeline on a simulated cluster on this machine"

log = logging.getLogger("npu_job.demo")
POSITIVE = int_at_least(1)
SECONDS = seconds(zero_ok=False)


def configure(parser: argparse.ArgumentParser) -> None:
    from npu_job.demo.images import offered_images
    from npu_job.kinds import DEFAULT, KINDS

    parser.description = (
        "Simulate a cluster (a CCE-format rank table + ranktable_tor.json, pods scattered over "
        "ToRs), render a CPU job of --kind with routing on with npu-job render (its rank table "
        "comes in a ConfigMap the job mounts at /user/config, named by RANK_TABLE_FILE: CCE "
        "delivers rank tables to NPU jobs only; a kind that runs NPU pods only, AscendJob, "
        "renders its NPU job, its rank table filled as its operator would), and run every pod's"
        " container command exactly as rendered, each pod in its own mount namespace with its "
        "own loopback address and /etc/hosts: bootstrap.sh, then train.sh, then npu-run with "
        "the tiered store and a small real DDP training (gloo). Checks that every worker's rank"
        " follows the route plan, that all ranks agree on the trained parameters and that the "
        "loss went down. No root needed (uses 'unshare --user --map-root-user')."
    )
    parser.epilog = (
        "Exit status: 0 when the whole chain is consistent, 2 for bad flags, 7 when a check "
        "failed, 8 when pods cannot run, 9 for --picture without the [picture] extra."
    )
    parser.set_defaults(_demo_parser=parser)  # for usage errors found after parsing (_usage_error)
    parser.add_argument(
        "--nodes", type=POSITIVE, default=6, help="pods (nodes) of the job (default 6)"
    )
    parser.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        type=POSITIVE,
        default=2,
        help="workers per pod (default 2)",
    )
    parser.add_argument(
        "--tors", type=POSITIVE, default=3, help="ToR switches the pods are spread over (default 3)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the simulated cluster and the training (default 0)",
    )
    parser.add_argument("--steps", type=POSITIVE, default=20, help="training steps (default 20)")
    parser.add_argument(
        "--no-routing",
        dest="routing",
        action="store_false",
        help="render with routing acceleration off (pods keep the scheduler's order)",
    )
    parser.add_argument(
        "--image",
        choices=offered_images(),
        default="stock",
        help="what the pods' image holds. stock (default, what users meet): python3 with torch "
        "and no npu-job, so the pods run npu-job only from the job's bundle; stock-py37: the "
        "same but python3 is CPython 3.7 (the bootstrap's) and torch is in another interpreter, "
        "named by NPU_JOB_LAUNCHER_PYTHON (offered when python3.7 is on PATH or under pyenv); "
        "installed: this installation's python and npu-job commands first on the pods' PATH",
    )
    parser.add_argument(
        "--kind",
        choices=sorted(KINDS),
        default=DEFAULT,
        help=f"the job kind rendered and simulated (default {DEFAULT}): its job object, and its "
        "controller's pods, names, labels and variables",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        default=None,
        help="keep everything (rendered job, pod logs, private /tmp of each pod, reports) in DIR "
        "(a failed run is kept without it, in a temporary directory its TIP line names)",
    )
    parser.add_argument(
        "--write-inputs",
        metavar="DIR",
        default=None,
        help="only write the simulated cluster's rank table and ranktable_tor.json (as CCE "
        "mounts them) to DIR, for npu-job plan or npu-job bootstrap, and exit: no pods",
    )
    parser.add_argument(
        "--timeout",
        type=SECONDS,
        default=240.0,
        help="seconds before every pod is killed (default 240)",
    )
    parser.add_argument(
        "--probe",
        nargs="?",
        const=True,
        default=False,
        type=POSITIVE,
        metavar="SECONDS",
        help="render the job with the spec key probe: npu-run times all_reduce under the plan's "
        "order and the scheduler's before the workers start and keeps the faster (bare: its "
        "60 s budget)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a machine-readable summary on stdout"
    )
    parser.add_argument(
        "--picture",
        metavar="FILE",
        type=picture_file,
        help="also draw the job's plan to FILE (.png or .svg), as npu-job plan --picture "
        "does, before the pods start (needs the extra: pip install 'npu-job[picture]')",
    )


def run(args: argparse.Namespace) -> int:
    from npu_job import demo
    from npu_job.demo import podsim
    from npu_job.errors import InconsistentError, LaunchError

    if args.tors > args.nodes:
        return _usage_error(
            args,
            f"--tors {args.tors}: cannot spread {args.nodes} node(s) over more ToRs than "
            f"nodes; use --tors {args.nodes} or fewer",
        )
    if args.picture:
        from .picture import require_matplotlib

        require_matplotlib()  # before any work: a missing extra is one line, exit 9
    if args.write_inputs is not None:
        code = _write_inputs(args)
        if code == 0 and args.picture:
            _write_picture(args)
        return code
    problem = demo.keep_directory_problem(args.keep)
    if problem is not None:
        return _usage_error(args, problem)
    reason = podsim.unshare_unavailable_reason()
    if reason is not None:
        raise LaunchError(
            f"cannot give each pod its own mount namespace: {reason}",
            tip="install util-linux and allow unprivileged user namespaces "
            "(sysctl kernel.unprivileged_userns_clone=1 or "
            "kernel.apparmor_restrict_unprivileged_userns=0), or run as root",
        )
    device = demo.demo_device(args.kind)
    if device != "cpu":
        log.info(
            "the %s runs %s pods only: the demo renders that job; the workers fall back to gloo "
            "on this machine's CPU",
            demo.KINDS[args.kind].title,
            device,
        )
    options = demo.DemoOptions(
        nodes=args.nodes,
        nproc_per_node=args.nproc_per_node,
        tors=args.tors,
        seed=args.seed,
        steps=args.steps,
        routing=args.routing,
        timeout=args.timeout,
        image=args.image,
        kind=args.kind,
        device=device,
        probe=args.probe,
    )
    if args.picture:
        _write_picture(args)
    phases = demo.Phases()
    phases.mark("start")
    workspace, remove = demo.default_workspace(args.keep)
    try:
        result = demo.run(
            options, workspace, progress=lambda line: log.info("%s", line), phases=phases
        )
    except Exception:  # a bug: what the pods did is the report's evidence
        if remove:
            log.warning("kept the failed run in %s (delete it when done)", workspace)
        raise
    except BaseException:  # Ctrl-C: nothing asked to be kept
        if remove:
            shutil.rmtree(workspace, ignore_errors=True)
        raise
    # a failure may not come back when rerun (a race, a busy machine): keep what it left
    kept_for_failure = remove and not result.ok
    remove = remove and result.ok
    if remove:
        shutil.rmtree(workspace, ignore_errors=True)
    phases.mark("finished")
    _report(result, keep=None if remove else workspace)
    if args.json:
        summary = result.summary()
        summary["workspace"] = None if remove else str(workspace)
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    if not result.ok:
        shown = "; ".join(result.problems[:3]) + (
            f" (+{len(result.problems) - 3} more)" if len(result.problems) > 3 else ""
        )
        raise InconsistentError(
            f"demo: {shown}",
            tip=f"read {workspace}/pods/*/pod.log"
            + (" (kept because the demo failed; delete it when done)" if kept_for_failure else ""),
        )
    return 0


def _write_inputs(args: argparse.Namespace) -> int:
    """``--write-inputs DIR``: the simulated cluster's CCE files only (never overwritten)."""
    from pathlib import Path

    from npu_job import demo

    directory = Path(args.write_inputs)
    existing = [name for name in demo.INPUT_FILES if (directory / name).exists()]
    if existing:
        return _usage_error(
            args,
            f"--write-inputs {directory}: it already holds {', '.join(existing)}; "
            "the demo never overwrites a file",
        )
    if directory.exists() and not directory.is_dir():
        return _usage_error(args, f"--write-inputs {directory}: not a directory")
    options = demo.DemoOptions(
        nodes=args.nodes, nproc_per_node=args.nproc_per_node, tors=args.tors, seed=args.seed
    )
    cluster = demo.simulated_cluster(options, demo.loopback_ips(options.nodes))
    for path in demo.write_cluster_inputs(cluster, directory):
        log.info("wrote %s", path)
    return 0


def _write_picture(args: argparse.Namespace) -> None:
    """The picture of the plan every pod will compute (the same cluster and plan as the run)."""
    from npu_job import demo

    from ._args import write_picture

    options = demo.DemoOptions(
        nodes=args.nodes,
        nproc_per_node=args.nproc_per_node,
        tors=args.tors,
        seed=args.seed,
        routing=args.routing,
    )
    cluster = demo.simulated_cluster(options, demo.loopback_ips(options.nodes))
    write_picture(
        args.picture,
        cluster.table,
        cluster.topology,
        demo.expected_plan(cluster, options),
        f"npu-job demo: {options.nodes} pods on {options.tors} ToRs (seed {options.seed})",
    )


def _usage_error(args: argparse.Namespace, message: str) -> int:
    """argparse's own usage error (usage line, then ``npu-job demo: error: MESSAGE``), exit code 2,
    for flag combinations no single flag's type can reject; returned like any other usage error."""
    from npu_job.errors import EXIT_USAGE, print_error

    parser: argparse.ArgumentParser = args._demo_parser
    parser.print_usage(sys.stderr)
    print_error(message, parser.prog)
    return EXIT_USAGE


def _report(result, *, keep) -> None:
    """The closing lines: ranks vs plan, loss, phases, and the result with the one total."""
    plan = result.prepared.plan
    nproc = result.options.nproc_per_node
    checked = [r for r in result.reports if r.get("rank_ok")]
    log.info(
        "ranks: %d/%d workers run at the global rank the plan gives (node_rank*%d + local_rank)",
        len(checked),
        result.options.nodes * nproc,
        nproc,
    )
    for report in sorted(result.reports, key=lambda r: r.get("rank", -1)):
        pod = report.get("pod_index")
        node_rank = (
            plan.node_rank_of_pod[pod]
            if isinstance(pod, int) and pod < len(plan.node_rank_of_pod)
            else "?"
        )
        log.debug(
            "  rank %s = pod %s (node rank %s) local rank %s on %s",
            report.get("rank"),
            pod,
            node_rank,
            report.get("local_rank"),
            report.get("host"),
        )
    if result.reports:
        first = min(result.reports, key=lambda r: r.get("rank", 0))
        digests = {r.get("param_digest") for r in result.reports}
        log.info(
            "parameters: %s across all ranks; held-out loss %.4f -> %.4f",
            "identical" if len(digests) == 1 else f"{len(digests)} DIFFERENT digests",
            first.get("eval_loss_initial", float("nan")),
            first.get("eval_loss_final", float("nan")),
        )
    phases = result.phases.durations(digits=1)
    total = phases.pop("total", 0.0)
    log.info("phases: %s", ", ".join(f"{name} {value:.1f} s" for name, value in phases.items()))
    if keep is not None:
        log.info("kept everything in %s", keep)
    log.info("%s in %.1f s", "OK: the whole chain is consistent" if result.ok else "FAILED", total)
