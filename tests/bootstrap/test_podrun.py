"""The bootstrap with no rank table: the job's pods from a `kubectl get pods -o json` file or from
the Kubernetes API, waited for until every one is scheduled, then planned like a rank table.

The API is a real HTTPS server on loopback serving a thin fake of the documented Kubernetes LIST
endpoints (tests/bootstrap/fake_kube_api.py: typed lists, labelSelector, limit/continue pages,
bearer token, RBAC refusals) from the fixtures of tests/bootstrap/fixtures/kube and from a
generated 4096-pod job."""

import json
import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from npu_job.bootstrap import planner
from npu_job.bootstrap.kube import api as kubeapi
from npu_job.bootstrap.kube.facts import read_pods
from npu_job.bootstrap.kube.jobpods import (
    JobSelector,
    by_server,
    job_roster,
    node_names,
    roster_table,
)
from npu_job.bootstrap.kube.objects import read_objects
from npu_job.bootstrap.kube.topology import KubeContext, topology_from_objects
from npu_job.bootstrap.nodereport import plan_round
from npu_job.bootstrap.run import bootstrap

from npu_job.errors import InputError, NotReadyError
from npu_job.podfacts import (
    ENV_FILE,
    MASTER_FILE,
    NODE_REPORT_FILE,
    RANK_FILE,
    RANK_TABLE_COPY,
    ROUTE_PLAN_FILE,
)

from .fake_kube_api import FakeKubernetesAPI, in_cluster, service_account
from .https_server import HTTPSServer, tls_files_fixture
from .kubejob import big_job
from .testkind import INDEX_LABEL, as_numbered

tls_files = pytest.fixture(scope="module")(tls_files_fixture)
FIXTURES = Path(__file__).parent / "fixtures" / "kube"
CLUSTER = json.loads((FIXTURES / "cluster.json").read_text())
KINDS = {
    kind: [i for i in CLUSTER["items"] if i["kind"] == kind]
    for kind in ("Node", "Pod", "HyperNode")
}
JOB_PODS = [
    p for p in KINDS["Pod"] if p["metadata"]["labels"].get("volcano.sh/job-name") == "llama"
]


def expected_plan(items):
    """What every pod must compute: the planner on the fixture job, read straight from the objects."""
    objects = read_objects({"kind": "List", "items": items}, "x")
    roster = job_roster(read_pods(objects.pods, "x"), JobSelector(job="llama"), "x")
    table, nodes = roster_table(roster, "x"), node_names(roster)
    topology = topology_from_objects(objects, "x", context=KubeContext(names=nodes)).topology
    return planner.plan(table, by_server(topology, table, nodes))


def pod_env(index, out, **extra):
    pod = JOB_PODS[index]
    return {
        "VC_TASK_INDEX": str(index),
        "MA_CURRENT_HOST_IP": pod["status"]["hostIP"],
        "MA_VJ_NAME": "llama",
        "MA_TASK_NAME": "worker",
        "MA_NUM_HOSTS": "8",
        "NPU_JOB_OUTPUT_DIR": str(out),
        "NPU_JOB_K8S_TOPOLOGY": "1",
        **extra,
    }


# --- a file of pods ---------------------------------------------------------------------------


def test_every_pod_plans_the_same_from_a_cluster_file_and_writes_no_rank_table(tmp_path):
    expected = expected_plan(CLUSTER["items"])
    assert expected.status.value == "success"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / RANK_TABLE_COPY).write_text("{}")  # a stale copy from an earlier run
    cluster = str(FIXTURES / "cluster.json")
    reports = {}
    for index in range(8):
        result = bootstrap({}, pod_env(index, tmp_path / "out", NPU_JOB_PODS=cluster))
        reports[f"agent-{7 - index}"] = (tmp_path / "out" / NODE_REPORT_FILE).read_bytes()
        plan = result.route_plan
        assert plan["status"] == "success", plan["reason"]
        assert (plan["rank_mapping"], plan["mapping_digest"]) == (
            expected.rank_mapping,
            expected.mapping_digest,
        )
        assert plan["pods"] == cluster and plan["rank_table"] is None
        assert plan["topology"] == f"{cluster} (volcano-hypernodes)"
        out = tmp_path / "out"
        assert (out / RANK_FILE).read_text() == str(expected.node_rank_of_pod[index])
        assert (out / MASTER_FILE).read_text() == str(expected.master_index)
        assert not (out / RANK_TABLE_COPY).exists()
        assert "RANK_TABLE_FILE" not in (out / ENV_FILE).read_text()
        assert json.loads((out / ROUTE_PLAN_FILE).read_text()) == plan
    # the rendezvous root's plan over the pods' reports is the one every pod made
    round_plan = plan_round(reports)
    assert round_plan.problems == () and round_plan.mapping_digest == expected.mapping_digest
    assert [round_plan.node_rank[f"agent-{7 - index}"] for index in range(8)] == list(
        expected.node_rank_of_pod
    )


def test_a_pod_file_finds_this_pod_by_its_host_ip_and_index(tmp_path):
    env = pod_env(3, tmp_path, NPU_JOB_PODS=str(FIXTURES / "cluster.json"), VC_TASK_INDEX="5")
    result = bootstrap({}, env)
    assert result.route_plan["status"] == "failed"
    assert result.route_plan["reason"].endswith(
        "cluster.json: pods[3]: this host '10.1.3.5' is pod index 3 in the job's pods, but VC_TASK_INDEX is 5"
    )


def _master_pod_ip(plan):
    """The pod IP of the pod holding the plan's new rank 0, as the fixture lists it."""
    (master,) = [
        pod
        for pod in JOB_PODS
        if pod["metadata"]["labels"]["volcano.sh/task-index"] == str(plan.master_index)
    ]
    return master["status"]["podIP"]


def test_the_route_plan_and_env_file_name_the_masters_pod_ip(tmp_path):
    """How train.sh reaches the new rank 0 where the kind gives its pods no DNS name."""
    expected = expected_plan(CLUSTER["items"])
    for index in (0, 5):
        out = tmp_path / str(index)
        plan = bootstrap({}, pod_env(index, out, NPU_JOB_PODS=str(FIXTURES / "cluster.json")))
        assert plan.route_plan["master_addr"] == _master_pod_ip(expected)
        exported = f"export NPU_JOB_MASTER_ADDR={_master_pod_ip(expected)}\n"
        assert exported in (out / ENV_FILE).read_text()


def test_a_rank_table_still_wins_over_pods(tmp_path):
    from .documents import write_cce_job

    table, _, _ = write_cce_job(tmp_path / "config", 5, 2)
    env = {
        "RANK_TABLE_FILE": str(tmp_path / "config"),
        "NPU_JOB_PODS": str(FIXTURES / "cluster.json"),
        "MA_CURRENT_HOST_IP": table.servers[0].server_id,
        "NPU_JOB_OUTPUT_DIR": str(tmp_path / "o"),
        "NPU_JOB_K8S_TOPOLOGY": "0",
    }
    result = bootstrap({}, env)
    assert result.route_plan["status"] == "success" and "pods" not in result.route_plan
    assert (tmp_path / "o" / RANK_TABLE_COPY).exists()


# --- the API ------------------------------------------------------------------------------------


@pytest.fixture
def api(tls_files, tmp_path):
    with HTTPSServer(*tls_files, keep_alive=True) as server:
        fake = FakeKubernetesAPI(
            server,
            "sa-token",
            KINDS["Node"],
            pods=KINDS["Pod"],
            hypernodes=KINDS["HyperNode"],
            namespaces=("team-a",),
        )
        fake.env = in_cluster(server, service_account(tmp_path / "sa", "sa-token", tls_files[0]))
        yield fake


def test_pods_nodes_and_hypernodes_from_the_api_in_pages(api, tmp_path, monkeypatch, logs):
    monkeypatch.setattr(kubeapi, "PAGE_SIZE", 3)
    expected = expected_plan(CLUSTER["items"])
    result = bootstrap({}, pod_env(2, tmp_path / "out", NPU_JOB_PODS="k8s", **api.env))
    plan = result.route_plan
    assert plan["status"] == "success", plan["reason"]
    assert plan["rank_mapping"] == expected.rank_mapping
    assert plan["pods"].endswith("/api/v1/namespaces/team-a/pods")
    assert plan["topology"].endswith(
        "/apis/topology.volcano.sh/v1alpha1/hypernodes (volcano-hypernodes)"
    )
    pods = [q for path, q in api.lists if path.endswith("/pods")]
    assert len(pods) == 3  # 8 pods, 3 a page
    assert pods[0]["labelSelector"] == ["volcano.sh/job-name=llama,volcano.sh/task-spec=worker"]
    assert pods[0]["resourceVersion"] == ["0"] and pods[0]["limit"] == ["3"]
    assert "resourceVersion" not in pods[1] and pods[1]["continue"]
    assert len([1 for path, _ in api.lists if path.endswith("/nodes")]) == 4  # 12 nodes
    assert any(
        line.startswith("no rank table: the servers are the pods of job 'llama' task 'worker'")
        for line in logs()
    )


def test_the_bootstrap_waits_for_every_pod_to_be_scheduled(api, tmp_path, logs):
    pending = json.loads(json.dumps(KINDS["Pod"]))
    for pod in pending[5:7]:
        del pod["spec"]["nodeName"]
    del pending[2]  # not created yet
    api.pods = pending
    polls = []

    def sleep(seconds):  # the scheduler catches up after two polls
        polls.append(seconds)
        if len(polls) == 2:
            api.pods = KINDS["Pod"]

    clock = iter(range(0, 1000, 5)).__next__
    result = bootstrap(
        {}, pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **api.env), clock=clock, sleep=sleep
    )
    assert result.route_plan["status"] == "success", result.route_plan["reason"]
    assert polls == [5.0, 5.0]
    waiting = [line for line in logs() if line.startswith("waiting for the job's pods")]
    assert waiting[0] == (
        "waiting for the job's pods: 5 of 8 pods of job 'llama' scheduled; waiting: "
        "pod index(es) 2 not created; 'llama-worker-5', 'llama-worker-6' not scheduled, "
        "5 s of 300 s"
    )


def test_a_job_never_scheduled_times_out_into_scheduler_order(api, tmp_path):
    pending = json.loads(json.dumps(KINDS["Pod"]))
    del pending[1]["spec"]["nodeName"]
    api.pods = pending
    clock = iter(range(0, 1000, 50)).__next__
    result = bootstrap(
        {"wait_timeout": 120},
        pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **api.env),
        clock=clock,
        sleep=lambda s: None,
    )
    assert result.exit_code == 0 and result.route_plan["status"] == "failed"
    assert result.route_plan["reason"].endswith(
        "pods: expected every pod of job 'llama' scheduled within 120 s; 7 of 8 pods of job 'llama' "
        "scheduled; waiting: 'llama-worker-1' not scheduled"
    )
    assert not (tmp_path / RANK_FILE).exists()
    with pytest.raises(NotReadyError):
        bootstrap(
            {"wait_timeout": 120, "strict": True},
            pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **api.env),
            clock=iter(range(0, 1000, 50)).__next__,
            sleep=lambda s: None,
        )


def test_no_permission_to_list_pods_is_one_line_naming_the_rule(api, tmp_path, logs):
    api.forbidden = {"pods"}
    result = bootstrap({}, pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **api.env))
    reason = result.route_plan["reason"]
    assert result.route_plan["status"] == "failed" and "\n" not in reason
    assert reason.endswith(
        "/api/v1/namespaces/team-a/pods: HTTP status: expected 200 OK, got 403 Forbidden: "
        'pods is forbidden: User "system:serviceaccount:x:y" cannot list resource "pods" in '
        'the namespace "team-a"'
    )
    assert any(
        line.startswith("TIP: the job's service account needs list permission") for line in logs()
    )


def test_without_hypernodes_the_node_labels_place_the_nodes(api, tmp_path):
    api.hypernodes = None  # the CRD is not installed: 404
    api.forbidden = set()
    labelled = json.loads(json.dumps(KINDS["Node"]))
    for node in labelled:
        rack = node["metadata"]["labels"].get("example.com/rack")
        if rack:
            node["metadata"]["labels"]["volcano.sh/tor"] = f"tor-{rack}"
    api.nodes = labelled
    result = bootstrap({}, pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **api.env))
    assert result.route_plan["status"] == "success"
    assert result.route_plan["topology"].endswith("/api/v1/nodes (k8s-node-labels)")
    expected = expected_plan(labelled + JOB_PODS)
    assert result.route_plan["rank_mapping"] == expected.rank_mapping


def test_hypernodes_forbidden_and_no_labels_is_no_topology(api, tmp_path, logs):
    """The fixture's nodes carry their rack in a label family of their own (example.com/rack):
    the log names the keys seen and the flag that reads them."""
    api.forbidden = {"hypernodes"}
    result = bootstrap({}, pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **api.env))
    assert result.route_plan["reason"] == "no switch topology available"
    notes = [line for line in logs() if "node labels placed none" in line]
    assert len(notes) == 1 and notes[0].startswith(
        "topology: note: node labels placed none of 8 node(s): none has a label of a known "
        "scheme (CCE cabinet, "
    )
    assert "; label keys on them: 'example.com/rack', 'nvidia.com/gpu.present', " in notes[0]
    assert notes[0].endswith(
        "--topology-labels KEY,KEY,... (NPU_JOB_TOPOLOGY_LABELS; outermost first) reads the "
        "switch path from other keys"
    )
    named = {**api.env, "NPU_JOB_TOPOLOGY_LABELS": "example.com/rack"}
    assert (
        bootstrap({}, pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **named))
        .route_plan["topology"]
        .endswith("/api/v1/nodes (k8s-node-labels)")
    )


def test_missing_job_name_or_credentials_are_one_line(api, tmp_path):
    env = pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **api.env)
    del env["MA_VJ_NAME"]
    assert bootstrap({}, env).route_plan["reason"] == (
        "environment: MA_VJ_NAME: expected the Volcano Job's name (MA_VJ_NAME, or --job) to list its pods"
    )
    env = pod_env(0, tmp_path, NPU_JOB_PODS="k8s")
    assert (
        bootstrap({}, env)
        .route_plan["reason"]
        .startswith("Kubernetes API: KUBERNETES_SERVICE_HOST: expected in-cluster credentials")
    )


SECRET = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0.c2lnbmF0dXJl"


@pytest.mark.parametrize(
    "token, found",
    [
        (f"{SECRET}\n{SECRET}\n".encode(), "a line break inside"),
        (SECRET.encode() + b"\xff\xfe", "bytes that are not UTF-8"),
        (f"{SECRET} x".encode(), "a space or control character inside"),
        (f"{SECRET}é".encode(), "characters that are not ASCII"),
    ],
)
def test_a_token_that_is_not_one_line_is_one_line_that_never_shows_it(
    api, tmp_path, logs, token, found
):
    """The token is a credential: the error line (in the pod log and route_plan.json) gives its
    length and a short digest only; --strict raises the same error, not a traceback's."""
    import hashlib

    token_file = tmp_path / "sa" / "token"
    token_file.write_bytes(token)
    env = pod_env(0, tmp_path / "out", NPU_JOB_PODS="k8s", **api.env)
    digest = hashlib.sha256(token).hexdigest()[:12]
    expected = (
        f"{token_file}: token: expected a service account token on one line; got {len(token)} "
        f"bytes with {found} (sha256 {digest}...; the token is not shown)"
    )
    assert bootstrap({}, env).route_plan["reason"] == expected
    written = (tmp_path / "out" / ROUTE_PLAN_FILE).read_text()
    assert "c2VjcmV0" not in written and not any("c2VjcmV0" in line for line in logs())
    with pytest.raises(InputError) as raised:
        bootstrap({"strict": True}, env)
    assert raised.value.message == expected


@pytest.mark.parametrize("port", ["https", "99999", "0", ""])
def test_a_service_port_that_is_no_port_number_is_one_line(api, tmp_path, port):
    env = pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **{**api.env, "KUBERNETES_SERVICE_PORT": port})
    expected = (
        "environment: KUBERNETES_SERVICE_PORT: expected the API server's port, a number from 1 "
        f"to 65535, got {port!r}"
    )
    assert bootstrap({}, env).route_plan["reason"] == expected
    with pytest.raises(InputError, match=expected):
        bootstrap({"strict": True}, env)


def test_a_missing_token_is_named_by_its_path_not_the_service_host(api, tmp_path):
    (tmp_path / "sa" / "token").unlink()
    result = bootstrap({}, pod_env(0, tmp_path, NPU_JOB_PODS="k8s", **api.env))
    assert result.route_plan["reason"] == (
        f"{tmp_path / 'sa' / 'token'}: file: expected the service account token (not found) for "
        "NPU_JOB_PODS=k8s"
    )


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(orders=st.lists(st.integers(0, 10_000), min_size=3, max_size=3))
def test_every_pod_agrees_whatever_order_the_api_lists_in(api, tmp_path, orders):
    digests = set()
    for index, order in enumerate(orders):
        api.order = order
        result = bootstrap({}, pod_env(index, tmp_path / str(index), NPU_JOB_PODS="k8s", **api.env))
        assert result.route_plan["status"] == "success"
        digests.add((result.route_plan["input_digest"], result.route_plan["mapping_digest"]))
    assert len(digests) == 1


# --- a 4096-pod job -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big():
    return big_job(4096, leaves=256)


@pytest.mark.parametrize("whole", [False, True], ids=["in pages", "one page from the cache"])
def test_a_4096_pod_job_from_the_api_in_pages(big, tls_files, tmp_path, whole):
    """In pages of 500 (API servers from Kubernetes 1.34), or whole in the first answer (before:
    their watch cache ignores ``limit``), where the typed reader reads 20 MB in one page."""
    nodes, hypernodes, pods = big
    with HTTPSServer(*tls_files, keep_alive=True) as server:
        fake = FakeKubernetesAPI(
            server,
            "t",
            nodes,
            pods=pods,
            hypernodes=hypernodes,
            namespaces=("team-a",),
            order=7,
            cached_lists_whole=whole,
        )
        env = in_cluster(server, service_account(tmp_path / "sa", "t", tls_files[0]))
        me = 1234
        result = bootstrap(
            {},
            {
                **env,
                "NPU_JOB_PODS": "k8s",
                "MA_VJ_NAME": "llama",
                "MA_NUM_HOSTS": "4096",
                "VC_TASK_INDEX": str(me),
                "MA_CURRENT_HOST_IP": pods[me]["status"]["hostIP"],
                "NPU_JOB_OUTPUT_DIR": str(tmp_path / "out"),
            },
        )
    plan = result.route_plan
    assert plan["status"] == "success", plan["reason"]
    assert plan["node_count"] == 4096
    assert len([1 for path, _ in fake.lists if path.endswith("/pods")]) == (1 if whole else 9)
    expected = expected_plan(nodes + hypernodes + pods)
    assert plan["mapping_digest"] == expected.mapping_digest
    # each leaf HyperNode's 16 nodes get consecutive ranks
    leaf_of = {
        m["selector"]["exactMatch"]["name"]: h["metadata"]["name"]
        for h in hypernodes
        if h["spec"]["tier"] == 1
        for m in h["spec"]["members"]
    }
    order = [
        leaf_of[pods[int(pair.split("-")[1])]["spec"]["nodeName"]]
        for pair in plan["rank_mapping"].split(",")
    ]
    assert sum(a != b for a, b in zip(order, order[1:])) == 255
    assert os.path.exists(tmp_path / "out" / RANK_FILE)


def test_a_hypernode_cycle_from_the_api_is_named_at_the_list_url(api, tmp_path):
    cycle = [
        {
            "apiVersion": "topology.volcano.sh/v1alpha1",
            "kind": "HyperNode",
            "metadata": {"name": name},
            "spec": {
                "tier": 1,
                "members": [{"type": "HyperNode", "selector": {"exactMatch": {"name": other}}}],
            },
        }
        for name, other in (("loop-a", "loop-b"), ("loop-b", "loop-a"))
    ]
    api.hypernodes = KINDS["HyperNode"] + cycle
    result = bootstrap({}, pod_env(2, tmp_path / "out", NPU_JOB_PODS="k8s", **api.env))
    reason = result.route_plan["reason"]
    assert result.route_plan["status"] == "failed"
    root = api.env["KUBERNETES_SERVICE_HOST"]
    assert (
        f"{root}:{api.env['KUBERNETES_SERVICE_PORT']}/apis/topology.volcano.sh/v1alpha1/hypernodes: "
        in reason
    )
    assert "'loop-a' > 'loop-b' > 'loop-a' is a cycle" in reason


# --- another kind -----------------------------------------------------------------------------


def _numbered_env(api, index, out, kind="numbered", **extra):
    env = pod_env(index, out, NPU_JOB_PODS="k8s", NPU_JOB_KIND=kind, **api.env, **extra)
    env["SET_INDEX"] = env.pop("VC_TASK_INDEX")  # what its controller sets instead
    return env


def test_another_kinds_pods_are_listed_by_its_selector_and_planned_alike(api, tmp_path, test_kinds):
    api.pods = [as_numbered(pod) for pod in KINDS["Pod"]]
    expected = expected_plan(CLUSTER["items"])
    result = bootstrap({"wait_timeout": 0}, _numbered_env(api, 2, tmp_path))  # all there
    plan = result.route_plan
    assert plan["status"] == "success", plan["reason"]
    assert (plan["rank_mapping"], plan["pod_index"]) == (expected.rank_mapping, 2)
    assert plan["master_addr"] == _master_pod_ip(expected)
    (query,) = [q for path, q in api.lists if path.endswith("/pods")]
    assert query["labelSelector"] == [
        "example.com/set-name=llama,example.com/controller=numbered-set"
    ]
    api.pods = KINDS["Pod"]  # a Volcano Job's pods are no pods of this kind
    missing = bootstrap({"wait_timeout": 0}, _numbered_env(api, 2, tmp_path))
    assert missing.route_plan["status"] == "failed"
    assert "0 of 8 pods of job 'llama' scheduled" in missing.route_plan["reason"]


def test_a_kind_reached_by_pod_ip_waits_for_the_pods_ips(api, tmp_path, test_kinds, logs):
    numbered = [as_numbered(pod) for pod in KINDS["Pod"]]
    no_ip = json.loads(json.dumps(numbered))
    del no_ip[3]["status"]["podIP"]
    api.pods = no_ip
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        api.pods = numbered

    clock = iter(range(0, 1000, 5)).__next__
    env = _numbered_env(api, 0, tmp_path, kind="numbered-nodns")
    result = bootstrap({}, env, clock=clock, sleep=sleep)
    assert result.route_plan["status"] == "success" and len(polls) == 1
    name = no_ip[3]["metadata"]["name"]
    assert any(f"waiting: '{name}' not scheduled" in line for line in logs())
    assert result.route_plan["master_addr"] == _master_pod_ip(expected_plan(CLUSTER["items"]))


@pytest.mark.parametrize(
    "damage, field",
    [
        ("no index", "metadata.name: expected a example.com/set-index label or a pod name"),
        ("one index twice", "metadata.labels.example.com/set-index: expected one live pod per"),
    ],
)
def test_a_pod_of_the_kind_without_its_own_index_is_one_line_and_the_scheduler_order(
    api, tmp_path, test_kinds, logs, damage, field
):
    pods = [as_numbered(pod) for pod in KINDS["Pod"]]
    bad = next(pod for pod in pods if pod["metadata"]["labels"].get(INDEX_LABEL) == "2")
    if damage == "no index":
        del bad["metadata"]["labels"][INDEX_LABEL]
        bad["metadata"]["name"] = "llama-worker-two"
    else:
        bad["metadata"]["labels"][INDEX_LABEL] = "1"
    api.pods = pods
    env = _numbered_env(api, 0, tmp_path / "out", NPU_JOB_WAIT_TIMEOUT="0")  # every pod is there
    result = bootstrap({}, env)
    assert result.exit_code == 0 and result.route_plan["status"] == "failed"
    reason = result.route_plan["reason"]
    assert "/api/v1/namespaces/team-a/pods: items[" in reason and f"): {field}" in reason
    assert f"(Pod {bad['metadata']['name']!r})" in reason
    assert logs(logging.ERROR) == [reason]
    assert sorted(os.listdir(tmp_path / "out")) == [NODE_REPORT_FILE, ROUTE_PLAN_FILE]
    with pytest.raises(InputError):
        bootstrap({"strict": True}, env)
