"""The whole bootstrap in-process: real files, a real HTTPS server, the real planner. Every failure
falls back to scheduler order (exit 0, no rank files, one error line) unless strict."""

import json
import logging
import os
import time

import pytest
from npu_job.bootstrap import planner
from npu_job.bootstrap.base.model import Collective
from npu_job.bootstrap.nodereport import NodeReport, decode_report, plan_round
from npu_job.bootstrap.ranktable import parse_rank_table
from npu_job.bootstrap.run import bootstrap

from npu_job.errors import InconsistentError, InputError, NotReadyError
from npu_job.podfacts import (
    MASTER_FILE,
    NODE_REPORT_FILE,
    RANK_FILE,
    RANK_TABLE_COPY,
    ROUTE_PLAN_FILE,
)

from .documents import node, write_cce_job
from .fake_kube_api import FakeKubernetesAPI
from .https_server import HTTPSServer, serve_bytes, tls_files_fixture

tls_files = pytest.fixture(scope="module")(tls_files_fixture)


@pytest.fixture
def job(tmp_path):
    """An 8-node CCE job over 3 ToRs, mounted at <tmp>/config, and pod 5's environment."""
    table, topology, rank_table = write_cce_job(tmp_path / "config", 8, 3)
    me = table.servers[5]
    env = {
        "RANK_TABLE_FILE": str(tmp_path / "config"),
        "MA_CURRENT_HOST_IP": me.server_id,
        "VC_TASK_INDEX": "5",
        "NPU_JOB_OUTPUT_DIR": str(tmp_path / "out"),
        "NPU_JOB_K8S_TOPOLOGY": "0",
    }
    return table, topology, rank_table, env


def _out(env):
    return env["NPU_JOB_OUTPUT_DIR"]


def test_pod_gets_the_planners_rank_and_all_files(job, logs):
    table, topology, _, env = job
    result = bootstrap({}, env)
    expected = planner.plan(table, topology, Collective.RING)
    assert result.exit_code == 0 and result.route_plan["status"] == "success"
    assert open(os.path.join(_out(env), RANK_FILE)).read() == str(expected.node_rank_of_pod[5])
    assert open(os.path.join(_out(env), MASTER_FILE)).read() == str(expected.master_index)
    assert result.route_plan["rank_mapping"] == expected.rank_mapping
    copy = parse_rank_table(open(os.path.join(_out(env), RANK_TABLE_COPY), "rb").read(), "copy")
    assert [s.server_id for s in copy.servers] == [
        table.servers[p].server_id for p in expected.pod_of_node_rank
    ]
    lines = logs()
    assert (
        f"input sha256 {expected.input_digest}, mapping sha256 {expected.mapping_digest}" in lines
    )
    assert any(
        line.startswith(f"node rank {expected.node_rank_of_pod[5]} of 8 (pod index 5)")
        for line in lines
    )


def test_every_pod_computes_the_same_plan(job):
    table, _, _, env = job
    mappings, ranks = set(), []
    for server in table.servers:
        pod_env = dict(
            env, MA_CURRENT_HOST_IP=server.server_id, VC_TASK_INDEX=str(server.pod_index)
        )
        result = bootstrap({}, pod_env)
        mappings.add((result.route_plan["rank_mapping"], result.route_plan["mapping_digest"]))
        ranks.append(result.route_plan["node_rank"])
    assert len(mappings) == 1 and sorted(ranks) == list(range(8))


@pytest.mark.parametrize("collective", list(Collective), ids=str)
def test_the_round_over_every_pods_node_report_is_the_plan_every_pod_made(job, collective):
    """What the rendezvous root plans from the reports the bootstraps wrote: each pod's rank."""
    table, topology, _, env = job
    expected = planner.plan(table, topology, collective)
    reports, ranks = {}, {}
    for server in table.servers:
        pod_env = dict(
            env, MA_CURRENT_HOST_IP=server.server_id, VC_TASK_INDEX=str(server.pod_index)
        )
        result = bootstrap({"collective": collective.value}, pod_env)
        member = f"agent-{(server.pod_index * 5) % 8}"  # keys in another order than pods
        reports[member] = open(os.path.join(_out(env), NODE_REPORT_FILE), "rb").read()
        ranks[member] = result.route_plan["node_rank"]
    round_plan = plan_round(reports)
    assert round_plan.problems == () and round_plan.node_rank == ranks
    assert round_plan.mapping_digest == expected.mapping_digest
    assert round_plan.plan.input_digest == expected.input_digest


def test_the_node_report_says_what_the_pod_resolved(job):
    table, topology, _, env = job
    bootstrap({"collective": "nhr"}, env)
    report = decode_report(open(os.path.join(_out(env), NODE_REPORT_FILE), "rb").read(), "x")
    me = table.servers[5]
    assert report == NodeReport(
        node_id=me.server_id,
        pod_index=5,
        pod_name="",  # a v1.0 rank table names no pods
        device_count=me.device_count,
        placement=topology.placement_of(me.server_id),
        topology_source=f"{env['RANK_TABLE_FILE']}/ranktable_tor.json (cce-ranktable-tor)",
        collective="nhr",
    )


def test_compressed_rank_table_and_flags_over_env(tmp_path):
    table, _, rank_table = write_cce_job(tmp_path / "cfg", 5, 2, compress_rank_table=True)
    flags = {
        "rank_table": str(rank_table),
        "host_ip": table.servers[1].server_id,
        "pod_index": "1",
        "output_dir": str(tmp_path / "o"),
    }
    result = bootstrap(
        flags, {"RANK_TABLE_FILE": "/nowhere", "VC_TASK_INDEX": "4", "NPU_JOB_K8S_TOPOLOGY": "0"}
    )
    assert result.route_plan["status"] == "success" and result.route_plan["pod_index"] == 1


@pytest.mark.parametrize(
    "hccl_algo, flag, expected",
    [
        (None, None, "ring"),
        ("level0:NA;level1:H-D_R", None, "rhd"),
        ("level0:NA;level1:NHR", None, "nhr"),
        ("level0:NA;level1:H-D_R", "ring", "ring"),
    ],
    ids=["default-ring", "hccl-algo-rhd", "hccl-algo-nhr", "flag-wins"],
)
def test_collective_from_flag_else_hccl_algo_else_ring(job, hccl_algo, flag, expected):
    _, _, _, env = job
    if hccl_algo:
        env = dict(env, HCCL_ALGO=hccl_algo)
    assert bootstrap({"collective": flag}, env).route_plan["collective"] == expected


def _stale(env):
    if not os.path.isdir(os.path.dirname(_out(env))):
        return  # the unwritable case: nothing can be there
    os.makedirs(_out(env), exist_ok=True)
    for name in (RANK_FILE, MASTER_FILE):
        with open(os.path.join(_out(env), name), "w") as handle:
            handle.write("99")


def _no_rank_table(tmp, env):
    env.pop("RANK_TABLE_FILE")


def _blank_rank_table_file(tmp, env):
    env["RANK_TABLE_FILE"] = "  "  # blank means unset, as for every variable
    env["NPU_JOB_WAIT_TIMEOUT"] = "0"


def _truncated_json(tmp, env):
    path = os.path.join(env["RANK_TABLE_FILE"], "jobstart_hccl.json")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    env["NPU_JOB_WAIT_TIMEOUT"] = "0"


def _stuck_initializing(tmp, env):
    open(os.path.join(env["RANK_TABLE_FILE"], "jobstart_hccl.json"), "w").write(
        '{"status": "initializing"}'
    )
    env["NPU_JOB_WAIT_TIMEOUT"] = "0.2"
    env["NPU_JOB_POLL_INTERVAL"] = "0.05"


def _host_not_in_table(tmp, env):
    env["MA_CURRENT_HOST_IP"] = "10.99.99.99"


def _index_mismatch(tmp, env):
    env["VC_TASK_INDEX"] = "2"


def _two_nodes(tmp, env):
    table, _, _ = write_cce_job(tmp / "small", 2, 1)
    env.update(
        RANK_TABLE_FILE=str(tmp / "small"),
        MA_CURRENT_HOST_IP=table.servers[1].server_id,
        VC_TASK_INDEX="1",
    )


def _no_topology(tmp, env):
    os.unlink(os.path.join(env["RANK_TABLE_FILE"], "ranktable_tor.json"))


def _bad_topology(tmp, env):
    open(os.path.join(env["RANK_TABLE_FILE"], "ranktable_tor.json"), "w").write("H4sI garbage")


def _bad_env(tmp, env):
    env["NPU_JOB_WAIT_TIMEOUT"] = "soon"


def _unknown_kind(tmp, env):
    env["NPU_JOB_KIND"] = "slurm"


def _unwritable_output(tmp, env):
    blocker = tmp / "a-file"
    blocker.write_text("")
    env["NPU_JOB_OUTPUT_DIR"] = str(blocker / "out")  # a directory below a regular file


FALLBACKS = [
    (
        "no-rank-table",
        _no_rank_table,
        "rank table: location: expected $RANK_TABLE_FILE or one of",
        InputError,
    ),
    (
        "blank-rank-table-file",
        _blank_rank_table_file,
        "rank table: location: expected $RANK_TABLE_FILE or one of",
        InputError,
    ),
    ("truncated-json", _truncated_json, "jobstart_hccl.json: line ", InputError),
    (
        "stuck-initializing",
        _stuck_initializing,
        "status: expected \"completed\" within 0 s, last seen status='initializing'",
        NotReadyError,
    ),
    (
        "host-not-in-table",
        _host_not_in_table,
        "server_list: expected this host's IP '10.99.99.99' (MA_CURRENT_HOST_IP)",
        InconsistentError,
    ),
    (
        "index-mismatch",
        _index_mismatch,
        "in the rank table, but VC_TASK_INDEX is 2",
        InconsistentError,
    ),
    ("fewer-than-3-nodes", _two_nodes, "only 2 node(s); reordering needs at least 3", InputError),
    ("no-topology", _no_topology, "no switch topology available", InputError),
    ("bad-topology", _bad_topology, "ranktable_tor.json: content: expected", InputError),
    (
        "unwritable-output-dir",
        _unwritable_output,
        "a-file/out: output directory: expected a writable directory",
        InputError,
    ),
    (
        "bad-env-value",
        _bad_env,
        "environment: NPU_JOB_WAIT_TIMEOUT: expected a number of seconds >= 0, got 'soon'",
        InputError,
    ),
    (
        "unknown-kind",
        _unknown_kind,
        "environment: NPU_JOB_KIND: expected a job kind, one of ",
        InputError,
    ),
]


@pytest.mark.parametrize(
    "breakage, message, error", [c[1:] for c in FALLBACKS], ids=[c[0] for c in FALLBACKS]
)
def test_failure_falls_back_to_scheduler_order(job, tmp_path, logs, breakage, message, error):
    _, _, _, env = job
    env = dict(env)
    breakage(tmp_path, env)
    _stale(env)
    result = bootstrap({}, env)
    assert result.exit_code == 0
    assert result.route_plan["status"] == "failed" and message in result.route_plan["reason"]
    if os.path.isdir(os.path.dirname(_out(env))):
        assert sorted(os.listdir(_out(env))) == [NODE_REPORT_FILE, ROUTE_PLAN_FILE], (
            "no rank files: the pod uses VC_TASK_INDEX / 0"
        )
        assert json.load(open(os.path.join(_out(env), ROUTE_PLAN_FILE))) == result.route_plan
        _holds_what_the_pod_knew(env, result.route_plan)
    errors = logs(logging.ERROR)
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0]
    assert errors[0].startswith(
        ("rank table: ", "environment: ", env.get("RANK_TABLE_FILE", "-"), _out(env))
    )
    with pytest.raises(error) as caught:
        bootstrap({"strict": True}, env)
    assert message in caught.value.message
    with pytest.raises(error):
        bootstrap({}, dict(env, NPU_JOB_STRICT="1"))


def _holds_what_the_pod_knew(env, route_plan):
    """A pod that could not plan still reports itself: its entry of the rank table once found
    (and its placement once its topology was read), else the index its scheduler gave it."""
    data = open(os.path.join(_out(env), NODE_REPORT_FILE), "rb").read()
    report = decode_report(data, NODE_REPORT_FILE)
    if route_plan["pod_index"] is None:  # an unknown kind names no index variable
        scheduler = -1 if "NPU_JOB_KIND" in env else int(env["VC_TASK_INDEX"])
        assert report == NodeReport(pod_index=scheduler)
        return
    assert report.pod_index == route_plan["pod_index"] and report.node_id
    assert report.device_count == 2  # write_cce_job's nodes
    topology = route_plan["topology"]
    assert (report.placement is not None) == (topology is not None and topology != "none")


def test_a_bug_of_ours_does_not_break_the_job_either(job, logs, monkeypatch):
    _, _, _, env = job

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(planner, "plan", broken)
    _stale(env)
    result = bootstrap({}, env)
    assert result.exit_code == 0 and result.route_plan["status"] == "failed"
    assert sorted(os.listdir(_out(env))) == [NODE_REPORT_FILE, ROUTE_PLAN_FILE]
    assert logs(logging.ERROR) == ["internal error (a bug, please report it): RuntimeError: boom"]
    with pytest.raises(RuntimeError):
        bootstrap({"strict": True}, env)


def test_rank_table_and_topology_over_https(tmp_path, tls_files):
    table, topology, rank_table = write_cce_job(tmp_path / "served", 6, 2)
    with HTTPSServer(*tls_files) as server:
        server.routes["/jobstart_hccl.json"] = serve_bytes(rank_table.read_bytes())
        server.routes["/ranktable_tor.json"] = serve_bytes(
            (tmp_path / "served" / "ranktable_tor.json").read_bytes()
        )
        env = {
            "RANK_TABLE_FILE": server.url("/jobstart_hccl.json"),
            "NPU_JOB_TOPOLOGY": server.url("/ranktable_tor.json"),
            "NPU_JOB_CA_BUNDLE": str(tls_files[0]),
            "MA_CURRENT_HOST_IP": table.servers[0].server_id,
            "NPU_JOB_OUTPUT_DIR": str(tmp_path / "out"),
        }
        result = bootstrap({}, env)
    assert result.route_plan["status"] == "success"
    assert result.route_plan["rank_mapping"] == planner.plan(table, topology).rank_mapping


def _nodes_for(topology):
    return [
        node(f"node-{i}", server_id, {"cce.kubectl.kubernetes.io/cabinet": "-".join(p.tors)})
        for i, (server_id, p) in enumerate(topology.placements.items())
    ]


def _in_cluster(tmp_path, tls_files, server, token):
    account = tmp_path / "sa"
    account.mkdir(exist_ok=True)
    (account / "token").write_text(token)
    (account / "ca.crt").write_bytes(tls_files[0].read_bytes())
    return {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(server.port),
        "NPU_JOB_K8S_SA_DIR": str(account),
    }


def test_topology_from_kubernetes_node_labels(job, tmp_path, tls_files):
    table, topology, _, env = job
    os.unlink(os.path.join(env["RANK_TABLE_FILE"], "ranktable_tor.json"))
    with HTTPSServer(*tls_files) as server:
        FakeKubernetesAPI(server, "tok", _nodes_for(topology))
        env = dict(env, **_in_cluster(tmp_path, tls_files, server, "tok"))
        env.pop("NPU_JOB_K8S_TOPOLOGY")  # on by default when in a cluster
        result = bootstrap({}, env)
        explicit = bootstrap({"topology": "k8s"}, dict(env, NPU_JOB_K8S_TOPOLOGY="0"))
    assert result.route_plan["status"] == "success"
    assert result.route_plan["topology"].endswith("/api/v1/nodes (k8s-node-labels)")
    assert result.route_plan["rank_mapping"] == planner.plan(table, topology).rank_mapping
    assert explicit.route_plan["rank_mapping"] == result.route_plan["rank_mapping"]


def test_refused_kubernetes_api_is_skipped_in_the_chain_but_fatal_when_asked_for(
    job, tmp_path, tls_files, logs
):
    _, topology, _, env = job
    os.unlink(os.path.join(env["RANK_TABLE_FILE"], "ranktable_tor.json"))
    with HTTPSServer(*tls_files) as server:
        FakeKubernetesAPI(server, "the-real-token", _nodes_for(topology))
        env = dict(env, **_in_cluster(tmp_path, tls_files, server, "not-the-token"))
        env.pop("NPU_JOB_K8S_TOPOLOGY")
        chained = bootstrap({}, env)
        asked = bootstrap({"topology": "k8s"}, env)
    assert chained.route_plan["reason"] == "no switch topology available"
    assert any("skipping Kubernetes node labels" in line and "401" in line for line in logs())
    assert "HTTP status: expected 200 OK, got 401 Unauthorized" in asked.route_plan["reason"]


def test_a_misconfigured_api_address_is_skipped_in_the_chain_but_fatal_when_asked_for(
    job, tmp_path, tls_files, logs
):
    """A KUBERNETES_SERVICE_PORT that is no port number: the automatic chain goes on without the
    API (as for a refusing one), --topology k8s names the variable."""
    _, _, _, env = job
    os.unlink(os.path.join(env["RANK_TABLE_FILE"], "ranktable_tor.json"))

    class NoServer:
        port = 0

    env = dict(env, **_in_cluster(tmp_path, tls_files, NoServer, "tok"))
    env["KUBERNETES_SERVICE_PORT"] = "https"
    env.pop("NPU_JOB_K8S_TOPOLOGY")
    chained = bootstrap({}, env)
    asked = bootstrap({"topology": "k8s"}, env)
    assert chained.route_plan["reason"] == "no switch topology available"
    assert any(
        "skipping Kubernetes node labels" in line and "KUBERNETES_SERVICE_PORT" in line
        for line in logs()
    )
    assert "environment: KUBERNETES_SERVICE_PORT: " in asked.route_plan["reason"]


def test_unreachable_kubernetes_api_does_not_hold_the_pod_up(job, tmp_path, tls_files, logs):
    _, _, _, env = job
    os.unlink(os.path.join(env["RANK_TABLE_FILE"], "ranktable_tor.json"))
    with HTTPSServer(*tls_files) as server:
        env = dict(env, **_in_cluster(tmp_path, tls_files, server, "tok"))
    env.pop("NPU_JOB_K8S_TOPOLOGY")  # the server is gone now: connection refused
    started = time.monotonic()
    result = bootstrap({}, env)
    assert time.monotonic() - started < 1.5, (
        "the optional API source retried too long (3 s without quick)"
    )
    assert result.route_plan["reason"] == "no switch topology available"
    assert any("skipping Kubernetes node labels" in line and "reachable" in line for line in logs())


def test_json_flag_prints_the_route_plan(job, capsys):
    _, _, _, env = job
    bootstrap({"json": True}, env)
    printed = json.loads(capsys.readouterr().out)
    assert printed["version"] == 1 and printed["status"] == "success"


def _partial_node_job(tmp_path):
    """3 pods of 4-device servers (half an ascend-1980 node each) over 3 ToRs, as CCE mounts it."""
    from npu_job.bootstrap.ranktable import rank_table_document
    from npu_job.bootstrap.topology import encode_ranktable_tor
    from npu_job.demo.synthetic import synthetic_cluster

    table, topology = synthetic_cluster(3, 3, npus_per_node=4, seed=1)
    config = tmp_path / "config"
    config.mkdir()
    (config / "jobstart_hccl.json").write_text(json.dumps(rank_table_document(table)))
    (config / "ranktable_tor.json").write_bytes(encode_ranktable_tor(table, topology))
    me = table.servers[1]
    return {
        "RANK_TABLE_FILE": str(config),
        "MA_CURRENT_HOST_IP": me.server_id,
        "VC_TASK_INDEX": "1",
        "NPU_JOB_OUTPUT_DIR": str(tmp_path / "out"),
        "NPU_JOB_K8S_TOPOLOGY": "0",
    }


@pytest.mark.parametrize("how", ["env", "flag"])
def test_partial_nodes_below_the_full_node_size_fall_back_with_the_reason(tmp_path, logs, how):
    """The rule render warns about: with the full node size known, 4 of 8 devices is a partial node."""
    env = _partial_node_job(tmp_path)
    assert bootstrap({}, env).route_plan["status"] == "success"  # equal counts alone are planned
    flags = {"full_node_devices": 8} if how == "flag" else {}
    if how == "env":
        env["NPU_JOB_FULL_NODE_DEVICES"] = "8"
    result = bootstrap(flags, env)
    assert result.exit_code == 0 and result.route_plan["status"] == "failed"
    reason = "partial nodes: 3 server(s) do not have the full 8 devices"
    assert any(reason in line for line in result.route_plan["reasons"]), result.route_plan
    assert sorted(os.listdir(_out(env))) == [NODE_REPORT_FILE, ROUTE_PLAN_FILE], (
        "no rank files: the pod keeps VC_TASK_INDEX"
    )
    assert any(reason in line for line in logs(logging.ERROR))


def test_full_node_devices_matching_the_servers_is_planned(tmp_path):
    env = dict(_partial_node_job(tmp_path), NPU_JOB_FULL_NODE_DEVICES="4")
    assert bootstrap({}, env).route_plan["status"] == "success"


@pytest.mark.parametrize(
    "value",
    ["0", "eight", "-8", "８", "8" * 5000],
    ids=["zero", "word", "negative", "fullwidth-digit", "past-int-limit"],
)
def test_a_bad_full_node_size_is_a_one_line_error(tmp_path, value):
    env = dict(_partial_node_job(tmp_path), NPU_JOB_FULL_NODE_DEVICES=value)
    with pytest.raises(InputError) as caught:
        bootstrap({"strict": True}, env)
    assert caught.value.message.startswith(
        "environment: NPU_JOB_FULL_NODE_DEVICES: expected a whole number >= 1, got '"
    )


def test_the_full_node_flag_reaches_the_planner_from_the_command_line(
    tmp_path, monkeypatch, capsys
):
    from npu_job.cli import main

    for name, value in _partial_node_job(tmp_path).items():
        monkeypatch.setenv(name, value)
    package_logger = logging.getLogger(
        "npu_job"
    )  # the CLI sets it up; later tests' caplog needs it back
    monkeypatch.setattr(
        package_logger, "handlers", list(package_logger.handlers)
    )  # a copy it may change
    monkeypatch.setattr(package_logger, "propagate", package_logger.propagate)
    monkeypatch.setattr(package_logger, "level", package_logger.level)
    assert main(["bootstrap", "--full-node-devices", "8", "--json"]) == 0
    assert "do not have the full 8 devices" in " ".join(
        json.loads(capsys.readouterr().out)["reasons"]
    )
    assert main(["bootstrap", "--full-node-devices", "0"]) == 2
    assert "expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_the_fallback_says_which_variable_the_pod_keeps_its_rank_from(job, logs, test_kinds):
    """The job kind's index variable, which the pod command falls back to (a kind it cannot name:
    this pod's scheduler index)."""
    _, _, _, env = job
    for kind, keeps in [
        (None, "VC_TASK_INDEX"),
        ("numbered", "SET_INDEX"),
        ("slurm", "this pod's scheduler index"),
    ]:
        broken = dict(env, NPU_JOB_WAIT_TIMEOUT="soon", **({"NPU_JOB_KIND": kind} if kind else {}))
        assert bootstrap({}, broken).route_plan["status"] == "failed"
        assert logs()[-1] == (
            f"continuing in scheduler order (RANK_AFTER_ACC={keeps}); --strict makes this fatal"
        )


def test_a_pod_of_another_kind_is_checked_against_its_kinds_index_variable(job, test_kinds):
    """Its controller's variable is SET_INDEX: Volcano's VC_TASK_INDEX, though set, is not read."""
    table, _, _, env = job
    env = dict(env, NPU_JOB_KIND="numbered", SET_INDEX="2")
    assert bootstrap({}, env).route_plan["reason"] == (
        f"{env['RANK_TABLE_FILE']}/jobstart_hccl.json: server_list[5]: this host "
        f"'{table.servers[5].server_id}' is pod index 5 in the rank table, but SET_INDEX is 2"
    )
    assert bootstrap({}, dict(env, SET_INDEX="5")).route_plan["status"] == "success"
    del env["MA_CURRENT_HOST_IP"]
    assert (
        bootstrap({}, dict(env, SET_INDEX="9"))
        .route_plan["reason"]
        .endswith("server_list: expected an entry for SET_INDEX 9, the rank table lists 8")
    )
    del env["SET_INDEX"]
    assert bootstrap({}, env).route_plan["reason"] == (
        "environment: MA_CURRENT_HOST_IP: expected this host's IP (or SET_INDEX, or "
        "--host-ip/--pod-index), neither is set"
    )


def test_from_a_rank_table_the_masters_address_is_its_servers_host_address(job):
    table, topology, _, env = job
    expected = planner.plan(table, topology, Collective.RING)
    master = table.servers[expected.master_index]
    result = bootstrap({}, env)
    assert result.route_plan["master_addr"] == (
        master.container_ip or master.host_ip or master.server_id
    )
    exported = f"export NPU_JOB_MASTER_ADDR={result.route_plan['master_addr']}\n"
    assert exported in open(os.path.join(_out(env), "npu_job_env.sh")).read()
