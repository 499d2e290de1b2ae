"""The bootstrap's command line: ``bash bootstrap.sh``, ``python -m npu_job.bootstrap`` and
``npu-job bootstrap`` (pod step 1).

Its flags (:func:`configure`; they override the environment variables named in their help) and
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

if TYPE_CHECKING:
    import argparse  # imported where a parser is built: the pod command passes no flag

HELP = "compute this pod's routing-affine node rank (pod step 1)"

_EPILOG = """\
The pod command runs it first and reads its files:
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

Environment: RANK_TABLE_FILE, NPU_JOB_PODS, MA_VJ_NAME, MA_TASK_NAME, MA_NUM_HOSTS,
NPU_JOB_NAMESPACE, NPU_JOB_TOPOLOGY, NPU_JOB_TOPOLOGY_FORMAT, NPU_JOB_TOR_INFO,
NPU_JOB_NODES, NPU_JOB_TOPOLOGY_LABELS, NPU_JOB_K8S_TOPOLOGY (0 = do not ask the Kubernetes API),
MA_CURRENT_HOST_IP, VC_TASK_INDEX, HCCL_ALGO, NPU_JOB_FULL_NODE_DEVICES, NPU_JOB_OUTPUT_DIR,
NPU_JOB_WAIT_TIMEOUT, NPU_JOB_POLL_INTERVAL, NPU_JOB_STRICT, NPU_JOB_CA_BUNDLE.
"""

TOPOLOGY_FORMATS = (
    "cce-ranktable-tor",
    "basic-tor-node-cm",
    "k8s-node-labels",
    "volcano-hypernodes",
    "file",
)
SECONDS = seconds(zero_ok=True)


def configure(parser: argparse.ArgumentParser) -> None:
    import argparse

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    inputs = parser.add_argument_group("inputs")
    inputs.add_argument(
        "--rank-table",
        "--rank_table",
        dest="rank_table",
        metavar="PATH|URL",
        help="rank table file, directory holding jobstart_hccl.json "
        "(or hccl.json), or http(s) URL "
        "(default: $RANK_TABLE_FILE, /user/config/jobstart_hccl.json, "
        "/user/serverid/devindex/config/hccl.json)",
    )
    inputs.add_argument(
        "--pods",
        metavar="k8s|PATH|URL",
        help="no rank table: the job's pods are the servers, listed from the "
        "in-cluster API ('k8s') or read from kubectl get pods -o json; waits "
        "until every pod is scheduled (default: $NPU_JOB_PODS; a rank table "
        "named by --rank-table or $RANK_TABLE_FILE wins)",
    )
    inputs.add_argument(
        "--job",
        metavar="NAME",
        help="with --pods: the Volcano job (label volcano.sh/job-name; default: $MA_VJ_NAME)",
    )
    inputs.add_argument(
        "--task",
        metavar="NAME",
        help="with --pods: its task (label volcano.sh/task-spec; default: $MA_TASK_NAME)",
    )
    inputs.add_argument(
        "--namespace",
        metavar="NAME",
        help="with --pods k8s: the job's namespace (default: $NPU_JOB_NAMESPACE, "
        "else the service account's)",
    )
    inputs.add_argument(
        "--topology",
        metavar="PATH|URL|k8s",
        help="switch topology: a file, a URL, or 'k8s' for the cluster's "
        "HyperNodes, else its node labels, from the Kubernetes API "
        "(default: $NPU_JOB_TOPOLOGY, else the first found of "
        "ranktable_tor.json "
        "beside the rank table, $NPU_JOB_TOR_INFO, the Kubernetes API, "
        "/etc/npu-job/topology.yaml)",
    )
    inputs.add_argument(
        "--topology-format",
        "--topology_format",
        dest="topology_format",
        choices=TOPOLOGY_FORMATS,
        help="read --topology as this format (default: detect by content)",
    )
    inputs.add_argument(
        "--nodes",
        metavar="PATH|URL",
        help="the cluster's Nodes (kubectl get nodes -o json) for a HyperNode "
        "topology file: their labels serve labelMatch members, their "
        "InternalIPs key the result (default: $NPU_JOB_NODES)",
    )
    inputs.add_argument(
        "--topology-labels",
        "--topology_labels",
        dest="topology_labels",
        metavar="KEY,KEY,...",
        help="read the switch path from these node labels, outermost first, "
        "instead of the known Volcano, CCE, EKS, GKE and topograph labels "
        "(default: $NPU_JOB_TOPOLOGY_LABELS)",
    )
    inputs.add_argument(
        "--ca-bundle",
        "--ca_bundle",
        dest="ca_bundle",
        metavar="FILE",
        help="CA certificates for https:// inputs (default: $NPU_JOB_CA_BUNDLE, else the system's)",
    )
    who = parser.add_argument_group("this pod")
    who.add_argument(
        "--host-ip",
        "--host_ip",
        dest="host_ip",
        metavar="IP",
        help="this host's IP, matched to a server_id (default: $MA_CURRENT_HOST_IP)",
    )
    who.add_argument(
        "--pod-index",
        "--pod_index",
        dest="pod_index",
        metavar="N",
        help="this pod's scheduler index, a cross-check (default: $VC_TASK_INDEX)",
    )
    planning = parser.add_argument_group("planning and output")
    planning.add_argument(
        "--collective",
        choices=("ring", "nhr", "rhd"),
        help="collective to optimise the order for (default: from $HCCL_ALGO, else ring)",
    )
    planning.add_argument(
        "--full-node-devices",
        "--full_node_devices",
        dest="full_node_devices",
        type=int_at_least(1),
        metavar="N",
        help="devices of a full node: a rank table with any server holding another "
        "count is not reordered (partial nodes; platform rule) "
        "(default: $NPU_JOB_FULL_NODE_DEVICES, else only equal counts on "
        "every server are required)",
    )
    planning.add_argument(
        "--output-dir",
        "--output_dir",
        dest="output_dir",
        metavar="DIR",
        help="where to write the files (default: $NPU_JOB_OUTPUT_DIR, else /tmp)",
    )
    planning.add_argument(
        "--wait-timeout",
        "--wait_timeout",
        dest="wait_timeout",
        type=SECONDS,
        metavar="SECONDS",
        help="give up waiting for status 'completed' after this long "
        "(default: $NPU_JOB_WAIT_TIMEOUT, else 300)",
    )
    planning.add_argument(
        "--poll-interval",
        "--poll_interval",
        dest="poll_interval",
        type=SECONDS,
        metavar="SECONDS",
        help="seconds between rank table polls (default: $NPU_JOB_POLL_INTERVAL, else 5)",
    )
    planning.add_argument(
        "--strict",
        action="store_true",
        default=None,
        help="exit with the error's code instead of falling back to "
        "scheduler order "
        "(also NPU_JOB_STRICT=1)",
    )
    planning.add_argument(
        "--json",
        action="store_true",
        help="print the route plan (JSON, with a version field) on stdout",
    )


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
