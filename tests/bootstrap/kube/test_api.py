"""The in-cluster API client: pages, retries, refusals, against a real HTTPS server on loopback
serving a thin fake of the documented Kubernetes LIST endpoints (tests/bootstrap/fake_kube_api.py)
or, for the failure cases, answers written here as the API server documents them."""

import gzip
import itertools
import json
import time

import pytest
from npu_job.bootstrap.kube import api as kubeapi
from npu_job.bootstrap.kube.api import (
    HYPERNODES_PATH,
    NODES_PATH,
    KubeClient,
    job_selector_query,
    namespace_of,
    pods_path,
    status_of,
    topology_objects,
)
from npu_job.bootstrap.kube.facts import read_pods
from npu_job.bootstrap.sources import KubernetesAPI, SourceUnavailable
from npu_job.kinds.volcano import KIND as VOLCANO

from npu_job.errors import InputError
from npu_job.polling import Backoff

from ..documents import node
from ..engines import json_engine
from ..fake_kube_api import FakeKubernetesAPI, status
from ..https_server import HTTPSServer, serve_dripping, serve_sequence, tls_files_fixture

tls_files = pytest.fixture(scope="module")(tls_files_fixture)


@pytest.fixture
def server(tls_files):
    with HTTPSServer(*tls_files, keep_alive=True) as running:
        yield running


@pytest.fixture
def api(server, tmp_path, tls_files):
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "ca.crt").write_bytes(tls_files[0].read_bytes())
    return KubernetesAPI(
        f"https://127.0.0.1:{server.port}", str(tmp_path / "token"), str(tmp_path / "ca.crt")
    )


def _pod(index, job="j"):
    return {
        "metadata": {
            "name": f"{job}-worker-{index}",
            "namespace": "ns",
            "labels": {"volcano.sh/job-name": job, "volcano.sh/task-spec": "worker"},
        },
        "spec": {"nodeName": f"n{index}"},
        "status": {"hostIP": f"10.0.0.{index}"},
    }


def test_a_list_follows_continue_tokens_page_by_page(server, api):
    pods = [_pod(i) for i in range(7)] + [_pod(i, "other") for i in range(3)]
    fake = FakeKubernetesAPI(server, "tok", pods=pods, namespaces=("ns",))
    with KubeClient(api, page_size=3) as client:
        objects = client.list(pods_path("ns"), job_selector_query(VOLCANO, "j", "worker"))
    assert [o.item["metadata"]["name"] for o in objects.pods] == [f"j-worker-{i}" for i in range(7)]
    queries = [query for _, query in fake.lists]
    assert [q.get("limit") for q in queries] == [["3"]] * 3
    assert queries[0]["resourceVersion"] == ["0"] and "continue" not in queries[0]
    assert all("resourceVersion" not in q and q["continue"] for q in queries[1:])
    assert queries[0]["labelSelector"] == ["volcano.sh/job-name=j,volcano.sh/task-spec=worker"]


def test_the_label_selector_of_a_jobs_pods_is_its_kinds():
    from ..testkind import NUMBERED

    assert job_selector_query(VOLCANO, "j", None) == {"labelSelector": "volcano.sh/job-name=j"}
    assert job_selector_query(NUMBERED, "j", "worker") == {  # a kind without a group label
        "labelSelector": "example.com/set-name=j,example.com/controller=numbered-set"
    }


def test_pods_are_read_page_by_page_straight_or_the_general_way(server, api):
    """A damaged pod (the label of its index a number) is read the general way, which names it;
    an intact page is read straight into the same facts."""
    pods = [_pod(i) for i in range(5)]
    FakeKubernetesAPI(server, "tok", pods=pods, namespaces=("ns",))
    with json_engine("msgspec"), KubeClient(api, page_size=2) as client:
        facts = client.list_pods(pods_path("ns"))
        objects = client.list(pods_path("ns"))
    assert facts == read_pods(objects.pods, "x") and [p.where for p in facts][:3] == [
        "items[0]",
        "items[1]",
        "items[0]",
    ]
    pods[3] = {
        **pods[3],
        "metadata": {**pods[3]["metadata"], "labels": {"volcano.sh/task-index": 3}},
    }
    FakeKubernetesAPI(server, "tok", pods=pods, namespaces=("ns",))
    with json_engine("msgspec"), KubeClient(api, page_size=2) as client, pytest.raises(
        InputError,
        match=r"/api/v1/namespaces/ns/pods: items\[1\] \(Pod 'j-worker-3'\): "
        r"metadata.labels.volcano.sh/task-index: expected a string, got a number 3$",
    ):
        client.list_pods(pods_path("ns"))


def test_big_answers_come_gzipped_and_read_the_same(server, api):
    nodes = [
        node(f"n{i}", f"10.0.{i // 256}.{i % 256}", {"volcano.sh/tor": f"t{i % 9}"})
        for i in range(800)
    ]
    FakeKubernetesAPI(server, "tok", nodes)
    with KubeClient(api) as client:
        objects = client.list(NODES_PATH)
    assert len(objects.nodes) == 800
    assert any(h.get("Accept-Encoding") == "gzip" for _, h in server.requests)


def test_busy_and_failing_servers_are_retried_then_unavailable(server, api, monkeypatch):
    monkeypatch.setattr(kubeapi, "RETRY", Backoff.fixed(0.01))
    body = json.dumps({"kind": "NodeList", "items": []}).encode()
    server.routes[NODES_PATH] = serve_sequence(
        status(503, "ServiceUnavailable", "etcd is slow"),
        status(429, "TooManyRequests", "slow down"),
        (200, {"Content-Type": "application/json"}, body),
    )
    with KubeClient(api) as client:
        assert client.list(NODES_PATH).nodes == ()
    server.routes[NODES_PATH] = serve_sequence(status(500, "InternalError", "boom"))
    with pytest.raises(SourceUnavailable) as caught:
        KubeClient(api).list(NODES_PATH)
    assert caught.value.message.endswith(
        "/api/v1/nodes: HTTP status: expected 200 OK, got 500 Internal Server Error: boom"
    )


@pytest.mark.parametrize(
    "quick, pauses", [(False, [0.5, 1.0, 2.0]), (True, [0.5])], ids=["required", "quick"]
)
def test_a_failing_server_is_asked_again_after_doubling_pauses_then_given_up(
    server, api, quick, pauses
):
    """Three retries 0.5, 1 and 2 s apart (one for an optional source), without jitter."""
    server.routes[NODES_PATH] = serve_sequence(status(503, "ServiceUnavailable", "etcd is slow"))
    slept = []
    with pytest.raises(SourceUnavailable, match="503"):
        KubeClient(api, quick=quick, sleep=slept.append).list(NODES_PATH)
    assert slept == pauses
    assert len(server.requests) == len(pauses) + 1


def test_an_expired_continue_token_is_a_passing_failure(server, api, monkeypatch):
    monkeypatch.setattr(kubeapi, "RETRY", Backoff.fixed(0.01))
    server.routes[NODES_PATH] = serve_sequence(
        status(410, "Expired", "The provided continue parameter is too old")
    )
    with pytest.raises(
        SourceUnavailable, match="410 Gone: The provided continue parameter is too old"
    ):
        KubeClient(api).list(NODES_PATH)


def test_a_refusal_names_the_rule_and_is_not_retried(server, api):
    fake = FakeKubernetesAPI(server, "tok", forbidden={"nodes"})
    with pytest.raises(InputError) as caught:
        KubeClient(api).list(NODES_PATH)
    assert status_of(caught.value) == 403 and len(fake.lists) == 0
    assert "got 403 Forbidden: nodes is forbidden" in caught.value.message
    assert "npu-job render emits the Role and ClusterRole" in caught.value.tip


def test_topology_objects_skip_what_the_cluster_lacks_or_refuses(server, api):
    nodes = [node("n1", "10.0.0.1", {})]
    FakeKubernetesAPI(server, "tok", nodes)  # no HyperNode CRD: 404
    with KubeClient(api) as client:
        objects = topology_objects(client)
    assert len(objects.nodes) == 1 and objects.hypernodes == ()
    hypernode = {
        "metadata": {"name": "s0"},
        "spec": {
            "tier": 1,
            "members": [{"type": "Node", "selector": {"exactMatch": {"name": "n1"}}}],
        },
    }
    fake = FakeKubernetesAPI(server, "tok", nodes, hypernodes=[hypernode], forbidden={"nodes"})
    with KubeClient(api) as client:
        objects = topology_objects(client)
    assert len(objects.hypernodes) == 1 and objects.nodes == ()
    fake.forbidden = set()
    fake.lists.clear()
    with KubeClient(api) as client:  # the HyperNodes name their nodes: no need for the Nodes
        topology_objects(client, by_name=True)
    assert [path for path, _ in fake.lists] == [HYPERNODES_PATH]
    fake.hypernodes = [
        {
            "metadata": {"name": "s0"},
            "spec": {
                "tier": 1,
                "members": [
                    {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": "r1"}}}}
                ],
            },
        }
    ]
    fake.lists.clear()
    with KubeClient(api) as client:  # a label member: the Nodes' labels are needed
        topology_objects(client, by_name=True)
    assert [path for path, _ in fake.lists] == [HYPERNODES_PATH, NODES_PATH]


def test_an_untrusted_certificate_is_an_input_error_at_once(server, api, tmp_path):
    from ..https_server import make_self_signed

    (tmp_path / "other").mkdir()
    other_ca, _ = make_self_signed(tmp_path / "other")
    stranger = KubernetesAPI(api.base_url, api.token_path, str(other_ca))
    with pytest.raises(
        InputError,
        match=r"/api/v1/nodes: TLS: expected a certificate trusted by the "
        r"service account's CA",
    ):
        KubeClient(stranger).list(NODES_PATH)


def test_an_answer_over_the_cap_is_refused(server, api, monkeypatch):
    monkeypatch.setattr(kubeapi, "MAX_INPUT_BYTES", 1000)
    monkeypatch.setattr("npu_job.bootstrap.base.payload.MAX_INPUT_BYTES", 1000)
    server.routes[NODES_PATH] = lambda handler: (200, {}, b"{" + b" " * 5000 + b"}")
    with pytest.raises(InputError, match="size: expected at most 1000 bytes, got 5002 bytes"):
        KubeClient(api).list(NODES_PATH)


def test_the_namespace_comes_from_the_environment_or_the_service_account(tmp_path):
    assert namespace_of({"NPU_JOB_NAMESPACE": "a"}) == "a"
    (tmp_path / "namespace").write_text("team-b\n")
    assert namespace_of({"NPU_JOB_K8S_SA_DIR": str(tmp_path)}) == "team-b"
    assert namespace_of({"NPU_JOB_K8S_SA_DIR": str(tmp_path / "none")}) is None


def test_gzip_bodies_are_what_the_reader_unwraps():
    from npu_job.bootstrap.base.payload import decode_document

    document = {"kind": "NodeList", "items": []}
    assert decode_document(gzip.compress(json.dumps(document).encode()), "x") == document


def test_a_kept_alive_connection_the_server_closed_is_opened_again_at_once(
    server, api, monkeypatch
):
    # a retry that waited would time the test out
    monkeypatch.setattr(kubeapi, "RETRY", Backoff.fixed(60.0))
    body = json.dumps({"kind": "NodeList", "items": []}).encode()
    answers = [(200, {}, body), None, (200, {}, body)]
    server.routes[NODES_PATH] = lambda handler: answers.pop(0)
    with KubeClient(api) as client:
        client.list(NODES_PATH)
        client.list(NODES_PATH)  # the kept-alive connection is gone: a new one, no backoff
    assert answers == []


# --- bounded whatever the server answers ------------------------------------------------------


def _page(token, items=()):
    metadata = {"continue": token} if token else {}
    body = {"kind": "NodeList", "metadata": metadata, "items": list(items)}
    return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()


@pytest.mark.parametrize(
    "tokens, pages",
    [({"": "again", "again": "again"}, 2), ({"": "A", "A": "B", "B": "A"}, 3)],
    ids=["the same token again", "a cycle A, B, A"],
)
def test_a_continue_token_that_comes_back_ends_the_list_naming_it(server, api, tokens, pages):
    """A server that answers every page with a token it gave before would be asked ~2,000 times
    a second for ever (and its items kept): the first repeat is an error naming the list."""
    asked = []

    def route(handler):
        given = handler.path.partition("continue=")[2]
        asked.append(given)
        return _page(tokens[given], [node(f"n{len(asked)}", "10.0.0.1", {})])

    server.routes[NODES_PATH] = route
    with KubeClient(api) as client, pytest.raises(InputError) as raised:
        client.list(NODES_PATH)
    assert raised.value.message == (
        f"{api.base_url}{NODES_PATH}: metadata.continue: expected a new continue token on every "
        f"page; page {pages} gave {tokens[asked[-1]]!r} again (the server pages in a cycle)"
    )
    assert len(asked) == pages


def test_a_list_that_pages_on_without_end_stops_at_max_pages(server, api, monkeypatch):
    monkeypatch.setattr(kubeapi, "MAX_PAGES", 5)
    counter = itertools.count()
    server.routes[NODES_PATH] = lambda handler: _page(f"t{next(counter)}")
    with KubeClient(api) as client, pytest.raises(
        InputError,
        match=r"/api/v1/nodes: metadata.continue: expected the list to end within 5 "
        r"pages of 500$",
    ):
        client.list(NODES_PATH)
    assert next(counter) == 5


def test_a_list_keeps_at_most_max_items(server, api, monkeypatch):
    """Counted whatever the pages' size (a server may ignore limit), before a page is kept."""
    monkeypatch.setattr(kubeapi, "MAX_ITEMS", 10)
    FakeKubernetesAPI(server, "tok", [node(f"n{i}", f"10.0.0.{i}", {}) for i in range(11)])
    with KubeClient(api, page_size=4) as client, pytest.raises(
        InputError, match=r"/api/v1/nodes: items: expected at most 10 items in the list \(page 3\)$"
    ):
        client.list(NODES_PATH)
    with KubeClient(api, page_size=4) as client:
        monkeypatch.setattr(kubeapi, "MAX_ITEMS", 11)
        assert len(client.list(NODES_PATH).nodes) == 11


@pytest.mark.parametrize("head_too", [True, False], ids=["headers dripped", "body dripped"])
def test_an_answer_sent_a_byte_at_a_time_ends_by_its_deadline(server, api, head_too):
    """Each byte comes well within the per-read timeout, so only a deadline on the whole answer
    ends it; a retry would not come faster, so there is none."""
    body = json.dumps({"kind": "NodeList", "items": [node("n0", "10.0.0.1", {})]}).encode()
    server.routes[NODES_PATH] = serve_dripping(body, 0.05, head_too=head_too)
    client = KubeClient(api)
    client.answer_deadline = 0.6
    started = time.monotonic()
    with client, pytest.raises(SourceUnavailable) as raised:
        client.list(NODES_PATH)
    assert time.monotonic() - started < 0.6 + 0.5
    assert raised.value.message == (
        f"{api.base_url}{NODES_PATH}: answer: expected a whole answer within 0.6 s (the server sent "
        "it too slowly)"
    )
    assert len(server.requests) == 1


def test_a_whole_list_ends_by_its_deadline_however_quick_each_page(server, api):
    counter = itertools.count()

    def route(handler):
        time.sleep(0.1)
        return _page(f"t{next(counter)}")

    server.routes[NODES_PATH] = route
    client = KubeClient(api)
    client.list_deadline = 0.5
    started = time.monotonic()
    with client, pytest.raises(
        SourceUnavailable, match=r"/api/v1/nodes: list: expected the whole list within 0.5 s$"
    ):
        client.list(NODES_PATH)
    assert time.monotonic() - started < 0.5 + 0.3
    assert 3 <= next(counter) <= 6
