"""Switch placement from a Kubernetes node's labels (pure): the one place that knows the keys.

A node's placement comes from the first of these schemes that has any of its keys on the node
(a key with an empty value counts as absent), or only from the keys the user names
(``--topology-labels``, outermost first). A scheme lists its tiers outermost first, the innermost
one present being the node's ToR; a tier may have several keys, the first present wins.

==========  ===================================================================================
scheme      keys (outermost first) and where they are documented
==========  ===================================================================================
cce         ``cce.kubectl.kubernetes.io/cabinet``: the node's ToR IPs joined by ``-`` (several
            when its NICs reach several ToRs). Huawei Cloud CCE.
volcano     ``volcano.sh/hypercluster``, then ``volcano.sh/tor`` (the ToR of an Ascend 910B node)
            or else ``volcano.sh/hypernode`` (the super node of an A3 node): the labels Volcano's
            HyperNode auto-discovery reads, volcano-sh/volcano
            ``docs/user-guide/how_to_use_hypernode_auto_discovery.md`` (commit ed72c7c).
eks         ``topology.k8s.aws/network-node-layer-1`` (the top of the network hierarchy),
            ``-2``, ``-3`` (the bottom layer for most instance types) and ``-4`` (only on
            instance types whose topology has four layers): Amazon EKS, "Place distributed AI/ML
            workloads with network topology labels",
            https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html
gke         ``cloud.google.com/gce-topology-block``, ``cloud.google.com/gce-topology-subblock``:
            GKE, "Schedule GKE workloads with Topology Aware Scheduling",
            https://cloud.google.com/ai-hypercomputer/docs/workloads/schedule-gke-workloads-tas
            The third key there, ``cloud.google.com/gce-topology-host``, names the physical
            host the VM runs on (one host per full-size accelerator VM): below every switch, so
            it is not a tier here.
topograph   ``fabric.topograph.run/tier-N`` for every N on the node, the highest N outermost
            (tier 0 is the switch closest to the node, its leaf; there is no fixed depth), then
            ``accelerator.topograph.run/domain`` (the NVLink domain, innermost): the keys
            topograph 1.0 and later writes, NVIDIA/topograph ``docs/reference/node-labels.md``
            and ``pkg/topology/topology.go`` (commit e2b6250; v1.0.0 is aab33e1). Its
            ``accelerator.topograph.run/sub-domain`` (a part of the domain, e.g. a rack of it)
            is not a tier here, as the older family has none.
topograph-0 ``network.topology.nvidia.com/core`` (``/datacenter`` in topograph 0.1), ``/spine``,
            ``/leaf`` (``/block`` in 0.1) and ``/accelerator`` (the NVLink domain, innermost):
            topograph before 1.0, NVIDIA/topograph ``docs/engines/k8s.md`` at v0.5.0 (commit
            253cb10; v0.1.0 for the older names). Read after the newer family, so a node still
            carrying both is placed by the newer.
==========  ===================================================================================
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..base.fields import expect_str
from ..base.model import Placement

CABINET_LABEL = "cce.kubectl.kubernetes.io/cabinet"
VOLCANO_TOR_LABEL = "volcano.sh/tor"
VOLCANO_HYPERNODE_LABEL = "volcano.sh/hypernode"
VOLCANO_HYPERCLUSTER_LABEL = "volcano.sh/hypercluster"
EKS_LAYER_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3, 4))
GKE_BLOCK_LABEL = "cloud.google.com/gce-topology-block"
GKE_SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
GKE_HOST_LABEL = "cloud.google.com/gce-topology-host"  # documented, deliberately not a tier
TOPOGRAPH_TIER_PREFIX = "fabric.topograph.run/tier-"  # + N, N = 0 the closest to the node
TOPOGRAPH_DOMAIN_LABEL = "accelerator.topograph.run/domain"
TOPOGRAPH_SUBDOMAIN_LABEL = "accelerator.topograph.run/sub-domain"  # documented, not a tier
TOPOGRAPH_0 = "network.topology.nvidia.com/"  # topograph before 1.0

USER_SCHEME = "user"  # the keys named by --topology-labels


class LabelScheme(NamedTuple):
    """A provider's topology labels: tiers outermost first, each the keys that may name it."""

    name: str
    title: str  # for log lines
    tiers: Tuple[Tuple[str, ...], ...]
    joined_by: Optional[str] = None  # the innermost value lists several ToRs joined by this
    # keys ``numbered + N`` (N a decimal without leading zeros, 0 the innermost) are tiers
    # outside ``tiers``, as many as the node has, the highest N outermost
    numbered: Optional[str] = None

    @property
    def keys(self) -> Tuple[str, ...]:
        return tuple(key for tier in self.tiers for key in tier)


SCHEMES: Tuple[LabelScheme, ...] = (
    LabelScheme("cce", "CCE cabinet", ((CABINET_LABEL,),), joined_by="-"),
    LabelScheme(
        "volcano",
        "Volcano",
        ((VOLCANO_HYPERCLUSTER_LABEL,), (VOLCANO_TOR_LABEL, VOLCANO_HYPERNODE_LABEL)),
    ),
    LabelScheme("eks", "Amazon EKS", tuple((key,) for key in EKS_LAYER_LABELS)),
    LabelScheme("gke", "GKE", ((GKE_BLOCK_LABEL,), (GKE_SUBBLOCK_LABEL,))),
    LabelScheme(
        "topograph",
        "NVIDIA topograph",
        ((TOPOGRAPH_DOMAIN_LABEL,),),
        numbered=TOPOGRAPH_TIER_PREFIX,
    ),
    LabelScheme(
        "topograph-0",
        "NVIDIA topograph 0.x",
        (
            (TOPOGRAPH_0 + "core", TOPOGRAPH_0 + "datacenter"),
            (TOPOGRAPH_0 + "spine",),
            (TOPOGRAPH_0 + "leaf", TOPOGRAPH_0 + "block"),
            (TOPOGRAPH_0 + "accelerator",),
        ),
    ),
)


def _numbered_tiers(labels: Mapping[str, Any], prefix: str) -> Tuple[Tuple[str, ...], ...]:
    """The keys ``prefix + N`` on the node as tiers, the highest N first."""
    numbers = [
        key[len(prefix) :]
        for key in labels
        if isinstance(key, str) and key.startswith(prefix) and len(key) > len(prefix)
    ]
    numbers = [
        n for n in numbers if all(c in "0123456789" for c in n) and (n == "0" or n[0] != "0")
    ]
    # decimals without leading zeros order by length, then text (no int(): no digit limit)
    numbers.sort(key=lambda n: (len(n), n), reverse=True)
    return tuple((prefix + n,) for n in numbers)


def user_scheme(keys: Sequence[str]) -> LabelScheme:
    """The scheme of label keys a user names, outermost first."""
    return LabelScheme(USER_SCHEME, "the named labels", tuple((key,) for key in keys))


def placement_from_labels(
    labels: Mapping[str, Any],
    source: str,
    path: str,
    keys: Optional[Sequence[str]] = None,
) -> Optional[Tuple[Placement, LabelScheme]]:
    """Where the node with these labels sits and by which scheme; None when it has no topology
    label. ``keys``: only these (outermost first), instead of the schemes."""

    def label(key: str) -> str:
        value = labels.get(key)
        if value is None:
            return ""
        return expect_str(value, source, f"{path}.{key}", empty_ok=True)

    for scheme in (user_scheme(keys),) if keys is not None else SCHEMES:
        tiers = scheme.tiers
        if scheme.numbered is not None:
            tiers = _numbered_tiers(labels, scheme.numbered) + tiers
        switches = [
            value for value in (next(filter(None, map(label, tier)), "") for tier in tiers) if value
        ]
        if not switches:
            continue
        tors: Tuple[str, ...] = tuple(switches[-1:])
        if scheme.joined_by is not None:
            tors = tuple(part for part in switches[-1].split(scheme.joined_by) if part)
            if not tors:
                continue
        return Placement(tiers=tuple(switches[:-1]), tors=tors), scheme
    return None
