"""Switch placement from a Kubernetes node's labels (pure): the one place that knows the keys.

A node's placement comes from the first of these schemes that has any of its keys on the node
(a key with an empty value counts as absent), or only from the keys the user names
(``--topology-labels``, outermost first). A scheme lists its tiers outermost first, the innermost
one present being the node's ToR; a tier may have several keys, the first present wins.

==========  ===================================================================================
scheme      keys (outermost first) and where they are documented
==========  ===================================================================================
cce         ``cce.kubectl.kubernetes.io/cabinet``: the node's ToR IPs joined by ``-`` (several
            when its NICs reach several ToRs). Huawei Cloud CCE (DESIGN §4).
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
topograph   ``network.topology.nvidia.com/core`` (``/datacenter`` in topograph 0.1), ``/spine``,
            ``/leaf`` (``/block`` in 0.1) and ``/accelerator`` (the NVLink domain, innermost):
            NVIDIA topograph, https://docs.nvidia.com/topograph/engines/kubernetes and
            NVIDIA/topograph ``docs/engines/k8s.md`` (v0.1.0 for the older names).
==========  ===================================================================================
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional, Sequence, Tuple

from npu_job.bootstrap.fields import expect_str
from npu_job.bootstrap.model import Placement

from npu_job.errors import InputError, shown

CABINET_LABEL = "cce.kubectl.kubernetes.io/cabinet"
VOLCANO_TOR_LABEL = "volcano.sh/tor"
VOLCANO_HYPERNODE_LABEL = "volcano.sh/hypernode"
VOLCANO_HYPERCLUSTER_LABEL = "volcano.sh/hypercluster"
EKS_LAYER_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3, 4))
GKE_BLOCK_LABEL = "cloud.google.com/gce-topology-block"
GKE_SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
GKE_HOST_LABEL = "cloud.google.com/gce-topology-host"  # documented, deliberately not a tier
TOPOGRAPH = "network.topology.nvidia.com/"

USER_SCHEME = "user"  # the keys named by --topology-labels


class LabelScheme(NamedTuple):
    """A provider's topology labels: tiers outermost first, each the keys that may name it."""

    name: str
    title: str  # for log lines
    tiers: Tuple[Tuple[str, ...], ...]
    joined_by: Optional[str] = None  # the innermost value lists several ToRs joined by this

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
        (
            (TOPOGRAPH + "core", TOPOGRAPH + "datacenter"),
            (TOPOGRAPH + "spine",),
            (TOPOGRAPH + "leaf", TOPOGRAPH + "block"),
            (TOPOGRAPH + "accelerator",),
        ),
    ),
)


def user_scheme(keys: Sequence[str]) -> LabelScheme:
    """The scheme of label keys a user names, outermost first."""
    return LabelScheme(USER_SCHEME, "the named labels", tuple((key,) for key in keys))


def label_keys_from_text(text: str, name: str) -> Tuple[str, ...]:
    """``"k1,k2,k3"`` (outermost first) as keys; ``name`` (a flag or variable) for the error."""
    keys = tuple(part.strip() for part in text.split(","))
    if not keys or any(not key or any(c.isspace() for c in key) for key in keys):
        raise InputError(
            "environment" if name.isupper() else "command line",
            name,
            "expected label keys separated by commas, outermost first "
            f"(e.g. example.com/spine,example.com/rack), got {shown(text)}",
        )
    return keys


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
        switches = [
            value
            for value in (next(filter(None, map(label, tier)), "") for tier in scheme.tiers)
            if value
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
