"""Node labels of the common clouds and tools as a topology: the fixtures are node lists written
here in the shape `kubectl get nodes -o json` prints, labelled by each provider's documented keys
(tests/bootstrap/fixtures/kube/nodes-*.json)."""

import json
from pathlib import Path

import pytest
from npu_job.bootstrap.base.model import K8S_NODE_LABELS, Placement
from npu_job.bootstrap.kube.labels import SCHEMES, placement_from_labels
from npu_job.bootstrap.kube.objects import read_objects
from npu_job.bootstrap.kube.topology import KubeContext, topology_from_document
from npu_job.bootstrap.run import bootstrap, resolve
from npu_job.bootstrap.topology import parse_topology

FIXTURES = Path(__file__).parent.parent / "fixtures" / "kube"


def _load(name):
    return json.loads((FIXTURES / name).read_text())


def _by_name(topology, document):
    return {
        item["metadata"]["name"]: topology.placement_of(item["metadata"]["name"])
        for item in document["items"]
    }


def test_eks_network_node_layers_outermost_first():
    document = _load("nodes-eks.json")
    found = topology_from_document(document, "nodes-eks.json")
    placed = _by_name(found.topology, document)
    assert placed["ip-10-0-21-17.us-west-2.compute.internal"] == Placement(
        ("nn-e50490a237cb0f01a", "nn-7c0d9e8f1a2b3c402"), ("nn-3c4b5a69788796a04",)
    )
    assert placed["ip-10-0-9-140.us-west-2.compute.internal"] == Placement(
        ("nn-e50490a237cb0f01a", "nn-3a1f0b7c9d2e4f601"), ("nn-0f1e2d3c4b5a69781",)
    )
    assert (
        found.topology.placement_of("10.0.21.17")
        == placed["ip-10-0-21-17.us-west-2.compute.internal"]
    )
    assert found.notes == ("node labels placed 6 of 6 node(s): 6 by Amazon EKS",)


def test_eks_fourth_layer_is_the_innermost_when_present():
    labels = {f"topology.k8s.aws/network-node-layer-{n}": f"nn-{n}" for n in (1, 2, 3, 4)}
    placement, scheme = placement_from_labels(labels, "n", "labels")
    assert (placement, scheme.name) == (Placement(("nn-1", "nn-2", "nn-3"), ("nn-4",)), "eks")


def test_gke_block_and_subblock_the_host_is_not_a_switch():
    document = _load("nodes-gke.json")
    placed = _by_name(parse_topology(json.dumps(document).encode(), "nodes-gke.json"), document)
    hosts = {
        item["metadata"]["labels"]["cloud.google.com/gce-topology-host"]
        for item in document["items"]
    }
    assert len(hosts) == 6  # one VM per host: a tier of it would make every node its own ToR
    assert set(placed.values()) == {
        Placement(("5b1d8f0e2a3c",), ("5b1db7c1e0",)),
        Placement(("5b1d8f0e2a3c",), ("5b1d3f9a2d",)),
        Placement(("9e7a6c4b2d10",), ("9e7ac0d4e8",)),
    }
    assert placed["gke-a3u-train-np-7f3c9a1e-q0k0"] == placed["gke-a3u-train-np-7f3c9a1e-z3k1"]


def test_topograph_core_spine_leaf_and_the_nvlink_domain_innermost_old_names_too():
    document = _load("nodes-topograph.json")
    placed = _by_name(parse_topology(json.dumps(document).encode(), "t"), document)
    assert (
        placed["dgx-00"]
        == placed["dgx-03"]
        == Placement(("core-1", "spine-1", "leaf-11"), ("nvl-a",))
    )
    assert placed["dgx-01"] == placed["dgx-04"] == Placement(("core-1", "spine-2"), ("leaf-21",))
    # dgx-05 carries topograph 0.1's names (datacenter, block): the same path as dgx-02's
    assert placed["dgx-05"] == placed["dgx-02"] == Placement(("core-1", "spine-1"), ("leaf-12",))


def test_topograph_1_fabric_tiers_highest_outermost_and_the_nvlink_domain_innermost():
    """topograph >= 1.0: fabric.topograph.run/tier-N, tier 0 closest to the node, any depth."""
    labels = {
        "fabric.topograph.run/tier-0": "s1",
        "fabric.topograph.run/tier-1": "s2",
        "fabric.topograph.run/tier-2": "s3",
        "accelerator.topograph.run/domain": "nvl1",
        "accelerator.topograph.run/sub-domain": "nvl1.rack01",  # documented, not a tier
        "kubernetes.io/hostname": "dgx-00",
    }
    placement, scheme = placement_from_labels(labels, "n", "labels")
    assert (placement, scheme.name) == (Placement(("s3", "s2", "s1"), ("nvl1",)), "topograph")
    del labels["accelerator.topograph.run/domain"]
    assert placement_from_labels(labels, "n", "labels")[0] == Placement(("s3", "s2"), ("s1",))


def test_topograph_1_tiers_are_numbers_not_text_and_only_plain_decimals():
    labels = {f"fabric.topograph.run/tier-{n}": f"s{n}" for n in range(12)}
    labels.update(
        {
            "fabric.topograph.run/tier-": "no number",
            "fabric.topograph.run/tier-01": "leading zero",
            "fabric.topograph.run/tier-x": "not a number",
            "fabric.topograph.run/tier-\u0663": "not ASCII",
            "fabric.topograph.run/tier-" + "9" * 5000: "",  # empty: absent (and no int())
            "fabric.topograph.run/tier-5": "",
        }
    )
    placement, _ = placement_from_labels(labels, "n", "labels")
    assert placement == Placement(
        ("s11", "s10", "s9", "s8", "s7", "s6", "s4", "s3", "s2", "s1"), ("s0",)
    )


@pytest.mark.parametrize(
    "labels, expected, scheme",
    [
        (
            {"cce.kubectl.kubernetes.io/cabinet": "10.9.0.2-10.9.0.1", "volcano.sh/tor": "t"},
            Placement((), ("10.9.0.1", "10.9.0.2")),
            "cce",
        ),
        (
            {
                "volcano.sh/tor": "tor-b",
                "volcano.sh/hypernode": "hn-1",
                "volcano.sh/hypercluster": "hc",
            },
            Placement(("hc",), ("tor-b",)),
            "volcano",
        ),
        (
            {"volcano.sh/hypernode": "hn-1", "volcano.sh/hypercluster": "hc"},
            Placement(("hc",), ("hn-1",)),
            "volcano",
        ),
        (
            {"volcano.sh/tor": "", "topology.k8s.aws/network-node-layer-1": "nn-1"},
            Placement((), ("nn-1",)),
            "eks",
        ),
        (
            {"cce.kubectl.kubernetes.io/cabinet": "-", "cloud.google.com/gce-topology-block": "b"},
            Placement((), ("b",)),
            "gke",
        ),
        (
            {"network.topology.nvidia.com/accelerator": "nvl-7"},
            Placement((), ("nvl-7",)),
            "topograph-0",
        ),
        (
            {"accelerator.topograph.run/domain": "nvl-7"},
            Placement((), ("nvl-7",)),
            "topograph",
        ),
        (  # a node still carrying topograph 0.x's labels after the upgrade: the newer decide
            {
                "network.topology.nvidia.com/leaf": "old-leaf",
                "fabric.topograph.run/tier-0": "leaf-1",
            },
            Placement((), ("leaf-1",)),
            "topograph",
        ),
    ],
)
def test_the_first_scheme_with_a_key_on_the_node_decides(labels, expected, scheme):
    found = placement_from_labels(labels, "n", "labels")
    assert (found[0], found[1].name) == (expected, scheme)


def test_no_known_label_is_no_placement():
    assert (
        placement_from_labels(
            {"kubernetes.io/hostname": "n", "cloud.google.com/gce-topology-host": "h"},
            "n",
            "labels",
        )
        is None
    )


def test_every_scheme_key_is_read_by_exactly_one_scheme():
    keys = [key for scheme in SCHEMES for key in scheme.keys]
    assert len(keys) == len(set(keys))


def test_user_named_keys_replace_the_schemes():
    document = _load("nodes.json")
    context = KubeContext(label_keys=("topology.kubernetes.io/zone", "example.com/rack"))
    found = topology_from_document(document, "nodes.json", context=context)
    placed = _by_name(found.topology, document)
    assert placed["node-6"] == Placement(("zone-a",), ("r2",))
    assert placed["node-11"] == Placement(
        (), ("zone-a",)
    )  # no rack: the zone is its innermost tier
    assert found.notes == ("node labels placed 12 of 12 node(s): 12 by the named labels",)
    eks = topology_from_document(_load("nodes-eks.json"), "x", context=context).topology
    assert eks.placement_of("10.0.21.17") == Placement((), ("us-west-2a",))  # EKS layers unread


def test_flag_and_environment_name_the_keys():
    assert resolve({}, {"NPU_JOB_TOPOLOGY_LABELS": " a/b , c "}).topology_labels == ("a/b", "c")
    assert resolve({"topology_labels": "x"}, {"NPU_JOB_TOPOLOGY_LABELS": "a"}).topology_labels == (
        "x",
    )
    assert resolve({}, {}).topology_labels is None


def test_bootstrap_with_named_labels_plans_by_them(tmp_path):
    """The whole bootstrap on a rank table of the EKS nodes' addresses and their node list as
    the topology file: by the layers, and by named labels when told."""
    from tests.bootstrap.documents import v1_0

    document = _load("nodes-eks.json")
    ips = tuple(item["status"]["addresses"][0]["address"] for item in document["items"])
    (tmp_path / "jobstart_hccl.json").write_text(json.dumps(v1_0(ips)))
    (tmp_path / "nodes.json").write_text(json.dumps(document))
    env = {
        "RANK_TABLE_FILE": str(tmp_path / "jobstart_hccl.json"),
        "NPU_JOB_TOPOLOGY": str(tmp_path / "nodes.json"),
        "MA_CURRENT_HOST_IP": ips[0],
        "NPU_JOB_OUTPUT_DIR": str(tmp_path / "out"),
        "NPU_JOB_K8S_TOPOLOGY": "0",
    }
    by_layers = bootstrap({}, env).route_plan
    assert by_layers["status"] == "success" and by_layers["topology"].endswith(
        f"({K8S_NODE_LABELS})"
    )
    # layer-3 groups: {1, 3}, {2}, {4}, {0, 5} in path order -> pods 1 and 3 first
    assert by_layers["rank_mapping"].startswith("0-1,1-3,")
    by_zone = bootstrap(
        {}, dict(env, NPU_JOB_TOPOLOGY_LABELS="topology.kubernetes.io/zone")
    ).route_plan
    assert by_zone["status"] == "success" and by_zone["rank_mapping"] != by_layers["rank_mapping"]
    bad = bootstrap({}, dict(env, NPU_JOB_TOPOLOGY_LABELS="a,,b")).route_plan
    assert bad["status"] == "failed" and "NPU_JOB_TOPOLOGY_LABELS" in bad["reason"]


def test_labels_of_a_combined_list_ignore_its_pods():
    document = _load("nodes-eks.json")
    document["items"].append(
        {"kind": "Pod", "metadata": {"name": "p", "labels": {"volcano.sh/tor": "t"}}}
    )
    objects = read_objects(document, "c")
    assert len(objects.nodes) == 6 and len(objects.pods) == 1
    assert len(parse_topology(json.dumps(document).encode(), "c").placements) == 12  # names + IPs
