"""The bootstrap's inputs, read in one sequence by every pod and by ``npu-job plan`` (the edge).

:func:`load_inputs` reads, in this order:

1. **the servers**: a rank table (a path, a directory or a URL, located as ``--rank-table`` says,
   then the default locations) or, with ``--pods`` and no rank table, the job's pods
   (:mod:`.podrun`);
2. **the job's node count** (``--nnodes``, ``$MA_NUM_HOSTS``) against a rank table's servers:
   another count is refused (:func:`~.identity.check_job_nodes`), and every pod, given the same
   count, refuses it alike;
3. **this pod** among them (a pod only: :mod:`.identity`);
4. **their topology**, first found in the pod's chain (:mod:`.topologychain`; for pods, the
   HyperNodes or Nodes that came with them first).

What only a pod in a cluster has comes with :class:`InPod`: the environment, the in-cluster API,
``$NPU_JOB_TOR_INFO`` and waiting (for ``status: completed``, or for every pod to be scheduled).
Without it (``npu-job plan``) every source is read once, as it is.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from .base.model import Plan, RankTable, Topology
from .options import BootstrapOptions
from .sources import Verify, locate_rank_table, read_bytes

log = logging.getLogger(__name__)


class InPod(NamedTuple):
    """What a pod has that ``npu-job plan`` has not: its environment, and time to wait."""

    env: Mapping[str, str]
    clock: Callable[[], float]
    sleep: Callable[[float], None]


class Inputs(NamedTuple):
    """The servers to order, where they came from, this pod among them, and their topology."""

    table: RankTable
    table_source: str  # the rank table's path or URL, or the pods' source
    topology: Optional[Topology]
    topology_source: str  # "none" when none was found
    node_names: Optional[Tuple[str, ...]]  # each server's node (pods only)
    pod_index: Optional[int] = None  # this pod's index (in a pod)
    # the rank table's document in a plan's order (a pod's rank table only)
    reorder: Optional[Callable[[Plan], Dict[str, Any]]] = None
    pod_ips: Optional[Tuple[str, ...]] = None  # each server's pod IP, "" for none yet (pods only)

    @property
    def from_pods(self) -> bool:
        """The servers are the job's pods (no rank table)."""
        return self.node_names is not None

    def address_of(self, pod_index: int) -> Optional[str]:
        """The address train.sh reaches the server of ``pod_index`` at (the new rank 0's, for the
        launcher's master): its pod IP when the servers are the job's pods (None while it has
        none), else its rank table entry's pod address (``container_ip``: MindX's tables give the
        pod's, which is not its host's outside the host network), else its host address
        (``host_ip``, else ``server_id``)."""
        if self.pod_ips is not None:
            return self.pod_ips[pod_index] or None
        server = self.table.servers[pod_index]
        return server.container_ip or server.host_ip or server.server_id


def _ignore(**fields: Any) -> None:
    pass


def load_inputs(
    options: BootstrapOptions,
    verify: Verify = True,
    pod: Optional[InPod] = None,
    noted: Callable[..., None] = _ignore,
) -> Inputs:
    """Read the inputs in the module docstring's order; ``pod`` None: as ``npu-job plan`` does.

    ``noted(field=value)`` hears each of ``rank_table``, ``pods``, ``node_count`` (with the
    ``table``), ``pod_index`` and ``topology`` as soon as it is known, so that a run stopped by
    a later step can say how far it got. Errors are :class:`~npu_job.errors.NpuJobError` s.
    """
    from .topologychain import load_topology, server_addresses

    env: Mapping[str, str] = pod.env if pod is not None else {}
    if pod is None:  # nothing but the named files: not the API, not a mounted tor_info
        options = options._replace(k8s_topology=False, tor_info=None)
    job: Any = None
    reorder: Optional[Callable[[Plan], Dict[str, Any]]] = None
    if options.pods and not options.rank_table:
        from . import podrun  # no rank table: the job's pods are the servers

        if pod is None:
            job = podrun.read_job(options, verify)
        else:
            job = podrun.load_job(options, env, verify, pod.clock, pod.sleep)
        table, source = job.table, job.location
        noted(pods=source)
    else:
        source = locate_rank_table(options.rank_table)
        noted(rank_table=source)
        if pod is None:
            from .ranktable import parse_rank_table

            table = parse_rank_table(read_bytes(source, verify=verify), source)
        else:
            table, reorder = _wait_for_rank_table(options, source, verify, pod)
    noted(node_count=table.node_count, table=table)
    if job is None:  # the pods path waited for that many pods
        from .identity import check_job_nodes

        check_job_nodes(table, options.nnodes, source, _named_count(options, env))
    pod_index = None
    if pod is not None:
        pod_index = _this_pod(options, table, source, from_pods=job is not None)
        noted(pod_index=pod_index)
    pod_ips = None
    if job is not None:
        from . import podrun
        from .kube.jobpods import pod_addresses

        topology, topology_source = podrun.job_topology(options, env, verify, job)
        pod_ips = pod_addresses(job.roster)
    else:
        topology, topology_source = load_topology(
            options, source, env, verify, names=server_addresses(table)
        )
    noted(topology=topology_source)
    nodes = job.nodes if job is not None else None
    return Inputs(table, source, topology, topology_source, nodes, pod_index, reorder, pod_ips)


def _wait_for_rank_table(
    options: BootstrapOptions, location: str, verify: Verify, pod: InPod
) -> Tuple[RankTable, Callable[[Plan], Dict[str, Any]]]:
    """The completed rank table at ``location``, and how to write it in a plan's order."""
    # imported once there is a rank table: a pod without one (the fallback) never reads one
    from . import wait
    from .ranktable import reordered_document

    log.debug("rank table: %s", location)
    loaded = wait.wait_for_rank_table(
        lambda: read_bytes(location, verify=verify),
        location,
        timeout=options.wait_timeout,
        interval=options.poll_interval,
        clock=pod.clock,
        sleep=pod.sleep,
    )
    # the run owns this freshly decoded document and only serialises the result
    return (
        loaded.table,
        lambda plan: reordered_document(loaded.document, loaded.table, plan, in_place=True),
    )


def _named_count(options: BootstrapOptions, env: Mapping[str, str]) -> str:
    """Where the job's node count came from: the variable every pod is given, else the flag."""
    from npu_job.parsing import count_from_text

    from .options import JOB_SIZE_ENV

    given = count_from_text(env.get(JOB_SIZE_ENV, "").strip())
    return JOB_SIZE_ENV if given is not None and given == options.nnodes else "--nnodes"


def _this_pod(options: BootstrapOptions, table: RankTable, source: str, *, from_pods: bool) -> int:
    from . import identity

    index_env = options.kind.index_env
    return identity.find_pod_index(
        table,
        options.host_ip,
        identity.parse_task_index(options.pod_index, index_env),
        source,
        index_env=index_env,
        **(
            {"entries": "pods", "what": "the job's pods", "ids": "pods' host IPs"}
            if from_pods
            else {}
        ),
    )
