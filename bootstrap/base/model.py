"""The bootstrap's domain: what a cluster looks like, where its nodes sit, and the plan for them.

Small frozen dataclasses only; no I/O and no parsing here. Readers (``ranktable``, ``topology``)
build these from bytes, the planner turns them into a :class:`Plan`, the scorer measures orders,
and the writers serialise results. Every module of the bootstrap imports this one and none of the
others sideways. Building thousands of them fast from already validated columns is ``columns``'s.

Conventions:

* A *pod index* is the scheduler's index of a pod (``VC_TASK_INDEX``); it is also the position of
  the server in a CCE rank table's ``server_list``.
* A *node rank* is the rank of a whole node (pod) in the new order; worker ranks are
  ``node_rank * nproc_per_node + local_rank``.
* Switch paths list switch ids outermost first; the last tier is the ToR (top-of-rack switch).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Dict, Generic, Mapping, Optional, Sequence, Tuple, TypeVar

try:
    from functools import cached_property  # novermin: the fallback below serves 3.7
except ImportError:  # Python 3.7: the pod side runs on the image's python3
    _Value = TypeVar("_Value")

    class cached_property(Generic[_Value]):  # type: ignore[no-redef]  # noqa: N801
        """``functools.cached_property`` as these frozen dataclasses use it: computed once, kept in
        the instance's ``__dict__`` (which a frozen dataclass's ``__setattr__`` does not guard)."""

        def __init__(self, function: Callable[[Any], _Value]) -> None:
            self.function = function
            self.name = function.__name__
            self.__doc__ = function.__doc__

        def __set_name__(self, owner: type, name: str) -> None:
            self.name = name

        def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
            if instance is None:
                return self
            value = instance.__dict__[self.name] = self.function(instance)
            return value


@dataclass(frozen=True)
class Device:
    """One accelerator of a server, as the rank table lists it."""

    device_id: str
    device_ip: Optional[str] = None
    rank_id: Optional[int] = None  # None where the format has none (legacy group_list)
    super_device_id: Optional[str] = None


@dataclass(frozen=True)
class Server:
    """One node (pod) of the job, in scheduler order."""

    server_id: str  # usually the host IP; what MA_CURRENT_HOST_IP is matched against
    pod_index: int  # scheduler order, 0-based (VC_TASK_INDEX)
    devices: Tuple[Device, ...]
    host_ip: Optional[str] = None
    container_ip: Optional[str] = None
    pod_name: Optional[str] = None
    super_pod_id: Optional[str] = None  # v1.2 super pod: an outer switch tier

    @property
    def device_count(self) -> int:
        """``len(self.devices)``, without building the :class:`Device` objects of a server made by
        ``columns.servers_from_device_columns`` that nobody has asked for yet."""
        state = self.__dict__
        devices = state.get("devices")
        if devices is not None:
            return len(devices)
        columns, position = state["_device_rows"]
        return columns.count_of(position)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickles and copies hold the devices themselves, never the shared columns."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class _DevicesFromColumns:
    """``Server.devices`` of a server made by ``columns.servers_from_device_columns``.

    A non-data descriptor: a server made by its constructor (or already asked once) has
    ``devices`` in its ``__dict__``, which wins over this. Otherwise the first access builds the
    tuple from the server's rows of the shared ``columns.DeviceColumns`` and stores it there, so
    ``devices`` reads like any other field afterwards (equality, hash, repr and pickle all read
    the field through ``getattr`` and so see the same tuple an eagerly built server holds).
    """

    def __get__(self, server: Optional[Server], owner: Optional[type] = None) -> Tuple[Device, ...]:
        rows = None if server is None else server.__dict__.get("_device_rows")
        if server is None or rows is None:  # as for any field without a default
            raise AttributeError(
                f"{owner.__name__ if owner else 'Server'!s} has no attribute 'devices'"
            )
        columns, position = rows
        devices = columns.devices_of(position)
        server.__dict__["devices"] = devices
        return devices


# Set after @dataclass so that the field keeps no default and __init__ its signature.
Server.devices = _DevicesFromColumns()  # type: ignore[assignment]


@dataclass(frozen=True)
class RankTable:
    """A parsed rank table; ``servers`` are sorted by ``pod_index`` (0..n-1)."""

    version: str  # "1.0", "1.2", "1.3", "1.4", or "0" for the legacy group_list format
    status: str  # "completed" when usable; "initializing" while the plugin is still filling it
    servers: Tuple[Server, ...]

    @property
    def is_completed(self) -> bool:
        return self.status == "completed"

    @property
    def node_count(self) -> int:
        return len(self.servers)

    @cached_property  # the digest and the partial-node check both read every count
    def device_counts(self) -> Tuple[int, ...]:
        """``server.device_count`` of every server, in pod order."""
        return tuple(server.device_count for server in self.servers)


@dataclass(frozen=True)
class Placement:
    """Where one server sits in the switch fabric.

    ``tiers`` are the switch levels above the ToR, outermost first (for example
    ``("superpod-1", "spine-group-a")``); empty for a single-layer fabric. ``tors`` are the ToR
    switches the server's NICs attach to, sorted and unique: usually one, several when NICs go to
    different switches. ``slot`` is the server's slot (slice id) under its ToR, when known.
    """

    tiers: Tuple[str, ...] = ()
    tors: Tuple[str, ...] = ()
    slot: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", tuple(self.tiers))
        object.__setattr__(self, "tors", tuple(sorted(set(self.tors))))


# The switch topology formats (docs/bootstrap.md), by the names a Topology's source gives them:
# npu_job.bootstrap.topology reads them, the two Kubernetes ones through kube/topology.py.
CCE_RANKTABLE_TOR = "cce-ranktable-tor"
BASIC_TOR_NODE_CM = "basic-tor-node-cm"
K8S_NODE_LABELS = "k8s-node-labels"
VOLCANO_HYPERNODES = "volcano-hypernodes"
PLAIN_FILE = "file"
TOPOLOGY_FORMATS = (
    CCE_RANKTABLE_TOR,
    BASIC_TOR_NODE_CM,
    K8S_NODE_LABELS,
    VOLCANO_HYPERNODES,
    PLAIN_FILE,
)


@dataclass(frozen=True)
class Topology:
    """Switch placement of servers, keyed by ``server_id``; read-only.

    ``source`` names the format it came from (one of :data:`TOPOLOGY_FORMATS`). Servers without an
    entry have no known placement.
    """

    placements: Mapping[str, Placement] = field(default_factory=dict)
    source: str = "none"

    def __post_init__(self) -> None:
        placements = self.placements
        keys = sorted(placements)
        ordered = dict(zip(keys, map(placements.__getitem__, keys)))
        object.__setattr__(self, "placements", MappingProxyType(ordered))

    def placement_of(self, server_id: str) -> Optional[Placement]:
        return self.placements.get(server_id)

    def __hash__(self) -> int:  # MappingProxyType is unhashable; hash the sorted items
        return hash((tuple(self.placements.items()), self.source))


class Collective(str, enum.Enum):
    """The collective algorithm the order is optimised for (docs/ordering.md)."""

    RING = "ring"  # ring allreduce: rank r sends to r+1
    NHR = "nhr"  # HCCL nonuniform hierarchical ring: r sends to r - 2^s
    RHD = "rhd"  # recursive halving-doubling: r pairs with r XOR 2^k, biggest step first

    def __str__(self) -> str:
        return self.value


class PlanStatus(str, enum.Enum):
    SUCCESS = "success"  # a routing-affine order was computed
    FAILED = "failed"  # identity (scheduler) order, see ``reasons``

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Plan:
    """The new node order, or the identity with the reason why no order was computed.

    ``node_rank_of_pod[i]`` is the new node rank of pod index ``i``. ``master_index`` is the pod
    index that gets node rank 0. The digests are sha256 hex of the canonical input and of the
    mapping, so that pods can compare logs and prove they agreed.
    """

    status: PlanStatus
    node_rank_of_pod: Tuple[int, ...]
    collective: Collective
    reasons: Tuple[str, ...] = ()
    input_digest: str = ""
    mapping_digest: str = ""

    def __post_init__(self) -> None:
        ranks = tuple(self.node_rank_of_pod)
        count = len(ranks)
        # distinct, and each within 0..count-1: a permutation (without sorting 4096 ranks)
        if ranks and (len(set(ranks)) != count or min(ranks) < 0 or max(ranks) >= count):
            raise ValueError(f"node_rank_of_pod is not a permutation of 0..{count - 1}")
        object.__setattr__(self, "node_rank_of_pod", ranks)
        object.__setattr__(self, "reasons", tuple(self.reasons))

    @cached_property  # read several times per run (master index, mapping, writers)
    def pod_of_node_rank(self) -> Tuple[int, ...]:
        """Inverse mapping: ``pod_of_node_rank[r]`` is the pod index holding node rank ``r``."""
        inverse = [0] * len(self.node_rank_of_pod)
        for pod, rank in enumerate(self.node_rank_of_pod):
            inverse[rank] = pod
        return tuple(inverse)

    @property
    def master_index(self) -> int:
        """Pod index of the new node rank 0 (``/tmp/MASTER_INDEX``); 0 for an empty plan."""
        return self.pod_of_node_rank[0] if self.node_rank_of_pod else 0

    @property
    def is_identity(self) -> bool:
        return all(rank == pod for pod, rank in enumerate(self.node_rank_of_pod))

    @cached_property  # its digest and the route plan both read it
    def rank_mapping(self) -> str:
        """The platform's ``"newRank-podIndex,..."`` form, in new-rank order."""
        return rank_mapping_text(self.pod_of_node_rank)


def rank_mapping_text(pod_of_node_rank: Sequence[int]) -> str:
    """:attr:`Plan.rank_mapping` of the order ``pod_of_node_rank`` (pod index by new rank)."""
    return ",".join([f"{rank}-{pod}" for rank, pod in enumerate(pod_of_node_rank)])
