"""The bootstrap's inputs read once from named sources: the servers, their topology, their nodes.

:func:`read_inputs` is what ``npu-job plan`` plans for: a rank table (a path, a directory or a URL,
located as a pod locates ``--rank-table``) or a job's pods (``kubectl get pods -o json``, or a
``List`` with the HyperNodes and Nodes too), and their topology found by the pod's own loaders,
in the pod's order: the one named, else the HyperNodes or Nodes that came with the pods, else
``ranktable_tor.json`` beside the servers' file, else ``/etc/npu-job/topology.yaml``. What only a
pod in a cluster has is left out: the environment, the in-cluster API and waiting.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Optional, Tuple

from .base.model import RankTable, Topology
from .options import BootstrapOptions
from .sources import Verify, locate_rank_table, read_bytes

log = logging.getLogger(__name__)


class Inputs(NamedTuple):
    """The servers to order, where they came from, and their topology (None: none found)."""

    table: RankTable
    table_source: str  # the rank table's path or URL, or the pods' source
    topology: Optional[Topology]
    topology_source: Optional[str]
    node_names: Optional[Tuple[str, ...]]  # each server's node (pods only)


def read_nodes(location: Optional[str], verify: Verify = True) -> Any:
    """The KubeObjects of ``--nodes`` (``kubectl get nodes -o json``); none when not given."""
    from .kube.objects import KubeObjects, decode_objects

    if not location:
        return KubeObjects()
    return decode_objects(read_bytes(location, verify=verify), location)


def job_names(table: RankTable, nodes: Tuple[str, ...]) -> Tuple[str, ...]:
    """What a job's servers may be known by in a Kubernetes topology: node names, then ids."""
    return nodes + tuple(server.server_id for server in table.servers)


def read_inputs(options: BootstrapOptions, verify: Verify = True) -> Inputs:
    """Read the servers (``options.pods`` when given, else ``options.rank_table``) and their
    topology, as a pod would in a cluster that offers nothing but these files.

    A pod's own loaders do the reading (:func:`~.topologychain.load_topology`,
    :func:`~.podrun.job_topology`), with what only a pod in a cluster has taken away: the
    environment, the in-cluster API, ``$NPU_JOB_TOR_INFO`` and waiting. The sources are each read
    once; pods not all scheduled are an :class:`~npu_job.errors.NpuJobError`, like any other.
    """
    from .topologychain import load_topology, server_addresses

    offline = options._replace(k8s_topology=False, tor_info=None)
    if options.pods:
        from .podrun import job_topology

        job = _read_job(options.pods, options, verify)
        topology, name = job_topology(offline, {}, verify, job)
        return Inputs(job.table, job.location, topology, _named(name), job.nodes)
    from .ranktable import parse_rank_table

    table_source = locate_rank_table(options.rank_table)
    table = parse_rank_table(read_bytes(table_source, verify=verify), table_source)
    topology, name = load_topology(offline, table_source, {}, verify, names=server_addresses(table))
    return Inputs(table, table_source, topology, _named(name), None)


def _named(name: str) -> Optional[str]:
    return None if name == "none" else name


def _read_job(source: str, options: BootstrapOptions, verify: Verify) -> Any:
    """The job's pods of one read of ``source``, all scheduled (a pod would wait for that)."""
    from .kube import jobpods
    from .kube.facts import read_pods
    from .kube.objects import decode_objects
    from .podrun import LoadedJob, job_selector

    objects = decode_objects(read_bytes(source, verify=verify), source)
    roster = jobpods.job_roster(read_pods(objects.pods, source), job_selector(options, {}), source)
    if not roster.ready:
        raise jobpods.not_ready_error(roster, source)
    table = jobpods.roster_table(roster, source)
    return LoadedJob(table, jobpods.node_names(roster), source, objects, roster)
