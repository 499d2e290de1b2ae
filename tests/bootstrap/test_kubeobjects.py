"""Reading Kubernetes objects: the fast readers (a 4096-pod job) mean exactly what the field-by-field
readers mean, on the fixtures and on every damaged copy of them hypothesis makes; lists as the API
and kubectl print them."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.bootstrap import kubefacts, kubeobjects, podpage
from npu_job.bootstrap.kubefacts import read_nodes, read_pods
from npu_job.bootstrap.kubeobjects import KubeObject, decode_objects, list_continue, read_objects

from npu_job.errors import InputError

from .engines import json_engine

FIXTURES = Path(__file__).parent / "fixtures" / "kube"
CLUSTER = json.loads((FIXTURES / "cluster.json").read_text())
NODE = next(i for i in CLUSTER["items"] if i["kind"] == "Node")
POD = next(i for i in CLUSTER["items"] if i["kind"] == "Pod")
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 12),
    st.text(max_size=4),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _paths(value, prefix=()):
    """Every path into a document, containers and leaves."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, prefix + (index,))


def _damaged(document, path, value):
    copy = json.loads(json.dumps(document))
    if not path:
        return value
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


def _outcome(read, obj):
    try:
        return "ok", read(obj)
    except InputError as error:
        return "error", error.message


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_damaged_pod_reads_the_same_either_way(data):
    paths = list(_paths(POD))
    path = data.draw(st.sampled_from(paths))
    item = _damaged(POD, path, data.draw(VALUES))
    obj = KubeObject("Pod", "items[0]", item) if isinstance(item, dict) else None
    if obj is None:
        return
    fast = _outcome(lambda o: read_pods([o], "s")[0], obj)
    checked = _outcome(lambda o: kubefacts._pod_checked(o, "s"), obj)
    assert fast == checked


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_page_of_the_apis_podlist_reads_straight_into_the_same_facts_or_declines(data):
    """``read_pod_page`` (msgspec, typed) reads what the general way reads, or leaves the page
    to it: a damaged pod, an item with a kind, a page that is no PodList."""
    pods = [{k: v for k, v in POD.items() if k not in ("kind", "apiVersion")} for _ in range(3)]
    page = {"kind": "PodList", "apiVersion": "v1", "metadata": {"continue": "t"}, "items": pods}
    path = data.draw(st.sampled_from([("items", 1, *p) for p in _paths(pods[1])] + [("kind",)]))
    damaged = _damaged(page, path, data.draw(VALUES))
    text = json.dumps(damaged).encode()
    with json_engine("msgspec"):
        typed = podpage.read_pod_page(text)
        general = _outcome(lambda d: read_pods(read_objects(d, "s").pods, "s"), damaged)
    if typed is not None:  # declining is always safe: the general way decides
        assert ("ok", typed[0]) == general and typed[1] == "t"


def test_an_intact_page_is_read_straight_and_without_msgspec_declined():
    items = [{k: v for k, v in POD.items() if k not in ("kind", "apiVersion")}]
    text = json.dumps({"kind": "PodList", "metadata": {}, "items": items}).encode()
    with json_engine("msgspec"):
        facts, token = podpage.read_pod_page(text)
    assert facts == read_pods(read_objects(json.loads(text), "s").pods, "s") and token is None
    with json_engine("stdlib"):
        assert podpage.read_pod_page(text) is None


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_damaged_node_reads_the_same_either_way(data):
    path = data.draw(st.sampled_from(list(_paths(NODE))))
    item = _damaged(NODE, path, data.draw(VALUES))
    if not isinstance(item, dict):
        return
    obj = KubeObject("Node", "items[0]", item)
    fast = _outcome(lambda o: read_nodes([o], "s")[0], obj)
    checked = _outcome(lambda o: kubefacts._nodes_checked([o], "s")[0], obj)
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


def test_typed_lists_imply_the_kind_and_lists_need_it():
    typed = read_objects({"kind": "PodList", "items": [{"metadata": {"name": "p"}}]}, "x")
    assert [o.kind for o in typed.pods] == ["Pod"]
    with pytest.raises(
        InputError, match=r"^x: items\[0\].kind: expected the kind of each item of a List"
    ):
        read_objects({"kind": "List", "items": [{"metadata": {"name": "p"}}]}, "x")
    with pytest.raises(
        InputError, match=r"^x: kind: expected HyperNodeList, List, NodeList, PodList or a single"
    ):
        read_objects({"kind": "ConfigMap", "items": []}, "x")
    with pytest.raises(InputError, match=r"^x: kind: expected HyperNodeList, .*, got an array$"):
        read_objects({"kind": [], "items": []}, "x")  # not a TypeError (unhashable)
    single = read_objects(NODE, "x")
    assert single.nodes[0].where == "" and read_nodes(single.nodes, "x")[0].name == "node-0"
    other = read_objects({"kind": "List", "items": [{"kind": "Service", "metadata": {}}]}, "x")
    assert other == kubeobjects.KubeObjects()


def test_kubectl_yaml_reads_like_its_json(tmp_path):
    import yaml
    from npu_job.bootstrap.hypernode import read_hypernodes

    def facts(objects):  # what is read (msgspec, when loaded, decodes JSON into just that)
        return (
            read_nodes(objects.nodes, "c"),
            read_pods(objects.pods, "c"),
            read_hypernodes(objects.hypernodes, "c"),
        )

    text = yaml.safe_dump(CLUSTER).encode()
    from_yaml = facts(decode_objects(text, "c.yaml"))
    assert from_yaml == facts(decode_objects(json.dumps(CLUSTER).encode(), "c.json"))
    assert all(from_yaml)


def test_the_continue_token_of_a_page():
    assert list_continue({"metadata": {"continue": "abc"}}) == "abc"
    assert list_continue({"metadata": {"continue": ""}}) is None
    assert list_continue({"metadata": {}}) is None and list_continue([]) is None


@pytest.mark.parametrize(
    "quantity, expected",
    [("8", 8), (8, 8), ("0008", 8), ("²", None), ("8 ", None), ("1000000000", None), (-1, None)],
)
def test_a_pods_accelerator_quantity_is_a_count_below_a_billion(quantity, expected):
    """Read either way by npu_job.parsing's count reader: ASCII digits only (``"²"`` is a digit
    to ``int()``), or a non-negative JSON integer; anything else names the field."""
    resources = {"limits": {"nvidia.com/gpu": quantity}, "requests": {"nvidia.com/gpu": quantity}}
    pod = _damaged(POD, ("spec", "containers", 0, "resources"), resources)
    obj = KubeObject("Pod", "items[0]", pod)
    for read in (lambda o: read_pods([o], "s")[0], lambda o: kubefacts._pod_checked(o, "s")):
        outcome = _outcome(read, obj)
        if expected is None:
            assert outcome[0] == "error" and "nvidia.com/gpu" in outcome[1], outcome
        else:
            assert outcome == ("ok", outcome[1]) and outcome[1].accelerators == expected
