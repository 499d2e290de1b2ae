"""A page of the API's PodList read straight into the pods' facts (msgspec, typed structs): the
facts the general readers read from it, or, having decided nothing, no answer, which leaves the
page to them: a damaged pod, an item with a kind, a page that is no PodList, msgspec not loaded."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.bootstrap.kube import podpage
from npu_job.bootstrap.kube.facts import read_pods
from npu_job.bootstrap.kube.objects import read_objects

from ..engines import json_engine
from ..kubedamage import POD, VALUES, damaged_copy, outcome_of, paths_into


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
    assert facts[0].pod_ip == POD["status"]["podIP"] and facts[0].host_ip == POD["status"]["hostIP"]
    with json_engine("stdlib"):
        assert podpage.read_pod_page(text) is None


def _page(items) -> bytes:
    return json.dumps({"kind": "PodList", "items": items}, separators=(",", ":")).encode()


def _two_letter_keys():
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return [a + b for a in letters for b in letters]


# The shapes that make the typed decoder build the most per byte of text: small strings and
# label entries, each a few bytes of JSON and a Python object of tens of bytes.
_DENSE_PAGES = {
    "two-letter labels": [
        {"metadata": {"name": f"p{i}", "labels": dict.fromkeys(_two_letter_keys(), "")}}
        for i in range(40)
    ],
    "one-letter pods": [{"metadata": {"name": "a"}} for _ in range(100_000)],
    "one-letter scheduled pods": [
        {
            "metadata": {"name": "a", "namespace": "n", "deletionTimestamp": "t"},
            "spec": {"nodeName": "n", "containers": [{}]},
            "status": {"hostIP": "h", "phase": "p"},
        }
        for _ in range(50_000)
    ],
    "a deletion time of nested objects": [
        {"metadata": {"name": "a", "deletionTimestamp": json.loads('{"a":' * 60 + "0" + "}" * 60)}}
        for _ in range(2000)
    ],
    "many containers": [
        {"metadata": {"name": "a"}, "spec": {"containers": [{"resources": {}}] * 400}}
        for _ in range(200)
    ],
}


def test_the_typed_decoder_builds_at_most_its_stated_bytes_per_byte_of_text():
    """POD_PAGE_BUILDS_AT_MOST is what lets a one-page list of a big job skip counting its
    values: the densest pages measured stay under it (no typed field decodes JSON whole)."""
    import tracemalloc

    import msgspec
    from npu_job.bootstrap.kube.podtypes import POD_PAGE_BUILDS_AT_MOST, pod_page_decoder

    decoder = pod_page_decoder(msgspec)
    for shape, items in _DENSE_PAGES.items():
        text = _page(items)
        tracemalloc.start()
        try:
            decoded = decoder.decode(text)
        except msgspec.ValidationError:  # refused (for the general way): built nothing kept
            decoded = None
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert decoded is None or len(decoded.items) == len(items)
        assert peak <= POD_PAGE_BUILDS_AT_MOST * len(text), (shape, peak / len(text))


def test_a_whole_job_in_one_page_is_read_without_counting_its_values(monkeypatch):
    """The API answers the first page (resourceVersion=0) from its watch cache, which ignores
    ``limit`` before Kubernetes 1.34: a job's pods come in one page of ~5 KB a pod. The typed
    reader decodes it without the whole-document count (a second pass over the text)."""
    from npu_job.bootstrap.base import jsondecode

    pod = {k: v for k, v in POD.items() if k not in ("kind", "apiVersion")}
    text = _page([pod] * (2 * jsondecode._FITS_UNCOUNTED // len(_page([pod]))))
    assert len(text) > jsondecode._FITS_UNCOUNTED  # what fits_decoded would count

    def counted(_text):
        raise AssertionError("counted the values of a page the typed decoder reads")

    monkeypatch.setattr(jsondecode, "_value_count", counted)
    with json_engine("msgspec"):
        facts, _ = podpage.read_pod_page(text)
    assert (
        len(facts) > 1
        and facts[0] == read_pods(read_objects(json.loads(_page([pod])), "s").pods, "s")[0]
    )
