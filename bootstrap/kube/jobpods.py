"""A job's pods as the servers to order, when there is no rank table (pure).

Which pods are the job's, and each one's index, is the job kind's to say (its record,
:class:`~npu_job.kinds.base.JobKind`): a pod is the job's when
:meth:`~npu_job.kinds.base.JobKind.selects` its labels (a Volcano Job's controller labels every
pod it creates ``volcano.sh/job-name``, ``volcano.sh/task-spec`` and ``volcano.sh/task-index``,
and names it ``<job>-<task>-<index>``); its index is what
:meth:`~npu_job.kinds.base.JobKind.pod_index` reads of its labels and name (a Volcano pod's
``volcano.sh/task-index`` label, else the index its name ends in); its node is ``spec.nodeName``.
Pods that are going away (a deletion timestamp) or have ended (``Succeeded``, ``Failed``) do not
count, nor, where the kind counts the restarts of the whole job (a JobSet's ``restart-attempt``),
the pods of an earlier attempt than another listed pod's
(:meth:`~npu_job.kinds.base.JobKind.of_latest_attempt`). A pod without an index (no index label,
and a name that does not end as the kind names its pods), a label that is no index, or two live
pods with one index: each is an :class:`~npu_job.errors.InputError` naming the pod and the
field.

The servers are the pods in index order, each known by its node's address as a rank table knows
it (``server_id`` = the pod's ``status.hostIP``, the node's IP, which ``MA_CURRENT_HOST_IP`` holds
too); its node's name is kept beside it (:func:`node_names`) for the topology, which names nodes
(:func:`by_server` keys a topology by the servers), and its pod IP (:func:`pod_addresses`) for the
launcher's master address. A server's device count is its pod's accelerators (``nvidia.com/gpu``,
``huawei.com/ascend-*``...), 1 for a pod without any. Routing needs one pod per node: two pods on
one node are an error naming both.

A :class:`Roster` is *ready* when the job has all its pods (``expected``, e.g. ``MA_NUM_HOSTS``;
else as many as the highest index listed says) and every one is scheduled: bound to a node
(``spec.nodeName``) and taken up by its kubelet (``status.hostIP``, moments later; and its pod IP
too where the kind reaches the master by it,
:attr:`~npu_job.kinds.base.JobKind.master_by_pod_ip`), so that every pod that reads the list reads
the same servers. Until then it says what it waits for. Nothing here depends on the order the pods
are listed in.
"""

from __future__ import annotations

from itertools import islice
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, cast

from npu_job.kinds import DEFAULT, KINDS
from npu_job.kinds.base import JobKind

from npu_job.errors import InputError, NotReadyError, shown
from npu_job.parsing import MAX_COUNT_DIGITS, count_from_text

from ..base.fields import fail
from ..base.model import Device, Placement, RankTable, Server, Topology
from .facts import PodFacts
from .objects import POD, object_field

ENDED_PHASES = ("Succeeded", "Failed")
POD_LIST_VERSION = "pods"  # RankTable.version of a table made from pods
LISTED = 5  # pods a progress line names before counting the rest


class JobSelector(NamedTuple):
    """Which pods are the job's: its kind's labels, the namespace, how many there must be."""

    job: Optional[str] = None  # the kind's job label; None: the one job the pods belong to
    task: Optional[str] = None  # the kind's group label (Volcano's task); None: every group
    namespace: Optional[str] = None
    expected: Optional[int] = None  # pods the job has; None: up to the highest index listed
    kind: JobKind = KINDS[DEFAULT]


class Roster(NamedTuple):
    """The job's live pods by index, and whether all of them are there and scheduled."""

    job: str
    pods: Tuple[PodFacts, ...]  # index order (those listed; a missing index is a gap)
    indices: Tuple[int, ...]
    expected: int
    unscheduled: Tuple[str, ...]  # names of pods without a node (or a host IP) yet
    missing: Tuple[int, ...]  # the lowest indices below expected that no live pod has (a few)

    @property
    def missing_count(self) -> int:
        """How many indices below expected no live pod has (the indices are distinct and each
        below expected, so it is what the count of them leaves)."""
        return self.expected - len(self.indices)

    @property
    def ready(self) -> bool:
        return not self.missing_count and not self.unscheduled

    def progress(self) -> str:
        """``6 of 8 pods of job 'llama' scheduled; waiting for ...``, for a log line."""
        scheduled = len(self.pods) - len(self.unscheduled)
        waiting: List[str] = []
        if self.missing_count:
            listed = _few([str(i) for i in self.missing], self.missing_count)
            waiting.append(f"pod index(es) {listed} not created")
        if self.unscheduled:
            waiting.append(f"{_few([shown(n) for n in self.unscheduled])} not scheduled")
        text = f"{scheduled} of {self.expected} pods of job {shown(self.job)} scheduled"
        return text + (f"; waiting: {'; '.join(waiting)}" if waiting else "")


def job_roster(pods: Sequence[PodFacts], selector: JobSelector, source: str) -> Roster:
    """The pods of ``selector``'s job (see the module docstring)."""
    kind = selector.kind
    job = selector.job if selector.job is not None else _only_job(pods, selector, source)
    group, namespace, selects = selector.task or "", selector.namespace, kind.selects
    live = [
        pod
        for pod in pods
        if selects(pod.labels, job, group)
        and (namespace is None or pod.namespace == namespace)
        and not pod.deleting
        and pod.phase not in ENDED_PHASES
    ]
    if kind.attempt_label:  # pods a restart of the whole job is replacing do not count
        latest = kind.of_latest_attempt([pod.labels for pod in live])
        live = [pod for pod, current in zip(live, latest) if current]
    labelled = _labelled_indices(live, kind)
    if labelled is not None and len(set(labelled)) == len(labelled):
        chosen = dict(zip(labelled, live))
    else:  # pod by pod: indices from names, or an index given twice (which is an error)
        chosen = {}
        for pod in live:
            index = pod_index(pod, source, kind)
            if index in chosen:
                fail(
                    source,
                    _index_field(pod, kind),
                    f"one live pod per index; {index} is also pod {shown(chosen[index].name)}",
                )
            chosen[index] = pod
    # without a count, the highest index says how many pods the job has at least
    expected = selector.expected if selector.expected is not None else max(chosen, default=-1) + 1
    if chosen and max(chosen) >= expected:
        highest = max(chosen)
        fail(
            source,
            _index_field(chosen[highest], kind),
            f"a pod index below {expected}, the job's pod count (MA_NUM_HOSTS); got {highest}",
        )
    indices = tuple(sorted(chosen))
    ordered = tuple(map(chosen.__getitem__, indices))
    # distinct indices, each in 0..expected-1: expected less their count are missing, and the
    # lowest of those are found past at most len(indices) present ones (whatever the highest
    # index a pod claims, when there is no count to hold it to)
    missing_count = expected - len(indices)
    absent = (index for index in range(expected) if index not in chosen)
    return Roster(
        job,
        ordered,
        indices,
        expected,
        tuple([pod.name for pod in ordered if not _scheduled(pod, kind)]),
        tuple(islice(absent, LISTED)) if missing_count else (),
    )


def _scheduled(pod: PodFacts, kind: JobKind) -> bool:
    """Bound to a node and taken up by its kubelet (with its pod IP, where the kind needs it)."""
    return bool(pod.node_name and pod.host_ip and (pod.pod_ip or not kind.master_by_pod_ip))


def _labelled_indices(pods: Sequence[PodFacts], kind: JobKind) -> Optional[List[int]]:
    """Each pod's index from the kind's index label, as :func:`pod_index` reads it, in one pass
    at C speed; None, having decided nothing, when some pod has no such label or one that is not
    a plain count, or the kind reads indices otherwise (then :func:`pod_index` reads each, or
    names the bad one)."""
    label = kind.index_label
    if not label or type(kind).pod_index is not JobKind.pod_index:
        return None
    found = [pod.labels.get(label) for pod in pods]
    if None in found:
        return None
    texts = cast(List[str], found)
    digits = "".join(texts)
    if not (digits.isdigit() and digits.isascii()) or max(map(len, texts)) > MAX_COUNT_DIGITS:
        return None  # (an empty list of pods joins to "", which is no digit either)
    try:
        return list(map(int, texts))  # each a run of ASCII digits
    except ValueError:  # an empty label
        return None


def pod_index(pod: PodFacts, source: str, kind: JobKind = KINDS[DEFAULT]) -> int:
    """The pod's index as its kind reads it (:meth:`~npu_job.kinds.base.JobKind.pod_index`: a
    Volcano pod's ``volcano.sh/task-index`` label, else the index its name ends in); none is an
    error naming the field it should have come from."""
    index = kind.pod_index(pod.labels, pod.name)
    if index is not None:
        return index
    label = pod.labels.get(kind.index_label) if kind.index_label else None
    if label is not None and count_from_text(label) is None:
        fail(source, _index_field(pod, kind), "a pod index (digits)", label)
    expected = kind.name_expected
    if kind.index_label:
        expected = f"a {kind.index_label} label or {expected}"
    fail(source, _field(pod, "metadata.name"), expected, pod.name)


def _index_field(pod: PodFacts, kind: JobKind) -> str:
    """Where ``pod``'s index was read: its kind's index label, where it has one, else its name."""
    if kind.index_label and kind.index_label in pod.labels:
        return _field(pod, f"metadata.labels.{kind.index_label}")
    return _field(pod, "metadata.name")


def roster_table(roster: Roster, source: str) -> RankTable:
    """The servers to order: one per pod, in index order, known by its host IP (a ready
    roster)."""
    if not roster.ready:
        raise ValueError(f"roster of job {roster.job!r} is not ready: {roster.progress()}")
    nodes = node_names(roster)
    on_node: Dict[str, PodFacts] = {}
    for pod in roster.pods if len(set(nodes)) != len(nodes) else ():  # name the two pods
        other = on_node.setdefault(pod.node_name, pod)
        if other is not pod:
            fail(
                source,
                _field(pod, "spec.nodeName"),
                f"one pod of the job per node (routing orders nodes); pods {shown(other.name)} "
                f"and {shown(pod.name)} are both on node {shown(pod.node_name)} (in the job "
                "spec, anti_affinity: true)",
            )
    counts = [pod.accelerators or 1 for pod in roster.pods]
    device_sets: Dict[int, Tuple[Device, ...]] = {  # immutable: one tuple per count, shared
        count: tuple(Device(str(position)) for position in range(count)) for count in set(counts)
    }
    devices = list(map(device_sets.__getitem__, counts))
    addresses = [pod.host_ip for pod in roster.pods]
    servers = [
        Server(address, index, devices_of, host_ip=address, pod_name=pod.name)
        for address, index, devices_of, pod in zip(addresses, roster.indices, devices, roster.pods)
    ]
    table = RankTable(version=POD_LIST_VERSION, status="completed", servers=tuple(servers))
    vars(table)["device_counts"] = tuple(counts)  # its cache: what it would count again
    return table


def node_names(roster: Roster) -> Tuple[str, ...]:
    """The node of each server of :func:`roster_table`, in the same order."""
    return tuple(pod.node_name for pod in roster.pods)


def pod_addresses(roster: Roster) -> Tuple[str, ...]:
    """The pod IP of each server of :func:`roster_table` (``""`` where a pod has none yet), in
    the same order."""
    return tuple(pod.pod_ip for pod in roster.pods)


def by_server(
    topology: Optional[Topology], table: RankTable, nodes: Sequence[str]
) -> Optional[Topology]:
    """``topology`` keyed by ``table``'s servers: each placed by its node's name (``nodes[i]`` for
    server ``i``), else by its address."""
    if topology is None:
        return None
    placement_of = topology.placements.get
    by_node = list(map(placement_of, nodes))
    if all(by_node):  # every node placed (a Placement is always true): the usual job, in bulk
        ids = [server.server_id for server in table.servers]
        return Topology(dict(zip(ids, cast(List[Placement], by_node))), source=topology.source)
    placements = {}
    for server, node in zip(table.servers, nodes):
        placement = placement_of(node) or placement_of(server.server_id)
        if placement is not None:
            placements[server.server_id] = placement
    return Topology(placements, source=topology.source)


def _only_job(pods: Sequence[PodFacts], selector: JobSelector, source: str) -> str:
    kind = selector.kind
    label = kind.job_label
    jobs = sorted(
        {
            pod.labels[label]
            for pod in pods
            if label in pod.labels
            and kind.selects(pod.labels, pod.labels[label])
            and (selector.namespace is None or pod.namespace == selector.namespace)
        }
    )
    if len(jobs) == 1:
        return jobs[0]
    if not jobs:
        raise InputError(source, "items", f"expected pods of a {kind.title} (label {label})")
    raise InputError(
        source,
        "items",
        f"expected the pods of one {kind.title}, got pods of {len(jobs)} jobs "
        f"({_few([shown(job) for job in jobs])})",
        tip="--job names the one to plan",
    )


def _field(pod: PodFacts, path: str) -> str:
    return object_field(POD, pod.where, pod.name, path)


def _few(items: Sequence[str], total: Optional[int] = None) -> str:
    """The first :data:`LISTED` of ``items`` and how many more (of ``total``, default all)."""
    total = len(items) if total is None else total
    listed = ", ".join(items[:LISTED])
    return listed + (f" and {total - LISTED} more" if total > LISTED else "")


def not_ready_error(roster: Roster, source: str, waited: Optional[float] = None) -> NotReadyError:
    """The error of a job whose pods are not all there and scheduled (after ``waited`` s)."""
    within = f" within {waited:.0f} s" if waited is not None else ""
    return NotReadyError(
        f"{source}: pods: expected every pod of job {shown(roster.job)} scheduled{within}; "
        f"{roster.progress()}",
        tip="raise NPU_JOB_WAIT_TIMEOUT (or --wait-timeout) if the scheduler is slow to place "
        "the job"
        if waited is not None
        else None,
    )
