"""Sources: where the rank table and topology are looked for, and how bytes are fetched from files,
from a real HTTPS server on loopback, and from a (fake, documented-format) Kubernetes API."""

import os
import time

import pytest
from npu_job.bootstrap.base import payload
from npu_job.bootstrap.kube.api import NODES_PATH, KubeClient
from npu_job.bootstrap.kube.topology import topology_from_objects
from npu_job.bootstrap.options import resolve
from npu_job.bootstrap.sources import (
    K8S_TOPOLOGY,
    KubernetesAPI,
    SourceUnavailable,
    fetch_url,
    http_session,
    locate_rank_table,
    read_bytes,
    read_file,
    topology_candidates,
)

from npu_job.errors import InputError

from .documents import node
from .fake_kube_api import FakeKubernetesAPI
from .https_server import (
    HTTPSServer,
    serve_bytes,
    serve_dripping,
    serve_sequence,
    tls_files_fixture,
)

tls_files = pytest.fixture(scope="module")(tls_files_fixture)


@pytest.fixture
def server(tls_files):
    with HTTPSServer(*tls_files) as running:
        yield running


@pytest.fixture
def ca(tls_files):
    return str(tls_files[0])


# --- where ------------------------------------------------------------------------------------


def located(flags, env):
    """Where the bootstrap looks for the rank table, given these flags and this environment."""
    return locate_rank_table(resolve(flags, env).rank_table)


def test_rank_table_file_may_be_a_file_a_directory_or_a_url(tmp_path):
    assert located({}, {"RANK_TABLE_FILE": str(tmp_path / "x.json")}) == str(tmp_path / "x.json")
    assert located({}, {"RANK_TABLE_FILE": str(tmp_path)}) == str(tmp_path / "jobstart_hccl.json")
    assert located({}, {"RANK_TABLE_FILE": "https://h/t.json"}) == "https://h/t.json"
    assert located({"rank_table": "/flag.json"}, {"RANK_TABLE_FILE": "/env.json"}) == "/flag.json"
    (tmp_path / "hccl.json").write_text("{}")  # a MindX rings-config mount holds hccl.json
    assert located({}, {"RANK_TABLE_FILE": str(tmp_path)}) == str(tmp_path / "hccl.json")
    (tmp_path / "jobstart_hccl.json").write_text("{}")
    assert located({}, {"RANK_TABLE_FILE": str(tmp_path)}) == str(tmp_path / "jobstart_hccl.json")


@pytest.mark.parametrize(
    "existing, expected",
    [
        (
            {"/user/config/jobstart_hccl.json", "/user/serverid/devindex/config/hccl.json"},
            "/user/config/jobstart_hccl.json",
        ),
        ({"/user/serverid/devindex/config/hccl.json"}, "/user/serverid/devindex/config/hccl.json"),
    ],
    ids=["cce-first", "mindx-second"],
)
def test_platform_default_locations_in_order(existing, expected):
    assert locate_rank_table(None, exists=existing.__contains__) == expected


def test_no_rank_table_anywhere_says_where_it_looked():
    with pytest.raises(InputError) as caught:
        locate_rank_table(None, exists=lambda path: False)
    assert caught.value.message == (
        "rank table: location: expected $RANK_TABLE_FILE or one of /user/config/jobstart_hccl.json, "
        "/user/serverid/devindex/config/hccl.json (none is set or exists)"
    )


def chain_of(flag, fmt, rank_table, env):
    """The topology chain a pod walks with ``--topology flag`` (None: not given) and ``env``."""
    options = resolve({"topology": flag, "topology_format": fmt}, env)
    return topology_candidates(
        options.topology,
        options.topology_format,
        rank_table,
        tor_info=options.tor_info,
        ask_api=options.k8s_topology,
    )


def test_topology_chain_order_and_overrides():
    chain = chain_of(
        None, None, "/user/config/jobstart_hccl.json", {"NPU_JOB_TOR_INFO": "/etc/tor/tor_info"}
    )
    assert [(c.location, c.fmt, c.required) for c in chain] == [
        ("/user/config/ranktable_tor.json", "cce-ranktable-tor", False),
        ("/etc/tor/tor_info", "basic-tor-node-cm", False),
        (K8S_TOPOLOGY, None, False),  # the cluster's HyperNodes, else its node labels
        ("/etc/npu-job/topology.yaml", "file", False),
        ("/etc/npu-job/topology.json", "file", False),
    ]
    no_api = chain_of(None, None, "https://h/t.json", {"NPU_JOB_K8S_TOPOLOGY": "0"})
    assert [c.location for c in no_api] == [
        "/etc/npu-job/topology.yaml",
        "/etc/npu-job/topology.json",
    ]
    forced = chain_of(None, "file", "/r.json", {"NPU_JOB_TOPOLOGY": "https://h/topo.yaml"})
    assert [(c.location, c.fmt, c.required) for c in forced] == [
        ("https://h/topo.yaml", "file", True)
    ]
    assert (
        chain_of("k8s", None, "/r.json", {"NPU_JOB_TOPOLOGY": "/ignored"})[0].location
        == K8S_TOPOLOGY
    )


# --- files ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda p: p, "file: expected an existing file (not found)"),
        (lambda p: (p.mkdir(), p)[1], "file: expected a file, got a directory"),
    ],
    ids=["missing", "directory"],
)
def test_unreadable_files(tmp_path, make, expected):
    path = make(tmp_path / "jobstart_hccl.json")
    with pytest.raises(InputError) as caught:
        read_file(path)
    assert caught.value.message == f"{path}: {expected}"


def test_huge_file_is_refused_before_reading_it(tmp_path):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(payload.MAX_INPUT_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(
        InputError, match=r"size: expected at most 64 MiB \(67108864 bytes\), got 67108865 bytes"
    ):
        read_file(huge)


# --- HTTPS ------------------------------------------------------------------------------------


def test_url_source_verifies_tls_against_the_given_ca(server, ca):
    server.routes["/rank.json"] = serve_bytes(b'{"status": "completed"}')
    assert read_bytes(server.url("/rank.json"), verify=ca) == b'{"status": "completed"}'


def test_untrusted_certificate_is_an_input_error_not_a_retry(server):
    server.routes["/rank.json"] = serve_bytes(b"{}")
    with pytest.raises(InputError) as caught:
        read_bytes(server.url("/rank.json"), verify=True)  # the system CAs do not know our cert
    assert not isinstance(caught.value, SourceUnavailable)
    assert caught.value.message.startswith(
        f"{server.url('/rank.json')}: TLS: expected a certificate trusted"
    )


def test_not_found_is_an_input_error(server, ca):
    with pytest.raises(InputError, match=r": HTTP status: expected 200 OK, got 404 Not Found$"):
        read_bytes(server.url("/missing.json"), verify=ca)


def test_server_errors_are_retried(server, ca):
    server.routes["/rank.json"] = serve_sequence((503, {}, b"busy"), (200, {}, b"[1]"))
    assert (
        fetch_url(server.url("/rank.json"), verify=ca, session=http_session(retries=2, backoff=0))
        == b"[1]"
    )
    assert [path for path, _ in server.requests] == ["/rank.json", "/rank.json"]


def test_persistent_server_error_is_unavailable_not_invalid(server, ca):
    server.routes["/rank.json"] = serve_bytes(b"down", status=502)
    with pytest.raises(SourceUnavailable, match="HTTP status: expected 200 OK, got 502"):
        fetch_url(server.url("/rank.json"), verify=ca, session=http_session(retries=1, backoff=0))


def test_connection_refused_is_unavailable(server, ca):
    url = server.url("/x")
    server.__exit__(None, None, None)
    with pytest.raises(SourceUnavailable, match="connection: expected a reachable server"):
        fetch_url(url, verify=ca, session=http_session(retries=0, backoff=0))


def test_oversized_response_is_refused(server, ca, monkeypatch):
    monkeypatch.setattr(payload, "MAX_INPUT_BYTES", 100)
    server.routes["/big"] = serve_bytes(b"x" * 101)
    with pytest.raises(InputError, match=r"size: expected at most 100 bytes, got 101 bytes"):
        read_bytes(server.url("/big"), verify=ca)


@pytest.mark.parametrize("head_too", [True, False], ids=["headers dripped", "body dripped"])
def test_a_url_sent_a_byte_at_a_time_ends_by_its_deadline(server, ca, head_too):
    """Each byte comes well within the read timeout, so only a deadline on the whole fetch ends
    it; the retries (default session, backoff and all) do not start again after it."""
    server.routes["/rank.json"] = serve_dripping(
        b'{"status": "completed"}', 0.05, head_too=head_too
    )
    started = time.monotonic()
    with pytest.raises(SourceUnavailable) as raised:
        fetch_url(server.url("/rank.json"), verify=ca, deadline=0.6)
    assert time.monotonic() - started < 0.6 + 0.5
    assert raised.value.message == (
        f"{server.url('/rank.json')}: answer: expected the whole answer within 0.6 s (the server "
        "sent it too slowly)"
    )
    assert len(server.requests) == 1


def test_a_declared_length_too_long_to_be_a_number_is_not_believed(server, ca):
    """The body is counted as it arrives anyway; a Content-Length of 5000 digits is no integer
    (``int()`` stops at 4300) and no reason to fail."""
    server.routes["/odd"] = lambda handler: (200, {"Content-Length": "9" * 5000}, b"[1]")
    assert read_bytes(server.url("/odd"), verify=ca) == b"[1]"


# --- Kubernetes API ---------------------------------------------------------------------------


def _service_account(tmp_path, ca, token="s3cr3t-token"):
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(token + "\n")
    (account / "ca.crt").write_bytes(open(ca, "rb").read())
    return account


def test_in_cluster_api_is_found_from_env_and_service_account(tmp_path, ca):
    account = _service_account(tmp_path, ca)
    env = {
        "KUBERNETES_SERVICE_HOST": "10.247.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "NPU_JOB_K8S_SA_DIR": str(account),
    }
    api = KubernetesAPI.from_env(env)
    assert api == KubernetesAPI(
        "https://10.247.0.1:443", str(account / "token"), str(account / "ca.crt")
    )
    assert (
        KubernetesAPI.from_env({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}).base_url
        == "https://[fd00::1]:443"
    )
    assert KubernetesAPI.from_env({"NPU_JOB_K8S_SA_DIR": str(account)}) is None
    assert KubernetesAPI.from_env({**env, "NPU_JOB_K8S_SA_DIR": str(tmp_path / "none")}) is None


def test_node_list_from_the_api_with_the_service_account_token(server, tmp_path, ca):
    nodes = [node("n1", "10.0.0.1", {"cce.kubectl.kubernetes.io/cabinet": "10.9.0.1-10.9.0.2"})]
    FakeKubernetesAPI(server, "s3cr3t-token", nodes)
    account = _service_account(tmp_path, ca)
    api = KubernetesAPI.from_env(
        {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(server.port),
            "NPU_JOB_K8S_SA_DIR": str(account),
        }
    )
    with KubeClient(api) as client:
        objects = client.list(NODES_PATH)
    assert [n.item["metadata"]["name"] for n in objects.nodes] == ["n1"]
    path, headers = server.requests[-1]
    # served from the API server's watch cache, in pages
    assert path == "/api/v1/nodes?limit=500&resourceVersion=0"
    assert headers["Authorization"] == "Bearer s3cr3t-token"
    assert topology_from_objects(objects, "api").topology.placement_of("10.0.0.1").tors == (
        "10.9.0.1",
        "10.9.0.2",
    )


def test_wrong_token_is_an_input_error(server, tmp_path, ca):
    FakeKubernetesAPI(server, "the-right-token", [])
    account = _service_account(tmp_path, ca, token="a-wrong-token")
    api = KubernetesAPI(
        f"https://127.0.0.1:{server.port}", str(account / "token"), str(account / "ca.crt")
    )
    with pytest.raises(
        InputError,
        match=r"/api/v1/nodes: HTTP status: expected 200 OK, got 401 "
        r"Unauthorized: Unauthorized$",
    ) as caught:
        KubeClient(api).list(NODES_PATH)
    assert caught.value.tip.startswith("the service account token was refused")
    assert os.path.exists(account / "token")


def test_a_certificate_made_with_the_openssl_command_verifies_too(tmp_path):
    import shutil

    from .https_server import _make_self_signed_with_openssl

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    cert, key = _make_self_signed_with_openssl(tmp_path)
    with HTTPSServer(cert, key) as running:
        running.routes["/x"] = serve_bytes(b"ok")
        assert read_bytes(running.url("/x"), verify=str(cert)) == b"ok"
