"""The bootstrap without a rank table: a job's pods from the API or a file (the edge).

``--pods k8s`` (``NPU_JOB_PODS=k8s``, what ``npu-job render`` sets on a routed job without a
rank table) lists the job's pods from the in-cluster API: namespace ``$NPU_JOB_NAMESPACE`` or the
service account's, with the label selector of the job's kind (``--kind``, ``$NPU_JOB_KIND``:
:meth:`~npu_job.kinds.base.JobKind.selector` of ``$MA_VJ_NAME`` and ``$MA_TASK_NAME``; a Volcano
Job's ``volcano.sh/job-name=$MA_VJ_NAME,volcano.sh/task-spec=$MA_TASK_NAME``). ``--pods
PATH|URL`` reads ``kubectl get pods -o json`` (or a ``List`` with HyperNodes and Nodes too)
instead, for tests and dry runs. Either way the source is read again, with a progress line, every
poll interval until the job has all its pods (``$MA_NUM_HOSTS``) and every one is scheduled,
within the wait timeout, exactly as a rank table is waited for; the pods then become the servers
(:mod:`npu_job.bootstrap.kube.jobpods`), and their pod IPs stay beside them for the master's
address.

The topology, first found: ``--topology`` (any source the rank-table path reads); the HyperNodes
or Nodes in the pods file; the cluster's HyperNodes, else node labels, from the API; then the rest
of the usual chain (``$NPU_JOB_TOR_INFO``, ``/etc/npu-job/topology.yaml``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Tuple

from npu_job.errors import InputError, NotReadyError
from npu_job.polling import Backoff, poll

from .base.model import RankTable, Topology
from .kube import jobpods
from .kube.facts import PodFacts, read_pods
from .kube.objects import KubeObjects, decode_objects
from .options import PODS_ENV, BootstrapOptions
from .sources import (
    K8S_TOPOLOGY,
    KubernetesAPI,
    SourceUnavailable,
    Verify,
    read_bytes,
)
from .topologychain import load_topology, read_nodes

log = logging.getLogger(__name__)

# What one look at the source gives: the pods' facts, and the objects of a file (its HyperNodes and
# Nodes serve the topology; the API's topology is listed apart, so none come with its pods)
Listed = Tuple[Tuple[PodFacts, ...], KubeObjects]


class LoadedJob(NamedTuple):
    """A job whose pods are all there and scheduled: its servers and the objects last listed."""

    table: RankTable
    nodes: Tuple[str, ...]  # each server's node name
    location: str  # what the route plan names as the source of the servers
    objects: KubeObjects  # the last listing (a file's Nodes and HyperNodes too)
    roster: jobpods.Roster  # the job's pods the servers were made from
    client: Any = None  # the open KubeClient, when the pods came from the API


def load_job(
    options: BootstrapOptions,
    env: Mapping[str, str],
    verify: Verify,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> LoadedJob:
    """Wait for the job's pods (see the module docstring) and make them the servers."""
    selector = job_selector(options)
    fetch, location, client = _source(options, env, selector, verify)
    log.info(
        "no rank table: the servers are the pods of job %s from %s", _job_text(selector), location
    )
    last: List[Tuple[Optional[jobpods.Roster], KubeObjects, str]] = []

    def attempt() -> Optional[LoadedJob]:
        last[:] = [_attempt(fetch, location, selector)]
        roster, objects, _ = last[0]
        if roster is None or not roster.ready:
            return None
        table = jobpods.roster_table(roster, location)
        log.info("%s", roster.progress())
        return LoadedJob(table, jobpods.node_names(roster), location, objects, roster, client)

    def progress(elapsed: float) -> None:
        log.info(
            "waiting for the job's pods: %s, %.0f s of %.0f s",
            last[0][2],
            elapsed,
            options.wait_timeout,
        )

    job = poll(
        attempt,
        options.wait_timeout,
        Backoff.fixed(options.poll_interval),
        tick=progress,
        clock=clock,
        sleep=sleep,
    )
    if job is not None:
        return job
    roster, _, seen = last[0]
    if roster is not None:
        raise jobpods.not_ready_error(roster, location, options.wait_timeout)
    raise NotReadyError(
        f"{location}: pods: expected the job's pods within "
        f"{options.wait_timeout:.0f} s, last seen {seen}"
    )


def read_job(options: BootstrapOptions, verify: Verify) -> LoadedJob:
    """The job's pods of one read of ``options.pods`` (a file or URL), all scheduled (a pod would
    wait for that; ``npu-job plan`` reads once)."""
    source = options.pods or ""
    objects = decode_objects(read_bytes(source, verify=verify), source)
    roster = jobpods.job_roster(read_pods(objects.pods, source), job_selector(options), source)
    if not roster.ready:
        raise jobpods.not_ready_error(roster, source)
    table = jobpods.roster_table(roster, source)
    return LoadedJob(table, jobpods.node_names(roster), source, objects, roster)


def _job_names(table: RankTable, nodes: Tuple[str, ...]) -> Tuple[str, ...]:
    """What a job's servers may be known by in a Kubernetes topology: node names, then ids."""
    return nodes + tuple(server.server_id for server in table.servers)


def _attempt(
    fetch: Callable[[], Listed], location: str, selector: jobpods.JobSelector
) -> Tuple[Optional[jobpods.Roster], KubeObjects, str]:
    try:
        pods, objects = fetch()  # a missing file, a 403 or a bad certificate raise: no polling
    except SourceUnavailable as error:
        return None, KubeObjects(), f"unreachable ({error.message})"
    roster = jobpods.job_roster(pods, selector, location)
    return roster, objects, roster.progress()


def job_selector(options: BootstrapOptions) -> jobpods.JobSelector:
    """Which pods are the job's: the options' job, task and namespace, and its node count."""
    return jobpods.JobSelector(
        job=options.job,
        task=options.task,
        namespace=options.namespace,
        expected=options.nnodes,
        kind=options.kind,
    )


def _source(
    options: BootstrapOptions, env: Mapping[str, str], selector: jobpods.JobSelector, verify: Verify
) -> Tuple[Callable[[], Listed], str, Any]:
    """How to list the job's pods: ``(fetch, name, the API client or None)``."""
    if options.pods != K8S_TOPOLOGY:
        location = options.pods

        def read() -> Listed:
            objects = decode_objects(read_bytes(location, verify=verify), location)
            return read_pods(objects.pods, location), objects

        return read, location, None
    from .kube.api import NAMESPACE_ENV, KubeClient, job_selector_query, namespace_of, pods_path

    api = KubernetesAPI.from_env(env)
    if api is None:
        raise KubernetesAPI.absent(env, f" for {PODS_ENV}=k8s")
    if not selector.job:
        raise InputError(
            "environment",
            "MA_VJ_NAME",
            f"expected the {selector.kind.title}'s name (MA_VJ_NAME, or --job) to list its pods",
        )
    namespace = selector.namespace or namespace_of(env)
    if not namespace:
        raise InputError(
            "environment",
            NAMESPACE_ENV,
            "expected the job's namespace ($NPU_JOB_NAMESPACE, --namespace, or the "
            "service account's namespace file)",
        )
    path = pods_path(namespace)
    query = job_selector_query(selector.kind, selector.job, selector.task)
    client = KubeClient(api)  # one connection, kept for the topology's lists too
    return (lambda: (client.list_pods(path, query), KubeObjects())), f"{api.base_url}{path}", client


def _job_text(selector: jobpods.JobSelector) -> str:
    from npu_job.errors import shown

    job = shown(selector.job) if selector.job else "(the one in the list)"
    return job + (f" task {shown(selector.task)}" if selector.task else "")


def job_topology(
    options: BootstrapOptions,
    env: Mapping[str, str],
    verify: Verify,
    job: LoadedJob,
) -> Tuple[Optional[Topology], str]:
    """The topology for ``job`` (first found, see the module docstring), the job's own objects
    before the chain the rank-table path walks (:func:`~.topologychain.load_topology`)."""
    try:
        topology, name = _job_topology(options, env, verify, job)
    finally:
        if job.client is not None:
            job.client.close()
    return jobpods.by_server(topology, job.table, job.nodes), name


def _job_topology(
    options: BootstrapOptions,
    env: Mapping[str, str],
    verify: Verify,
    job: LoadedJob,
) -> Tuple[Optional[Topology], str]:
    from .kube.topology import KubeContext, topology_from_objects

    names = _job_names(job.table, job.nodes)
    if options.topology:
        return load_topology(options, job.location, env, verify, names=names)
    extra = read_nodes(options.nodes, verify)
    context = KubeContext(objects=extra, names=names, label_keys=options.topology_labels)
    if job.client is None and (job.objects.hypernodes or job.objects.nodes):
        found = topology_from_objects(job.objects, job.location, options.topology_format, context)
        _log_found(found.topology, job.location, found.notes)
        return found.topology, f"{job.location} ({found.topology.source})"
    if job.client is not None and options.k8s_topology:
        from .kube.api import HYPERNODES_PATH, NODES_PATH, topology_objects

        base = job.client.api.base_url
        objects = topology_objects(job.client, by_name=True)
        if objects.hypernodes or objects.nodes:
            path = HYPERNODES_PATH if objects.hypernodes else NODES_PATH
            name = f"{base}{path}"  # errors name the list read, not the server
            found = topology_from_objects(objects, name, options.topology_format, context)
            if found.topology.placements:
                _log_found(found.topology, name, found.notes)
                return found.topology, f"{name} ({found.topology.source})"
            for note in found.notes:  # why the cluster's objects placed nothing
                log.info("topology: note: %s", note)
        options = options._replace(k8s_topology=False)  # asked already
    return load_topology(options, job.location, env, verify, names=names)


def _log_found(topology: Topology, name: str, notes: Tuple[str, ...]) -> None:
    for note in notes:
        log.info("topology: note: %s", note)
    log.info("topology: %s (%s, %d entries)", name, topology.source, len(topology.placements))
