"""A switch topology from the cluster's own objects (pure): Volcano HyperNodes, else node labels.

The documents are what the API lists or kubectl prints (:mod:`npu_job.bootstrap.kube.objects`):
``kubectl get hypernodes -o json`` with ``kubectl get nodes -o json`` beside it, or both in one
``kubectl get hypernodes,nodes,pods -o json``. With HyperNodes, each node's placement is its path
in their tree (:mod:`.hypernodetree`); without, its topology labels
(:mod:`npu_job.bootstrap.kube.labels`). Either way the :class:`~..base.model.Topology` is
keyed by node name and by each ``InternalIP`` of the node (a rank table's ``server_id``), and an
address two nodes claim with different placements is an error.
"""

from __future__ import annotations

from typing import (
    AbstractSet,
    Dict,
    FrozenSet,
    Iterable,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

from npu_job.errors import shown

from ..base.fields import fail
from ..base.model import K8S_NODE_LABELS, VOLCANO_HYPERNODES, Placement, Topology
from .facts import NodeFacts, read_nodes
from .hypernode import read_hypernodes
from .hypernodetree import exact_tree_placements, resolve
from .objects import NODE, KubeObjects, object_field, read_objects

HYPERNODES = VOLCANO_HYPERNODES
NODE_LABELS = K8S_NODE_LABELS


class KubeContext(NamedTuple):
    """What a topology document is read with besides itself.

    ``objects``: more objects, e.g. the Nodes of a ``kubectl get nodes -o json`` file beside a
    HyperNode file (their labels serve ``labelMatch``, their addresses key the result).
    ``names``: place only these servers (node names or addresses): a job's, where the cluster has
    thousands of nodes. ``label_keys``: read only these node labels (outermost first) instead of
    the known schemes of :mod:`npu_job.bootstrap.kube.labels`.
    """

    objects: KubeObjects = KubeObjects()
    names: Optional[Tuple[str, ...]] = None
    label_keys: Optional[Tuple[str, ...]] = None  # topology label keys, outermost first


class KubeTopology(NamedTuple):
    topology: Topology
    notes: Tuple[str, ...] = ()


def topology_from_document(
    document: object, source: str, fmt: Optional[str] = None, context: Optional[KubeContext] = None
) -> KubeTopology:
    """The topology of a decoded list document (see :func:`topology_from_objects`)."""
    return topology_from_objects(read_objects(document, source), source, fmt, context)


def topology_from_objects(
    objects: KubeObjects,
    source: str,
    fmt: Optional[str] = None,
    context: Optional[KubeContext] = None,
) -> KubeTopology:
    """HyperNodes when there are any (or ``fmt`` is :data:`HYPERNODES`), else node labels."""
    context = context or KubeContext()
    everything = objects + context.objects
    nodes = read_nodes(everything.nodes, source)
    wanted = _wanted_nodes(nodes, context.names)
    if fmt == HYPERNODES or (fmt is None and everything.hypernodes):
        if not everything.hypernodes:
            fail(source, "items", "HyperNode objects (kubectl get hypernodes -o json)")
        tree_placements, tree_notes = _tree_placements(everything, nodes, wanted, source)
        placements = _keyed(tree_placements, nodes, wanted, source)
        return KubeTopology(Topology(placements, source=HYPERNODES), tree_notes)
    from . import labels  # the label schemes: not needed with HyperNodes

    by_node: Dict[str, Placement] = {}
    schemes: Dict[str, int] = {}
    for node in nodes:
        if wanted is None or node.name in wanted:
            path = object_field(NODE, node.where, node.name, "metadata.labels")
            found = labels.placement_from_labels(node.labels, source, path, context.label_keys)
            if found is not None:
                by_node[node.name], scheme = found
                schemes[scheme.title] = schemes.get(scheme.title, 0) + 1
    notes: Tuple[str, ...] = ()
    if schemes:
        counted = ", ".join(f"{count} by {title}" for title, count in sorted(schemes.items()))
        notes = (
            f"node labels placed {len(by_node)} of {len(nodes if wanted is None else wanted)}"
            f" node(s): {counted}",
        )
    else:
        considered = [node for node in nodes if wanted is None or node.name in wanted]
        if considered:
            notes = (_unplaced_note(considered, context.label_keys),)
    return KubeTopology(Topology(_keyed(by_node, nodes, wanted, source), source=NODE_LABELS), notes)


# Label keys a note on unplaced nodes names before it counts the rest.
LISTED_KEYS = 6
# Label namespaces of Kubernetes itself (kubernetes.io/hostname, node.kubernetes.io/...): named
# last, after the keys more likely to hold a switch.
_KUBERNETES_DOMAINS = ("kubernetes.io", "k8s.io")


def _unplaced_note(nodes: Sequence[NodeFacts], keys: Optional[Tuple[str, ...]]) -> str:
    """Why node labels placed none of ``nodes``: the label keys they carry (a few, then how many
    more), and how to name the ones that hold the switch."""
    from . import labels

    seen = {key for node in nodes for key in node.labels}

    def domain_order(key: str) -> Tuple[bool, str]:
        domain = key.partition("/")[0] if "/" in key else ""
        return domain.endswith(_KUBERNETES_DOMAINS), key

    ordered = sorted(seen, key=domain_order)
    listed = ", ".join(shown(key) for key in ordered[:LISTED_KEYS])
    if len(ordered) > LISTED_KEYS:
        listed += f" and {len(ordered) - LISTED_KEYS} more"
    wanted = (
        f"the named labels ({', '.join(keys)})"
        if keys is not None
        else f"a label of a known scheme ({', '.join(s.title for s in labels.SCHEMES)})"
    )
    carried = f"label keys on them: {listed}" if seen else "they carry no labels"
    return (
        f"node labels placed none of {len(nodes)} node(s): none has {wanted}; {carried}; "
        "--topology-labels KEY,KEY,... (NPU_JOB_TOPOLOGY_LABELS; outermost first) reads the "
        "switch path from other keys"
    )


def _tree_placements(
    objects: KubeObjects,
    nodes: Sequence[NodeFacts],
    wanted: Optional[AbstractSet[str]],
    source: str,
) -> Tuple[Mapping[str, Placement], Tuple[str, ...]]:
    """Each node's placement in the HyperNode tree, and the notes on the choices made."""
    simple = exact_tree_placements(objects.hypernodes, wanted)
    if simple is not None:
        return simple, ()
    # a tree with choices to make, notes to write or errors to name: read and resolved in full
    resolved = resolve(read_hypernodes(objects.hypernodes, source), nodes, source, names=wanted)
    return resolved.placements, resolved.notes


def _wanted_nodes(
    nodes: Sequence[NodeFacts], names: Optional[Iterable[str]]
) -> Optional[FrozenSet[str]]:
    """The node names ``names`` stand for: a node's own name or one of its addresses; a name no
    listed node has is kept as it is (a node the HyperNodes name without a node list)."""
    if names is None:
        return None
    if not nodes:  # no Node to know by an address: the names are the node names
        return frozenset(names)
    wanted = set(names)
    found = {
        node.name for node in nodes if node.name in wanted or not wanted.isdisjoint(node.addresses)
    }
    addresses = {address for node in nodes for address in node.addresses}
    return frozenset(found | (wanted - addresses))  # asked "is it in?", never listed in order


def _keyed(
    by_node: Mapping[str, Placement],
    nodes: Sequence[NodeFacts],
    wanted: Optional[AbstractSet[str]],
    source: str,
) -> Dict[str, Placement]:
    """``by_node`` keyed by node name and by every InternalIP of the node as well."""
    if not nodes:  # no Nodes listed (HyperNodes that name their nodes): no address to add
        return dict(by_node)
    keyed: Dict[str, Placement] = {}
    claimed: Dict[str, str] = {}  # key -> the node that claimed it first
    keep = wanted
    listed = set()
    for node in nodes:
        listed.add(node.name)
        placement = by_node.get(node.name)
        if placement is None or (keep is not None and node.name not in keep):
            continue
        for key in (node.name, *node.addresses):
            held = keyed.setdefault(key, placement)
            if held is not placement and held != placement:
                fail(
                    source,
                    object_field(NODE, node.where, node.name, "status.addresses"),
                    f"one placement per node address; {shown(key)} is claimed twice "
                    f"(also by node {shown(claimed[key])})",
                )
            claimed.setdefault(key, node.name)
    for name, placement in by_node.items():  # named by the HyperNodes, not in the node list
        if name in listed:
            continue
        held = keyed.setdefault(name, placement)
        # nodes share placements: "is" spares comparing the dataclasses field by field
        if held is not placement and held != placement:
            fail(source, "items", f"one placement per node address; {shown(name)} is claimed twice")
    return keyed
