"""A topology from the cluster's own objects: the Nodes in one list with the HyperNodes or beside
them read alike, and the servers of interest may be named by node name or by address."""

from npu_job.bootstrap.kubetopology import topology_from_document

from .documents import NODES, THREE_TIER, kube_document, node_ip, nodes_context


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
