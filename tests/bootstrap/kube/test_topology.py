"""A topology from the cluster's own objects: the Nodes in one list with the HyperNodes or beside
them read alike, and the servers of interest may be named by node name or by address."""

import pytest
from npu_job.bootstrap.kube.topology import KubeContext, topology_from_document

from npu_job.errors import InputError

from ..documents import NODES, THREE_TIER, kube_document, node_ip, nodes_context


def test_one_combined_list_reads_like_the_two_files():
    combined = kube_document(THREE_TIER)
    combined["items"] = kube_document(NODES)["items"] + combined["items"]
    alone = topology_from_document(combined, "cluster.json")
    beside = topology_from_document(kube_document(THREE_TIER), "hn.yaml", context=nodes_context())
    assert alone == beside


def test_names_of_interest_by_address_place_the_same_as_the_whole_cluster():
    whole = topology_from_document(
        kube_document(THREE_TIER), "hn.yaml", context=nodes_context()
    ).topology
    some = [node_ip("node-3"), "node-8", node_ip("node-5"), "node-11"]
    part = topology_from_document(
        kube_document(THREE_TIER), "hn.yaml", context=nodes_context(some)
    ).topology
    for key in some:
        assert part.placement_of(key) == whole.placement_of(key)
    assert part.placement_of("node-0") is None  # not asked for


def test_asking_for_hypernodes_where_there_are_none_names_what_was_expected():
    with pytest.raises(InputError) as caught:
        topology_from_document(kube_document(NODES), "nodes.json", "volcano-hypernodes")
    assert caught.value.message == (
        "nodes.json: items: expected HyperNode objects (kubectl get hypernodes -o json)"
    )


def _sharing_an_address(node: str, other: str) -> object:
    """HyperNodes and Nodes in one list, where ``node`` reports ``other``'s InternalIP."""
    combined = kube_document(NODES)
    by_name = {item["metadata"]["name"]: item for item in combined["items"]}
    by_name[node]["status"]["addresses"][0]["address"] = node_ip(other)
    combined["items"] += kube_document(THREE_TIER)["items"]
    return combined


def test_an_address_two_nodes_claim_for_different_switches_is_an_error_naming_both():
    # node-1 is under tor-0, node-5 under tor-1: the address could place a server under either
    with pytest.raises(InputError) as caught:
        topology_from_document(_sharing_an_address("node-5", "node-1"), "cluster.json")
    assert caught.value.message == (
        "cluster.json: items[5] (Node 'node-5'): status.addresses: expected one placement per "
        f"node address; '{node_ip('node-1')}' is claimed twice (also by node 'node-1')"
    )


def test_an_address_two_nodes_claim_under_one_switch_places_the_same():
    # node-0 and node-1 are both under tor-0: whichever the address means, the placement is one
    topology = topology_from_document(_sharing_an_address("node-0", "node-1"), "c.json").topology
    assert topology.placement_of(node_ip("node-1")) == topology.placement_of("node-1")
    assert topology.placement_of("node-0") == topology.placement_of("node-1")


def test_nodes_no_label_places_are_noted_with_a_few_of_their_label_keys():
    """Other label families are named, Kubernetes' own last, a few and then a count, with the
    flag that reads them."""
    labels = {f"example.com/k{i}": "x" for i in range(7)}
    labels["kubernetes.io/hostname"] = "n0"
    document = {
        "kind": "NodeList",
        "items": [{"metadata": {"name": "n0", "labels": labels}}],
    }
    found = topology_from_document(document, "nodes.json")
    assert not found.topology.placements
    (note,) = found.notes
    assert "label keys on them: 'example.com/k0', 'example.com/k1', 'example.com/k2', " in note
    assert "'example.com/k5' and 2 more; --topology-labels KEY,KEY,..." in note
    named = topology_from_document(
        document, "nodes.json", context=KubeContext(label_keys=("example.com/rack",))
    )
    assert "none has the named labels (example.com/rack);" in named.notes[0]
