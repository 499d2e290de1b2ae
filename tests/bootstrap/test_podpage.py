"""A page of the API's PodList read straight into the pods' facts (msgspec, typed structs): the
facts the general readers read from it, or, having decided nothing, no answer, which leaves the
page to them: a damaged pod, an item with a kind, a page that is no PodList, msgspec not loaded."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.bootstrap import podpage
from npu_job.bootstrap.kubefacts import read_pods
from npu_job.bootstrap.kubeobjects import read_objects

from .engines import json_engine
from .kubedamage import POD, VALUES, damaged_copy, outcome_of, paths_into


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_page_of_the_apis_podlist_reads_straight_into_the_same_facts_or_declines(data):
    """``read_pod_page`` (msgspec, typed) reads what the general way reads, or leaves the page
    to it: a damaged pod, an item with a kind, a page that is no PodList."""
    pods = [{k: v for k, v in POD.items() if k not in ("kind", "apiVersion")} for _ in range(3)]
    page = {"kind": "PodList", "apiVersion": "v1", "metadata": {"continue": "t"}, "items": pods}
    path = data.draw(st.sampled_from([("items", 1, *p) for p in paths_into(pods[1])] + [("kind",)]))
    damaged = damaged_copy(page, path, data.draw(VALUES))
    text = json.dumps(damaged).encode()
    with json_engine("msgspec"):
        typed = podpage.read_pod_page(text)
        general = outcome_of(lambda d: read_pods(read_objects(d, "s").pods, "s"), damaged)
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
