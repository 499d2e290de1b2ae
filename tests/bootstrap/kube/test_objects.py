"""Kubernetes documents: which Nodes, Pods and HyperNodes a list holds, as the API (typed lists,
no kind per item) and kubectl (a List, -o yaml, a single object) print them; a page's continue
token."""

import json

import pytest
from npu_job.bootstrap.kube import objects as kubeobjects
from npu_job.bootstrap.kube.facts import read_nodes, read_pods
from npu_job.bootstrap.kube.objects import decode_objects, list_continue, read_objects

from npu_job.errors import InputError

from ..kubedamage import CLUSTER, NODE


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
    from npu_job.bootstrap.kube.hypernode import read_hypernodes

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
