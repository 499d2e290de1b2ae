"""Integers past Python's 4300-digit ``int()`` limit, in every numeric field of every format.

Each case writes a valid job (documents authored in ``tests/bootstrap/documents.py`` from the
platform formats), puts a 5000-digit number into one field, and runs the pod path, ``--strict`` and
``npu-job plan`` under both JSON engines. A field the reader turns into a number must be refused
in one line naming it; a field read as text (ids) or not read at all must be planned as usual.
Numbers are written both ways the formats do: quoted (rank tables) and bare (``tor_info``).
"""

from __future__ import annotations

import json
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
    v1_4_cce,
)
from tests.bootstrap.engines import ENGINES
from tests.cli.bad_input import (
    TOR_INFO_IDS,
    V1_0_IDS,
    assert_one_line_error,
    assert_planned,
    clean_environment,
    plain_topology,
    run_everywhere,
    set_field,
)

DIGITS = "1" * 5000
NUMBER = "<bare number>"  # a placeholder: :func:`_text` writes DIGITS there unquoted


def _text(document: Any) -> str:
    """The JSON text of ``document`` with :data:`NUMBER` written as a bare 5000-digit number
    (which no Python int can be printed as)."""
    return json.dumps(document).replace(json.dumps(NUMBER), DIGITS)


TORS = ("tor-a", "tor-b")


def _set(document: Any, path: str, value: Any) -> Any:
    """``document`` with the field at ``path`` (keys joined by ``/``) set to ``value``."""
    return set_field(
        document, [int(key) if key.isdigit() else key for key in path.split("/")], value
    )


# (id, builder of the rank table, host ip, expected field or None)
# None: the value is an id or unread, and the job is planned as usual.
RANK_TABLE_CASES = [
    (
        "v1.0-server_count",
        lambda: _set(v1_0(), "server_count", DIGITS),
        "192.168.0.11",
        "server_count",
    ),
    (
        "v1.0-rank_id",
        lambda: _set(v1_0(), "server_list/1/device/0/rank_id", DIGITS),
        "192.168.0.11",
        "server_list[1].device[0].rank_id",
    ),
    (
        "v1.0-rank_id-first-device",
        lambda: _set(v1_0(), "server_list/0/device/0/rank_id", DIGITS),
        "192.168.0.12",
        "server_list[0].device[0].rank_id",
    ),
    (
        "v1.0-device_id",
        lambda: _set(v1_0(), "server_list/1/device/0/device_id", DIGITS),
        "192.168.0.11",
        None,
    ),
    (
        "v1.0-server_id",
        lambda: _set(v1_0(), "server_list/1/server_id", DIGITS),
        "192.168.0.11",
        None,
    ),
    (
        "v1.2-super_pod_id",
        lambda: _set(v1_2_super_pods(), "super_pod_list/0/super_pod_id", DIGITS),
        "node-0",
        None,
    ),
    (
        "v1.2-super_device_id",
        lambda: _set(v1_2_super_pods(), "server_list/2/device/1/super_device_id", DIGITS),
        "node-0",
        None,
    ),
    (
        "v1.2-server_count",
        lambda: _set(v1_2_super_pods(), "server_count", DIGITS),
        "node-0",
        "server_count",
    ),
    (
        "v1.4-data_version-bare",
        lambda: _set(v1_4_cce(), "data_version", NUMBER),
        "111.111.111.1",
        "content",
    ),
    (
        "v1.4-numa_id",
        lambda: _set(v1_4_cce(), "server_list/0/device/0/numa_id", DIGITS),
        "111.111.111.1",
        None,
    ),
    (
        "v0-pod_name-suffix",
        lambda: _set(
            legacy_group_list(), "group_list/0/instance_list/0/pod_name", "fake-job-pod-" + DIGITS
        ),
        "10.19.1.70",
        "group_list[0].instance_list[0].pod_name",
    ),
    (
        "v0-group_count",
        lambda: _set(legacy_group_list(), "group_count", DIGITS),
        "10.19.1.70",
        None,
    ),
    (
        "v0-device_count",
        lambda: _set(legacy_group_list(), "group_list/0/device_count", DIGITS),
        "10.19.1.70",
        None,
    ),
    (
        "v0-device_id",
        lambda: _set(
            legacy_group_list(), "group_list/0/instance_list/1/devices/0/device_id", DIGITS
        ),
        "10.19.1.70",
        None,
    ),
]


def _server_ids(document: Dict[str, Any]):
    if "group_list" in document:
        return [i["server_id"] for i in document["group_list"][0]["instance_list"]]
    return [s["server_id"] for s in document["server_list"]]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "build, host_ip, field", [c[1:] for c in RANK_TABLE_CASES], ids=[c[0] for c in RANK_TABLE_CASES]
)
def test_a_long_integer_in_a_rank_table(
    tmp_path: Path, capsys, monkeypatch, engine, build: Callable, host_ip: str, field: Optional[str]
):
    clean_environment(monkeypatch)
    document = build()
    rank_table = tmp_path / "jobstart_hccl.json"
    rank_table.write_text(_text(document))
    topology = tmp_path / "topology.json"
    topology.write_text(json.dumps(plain_topology(_server_ids(document))))
    outcome = run_everywhere(rank_table, topology, host_ip, tmp_path / "out", capsys, engine)
    if field is None:
        assert_planned(outcome)
    else:
        assert_one_line_error(outcome, f"{rank_table}: {field}: expected ")


def _tor_info_without_tor_ips() -> Dict[str, Any]:
    document = tor_info()
    for tor in document["server_list"]:
        del tor["tor_ip"]  # the ToR is then named by its tor_id
    return document


def _configmap(document: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "basic-tor-node-cm"},
        "data": {"tor_level": "double_layer", "tor_info": _text(document)},
    }


def _labelled_nodes(label: str) -> Dict[str, Any]:
    return node_list(
        *(
            node(f"n{i}", sid, {"volcano.sh/tor": label if i == 1 else TORS[i % 2]})
            for i, sid in enumerate(V1_0_IDS)
        )
    )


CCE = {sid: [TORS[i % 2]] * 2 for i, sid in enumerate(V1_0_IDS)}

# A bare number too long for JSON in a format that may be YAML is read again as (flow) YAML, which
# names where it is.
LINE_1 = "line 1 column"

# (id, topology document builder, rank table ids, expected field or None)
TOPOLOGY_CASES = [
    (
        "tor_info-tor_count",
        lambda: _set(tor_info(), "tor_count", DIGITS),
        TOR_INFO_IDS,
        "tor_count",
    ),
    (
        "tor_info-tor_count-bare",
        lambda: _set(tor_info(), "tor_count", NUMBER),
        TOR_INFO_IDS,
        LINE_1,
    ),
    (
        "tor_info-slice_id",
        lambda: _set(tor_info(), "server_list/1/server/0/slice_id", DIGITS),
        TOR_INFO_IDS,
        "server_list[1].server[0].slice_id",
    ),
    (
        "tor_info-slice_id-bare",
        lambda: _set(tor_info(), "server_list/1/server/0/slice_id", NUMBER),
        TOR_INFO_IDS,
        LINE_1,
    ),
    (
        "tor_info-npu_count",
        lambda: _set(tor_info(), "server_list/0/server/1/npu_count", DIGITS),
        TOR_INFO_IDS,
        None,
    ),
    (
        "tor_info-npu_count-bare",
        lambda: _set(tor_info(), "server_list/0/server/1/npu_count", NUMBER),
        TOR_INFO_IDS,
        LINE_1,
    ),
    (
        "tor_info-tor_id",
        lambda: _set(_tor_info_without_tor_ips(), "server_list/1/tor_id", DIGITS),
        TOR_INFO_IDS,
        None,
    ),
    (
        "tor_info-tor_id-bare",
        lambda: _set(_tor_info_without_tor_ips(), "server_list/1/tor_id", NUMBER),
        TOR_INFO_IDS,
        LINE_1,
    ),
    (
        "configmap-tor_count",
        lambda: _configmap(_set(tor_info(), "tor_count", DIGITS)),
        TOR_INFO_IDS,
        "data.tor_info: tor_count",
    ),
    (
        "ranktable_tor-rank_id",
        lambda: _set(ranktable_tor(CCE), "server_list/1/device/0/rank_id", DIGITS),
        V1_0_IDS,
        None,
    ),
    (
        "ranktable_tor-server_count",
        lambda: _set(ranktable_tor(CCE), "server_count", DIGITS),
        V1_0_IDS,
        None,
    ),
    (
        "ranktable_tor-tor_ip",
        lambda: _set(ranktable_tor(CCE), "server_list/1/device/0/tor_ip", DIGITS),
        V1_0_IDS,
        None,
    ),
    (
        "ranktable_tor-pod_name",
        lambda: _set(ranktable_tor(CCE), "server_list/1/pod_name", "w-" + DIGITS),
        V1_0_IDS,
        None,
    ),
    (
        "plain-slot",
        lambda: _set(
            plain_topology(V1_0_IDS), "servers/192.168.0.12", {"path": ["tor-a"], "slot": DIGITS}
        ),
        V1_0_IDS,
        "servers.192.168.0.12.slot",
    ),
    (
        "plain-slot-bare",
        lambda: _set(
            plain_topology(V1_0_IDS), "servers/192.168.0.12", {"path": ["tor-a"], "slot": NUMBER}
        ),
        V1_0_IDS,
        LINE_1,
    ),
    (
        "plain-switch-id",
        lambda: _set(plain_topology(V1_0_IDS), "servers/192.168.0.12", ["spine-" + DIGITS, DIGITS]),
        V1_0_IDS,
        None,
    ),
    (
        "plain-switch-id-bare",
        lambda: _set(plain_topology(V1_0_IDS), "servers/192.168.0.12", [NUMBER]),
        V1_0_IDS,
        LINE_1,
    ),
    ("node-label", lambda: _labelled_nodes(DIGITS), V1_0_IDS, None),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "build, ids, field", [c[1:] for c in TOPOLOGY_CASES], ids=[c[0] for c in TOPOLOGY_CASES]
)
def test_a_long_integer_in_a_topology(
    tmp_path: Path, capsys, monkeypatch, engine, build: Callable, ids, field: Optional[str]
):
    """A ``ranktable_tor.json`` is found beside the rank table (and read server by server on the
    pod); any other topology is named with ``--topology``."""
    clean_environment(monkeypatch)
    rank_table = tmp_path / "jobstart_hccl.json"
    rank_table.write_text(json.dumps(v1_0(ids)))
    document = build()
    beside = "device" in json.dumps(document)
    topology = tmp_path / ("ranktable_tor.json" if beside else "topology.json")
    topology.write_text(_text(document))
    outcome = run_everywhere(
        rank_table, None if beside else topology, ids[0], tmp_path / "out", capsys, engine
    )
    if field is None:
        assert_planned(outcome)
    elif field == LINE_1:
        line = assert_one_line_error(outcome, f"{topology}: {LINE_1} ")
        assert ": expected integers of at most 4300 digits" in line
    else:
        assert_one_line_error(outcome, f"{topology}: {field}: expected ")


YAML_CASES = [
    ("slot-decimal", "{path: [tor-a], slot: " + DIGITS + "}", "line 4 column 39"),
    (
        "switch-id-binary",
        "[0b" + "1" * 20000 + "]",
        "line 4 column 18",
    ),  # base 2 has no int() limit
    ("switch-id-hex", "[0x" + "f" * 4000 + "]", "line 4 column 18"),
    ("switch-id-sexagesimal", "[" + ":".join(["59"] * 3000) + "]", "line 4 column 18"),
    ("switch-id-quoted", '["' + DIGITS + '"]', None),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("spec, field", [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_a_long_integer_in_a_yaml_topology(
    tmp_path: Path, capsys, monkeypatch, engine, spec: str, field: Optional[str]
):
    """YAML reads integers in bases 2, 8, 16 and 60 too; none may become a number too long to
    print (a switch id is printed into the digest and the plan)."""
    clean_environment(monkeypatch)
    rank_table = tmp_path / "jobstart_hccl.json"
    rank_table.write_text(json.dumps(v1_0(V1_0_IDS)))
    topology = tmp_path / "topology.yaml"
    topology.write_text(
        f"servers:\n  192.168.0.11: [tor-a]\n  192.168.0.13: [tor-b]\n  192.168.0.12: {spec}\n"
    )
    outcome = run_everywhere(rank_table, topology, V1_0_IDS[0], tmp_path / "out", capsys, engine)
    if field is None:
        assert_planned(outcome)
    else:
        line = assert_one_line_error(outcome, f"{topology}: {field}: expected ")
        assert "integers of at most 4300 digits" in line


@pytest.mark.parametrize("where", ["yaml", "--set"])
def test_render_refuses_a_long_integer_spec_key_in_one_validation_line(tmp_path, where):
    import subprocess
    import sys

    spec = tmp_path / "job.yaml"
    value = "9" * 5000
    tier = f"  highest_tier_allowed: {value}\n" if where == "yaml" else ""
    spec.write_text(
        "name: j\nimage: x\nnodes: 4\nscript: train.py\nnetwork_topology:\n  mode: hard\n" + tier
    )
    extra = ["--set", f"network_topology.highest_tier_allowed={value}"] if where == "--set" else []
    done = subprocess.run(
        [sys.executable, "-m", "npu_job", "render", str(spec), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    assert "network_topology.highest_tier_allowed" in done.stderr
    assert "expected an integer from 0 to 2147483647, got an integer of 16607 bits" in done.stderr
