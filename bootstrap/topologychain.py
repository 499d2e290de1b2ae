"""The switch topology a pod finds: the sources of the chain walked in order (the edge).

The chain (:func:`~npu_job.bootstrap.sources.topology_candidates`): ``--topology`` when named
(it must work), else ``ranktable_tor.json`` beside the rank table, ``$NPU_JOB_TOR_INFO``, the
cluster's HyperNodes or node labels from the in-cluster API, and ``/etc/npu-job/topology.yaml``;
the first found wins, an automatic source that is absent or refuses us is skipped with a log
line. The rank-table path and the pods path (:mod:`.podrun`, after the job's own objects) both
walk it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Mapping, Optional, Tuple

from npu_job.errors import InputError

from .base.model import RankTable, Topology
from .options import BootstrapOptions
from .sources import (
    K8S_TOPOLOGY,
    KubernetesAPI,
    TopologyCandidate,
    Verify,
    is_url,
    read_bytes,
    topology_candidates,
)

log = logging.getLogger(__name__)


def read_nodes(location: Optional[str], verify: Verify = True) -> Any:
    """The KubeObjects of ``--nodes`` (``kubectl get nodes -o json``); none when not given."""
    from .kube.objects import KubeObjects, decode_objects

    if not location:
        return KubeObjects()
    return decode_objects(read_bytes(location, verify=verify), location)


def server_addresses(table: RankTable) -> Tuple[str, ...]:
    """Every address a server of ``table`` may be known by in a topology (canonical's order)."""
    return tuple(
        address
        for server in table.servers
        for address in (server.server_id, server.host_ip, server.container_ip)
        if address
    )


def load_topology(
    options: BootstrapOptions,
    rank_table: str,
    env: Mapping[str, str],
    verify: Verify,
    *,
    names: Optional[Tuple[str, ...]] = None,
) -> Tuple[Optional[Topology], str]:
    """The first topology found (see :func:`~npu_job.bootstrap.sources.topology_candidates`).

    Returns ``(None, "none")`` when there is none. A source named explicitly must work; an
    automatic one that is absent, or (Kubernetes API) refuses us, is skipped with a log line.
    ``names`` are the job's servers: a Kubernetes topology places only those (with the Nodes of
    ``options.nodes`` for a HyperNode file's label members and addresses).
    """
    from .topology import parse_topology

    made: List[Any] = []

    def context() -> Any:
        """The KubeContext of a Kubernetes topology, made (and --nodes read) only for one: the
        rank-table path imports none of it."""
        if not made:
            from .kube.topology import KubeContext

            nodes = read_nodes(options.nodes, verify)
            made.append(KubeContext(objects=nodes, names=names, label_keys=options.topology_labels))
        return made[0]

    chain = topology_candidates(
        options.topology,
        options.topology_format,
        rank_table,
        tor_info=options.tor_info,
        ask_api=options.k8s_topology,
    )
    for candidate in chain:
        if candidate.location == K8S_TOPOLOGY:
            topology_and_name = _api_topology(candidate, env, context())
            if topology_and_name is None:
                continue
            topology, name = topology_and_name
        else:
            found = _read_candidate(candidate, verify)
            if found is None:
                continue
            data, name = found
            topology = parse_topology(data, name, candidate.fmt, context=context)
        if not topology.placements and not candidate.required:
            log.info("topology: %s places no server; trying the next source", name)
            continue
        log.info("topology: %s (%s, %d entries)", name, topology.source, len(topology.placements))
        return topology, f"{name} ({topology.source})"
    log.info("topology: none found")
    return None, "none"


def _api_topology(
    candidate: TopologyCandidate,
    env: Mapping[str, str],
    context: Any,
) -> Optional[Tuple[Topology, str]]:
    """The cluster's HyperNodes, else its node labels, from the in-cluster API; None when not in a
    cluster or (in the automatic chain) the API refuses us or cannot be reached."""
    from .kube.api import HYPERNODES_PATH, NODES_PATH, KubeClient, topology_objects
    from .kube.topology import topology_from_objects

    try:
        # in the automatic chain the API is optional: neither a misconfigured address nor a slow
        # or refusing server holds the pod up
        api = KubernetesAPI.from_env(env)
        if api is None:
            if candidate.required:
                raise KubernetesAPI.absent(env, "")
            return None
        with KubeClient(api, quick=not candidate.required) as client:
            objects = topology_objects(client)
    except InputError as error:
        if candidate.required:
            raise
        log.info("topology: skipping Kubernetes node labels and HyperNodes: %s", error.message)
        return None
    path = HYPERNODES_PATH if objects.hypernodes else NODES_PATH
    listed = f"{api.base_url}{path}"  # errors name the list read, not the server
    found = topology_from_objects(objects, listed, candidate.fmt, context)
    for note in found.notes:
        log.info("topology: note: %s", note)
    return found.topology, listed


def _read_candidate(candidate: TopologyCandidate, verify: Verify) -> Optional[Tuple[bytes, str]]:
    absent = not is_url(candidate.location) and not os.path.exists(candidate.location)
    if absent and not candidate.required:
        return None
    return read_bytes(candidate.location, verify=verify), candidate.location
