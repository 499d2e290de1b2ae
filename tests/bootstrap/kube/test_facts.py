"""The facts read of Nodes and Pods: the fast readers (a 4096-pod job) mean exactly what the
field-by-field readers mean, on the fixtures and on every damaged copy of them hypothesis makes; a
node listed twice; a pod's accelerator count."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.bootstrap.kube import facts as kubefacts
from npu_job.bootstrap.kube.facts import read_nodes, read_pods
from npu_job.bootstrap.kube.objects import KubeObject, read_objects

from npu_job.errors import InputError

from ..kubedamage import CLUSTER, NODE, POD, VALUES, damaged_copy, outcome_of, paths_into


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_damaged_pod_reads_the_same_either_way(data):
    paths = list(paths_into(POD))
    path = data.draw(st.sampled_from(paths))
    item = damaged_copy(POD, path, data.draw(VALUES))
    obj = KubeObject("Pod", "items[0]", item) if isinstance(item, dict) else None
    if obj is None:
        return
    fast = outcome_of(lambda o: read_pods([o], "s")[0], obj)
    checked = outcome_of(lambda o: kubefacts._pod_checked(o, "s"), obj)
    assert fast == checked


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_damaged_node_reads_the_same_either_way(data):
    path = data.draw(st.sampled_from(list(paths_into(NODE))))
    item = damaged_copy(NODE, path, data.draw(VALUES))
    if not isinstance(item, dict):
        return
    obj = KubeObject("Node", "items[0]", item)
    fast = outcome_of(lambda o: read_nodes([o], "s")[0], obj)
    checked = outcome_of(lambda o: kubefacts._nodes_checked([o], "s")[0], obj)
    assert fast == checked


def test_the_fixtures_read_the_same_either_way():
    objects = read_objects(CLUSTER, "c")
    assert read_pods(objects.pods, "c") == tuple(
        kubefacts._pod_checked(o, "c") for o in objects.pods
    )
    assert read_nodes(objects.nodes, "c") == tuple(kubefacts._nodes_checked(objects.nodes, "c"))


def test_a_node_listed_twice_is_an_error_naming_both():
    objects = read_objects({"kind": "NodeList", "items": [NODE, NODE]}, "n")
    with pytest.raises(
        InputError,
        match=r"^n: items\[1\] \(Node 'node-0'\): metadata.name: expected a "
        r"node name unique in the list; 'node-0' is also items\[0\]$",
    ):
        read_nodes(objects.nodes, "n")


@pytest.mark.parametrize(
    "quantity, expected",
    [
        ("8", 8),
        (8, 8),
        ("0008", 8),
        ("²", None),
        ("8 ", None),
        ("1024", 1024),
        (1024, 1024),
        ("0" * 30 + "1024", 1024),
        ("1025", None),
        (1025, None),
        ("999999999", None),
        (10**12, None),
        (int("9" * 4300), None),
        ("9" * 5000, None),
        (-1, None),
    ],
)
def test_a_pods_accelerator_quantity_is_a_count_of_at_most_1024(quantity, expected):
    """Read either way by npu_job.parsing's count reader: ASCII digits only (``"²"`` is a digit
    to ``int()``), or a non-negative JSON integer, at most kubefacts.MAX_DEVICES (a server's
    accelerators: the roster builds one object per device); anything else names the field."""
    resources = {"limits": {"nvidia.com/gpu": quantity}, "requests": {"nvidia.com/gpu": quantity}}
    pod = damaged_copy(POD, ("spec", "containers", 0, "resources"), resources)
    obj = KubeObject("Pod", "items[0]", pod)
    for read in (lambda o: read_pods([o], "s")[0], lambda o: kubefacts._pod_checked(o, "s")):
        outcome = outcome_of(read, obj)
        if expected is None:
            assert outcome[0] == "error" and "nvidia.com/gpu" in outcome[1], outcome
            assert "expected a whole number of devices, at most 1024, got" in outcome[1]
        else:
            assert outcome == ("ok", outcome[1]) and outcome[1].accelerators == expected


def test_a_pods_containers_ask_for_at_most_1024_accelerators_in_all():
    pod = damaged_copy(
        POD,
        ("spec", "containers"),
        [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": 600}}} for i in range(2)],
    )
    obj = KubeObject("Pod", "items[0]", pod)
    for read in (lambda o: read_pods([o], "s")[0], lambda o: kubefacts._pod_checked(o, "s")):
        assert outcome_of(read, obj) == (
            "error",
            "s: items[0] (Pod 'llama-worker-0'): spec.containers: expected at most 1024 in all (the "
            "server's accelerators), got 1200",
        )


def test_a_pods_ip_is_read_either_way_and_a_bad_one_named():
    """status.podIP: how a pod of a kind without DNS names is reached ("" until it has one)."""
    objects = read_objects(CLUSTER, "c")
    listed = [(o.item.get("status") or {}).get("podIP", "") for o in objects.pods]
    assert "172.20.7.11" in listed and "" in listed  # the fixtures' notebook has none
    readers = (lambda o: read_pods([o], "s")[0], lambda o: kubefacts._pod_checked(o, "s"))
    for read in readers:
        assert [read(o).pod_ip for o in objects.pods] == listed
        damaged = KubeObject("Pod", "items[0]", damaged_copy(POD, ("status", "podIP"), 5))
        assert outcome_of(read, damaged) == (
            "error",
            "s: items[0] (Pod 'llama-worker-0'): status.podIP: expected a string, got a number 5",
        )
