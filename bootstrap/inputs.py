"""The bootstrap's inputs read once from named sources: the servers, their topology, their nodes.

:func:`read_inputs` is what ``npu-job plan`` plans for: a rank table (a path, a directory or a URL,
located as a pod locates ``--rank-table``) or a job's pods (``kubectl get pods -o json``, or a
``List`` with the HyperNodes and Nodes too), and the topology by the pod's first rules: the one
named, else ``ranktable_tor.json`` beside a local rank table
(:func:`~npu_job.bootstrap.sources.ranktable_tor_beside`), else the HyperNodes or Nodes that came
with the pods. It reads each source once and never waits; the pod waits for the same sources and
then goes on along its chain (:mod:`npu_job.bootstrap.run`, :mod:`npu_job.bootstrap.podrun`),
with the helpers here.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple, Optional, Tuple

from .model import RankTable, Topology
from .sources import Verify, locate_rank_table, ranktable_tor_beside, read_bytes

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


def read_inputs(
    *,
    rank_table: Optional[str] = None,
    pods: Optional[str] = None,
    selector: Any = None,
    topology: Optional[str] = None,
    topology_format: Optional[str] = None,
    nodes: Any = None,
    label_keys: Optional[Tuple[str, ...]] = None,
    verify: Verify = True,
) -> Inputs:
    """Read the servers (``pods`` when given, else ``rank_table``) and their topology.

    ``selector`` (a :class:`~npu_job.bootstrap.kube.jobpods.JobSelector`) picks the job's pods;
    ``nodes`` (:func:`read_nodes`) serve a HyperNode topology's label members and addresses.
    Errors are :class:`~npu_job.errors.NpuJobError`; pods not all scheduled are one too.
    """
    if nodes is None:
        nodes = read_nodes(None)
    if pods:
        return _read_pods(pods, selector, topology, topology_format, nodes, label_keys, verify)
    from .kube.topology import KubeContext
    from .ranktable import parse_rank_table
    from .topologychain import server_addresses

    table_source = locate_rank_table(rank_table, {})
    table = parse_rank_table(read_bytes(table_source, verify=verify), table_source)
    topology_source = topology
    if topology_source is None:
        beside = ranktable_tor_beside(table_source)
        if beside is not None and os.path.isfile(beside):
            topology_source = beside
    found = None
    if topology_source is not None:
        context = KubeContext(objects=nodes, names=server_addresses(table), label_keys=label_keys)
        found = _parse(topology_source, topology_format, context, verify)
    return Inputs(table, table_source, found, topology_source, None)


def _read_pods(
    source: str,
    selector: Any,
    topology: Optional[str],
    topology_format: Optional[str],
    nodes: Any,
    label_keys: Optional[Tuple[str, ...]],
    verify: Verify,
) -> Inputs:
    """A job's pods as the servers; the topology named, else the one in the same document."""
    from .kube import jobpods
    from .kube.facts import read_pods
    from .kube.objects import decode_objects
    from .kube.topology import KubeContext, topology_from_objects

    objects = decode_objects(read_bytes(source, verify=verify), source)
    roster = jobpods.job_roster(
        read_pods(objects.pods, source), selector or jobpods.JobSelector(), source
    )
    if not roster.ready:
        raise jobpods.not_ready_error(roster, source)
    table = jobpods.roster_table(roster, source)
    node_names = jobpods.node_names(roster)
    names = job_names(table, node_names)
    found, topology_source = None, topology
    if topology_source is not None:
        context = KubeContext(objects=objects + nodes, names=names, label_keys=label_keys)
        found = _parse(topology_source, topology_format, context, verify)
    elif objects.hypernodes or objects.nodes or nodes.nodes:
        listed = topology_from_objects(
            objects,
            source,
            topology_format,
            KubeContext(objects=nodes, names=names, label_keys=label_keys),
        )
        for note in listed.notes:
            log.info("topology: note: %s", note)
        found, topology_source = listed.topology, f"{source} ({listed.topology.source})"
    return Inputs(
        table, source, jobpods.by_server(found, table, node_names), topology_source, node_names
    )


def _parse(location: str, fmt: Optional[str], context: Any, verify: Verify) -> Topology:
    from .topology import parse_topology

    return parse_topology(read_bytes(location, verify=verify), location, fmt, context=context)
