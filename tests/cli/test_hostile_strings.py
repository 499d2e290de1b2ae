"""Hostile strings in every input field an error can echo: the error stays one bounded line.

Each site below puts a string into one field of an otherwise valid job (documents authored in
``tests/bootstrap/documents.py`` from the platform formats) or into the pod's environment, such
that the resulting error (or the planner's reason) has to mention that field's value or name it in
its path. The strings are the ways text breaks a log: line breaks of every kind, a mebibyte,
terminal escapes and other control characters, quotes and backslashes, a lone surrogate. Through
the pod path, ``--strict`` and ``npu-job plan`` (under both JSON engines), every line on stderr
must still be one of ours, at most a few hundred characters, and ``route_plan.json`` small.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import pytest

from tests.bootstrap.documents import (
    legacy_group_list,
    node,
    node_list,
    ranktable_tor,
    tor_info,
    v1_0,
    v1_2_super_pods,
)
from tests.bootstrap.engines import ENGINES
from tests.cli.bad_input import (
    LINE_LIMIT,
    TOR_INFO_IDS,
    V1_0_IDS,
    clean_environment,
    plain_topology,
    run_everywhere,
    set_field,
)

HOSTILE = {
    "newline": "evil\nnpu-job: error: a forged second line",
    "carriage-return": "evil\rforged",
    "one-mebibyte": "x" * (1 << 20),
    "control-chars": "\x1b[31mred\x1b[0m\x01\x07bell\x7f",
    "quotes": 'it\'s "quoted" \\ and \\n',
    "other-line-breaks": "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg",
    "lone-surrogate": "\ud800x",
}
MAX_ROUTE_PLAN_BYTES = 8192


@dataclass
class Job:
    """What a site wrote: the rank table, a topology (None: ranktable_tor.json beside the rank
    table, or none), this pod's host IP, and environment variables to set."""

    rank_table: Any
    topology: Any = None
    topology_name: str = "topology.json"
    host_ip: str = V1_0_IDS[0]
    env: Dict[str, str] = field(default_factory=dict)


def _plain(ids=V1_0_IDS) -> Dict[str, Any]:
    return plain_topology(ids)


def _duplicate_tor_ip(hostile: str) -> Dict[str, Any]:
    document = tor_info()
    document["server_list"][0]["tor_ip"] = document["server_list"][1]["tor_ip"] = hostile
    return document


def _two_nodes_claiming(hostile: str) -> Dict[str, Any]:
    return node_list(
        node("n0", hostile, {"volcano.sh/tor": "tor-a"}),
        node("n1", hostile, {"volcano.sh/tor": "tor-b"}),
    )


def _partial_node(hostile: str) -> Dict[str, Any]:
    document = v1_0((*V1_0_IDS[:2], hostile))
    document["server_list"][2]["device"].pop()
    return document


def _server_twice(hostile: str) -> Dict[str, Any]:
    document = ranktable_tor({hostile: ["t"], V1_0_IDS[0]: ["t"]})
    document["server_list"].append(dict(document["server_list"][0]))
    return document


def _super_pod_member_twice(hostile: str) -> Dict[str, Any]:
    document = v1_2_super_pods()
    document["server_list"][1]["server_id"] = hostile
    document["super_pod_list"][0]["server_list"][0]["server_id"] = hostile
    document["super_pod_list"][1]["server_list"][0]["server_id"] = hostile
    return document


def _hypernodes(*items: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "kind": "HyperNodeList",
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "items": list(items),
    }


def _hypernode(name: str, members: Any) -> Dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"tier": 1, "members": members}}


def _child(name: str) -> Dict[str, Any]:
    return {"type": "HyperNode", "selector": {"exactMatch": {"name": name}}}


SITES: Dict[str, Callable[[str], Job]] = {
    "hypernode-cycle": lambda h: Job(v1_0(), _hypernodes(_hypernode(h, [_child(h)]))),
    "hypernode-member-type": lambda h: Job(
        v1_0(),
        _hypernodes(_hypernode("s0", [{"type": h, "selector": {"exactMatch": {"name": "n"}}}])),
    ),
    "hypernode-label-key": lambda h: Job(
        v1_0(),
        _hypernodes(
            _hypernode(
                "s0", [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {h: 7}}}}]
            )
        ),
    ),
    "node-label-key": lambda h: Job(v1_0(), node_list(node("n0", V1_0_IDS[0], {h: 5}))),
    "rank-table-status": lambda h: Job(set_field(v1_0(), ["status"], h)),
    "duplicate-server-id": lambda h: Job(
        set_field(
            set_field(v1_0(), ["server_list", 1, "server_id"], h),
            ["server_list", 2, "server_id"],
            h,
        )
    ),
    "rank-id": lambda h: Job(set_field(v1_0(), ["server_list", 1, "device", 0, "rank_id"], h)),
    "server-count": lambda h: Job(set_field(v1_0(), ["server_count"], h)),
    "unknown-super-pod-member": lambda h: Job(
        set_field(v1_2_super_pods(), ["super_pod_list", 0, "server_list", 0, "server_id"], h),
        _plain(("node-0", "node-1", "node-2", "node-3")),
        host_ip="node-0",
    ),
    "super-pod-member-twice": lambda h: Job(
        _super_pod_member_twice(h), _plain(("node-0", "node-2", "node-3")), host_ip="node-0"
    ),
    "legacy-pod-name": lambda h: Job(
        set_field(legacy_group_list(), ["group_list", 0, "instance_list", 0, "pod_name"], h),
        _plain(("10.19.1.70", "10.19.1.71", "10.19.1.72")),
        host_ip="10.19.1.70",
    ),
    "host-ip": lambda h: Job(v1_0(), host_ip=h),
    "env-task-index": lambda h: Job(v1_0(), env={"VC_TASK_INDEX": h}),
    "env-full-node-devices": lambda h: Job(v1_0(), env={"NPU_JOB_FULL_NODE_DEVICES": h}),
    "env-wait-timeout": lambda h: Job(v1_0(), env={"NPU_JOB_WAIT_TIMEOUT": h}),
    "env-poll-interval": lambda h: Job(v1_0(), env={"NPU_JOB_POLL_INTERVAL": h}),
    "plain-server-id": lambda h: Job(v1_0(), set_field(_plain(), ["servers", h], 5.5)),
    "plain-unknown-top-level-key": lambda h: Job(v1_0(), set_field(_plain(), [h], 1)),
    "plain-unknown-placement-key": lambda h: Job(
        v1_0(), set_field(_plain(), ["servers", V1_0_IDS[1]], {"path": ["t"], h: 1})
    ),
    "tor-info-duplicate-tor": lambda h: Job(
        v1_0(TOR_INFO_IDS), _duplicate_tor_ip(h), host_ip=TOR_INFO_IDS[0]
    ),
    "tor-info-slice-id": lambda h: Job(
        v1_0(TOR_INFO_IDS),
        set_field(tor_info(), ["server_list", 1, "server", 0, "slice_id"], h),
        host_ip=TOR_INFO_IDS[0],
    ),
    "tor-info-tor-count": lambda h: Job(
        v1_0(TOR_INFO_IDS), set_field(tor_info(), ["tor_count"], h), host_ip=TOR_INFO_IDS[0]
    ),
    "configmap-duplicate-tor": lambda h: Job(
        v1_0(TOR_INFO_IDS),
        {"kind": "ConfigMap", "data": {"tor_info": json.dumps(_duplicate_tor_ip(h))}},
        host_ip=TOR_INFO_IDS[0],
    ),
    "node-address-claimed-twice": lambda h: Job(v1_0(), _two_nodes_claiming(h)),
    "ranktable-tor-duplicate-server-id": lambda h: Job(
        v1_0(), _server_twice(h), topology_name="ranktable_tor.json"
    ),
    "planner-reason-names-a-server": lambda h: Job(_partial_node(h), _plain((*V1_0_IDS[:2], h))),
}

ENV_UNSAFE = ("lone-surrogate",)  # os.environ holds no lone surrogates (and no NUL)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("hostile_name", list(HOSTILE))
@pytest.mark.parametrize("site", list(SITES))
def test_an_error_echoing_a_hostile_string_stays_one_bounded_line(
    tmp_path: Path, capsys, monkeypatch, site, hostile_name, engine
):
    hostile = HOSTILE[hostile_name]
    job = SITES[site](hostile)
    if job.env and hostile_name in ENV_UNSAFE:
        pytest.skip("the environment cannot hold this string")
    clean_environment(monkeypatch)
    for name, value in job.env.items():
        monkeypatch.setenv(name, value)
    rank_table = tmp_path / "jobstart_hccl.json"
    rank_table.write_text(json.dumps(job.rank_table))
    topology: Optional[Path] = None
    document = job.topology if job.topology is not None else _plain()
    if job.topology_name == "ranktable_tor.json":  # found beside the rank table
        (tmp_path / job.topology_name).write_text(json.dumps(document))
    else:
        topology = tmp_path / job.topology_name
        topology.write_text(json.dumps(document))
    outcome = run_everywhere(rank_table, topology, job.host_ip, tmp_path / "out", capsys, engine)

    for entry in outcome.entries:
        assert not any("Traceback" in line for line in entry.stderr), (entry.name, entry.stderr[:5])
        for line in entry.stderr:
            assert line.startswith(("npu-job: ", "TIP: ")), (entry.name, line[:200])
            assert len(line) <= LINE_LIMIT, (entry.name, len(line), line[:200])
        for line in entry.stdout:  # npu-job plan's report: ids are shown in it too
            assert len(line) <= LINE_LIMIT, (entry.name, len(line), line[:200])
    assert outcome.pod.code == 0 and len(outcome.pod.errors) == 1, outcome.pod.stderr[:5]
    assert outcome.strict.code != 0 and len(outcome.strict.errors) == 1, outcome.strict.stderr[:5]
    assert outcome.plan.code == 0 or len(outcome.plan.errors) == 1, outcome.plan.stderr[:5]
    assert outcome.route_plan["status"] == "failed"
    assert outcome.route_plan_size <= MAX_ROUTE_PLAN_BYTES
    assert outcome.route_plan["reason"] and outcome.route_plan["reason"] in outcome.pod.errors[0]
