"""Volcano HyperNodes as a topology: the fixtures are kubectl dumps written here from the HyperNode
CRD (tests/bootstrap/fixtures/kube): a two- and a three-tier tree, members by exactMatch,
regexMatch and labelMatch, a node in no HyperNode and a node in two."""

import json
import random
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.bootstrap import planner
from npu_job.bootstrap.base.model import (
    VOLCANO_HYPERNODES,
    Collective,
    Device,
    Placement,
    RankTable,
    Server,
)
from npu_job.bootstrap.kube.facts import read_nodes
from npu_job.bootstrap.kube.hypernode import read_hypernodes
from npu_job.bootstrap.kube.hypernodetree import MAX_DEPTH, exact_tree_placements, resolve
from npu_job.bootstrap.kube.objects import read_objects
from npu_job.bootstrap.kube.topology import HYPERNODES, KubeContext, topology_from_document
from npu_job.bootstrap.topology import parse_topology

from npu_job.errors import InputError

from ..documents import KUBE_FIXTURES, NODES, THREE_TIER, kube_document, node_ip, nodes_context
from ..engines import ENGINES, json_engine

TWO_TIER = KUBE_FIXTURES / "hypernodes-two-tier.json"


def test_three_tier_tree_places_every_member_kind_by_its_path_outermost_first():
    found = topology_from_document(kube_document(THREE_TIER), "hn.yaml", context=nodes_context())
    topology = found.topology
    assert topology.source == HYPERNODES
    expected = {
        "node-0": ("spine-0", "tor-0"),
        "node-1": ("spine-0", "tor-0"),
        "node-2": ("spine-0", "tor-0"),
        "node-3": ("spine-0", "tor-1"),
        "node-4": ("spine-0", "tor-1"),
        "node-5": ("spine-0", "tor-1"),
        "node-6": ("spine-1", "tor-2"),
        "node-7": ("spine-1", "tor-2"),
        "node-8": ("spine-1", "tor-3"),
        "node-9": ("spine-1", "tor-3"),
        "node-10": ("spine-1", "tor-3"),
    }
    for name, (spine, tor) in expected.items():
        placement = Placement(tiers=("cluster-a", spine), tors=(tor,))
        assert topology.placement_of(name) == placement, name
        assert topology.placement_of(node_ip(name)) == placement, name  # keyed by InternalIP too
    assert topology.placement_of("node-11") is None  # no HyperNode selects it
    assert topology.placement_of(node_ip("node-11")) is None


def test_a_node_in_two_hypernodes_is_placed_by_lowest_tier_then_path_and_reported():
    found = topology_from_document(kube_document(THREE_TIER), "hn.yaml", context=nodes_context())
    # node-5: tor-1 by regex and tor-3 by rack=r3; both tier 1, cluster-a > spine-0 sorts first
    assert found.topology.placement_of("node-5") == Placement(("cluster-a", "spine-0"), ("tor-1",))
    assert len(found.notes) == 1
    note = found.notes[0]
    assert note.startswith("1 node(s) are held by several HyperNodes")
    assert "'node-5' ('cluster-a' > 'spine-0' > 'tor-1', 'cluster-a' > 'spine-1' > 'tor-3')" in note


def test_two_tier_tree_with_a_regex_and_a_label_selector_with_does_not_exist():
    found = topology_from_document(
        json.loads(TWO_TIER.read_text()), "hn.json", context=nodes_context()
    )
    topology = found.topology
    for name in ("node-0", "node-1", "node-2", "node-3"):
        assert topology.placement_of(name) == Placement(("s3",), ("s0",))
    for name in ("node-4", "node-5", "node-6", "node-7"):
        assert topology.placement_of(name) == Placement(("s3",), ("s1",))
    for name in ("node-8", "node-10"):
        assert topology.placement_of(name) == Placement(("s3",), ("s2",))
    assert topology.placement_of("node-9") is None  # rack r3 but drained: DoesNotExist fails
    assert topology.placement_of("node-11") is None
    assert "'node-5' ('s3' > 's1', 's3' > 's2')" in found.notes[0]


def test_parse_topology_detects_hypernodes_in_yaml_json_and_typed_lists():
    context = nodes_context()
    from_yaml = parse_topology(THREE_TIER.read_bytes(), "hn.yaml", context=context)
    from_json = parse_topology(
        json.dumps(kube_document(THREE_TIER)).encode(), "hn.json", context=context
    )
    typed = kube_document(THREE_TIER)
    typed["kind"] = "HyperNodeList"
    for item in typed["items"]:  # the API lists items without kind
        del item["kind"]
    from_api = parse_topology(json.dumps(typed).encode(), "api", context=context)
    assert from_yaml == from_json == from_api
    assert from_yaml.source == VOLCANO_HYPERNODES
    explicit = parse_topology(
        THREE_TIER.read_bytes(), "hn.yaml", VOLCANO_HYPERNODES, context=context
    )
    assert explicit == from_yaml


def test_without_node_labels_label_members_place_nothing_and_say_why():
    found = topology_from_document(
        kube_document(THREE_TIER),
        "hn.yaml",
        context=KubeContext(names=tuple(f"node-{i}" for i in range(12))),
    )
    topology = found.topology
    assert topology.placement_of("node-0") == Placement(("cluster-a", "spine-0"), ("tor-0",))
    assert topology.placement_of("node-4") == Placement(("cluster-a", "spine-0"), ("tor-1",))
    assert topology.placement_of("node-7") is None and topology.placement_of("node-8") is None
    assert any(
        note.startswith("labelMatch members cannot select nodes whose labels were not given")
        and "'tor-2' spec.members[0]" in note
        and "'tor-3' spec.members[0]" in note
        for note in found.notes
    )


def test_planner_puts_each_tor_and_spine_together():
    topology = topology_from_document(
        kube_document(THREE_TIER), "hn.yaml", context=nodes_context()
    ).topology
    names = [f"node-{i}" for i in range(12)]
    random.Random(4).shuffle(names)
    servers = tuple(
        Server(node_ip(name), i, tuple(Device(str(d)) for d in range(8)))
        for i, name in enumerate(names)
    )
    plan = planner.plan(RankTable("1.0", "completed", servers), topology, Collective.RING)
    assert plan.status.value == "success"
    tors = [topology.placement_of(servers[pod].server_id) for pod in plan.pod_of_node_rank]
    paths = [(p.tiers + p.tors) if p else None for p in tors]
    assert paths[:3] == [("cluster-a", "spine-0", "tor-0")] * 3
    assert paths[3:6] == [("cluster-a", "spine-0", "tor-1")] * 3
    assert paths[6:8] == [("cluster-a", "spine-1", "tor-2")] * 2
    assert paths[8:11] == [("cluster-a", "spine-1", "tor-3")] * 3
    assert paths[11] is None  # node-11: no topology, last


def _hn(name, tier, *members, kind="HyperNode"):
    return {
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"tier": tier, "members": list(members)},
    }


def _node_member(**selector):
    return {"type": "Node", "selector": selector}


def _child(name):
    return {"type": "HyperNode", "selector": {"exactMatch": {"name": name}}}


@pytest.mark.parametrize(
    "members, needs_labels",
    [
        ([_node_member(exactMatch={"name": "n1"}), _child("leaf")], False),
        ([_node_member(regexMatch={"pattern": "n.*"})], False),
        ([_node_member(exactMatch={"name": "n1"}), _node_member(labelMatch={})], True),
        ([_node_member(labelMatch=None)], False),
        ([{"type": "Node"}], True),  # no selector: malformed, the reader will say
        (["n1"], True),
    ],
)
def test_the_nodes_are_listed_only_for_trees_that_select_by_label(members, needs_labels):
    """A tree that names its nodes needs no Node objects (the pod path then lists none); any
    labelMatch, or anything malformed, says the labels may be needed."""
    from npu_job.bootstrap.kube.hypernode import selects_by_label

    objects = read_objects(
        {"kind": "List", "items": [_hn("leaf", 1), _hn("spine", 2, *members)]}, "s"
    ).hypernodes
    assert selects_by_label(objects) is needs_labels
    spec_not_an_object = read_objects({"kind": "HyperNode", "metadata": {}, "spec": "x"}, "s")
    assert selects_by_label(spec_not_an_object.hypernodes) is True


def test_a_hypernode_in_two_parents_hangs_under_the_lowest_tier_then_name():
    document = {
        "kind": "List",
        "items": [
            _hn("leaf", 1, _node_member(exactMatch={"name": "n1"})),
            _hn("z-spine", 2, _child("leaf")),
            _hn("a-top", 3, _child("leaf"), _child("z-spine")),
        ],
    }
    found = topology_from_document(document, "hn")
    assert found.topology.placement_of("n1") == Placement(("a-top", "z-spine"), ("leaf",))
    assert any("'leaf' (in 'z-spine', 'a-top')" in note for note in found.notes)


def test_a_cycle_is_one_line_naming_the_hypernode_and_member():
    document = {
        "kind": "List",
        "items": [
            _hn("s1", 1, _node_member(exactMatch={"name": "n1"}), _child("s3")),
            _hn("s2", 2, _child("s1")),
            _hn("s3", 3, _child("s2")),
        ],
    }
    with pytest.raises(InputError) as caught:
        topology_from_document(document, "hn.json")
    assert caught.value.message == (
        "hn.json: items[1] (HyperNode 's2'): spec.members[0].selector.exactMatch.name: expected "
        "HyperNodes that form a tree; 's1' > 's3' > 's2' > 's1' is a cycle"
    )


def test_selectors_volcano_would_refuse_match_nothing_and_are_reported():
    document = {
        "kind": "List",
        "items": [
            _hn("a", 1, _node_member(regexMatch={"pattern": "node-(?=1)"})),  # RE2 has no lookahead
            _hn("b", 1, _node_member(regexMatch={"pattern": "node-("})),
            _hn("c", 1, _node_member(labelMatch={})),
            _hn(
                "d",
                1,
                _node_member(labelMatch={"matchExpressions": [{"key": "k", "operator": "In"}]}),
            ),
            _hn(
                "e",
                1,
                _node_member(
                    labelMatch={
                        "matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]
                    }
                ),
            ),
            _hn("f", 1, _node_member(regexMatch={"pattern": "node-1$"})),
        ],
    }
    found = topology_from_document(document, "hn", context=KubeContext(names=("node-1", "node-2")))
    assert dict(found.topology.placements) == {"node-1": Placement((), ("f",))}
    note = next(n for n in found.notes if n.startswith("HyperNode members that select no node"))
    assert (
        "'a' spec.members[0] (invalid pattern: 'error parsing regexp: invalid or unsupported "
        "Perl syntax: `(?=`')" in note
    )
    assert (
        "'b' spec.members[0] (invalid pattern: 'error parsing regexp: missing closing ): "
        "`node-(`')" in note
    )
    assert "'c' spec.members[0] (an empty labelMatch)" in note
    assert "and 2 more" in note


BAD = [
    (
        "no-tier",
        {"metadata": {"name": "s"}, "spec": {"members": []}},
        "items[0] (HyperNode 's'): spec.tier: expected a required field (missing)",
    ),
    (
        "tier-text",
        {"metadata": {"name": "s"}, "spec": {"tier": "1"}},
        "items[0] (HyperNode 's'): spec.tier: expected an integer >= 0, got a string '1'",
    ),
    (
        "tier-negative",
        {"metadata": {"name": "s"}, "spec": {"tier": -1}},
        "items[0] (HyperNode 's'): spec.tier: expected an integer >= 0, got a number -1",
    ),
    (
        "no-name",
        {"metadata": {}, "spec": {"tier": 1}},
        "items[0].metadata.name: expected a required field",
    ),
    (
        "member-type",
        {
            "metadata": {"name": "s"},
            "spec": {
                "tier": 1,
                "members": [{"type": "Switch", "selector": {"exactMatch": {"name": "x"}}}],
            },
        },
        "items[0] (HyperNode 's'): spec.members[0].type: expected 'Node' or 'HyperNode', got a string 'Switch'",
    ),
    (
        "two-selectors",
        {
            "metadata": {"name": "s"},
            "spec": {
                "tier": 1,
                "members": [
                    {
                        "type": "Node",
                        "selector": {"exactMatch": {"name": "x"}, "regexMatch": {"pattern": "x"}},
                    }
                ],
            },
        },
        "items[0] (HyperNode 's'): spec.members[0].selector: expected exactly one of exactMatch, "
        "regexMatch or labelMatch, got exactMatch and regexMatch",
    ),
    (
        "no-selector",
        {"metadata": {"name": "s"}, "spec": {"tier": 1, "members": [{"type": "Node"}]}},
        "items[0] (HyperNode 's'): spec.members[0].selector: expected exactly one of exactMatch, "
        "regexMatch or labelMatch, got none",
    ),
    (
        "exact-empty",
        {
            "metadata": {"name": "s"},
            "spec": {
                "tier": 1,
                "members": [{"type": "Node", "selector": {"exactMatch": {"name": ""}}}],
            },
        },
        "items[0] (HyperNode 's'): spec.members[0].selector.exactMatch.name: expected a non-empty string",
    ),
    (
        "label-value",
        {
            "metadata": {"name": "s"},
            "spec": {
                "tier": 1,
                "members": [
                    {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"rack": 3}}}}
                ],
            },
        },
        "items[0] (HyperNode 's'): spec.members[0].selector.labelMatch.matchLabels.rack: expected a "
        "string, got a number 3",
    ),
    (
        "expression-no-key",
        {
            "metadata": {"name": "s"},
            "spec": {
                "tier": 1,
                "members": [
                    {
                        "type": "Node",
                        "selector": {"labelMatch": {"matchExpressions": [{"operator": "Exists"}]}},
                    }
                ],
            },
        },
        "items[0] (HyperNode 's'): spec.members[0].selector.labelMatch.matchExpressions[0].key: "
        "expected a required field (missing)",
    ),
    (
        "members-object",
        {"metadata": {"name": "s"}, "spec": {"tier": 1, "members": {}}},
        "items[0] (HyperNode 's'): spec.members: expected an array, got an object",
    ),
]


@pytest.mark.parametrize("item, expected", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_hypernodes_are_one_line_naming_object_and_field(item, expected):
    document = {"kind": "HyperNodeList", "items": [item]}
    with pytest.raises(InputError) as caught:
        parse_topology(json.dumps(document).encode(), "hn.json")
    assert caught.value.message.startswith(f"hn.json: {expected}")
    assert "\n" not in caught.value.message


def test_a_hypernode_name_twice_is_an_error():
    document = {"kind": "List", "items": [_hn("s", 1), _hn("s", 2)]}
    with pytest.raises(
        InputError,
        match=r"^hn: items\[1\] \(HyperNode 's'\): metadata.name: expected "
        r"a HyperNode name unique in the list; 's' is also items\[0\]$",
    ):
        read_hypernodes(read_objects(document, "hn").hypernodes, "hn")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_listing_order_never_changes_the_placements(seed):
    """The API lists objects in any order, and members in the order they were written."""
    rng = random.Random(seed)
    hypernodes, nodes = kube_document(THREE_TIER), kube_document(NODES)
    expected = topology_from_document(
        hypernodes, "hn", context=KubeContext(objects=read_objects(nodes, "nodes"))
    )
    rng.shuffle(hypernodes["items"])
    for item in hypernodes["items"]:
        rng.shuffle(item["spec"]["members"])
    rng.shuffle(nodes["items"])
    shuffled = topology_from_document(
        hypernodes, "hn", context=KubeContext(objects=read_objects(nodes, "nodes"))
    )
    assert shuffled == expected


def test_resolution_is_restricted_to_names_without_a_node_list():
    tree = read_hypernodes(read_objects(kube_document(TWO_TIER), "hn").hypernodes, "hn")
    resolved = resolve(tree, (), "hn", names=("node-6", "node-2", "node-40"))
    assert dict(resolved.placements) == {
        "node-2": Placement(("s3",), ("s0",)),
        "node-6": Placement(("s3",), ("s1",)),
    }
    nodes = read_nodes(read_objects(kube_document(NODES), "nodes").nodes, "nodes")
    assert resolve(tree, nodes, "hn").placements["node-10"] == Placement(("s3",), ("s2",))


def _combined_json():
    combined = kube_document(THREE_TIER)
    combined["items"] = kube_document(NODES)["items"] + combined["items"]
    return json.dumps(combined).encode()


@pytest.mark.parametrize("engine", ENGINES)
def test_both_json_engines_read_a_combined_list_alike(engine):
    """msgspec decodes only the fields read (a 4096-node list is big); the standard library
    everything: the topology and the messages are the same."""
    expected = topology_from_document(json.loads(_combined_json()), "c")
    with json_engine(engine):
        assert parse_topology(_combined_json(), "c") == expected.topology
        bad = json.loads(_combined_json())
        bad["items"][3]["metadata"]["labels"]["example.com/rack"] = ["r1"]
        with pytest.raises(InputError) as caught:
            parse_topology(json.dumps(bad).encode(), "c")
    assert caught.value.message == (
        "c: items[3] (Node 'node-3'): metadata.labels.example.com/rack: "
        "expected a string, got an array"
    )


def test_bootstrap_reads_a_hypernode_file_with_the_nodes_beside_it(tmp_path):
    """The thin file edge: --topology hypernodes.yaml --nodes nodes.json, a rank table whose
    server ids are the nodes' InternalIPs; every pod computes the same plan."""
    from npu_job.bootstrap.ranktable import rank_table_document
    from npu_job.bootstrap.run import bootstrap

    names = [f"node-{i}" for i in range(12)]
    random.Random(9).shuffle(names)
    servers = tuple(
        Server(
            node_ip(name), i, tuple(Device(str(d), f"29.0.{i}.{d}", i * 2 + d) for d in range(2))
        )
        for i, name in enumerate(names)
    )
    table = RankTable("1.0", "completed", servers)
    (tmp_path / "jobstart_hccl.json").write_text(json.dumps(rank_table_document(table)))
    mappings = set()
    for server in servers:
        env = {
            "RANK_TABLE_FILE": str(tmp_path / "jobstart_hccl.json"),
            "NPU_JOB_TOPOLOGY": str(THREE_TIER),
            "NPU_JOB_NODES": str(NODES),
            "MA_CURRENT_HOST_IP": server.server_id,
            "VC_TASK_INDEX": str(server.pod_index),
            "NPU_JOB_OUTPUT_DIR": str(tmp_path / "out"),
            "NPU_JOB_K8S_TOPOLOGY": "0",
        }
        result = bootstrap({}, env)
        assert result.route_plan["status"] == "success", result.route_plan["reason"]
        mappings.add(result.route_plan["mapping_digest"])
    assert len(mappings) == 1
    topology = parse_topology(THREE_TIER.read_bytes(), "t", context=nodes_context())
    expected = planner.plan(table, topology, Collective.RING)
    assert result.route_plan["rank_mapping"] == expected.rank_mapping
    assert result.route_plan["topology"] == f"{THREE_TIER} (volcano-hypernodes)"


# --- the shortcut for discovery's trees ----------------------------------------------------------

COMPLICATIONS = (
    "none",
    "second parent",
    "second holder",
    "cycle",
    "self member",
    "regex member",
    "label member",
    "selector with two keys",
    "member without a type",
    "member of an unknown type",
    "empty member name",
    "tier below zero",
    "tier as text",
    "tierName as a number",
    "name twice",
    "members not a list",
    "unknown child named twice",
    "member not an object",
    "selector not an object",
    "exactMatch not an object",
    "a number for a name",
)


@st.composite
def discovery_trees(draw):
    """A random forest of HyperNodes with exact members only (as Volcano's discovery writes
    them), nodes under the leaves, possibly with one complication the shortcut must leave to
    the general reader; and the node names a job asks for (None: every node)."""
    count = draw(st.integers(1, 7))
    names = [f"hn-{i}" for i in range(count)]
    items = [_hn(name, draw(st.integers(0, 4))) for name in names]
    for index in range(1, count):  # a forest: each HyperNode's parent comes before it
        parent = draw(st.one_of(st.none(), st.integers(0, index - 1)))
        if parent is not None:
            items[parent]["spec"]["members"].append(_child(names[index]))
    nodes = [f"node-{i}" for i in range(draw(st.integers(0, 12)))]
    for node in nodes:
        holder = draw(st.one_of(st.none(), st.integers(0, count - 1)))
        if holder is not None:
            repeats = draw(st.integers(1, 2))  # a node listed twice by one HyperNode is one member
            items[holder]["spec"]["members"] += [_node_member(exactMatch={"name": node})] * repeats
    complication = draw(st.sampled_from(COMPLICATIONS))
    victim = items[draw(st.integers(0, count - 1))]
    spec = victim["spec"]
    other = draw(st.sampled_from(names))
    if complication == "second parent":
        items.append(_hn("hn-extra", 5, _child(other)))
        spec["members"].append(_child(other))
    elif complication == "second holder":
        node = draw(st.sampled_from(nodes)) if nodes else "node-x"
        spec["members"].append(_node_member(exactMatch={"name": node}))
        items.append(_hn("hn-extra", 1, _node_member(exactMatch={"name": node})))
    elif complication == "cycle":
        items.append(_hn("hn-loop-a", 2, _child("hn-loop-b")))
        items.append(_hn("hn-loop-b", 3, _child("hn-loop-a")))
    elif complication == "self member":
        spec["members"].append(_child(victim["metadata"]["name"]))
    elif complication == "regex member":
        spec["members"].append(_node_member(regexMatch={"pattern": "node-1"}))
    elif complication == "label member":
        spec["members"].append(_node_member(labelMatch={"matchLabels": {"rack": "a"}}))
    elif complication == "selector with two keys":
        spec["members"].append(
            _node_member(exactMatch={"name": "node-0"}, regexMatch={"pattern": "x"})
        )
    elif complication == "member without a type":
        spec["members"].append({"selector": {"exactMatch": {"name": "node-0"}}})
    elif complication == "member of an unknown type":
        spec["members"].append({"type": "Rack", "selector": {"exactMatch": {"name": "node-0"}}})
    elif complication == "empty member name":
        spec["members"].append(_node_member(exactMatch={"name": ""}))
    elif complication == "tier below zero":
        spec["tier"] = -1
    elif complication == "tier as text":
        spec["tier"] = "1"
    elif complication == "tierName as a number":
        spec["tierName"] = 7
    elif complication == "name twice":
        items.append(_hn(victim["metadata"]["name"], 1))
    elif complication == "members not a list":
        spec["members"] = {"type": "Node"}
    elif complication == "unknown child named twice":
        spec["members"].append(_child("hn-ghost"))
        items.append(_hn("hn-extra", 1, _child("hn-ghost")))
    elif complication == "member not an object":
        spec["members"].append(draw(st.sampled_from(["node-0", ["node-0"], 3, None])))
    elif complication == "selector not an object":
        spec["members"].append({"type": "Node", "selector": draw(st.sampled_from(["x", ["x"]]))})
    elif complication == "exactMatch not an object":
        spec["members"].append(_node_member(exactMatch=draw(st.sampled_from(["node-0", None]))))
    elif complication == "a number for a name":
        spec["members"].append(_node_member(exactMatch={"name": draw(st.sampled_from([7, 0.5]))}))
    asked = draw(
        st.one_of(st.none(), st.lists(st.sampled_from(nodes + ["node-absent"]), unique=True))
    )
    return items, complication, None if asked is None else frozenset(asked)


@settings(max_examples=300, deadline=None)
@given(case=discovery_trees(), seed=st.integers(0, 10_000))
def test_the_shortcut_places_nodes_as_the_general_reader_or_leaves_the_tree_to_it(case, seed):
    """exact_tree_placements is only a shortcut: where it answers, its placements are the
    general reader's and the general reader has nothing to note; a tree with choices, notes or
    errors it leaves (None). It answers for every plain discovery tree, in any listing order."""
    items, complication, asked = case
    objects = read_objects({"kind": "List", "items": items}, "hn").hypernodes
    try:
        general = resolve(read_hypernodes(objects, "hn"), (), "hn", names=asked)
    except InputError:
        general = None
    short = exact_tree_placements(objects, asked)
    if general is None:
        assert short is None
    elif short is not None:
        assert short == dict(general.placements)
        assert general.notes == ()
    if complication == "none":
        assert short is not None
        shuffled = [json.loads(json.dumps(item)) for item in items]
        rng = random.Random(seed)
        rng.shuffle(shuffled)
        for item in shuffled:
            rng.shuffle(item["spec"]["members"])
        reread = read_objects({"kind": "List", "items": shuffled}, "hn").hypernodes
        assert exact_tree_placements(reread, asked) == short


def test_a_discovery_tree_takes_the_shortcut_and_a_tree_with_choices_does_not():
    plain = [
        _hn("leaf", 1, _node_member(exactMatch={"name": "n1"})),
        _hn("spine", 2, _child("leaf")),
    ]
    objects = read_objects({"kind": "List", "items": plain}, "hn").hypernodes
    assert exact_tree_placements(objects) == {"n1": Placement(("spine",), ("leaf",))}
    shared = plain + [_hn("other", 1, _node_member(exactMatch={"name": "n1"}))]
    objects = read_objects({"kind": "List", "items": shared}, "hn").hypernodes
    assert exact_tree_placements(objects) is None
    assert exact_tree_placements(objects, frozenset({"n2"})) == {}  # n1 is not asked for


def test_regex_members_are_matched_as_go_reads_them_in_bounded_time():
    names = tuple("a" * 28 + f"{i:02d}" for i in range(4))  # 30 characters, as in the issue
    document = {
        "kind": "List",
        "items": [
            _hn("slow", 1, _node_member(regexMatch={"pattern": "(a+)+$"})),  # minutes in re
            _hn("dots", 1, _node_member(regexMatch={"pattern": "(.*){40}z"})),
            _hn("posix", 2, _node_member(regexMatch={"pattern": "^[[:alpha:]]+0[[:digit:]]$"})),
        ],
    }
    started = time.perf_counter()
    found = topology_from_document(document, "hn", context=KubeContext(names=names))
    assert time.perf_counter() - started < 2.0
    assert dict(found.topology.placements) == {n: Placement((), ("posix",)) for n in names}


def test_matching_past_its_budget_is_one_error_naming_the_pattern(monkeypatch):
    monkeypatch.setattr("npu_job.bootstrap.kube.hypernodetree.MAX_MATCH_STEPS", 100)
    document = {"kind": "List", "items": [_hn("t", 1, _node_member(regexMatch={"pattern": "z"}))]}
    names = tuple(f"node-{i}" for i in range(50))
    with pytest.raises(InputError) as caught:
        topology_from_document(document, "hn.json", context=KubeContext(names=names))
    assert caught.value.message == (
        "hn.json: items[0] (HyperNode 't'): spec.members[0].selector.regexMatch.pattern: expected "
        "patterns that npu-job can match against 50 node name(s) within 100 steps in all"
    )


def _chain_of(depth: int) -> list:
    items = [_hn("h0", 1, _node_member(exactMatch={"name": "n1"}))]
    items += [_hn(f"h{d}", d + 1, _child(f"h{d - 1}")) for d in range(1, depth)]
    return items


def test_a_chain_deeper_than_the_bound_is_one_error_in_linear_memory():
    document = {"kind": "List", "items": _chain_of(30000)}
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as caught:
            topology_from_document(document, "hn.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.message == (
        "hn.json: items[29968] (HyperNode 'h29968'): spec.members[0].selector.exactMatch.name: "
        "expected HyperNodes nested at most 32 deep; 'h29967' is 33 deep, the deepest 30000"
    )
    assert peak < 200 * 2**20  # each level's copied path took over 2 GiB


def test_a_chain_as_deep_as_the_bound_is_placed():
    found = topology_from_document({"kind": "List", "items": _chain_of(MAX_DEPTH)}, "hn")
    placement = found.topology.placement_of("n1")
    assert placement.tors == ("h0",) and len(placement.tiers) == MAX_DEPTH - 1


@pytest.mark.parametrize("length", [5, 1000, 100000])
def test_a_long_cycle_is_named_by_its_first_members_and_its_length(length):
    items = _chain_of(length)
    items[0]["spec"]["members"].append(_child(f"h{length - 1}"))
    with pytest.raises(InputError) as caught:
        topology_from_document({"kind": "List", "items": items}, "hn.json")
    last = length - 1
    assert caught.value.message == (
        "hn.json: items[1] (HyperNode 'h1'): spec.members[0].selector.exactMatch.name: expected "
        f"HyperNodes that form a tree; 'h0' > 'h{last}' > 'h{last - 1}' > 'h{last - 2}' > ... "
        f"({length} HyperNodes in all) > 'h0' is a cycle"
    )
