"""Switch topologies: four formats, detected by content (or forced), all read into one model; a
node on several ToRs keeps them all; every malformed field is named precisely."""

import base64
import gzip
import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.bootstrap.base import payload
from npu_job.bootstrap.base.model import (
    BASIC_TOR_NODE_CM,
    CCE_RANKTABLE_TOR,
    K8S_NODE_LABELS,
    PLAIN_FILE,
    TOPOLOGY_FORMATS,
    Placement,
    Topology,
)
from npu_job.bootstrap.topology import (
    encode_ranktable_tor,
    parse_topology,
)
from npu_job.demo.synthetic import synthetic_cluster

from npu_job.errors import InputError

from .documents import (
    as_json,
    b64_gzip,
    node,
    node_list,
    plain_topology_document,
    ranktable_tor,
    tor_info,
)
from .engines import ENGINES, json_engine

CCE = ranktable_tor(
    {
        "192.168.0.11": ["10.0.1.1", "10.0.1.1"],
        "192.168.0.12": ["10.0.1.2", "10.0.1.2"],
        "192.168.0.13": ["10.0.1.2", "10.0.1.3"],  # NICs on two ToRs
        "192.168.0.14": ["", ""],  # the plugin knew no switch for this node
    }
)


def test_cce_ranktable_tor_is_base64_gzip_and_tor_set_comes_from_devices():
    topology = parse_topology(b64_gzip(CCE, wrap=76), "/user/config/ranktable_tor.json")
    assert topology.source == CCE_RANKTABLE_TOR
    assert dict(topology.placements) == {
        "192.168.0.11": Placement(tors=("10.0.1.1",)),
        "192.168.0.12": Placement(tors=("10.0.1.2",)),
        "192.168.0.13": Placement(tors=("10.0.1.2", "10.0.1.3")),
    }


def test_cce_ranktable_tor_status_is_not_waited_on():
    initializing = dict(CCE, status="initializing")
    assert (
        parse_topology(b64_gzip(initializing), "t").placements
        == parse_topology(b64_gzip(CCE), "t").placements
    )


def test_tor_info_slice_id_is_the_slot_and_tor_count_is_slots_per_tor():
    topology = parse_topology(as_json(tor_info()), "tor_info")
    assert topology.source == BASIC_TOR_NODE_CM
    assert topology.placement_of("1.1.0.2") == Placement(tors=("1.0.0.0",), slot=2)
    assert topology.placement_of("1.1.0.4") == Placement(tors=("1.0.0.1",), slot=3)
    assert len(topology.placements) == 7


def test_a_server_listed_twice_under_one_tor_is_merged_and_said(caplog):
    """MindCluster's own documentation example lists one server_ip twice under a ToR."""
    document = tor_info()
    document["server_list"][0]["server"].append(
        {"server_ip": "1.1.0.2", "npu_count": 8, "slice_id": 3}
    )
    with caplog.at_level("WARNING", logger="npu_job.bootstrap.topology"):
        topology = parse_topology(as_json(document), "tor_info.json")
    assert topology.placement_of("1.1.0.2") == Placement(tors=("1.0.0.0",), slot=2)
    assert [r.getMessage() for r in caplog.records] == [
        "tor_info.json: server_list[0].server[4].server_ip: server '1.1.0.2' is listed twice under "
        "ToR '1.0.0.0' (also server_list[0].server[2]); its entries are merged, taking the lower slot"
    ]


def test_a_server_under_two_tors_is_multi_homed_without_a_warning(caplog):
    document = tor_info()
    document["server_list"][1]["server"].append(
        {"server_ip": "1.1.0.2", "npu_count": 8, "slice_id": 0}
    )
    with caplog.at_level("WARNING", logger="npu_job.bootstrap.topology"):
        topology = parse_topology(as_json(document), "tor_info.json")
    assert topology.placement_of("1.1.0.2").tors == ("1.0.0.0", "1.0.0.1")
    assert not caplog.records


def test_tor_info_without_tor_ip_names_the_tor_by_id():
    document = tor_info()
    del document["server_list"][1]["tor_ip"]
    assert parse_topology(as_json(document), "t").placement_of("1.1.0.5").tors == ("tor-1",)


@pytest.mark.parametrize("dump", [json.dumps, yaml.safe_dump], ids=["kubectl-json", "kubectl-yaml"])
def test_whole_basic_tor_node_cm_configmap_is_unwrapped(dump):
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "basic-tor-node-cm", "namespace": "kube-system"},
        "data": {"tor_level": "double_layer", "tor_info": json.dumps(tor_info(), indent=2)},
    }
    topology = parse_topology(dump(configmap).encode(), "cm.yaml")
    assert topology == parse_topology(as_json(tor_info()), "x")


def test_node_labels_cabinet_lists_tor_ips_joined_by_dashes_and_internal_ip_is_the_key():
    nodes = node_list(
        node("n1", "10.0.0.1", {"cce.kubectl.kubernetes.io/cabinet": "10.9.0.1"}),
        node("n2", "10.0.0.2", {"cce.kubectl.kubernetes.io/cabinet": "10.9.0.2-10.9.0.1"}),
        node("n3", "10.0.0.3", {"volcano.sh/tor": "tor-b", "volcano.sh/hypercluster": "hc-1"}),
        node("n4", "10.0.0.4", {"volcano.sh/hypernode": "hn-7"}),
        node("n5", "10.0.0.5", {}),  # no topology label: not placed
    )
    topology = parse_topology(as_json(nodes), "https://10.247.0.1:443/api/v1/nodes")
    assert topology.source == K8S_NODE_LABELS
    assert topology.placement_of("10.0.0.2") == Placement(tors=("10.9.0.1", "10.9.0.2"))
    assert topology.placement_of("10.0.0.3") == Placement(tiers=("hc-1",), tors=("tor-b",))
    assert topology.placement_of("10.0.0.4") == Placement(tors=("hn-7",))
    assert (
        topology.placement_of("n1")
        == topology.placement_of("10.0.0.1")
        == Placement(tors=("10.9.0.1",))
    )
    assert topology.placement_of("10.0.0.5") is None


PLAIN_YAML = b"""\
# hand-written: server id -> switch path, outermost first, the ToR last
version: 1
servers:
  "10.0.0.1": [spine-a, tor-1]
  "10.0.0.2": {path: [spine-a, tor-1], slot: 3}
  "10.0.0.3": {path: [spine-a], tors: [tor-1, tor-2]}
  "10.0.0.4": tor-2
  "10.0.0.5": [7]
"""


def test_plain_file_short_and_long_forms():
    topology = parse_topology(PLAIN_YAML, "topology.yaml")
    assert topology.source == PLAIN_FILE
    assert dict(topology.placements) == {
        "10.0.0.1": Placement(tiers=("spine-a",), tors=("tor-1",)),
        "10.0.0.2": Placement(tiers=("spine-a",), tors=("tor-1",), slot=3),
        "10.0.0.3": Placement(tiers=("spine-a",), tors=("tor-1", "tor-2")),
        "10.0.0.4": Placement(tors=("tor-2",)),
        "10.0.0.5": Placement(tors=("7",)),
    }
    as_json_text = json.dumps(yaml.safe_load(PLAIN_YAML)).encode()
    assert parse_topology(as_json_text, "topology.json") == topology


def test_format_override_beats_detection():
    with pytest.raises(
        InputError, match=r"^t: server_list: expected only the keys 'version' and 'servers'"
    ):
        parse_topology(as_json(tor_info()), "t", fmt=PLAIN_FILE)


BAD_TOPOLOGIES = [
    ("unknown-shape", {"hello": 1}, None, "document: expected a topology: CCE ranktable_tor.json"),
    ("not-an-object", [1, 2], None, "document: expected a topology"),
    (
        "cce-missing-tor-ip",
        ranktable_tor({"a": ["t"]}),
        "del:server_list.0.device.0.tor_ip",
        "server_list[0].device[0].tor_ip: expected a required field (missing)",
    ),
    (
        "cce-duplicate-server",
        {"server_list": CCE["server_list"] + CCE["server_list"][:1]},
        None,
        "server_list[4].server_id: expected a unique server id; '192.168.0.11' is also server_list[0]",
    ),
    (
        "tor-info-slot-too-big",
        tor_info(),
        "set:server_list.1.server.0.slice_id=4",
        "server_list[1].server[0].slice_id: expected a slot below tor_count (4 slots per ToR), got 4",
    ),
    (
        "tor-info-slot-text",
        tor_info(),
        "set:server_list.1.server.0.slice_id=x",
        "server_list[1].server[0].slice_id: expected a non-negative integer",
    ),
    (
        "tor-info-duplicate-tor",
        tor_info(),
        "set:server_list.1.tor_ip=1.0.0.0",
        "server_list[1].tor_id: expected a unique ToR; '1.0.0.0' is also server_list[0]",
    ),
    (
        "tor-info-no-tor-count",
        tor_info(),
        "del:tor_count",
        "tor_count: expected a required field (missing)",
    ),
    (
        "nodes-label-not-string",
        node_list(node("n", "1.1.1.1", {"volcano.sh/tor": 5})),
        None,
        "items[0] (Node 'n'): metadata.labels.volcano.sh/tor: expected a string, got a number 5",
    ),
    (
        "nodes-no-name",
        {"kind": "NodeList", "items": [{"metadata": {}}]},
        None,
        "items[0].metadata.name: expected a required field (missing)",
    ),
    (
        "plain-unknown-top-key",
        {"servers": {}, "tors": {}},
        None,
        "tors: expected only the keys 'version' and 'servers' at the top level",
    ),
    (
        "plain-empty-path",
        {"servers": {"10.0.0.1": []}},
        None,
        "servers.10.0.0.1: expected at least one switch id (the ToR last)",
    ),
    (
        "plain-bad-slot",
        {"servers": {"10.0.0.1": {"path": ["t"], "slot": -1}}},
        None,
        "servers.10.0.0.1.slot: expected a non-negative integer",
    ),
    (
        "plain-unknown-key",
        {"servers": {"10.0.0.1": {"path": ["t"], "rack": 1}}},
        None,
        "servers.10.0.0.1.rack: expected only the keys 'path', 'slot' and 'tors'",
    ),
    (
        "plain-switch-not-string",
        {"servers": {"10.0.0.1": [["a"]]}},
        None,
        "servers.10.0.0.1[0]: expected a string, got an array",
    ),
    (
        "plain-server-list",
        {"servers": ["10.0.0.1"]},
        None,
        "servers: expected an object, got an array",
    ),
]


def _apply(document, edit):
    if edit is None:
        return document
    action, _, rest = edit.partition(":")
    path, _, value = rest.partition("=")
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    target = document
    for key in keys[:-1]:
        target = target[key]
    if action == "del":
        del target[keys[-1]]
    else:
        target[keys[-1]] = int(value) if value.isdigit() else value
    return document


@pytest.mark.parametrize(
    "document, edit, expected", [c[1:] for c in BAD_TOPOLOGIES], ids=[c[0] for c in BAD_TOPOLOGIES]
)
def test_bad_topology_names_the_exact_field(document, edit, expected):
    with pytest.raises(InputError) as caught:
        parse_topology(as_json(_apply(json.loads(json.dumps(document)), edit)), "topo")
    assert caught.value.message.startswith(f"topo: {expected}")


def test_yaml_server_ids_must_be_strings():
    with pytest.raises(
        InputError, match=r"servers.1: expected server ids as strings \(quote them in YAML\)"
    ):
        parse_topology(b"servers:\n  1: [tor-a]\n", "t.yaml")


@settings(max_examples=12, deadline=None)
@given(nodes=st.integers(2, 40), seed=st.integers(0, 500), multi=st.booleans(), tiers=st.booleans())
def test_serialisers_read_back_as_the_same_topology(nodes, seed, multi, tiers):
    tors = max(2, nodes // 5)
    table, topology = synthetic_cluster(
        nodes,
        tors,
        seed=seed,
        multi_tor=1 if multi else 0,
        spine_groups=2 if tiers else 0,
        missing_topology=1,
    )
    plain = parse_topology(yaml.safe_dump(plain_topology_document(topology)).encode(), "t.yaml")
    assert dict(plain.placements) == dict(topology.placements)
    cce = parse_topology(encode_ranktable_tor(table, topology), "ranktable_tor.json")
    # ranktable_tor.json carries ToRs only (no tiers, no slots)
    assert dict(cce.placements) == {
        sid: Placement(tors=p.tors) for sid, p in topology.placements.items()
    }
    assert isinstance(cce, Topology)


def test_cce_fast_path_and_field_by_field_path_agree(monkeypatch):
    from npu_job.bootstrap import topology as module

    fast = parse_topology(b64_gzip(CCE), "t")
    monkeypatch.setattr(module, "_cce_tor_sets_fast", lambda server_list: None)
    assert parse_topology(b64_gzip(CCE), "t") == fast


CCE_BAD = [case for case in BAD_TOPOLOGIES if case[0].startswith("cce-")] + [
    ("cce-truncated-json", None, "truncate", "line 1 column"),
    ("cce-server-list-twice", None, "twice", "server_list[0].device[0].tor_ip: expected a string"),
    (
        "cce-server-id-not-a-string",
        ranktable_tor({"a": ["t"]}),
        "set:server_list.0.server_id=7",
        "server_list[0].server_id: expected a string, got a number 7",
    ),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "document, edit, expected", [c[1:] for c in CCE_BAD], ids=[c[0] for c in CCE_BAD]
)
def test_ranktable_tor_read_server_by_server_names_the_same_field(document, edit, expected, engine):
    """The automatic candidate beside the rank table is read as cce-ranktable-tor, two fields of
    each server only (msgspec) or one server at a time (stdlib); anything unusual falls back to the
    whole-document reader and its exact message."""
    if edit == "truncate":
        data = gzip.compress(json.dumps(CCE).encode()[:-40])
    elif edit == "twice":  # json.loads keeps the last server_list: a bad one here
        text = (
            json.dumps(CCE)[:-1]
            + ', "server_list": [{"server_id": "x", "device": [{"tor_ip": 5}]}]}'
        )
        data = text.encode()
    else:
        data = as_json(_apply(json.loads(json.dumps(document)), edit))
    with json_engine(engine), pytest.raises(InputError) as caught:
        parse_topology(data, "topo", CCE_RANKTABLE_TOR)
    assert caught.value.message.startswith("topo: ") and expected in caught.value.message


@settings(max_examples=12, deadline=None)
@given(nodes=st.integers(2, 40), seed=st.integers(0, 500), multi=st.booleans())
def test_ranktable_tor_read_server_by_server_equals_the_whole_document_read(nodes, seed, multi):
    table, topology = synthetic_cluster(
        nodes, max(2, nodes // 5), seed=seed, multi_tor=1 if multi else 0, missing_topology=1
    )
    data = encode_ranktable_tor(table, topology)
    whole = parse_topology(data, "t")  # detected, not named: read as a whole document
    for engine in ENGINES:
        with json_engine(engine):
            assert parse_topology(data, "t", CCE_RANKTABLE_TOR) == whole


@pytest.mark.parametrize(
    "text",
    [
        '{"server_list": [{"server_id": "", "device": [{"tor_ip": "t"}]}]}',
        '{"server_list": [{"server_id": "a", "device": [{"tor_ip": "t"}]}, {"server_id": "a", "device": []}]}',
        '{"server_list": [{"server_id": "a", "device": [{"tor_ip": 1}]}]}',
        '{"server_list": [{"server_id": "a", "device": [{"tor_ip": "t", "x": "\\u0000\\ud800"}]}]}',
        '{"server_list": [{"server_id": "a", "device": [{"tor_ip": "t", "x": NaN}]}]}',
        '{"server_list": [{"server_id": "a", "device": {"tor_ip": "t"}}]}',
        '{"server_list": [], "server_list": [{"server_id": "a", "device": [{"tor_ip": "t"}]}]}',
        '{"server_list": [{"server_id": "a", "device": [{"tor_ip": "", "tor_ip": "t"}]}]}',
    ],
    ids=[
        "empty-id",
        "duplicate-id",
        "tor-not-a-string",
        "odd-strings-elsewhere",
        "nan-elsewhere",
        "device-not-a-list",
        "server-list-twice",
        "tor-ip-twice",
    ],
)
def test_ranktable_tor_engines_agree_on_unusual_documents(text):
    outcomes = []
    for engine in ENGINES:
        with json_engine(engine):
            try:
                outcomes.append(parse_topology(text.encode(), "t", CCE_RANKTABLE_TOR))
            except InputError as error:
                outcomes.append(error.message)
    assert outcomes[0] == outcomes[1]


def _broken_b64_gzip_payloads():
    document = json.dumps(tor_info()).encode()
    gzipped = gzip.compress(document)
    return {
        "over-the-cap": base64.b64encode(gzip.compress(b'{"a": "' + b"x" * 5000 + b'"}')),
        "truncated": base64.b64encode(gzipped[: len(gzipped) // 2]),
        "corrupt": base64.b64encode(gzipped[:10] + b"\xff" * 40),
        "not-json-inside": base64.b64encode(gzip.compress(b"servers: {a: b}")),
        "bad-padding": base64.b64encode(gzipped)[:-1],
        "wrapped-and-truncated": b"\n".join(
            base64.b64encode(gzipped[:-8])[i : i + 1] for i in range(0, 200)
        ),
    }


@pytest.mark.parametrize("fmt", [None, *TOPOLOGY_FORMATS])
@pytest.mark.parametrize("name", list(_broken_b64_gzip_payloads()))
def test_a_broken_base64_gzip_topology_fails_as_a_rank_table_would(monkeypatch, name, fmt):
    """Formats that may be YAML fall back to YAML only for what is not base64(gzip): a bomb, a
    truncated or corrupt stream gets the decoder's own error (the size cap's among them), not
    "expected an object, got a string"."""
    monkeypatch.setattr(payload, "MAX_INPUT_BYTES", 1000)
    data = _broken_b64_gzip_payloads()[name]
    with pytest.raises(InputError) as rank_table_error:
        payload.decode_document(data, "t")
    with pytest.raises(InputError) as topology_error:
        parse_topology(data, "t", fmt)
    assert topology_error.value.message == rank_table_error.value.message


def test_a_lone_word_is_still_read_as_yaml_and_refused_by_the_reader():
    with pytest.raises(
        InputError, match=r"^t: document: expected an object, got a string 'hello'$"
    ):
        parse_topology(b"hello", "t", PLAIN_FILE)


FLOW_YAML = [
    (
        "plain-short",
        b'{servers: {"10.0.0.1": tor-1, "10.0.0.2": [spine-a, tor-2]}}',
        None,
        {
            "10.0.0.1": Placement(tors=("tor-1",)),
            "10.0.0.2": Placement(tiers=("spine-a",), tors=("tor-2",)),
        },
    ),
    (
        "plain-long",
        b"{version: 1, servers: {'10.0.0.1': {path: [tor-1], slot: 3},}}",
        PLAIN_FILE,
        {"10.0.0.1": Placement(tors=("tor-1",), slot=3)},
    ),
    (
        "tor-info",
        b"{tor_count: 4, server_list: [{tor_id: 0, tor_ip: 1.0.0.0, server: [{server_ip: 1.1.0.0, "
        b"slice_id: 2}]}]}",
        BASIC_TOR_NODE_CM,
        {"1.1.0.0": Placement(tors=("1.0.0.0",), slot=2)},
    ),
    (
        "json-with-a-trailing-comma",
        b'{"servers": {"10.0.0.1": ["tor-1"],}}',
        None,
        {"10.0.0.1": Placement(tors=("tor-1",))},
    ),
]


@pytest.mark.parametrize(
    "text, fmt, placements", [c[1:] for c in FLOW_YAML], ids=[c[0] for c in FLOW_YAML]
)
def test_flow_style_yaml_is_read_where_yaml_is_allowed(text, fmt, placements):
    """Text starting with { or [ is valid YAML too: what JSON refuses is read again as YAML."""
    assert dict(parse_topology(text, "topology.yaml", fmt).placements) == placements


@pytest.mark.parametrize(
    "text, fmt, expected",
    [
        (
            b'{servers: {"10.0.0.1": tor-1}',
            None,
            "line 2 column 1: expected valid JSON or YAML (did not find expected ',' or '}')",
        ),
        (
            b'{"servers": {"a": ["t"] "b": ["u"]}}',
            PLAIN_FILE,
            "line 1 column 25: expected valid JSON or YAML (did not find expected ',' or '}')",
        ),
        (
            b'{"servers": {"a": "\xff"}}',
            None,
            "content: expected UTF-8 text (invalid start byte at byte 19)",
        ),
        (
            b"[" + b"a," * 300_000 + b"a]",
            None,
            "line 1 column 2: expected valid JSON (Expecting value)",
        ),
        (
            b"{server_list: [{server_id: a, device: []}]}",
            CCE_RANKTABLE_TOR,
            "line 1 column 2: expected valid JSON (Expecting property name enclosed in double quotes)",
        ),
        (
            b"{kind: NodeList, items: []}",
            K8S_NODE_LABELS,
            "line 1 column 2: expected valid JSON (Expecting property name enclosed in double quotes)",
        ),
    ],
    ids=[
        "neither",
        "broken-json",
        "not-utf8",
        "too-big-for-yaml",
        "ranktable-tor-is-never-yaml",
        "node-list-is-never-yaml",
    ],
)
def test_text_that_is_neither_json_nor_yaml_says_what_was_expected(text, fmt, expected):
    """YAML's error, naming both, when YAML read further; JSON's when YAML cannot be meant (not
    UTF-8, past YAML's caps, or a format that is only ever JSON)."""
    with pytest.raises(InputError) as caught:
        parse_topology(text, "t", fmt)
    assert caught.value.message == f"t: {expected}"
