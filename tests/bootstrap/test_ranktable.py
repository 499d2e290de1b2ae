"""Rank tables: every platform format reads into the same model, a not-yet-filled table is a valid
not-ready result, every malformed field is named precisely, and the reordered copy keeps what it
does not understand."""

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from npu_job.bootstrap.base.model import Collective, Plan, PlanStatus, RankTable
from npu_job.bootstrap.ranktable import (
    parse_rank_table,
    rank_table_document,
    rank_table_from_document,
    reordered_document,
)
from npu_job.demo.synthetic import synthetic_cluster

from npu_job.errors import InputError

from .documents import as_json, b64_gzip, legacy_group_list, v1_0, v1_2_super_pods, v1_4_cce

SOURCE = "/user/config/jobstart_hccl.json"


def test_v1_0_servers_in_pod_index_order_with_integer_rank_ids():
    table = parse_rank_table(as_json(v1_0()), SOURCE)
    assert table.version == "1.0" and table.is_completed and table.node_count == 3
    assert [s.server_id for s in table.servers] == ["192.168.0.11", "192.168.0.12", "192.168.0.13"]
    assert [s.pod_index for s in table.servers] == [0, 1, 2]
    assert [d.rank_id for d in table.servers[1].devices] == [2, 3]
    assert table.servers[1].devices[0].device_ip == "29.1.0.1"


def test_compressed_rank_table_reads_the_same():
    assert parse_rank_table(b64_gzip(v1_0(), wrap=76), SOURCE) == parse_rank_table(
        as_json(v1_0()), SOURCE
    )


def test_v1_2_super_pod_becomes_the_outer_tier_and_host_ip_is_kept():
    table = parse_rank_table(as_json(v1_2_super_pods()), SOURCE)
    assert table.version == "1.2"
    assert [s.super_pod_id for s in table.servers] == ["0", "1", "0", "1"]
    assert (
        table.servers[2].host_ip == "10.0.0.3" and table.servers[2].container_ip == "192.168.149.3"
    )
    assert table.servers[1].devices[1].super_device_id == "37748737"


def test_v1_4_extra_fields_are_tolerated():
    table = parse_rank_table(as_json(v1_4_cce()), SOURCE)
    assert table.version == "1.4" and table.node_count == 3
    assert [s.super_pod_id for s in table.servers] == ["hypernode-0", "hypernode-1", "hypernode-2"]


def test_legacy_group_list_is_ordered_by_pod_name_suffix():
    table = parse_rank_table(as_json(legacy_group_list()), SOURCE)
    assert table.version == "0"
    assert [s.pod_name for s in table.servers] == [
        "fake-job-pod-0",
        "fake-job-pod-1",
        "fake-job-pod-2",
    ]
    assert [s.server_id for s in table.servers] == ["10.19.1.70", "10.19.1.71", "10.19.1.72"]
    assert [s.pod_index for s in table.servers] == [0, 1, 2]
    assert all(d.rank_id is None for s in table.servers for d in s.devices)


@pytest.mark.parametrize(
    "document",
    [
        {"status": "initializing"},
        {"status": "initializing", "version": "1.0"},
        {"status": "initializing", "version": "1.0", "server_list": []},
        {"status": "initializing", "group_list": []},
    ],
    ids=["mindx-placeholder", "with-version", "empty-server-list", "legacy-empty"],
)
def test_initializing_table_without_servers_is_valid_but_not_ready(document):
    table = rank_table_from_document(document, SOURCE)
    assert not table.is_completed and table.servers == ()


def _drop(path):
    def mutate(doc):
        *parents, last = path
        target = doc
        for key in parents:
            target = target[key]
        del target[last]

    return mutate


def _set(path, value):
    def mutate(doc):
        *parents, last = path
        target = doc
        for key in parents:
            target = target[key]
        target[last] = value

    return mutate


BAD_TABLES = [
    ("not-an-object", lambda doc: ["x"], "document: expected an object, got an array"),
    ("missing-status", _drop(["status"]), "status: expected a required field (missing)"),
    ("status-number", _set(["status"], 1), "status: expected a string, got a number 1"),
    ("missing-version", _drop(["version"]), "version: expected a required field (missing)"),
    (
        "missing-server-list",
        _drop(["server_list"]),
        "server_list: expected a required field (missing)",
    ),
    (
        "server-list-object",
        _set(["server_list"], {}),
        "server_list: expected an array, got an object",
    ),
    (
        "server-not-object",
        _set(["server_list", 1], "x"),
        "server_list[1]: expected an object, got a string 'x'",
    ),
    (
        "missing-server-id",
        _drop(["server_list", 2, "server_id"]),
        "server_list[2].server_id: expected a required field (missing)",
    ),
    (
        "empty-server-id",
        _set(["server_list", 2, "server_id"], ""),
        "server_list[2].server_id: expected a non-empty string",
    ),
    (
        "duplicate-server-id",
        _set(["server_list", 2, "server_id"], "192.168.0.11"),
        "server_list[2].server_id: expected a unique server id; '192.168.0.11' is also server_list[0]",
    ),
    (
        "missing-device",
        _drop(["server_list", 1, "device"]),
        "server_list[1].device: expected a required field (missing)",
    ),
    (
        "empty-device",
        _set(["server_list", 1, "device"], []),
        "server_list[1].device: expected at least one device",
    ),
    (
        "device-not-object",
        _set(["server_list", 1, "device", 0], 7),
        "server_list[1].device[0]: expected an object, got a number 7",
    ),
    (
        "missing-device-id",
        _drop(["server_list", 0, "device", 1, "device_id"]),
        "server_list[0].device[1].device_id: expected a required field (missing)",
    ),
    (
        "rank-id-number-text",
        _set(["server_list", 2, "device", 1, "rank_id"], "five"),
        "server_list[2].device[1].rank_id: expected a non-negative integer (as a string, e.g. \"0\"), got a string 'five'",
    ),
    (
        "rank-id-negative",
        _set(["server_list", 2, "device", 1, "rank_id"], "-1"),
        "server_list[2].device[1].rank_id: expected a non-negative integer",
    ),
    (
        "missing-rank-id",
        _drop(["server_list", 1, "device", 0, "rank_id"]),
        "server_list[1].device[0].rank_id: expected a required field (missing)",
    ),
    (
        "duplicate-rank-id",
        _set(["server_list", 2, "device", 1, "rank_id"], "0"),
        'server_list[2].device[1].rank_id: expected a rank id unique in the table; "0" is also server_list[0].device[0]',
    ),
    (
        "device-ip-number",
        _set(["server_list", 0, "device", 0, "device_ip"], 29),
        "server_list[0].device[0].device_ip: expected a string, got a number 29",
    ),
    (
        "host-ip-list",
        _set(["server_list", 0, "host_ip"], ["a"]),
        "server_list[0].host_ip: expected a string, got an array",
    ),
    (
        "server-count-mismatch",
        _set(["server_count"], "4"),
        'server_count: expected "3" (the number of entries in server_list), got "4"',
    ),
    (
        "server-count-text",
        _set(["server_count"], "three"),
        "server_count: expected a non-negative integer",
    ),
]


@pytest.mark.parametrize(
    "mutate, expected", [c[1:] for c in BAD_TABLES], ids=[c[0] for c in BAD_TABLES]
)
def test_bad_table_names_the_exact_field(mutate, expected):
    document = v1_0()
    replaced = mutate(document)
    data = as_json(replaced if replaced is not None else document)
    with pytest.raises(InputError) as caught:
        parse_rank_table(data, SOURCE)
    assert caught.value.message.startswith(f"{SOURCE}: {expected}")


BAD_SUPER_PODS = [
    (
        "unknown-server",
        _set(["super_pod_list", 0, "server_list", 0, "server_id"], "node-9"),
        "super_pod_list: expected only server ids of server_list, got unknown 'node-9'",
    ),
    (
        "server-in-two-pods",
        _set(["super_pod_list", 0, "server_list", 0, "server_id"], "node-0"),
        "super_pod_list[1].server_list[0].server_id: expected each server in one super pod; 'node-0' is also in super_pod_list[0]",
    ),
    (
        "missing-super-pod-id",
        _drop(["super_pod_list", 1, "super_pod_id"]),
        "super_pod_list[1].super_pod_id: expected a required field (missing)",
    ),
]


@pytest.mark.parametrize(
    "mutate, expected", [c[1:] for c in BAD_SUPER_PODS], ids=[c[0] for c in BAD_SUPER_PODS]
)
def test_bad_super_pod_list_names_the_exact_field(mutate, expected):
    document = v1_2_super_pods()
    mutate(document)
    with pytest.raises(InputError) as caught:
        parse_rank_table(as_json(document), SOURCE)
    assert caught.value.message == f"{SOURCE}: {expected}"


BAD_LEGACY = [
    (
        "no-suffix",
        _set(["group_list", 0, "instance_list", 1, "pod_name"], "fake-job-pod"),
        "group_list[0].instance_list[1].pod_name: expected a pod name ending in -<index>",
    ),
    (
        "random-suffix",
        _set(["group_list", 0, "instance_list", 1, "pod_name"], "tf-bae41"),
        "group_list[0].instance_list[1].pod_name: expected a pod name ending in -<index>, as Volcano "
        "names pods <job>-<task>-<index> (the digits of a random suffix are not an index)",
    ),
    (
        "duplicate-suffix",
        _set(["group_list", 0, "instance_list", 1, "pod_name"], "x-2"),
        "group_list[0].instance_list[1].pod_name: expected a unique pod index; 2 is also group_list[0].instance_list[0]",
    ),
    (
        "gap-in-suffixes",
        _set(["group_list", 0, "instance_list", 0, "pod_name"], "fake-job-pod-5"),
        "group_list[0].instance_list: expected pod name suffixes 0..2, index 2 is missing "
        "(group_list[0].instance_list[0].pod_name 'fake-job-pod-5' has index 5",
    ),
    (
        "two-groups",
        lambda d: d["group_list"].append(copy.deepcopy(d["group_list"][0])),
        "group_list: expected exactly one group (one task), got 2",
    ),
    (
        "missing-devices",
        _drop(["group_list", 0, "instance_list", 2, "devices"]),
        "group_list[0].instance_list[2].devices: expected a required field (missing)",
    ),
]


@pytest.mark.parametrize(
    "mutate, expected", [c[1:] for c in BAD_LEGACY], ids=[c[0] for c in BAD_LEGACY]
)
def test_bad_legacy_table_names_the_exact_field(mutate, expected):
    document = legacy_group_list()
    mutate(document)
    with pytest.raises(InputError) as caught:
        parse_rank_table(as_json(document), SOURCE)
    assert caught.value.message.startswith(f"{SOURCE}: {expected}")


def _plan(ranks):
    return Plan(PlanStatus.SUCCESS, tuple(ranks), Collective.RING)


def test_reordered_copy_moves_servers_rewrites_rank_ids_and_keeps_unknown_fields():
    document = v1_4_cce()
    original = copy.deepcopy(document)
    table = rank_table_from_document(document, SOURCE)
    plan = _plan([2, 0, 1])  # pod 1 becomes node rank 0
    new = reordered_document(document, table, plan)
    assert document == original, "the input document must not be mutated"
    assert [s["server_id"] for s in new["server_list"]] == [
        "111.111.111.2",
        "111.111.111.3",
        "111.111.111.1",
    ]
    assert [d["rank_id"] for s in new["server_list"] for d in s["device"]] == [
        "0",
        "1",
        "2",
        "3",
        "4",
        "5",
    ]
    assert new["server_list"][0]["device"][0]["dpu_ip"] == "0.0.0.0"
    assert new["data_version"] == 3 and new["cluster_list"] == original["cluster_list"]
    assert [p["super_pod_id"] for p in new["super_pod_list"]] == [
        "hypernode-0",
        "hypernode-1",
        "hypernode-2",
    ]
    reread = rank_table_from_document(json.loads(json.dumps(new)), "copy")
    assert [s.server_id for s in reread.servers] == [
        table.servers[p].server_id for p in plan.pod_of_node_rank
    ]


def test_in_place_reordering_gives_the_same_document():
    document = v1_4_cce()
    table = rank_table_from_document(document, SOURCE)
    copied = reordered_document(document, table, _plan([2, 0, 1]))
    assert reordered_document(document, table, _plan([2, 0, 1]), in_place=True) == copied


def test_reordered_super_pod_members_follow_the_new_order():
    document = v1_2_super_pods()
    table = rank_table_from_document(document, SOURCE)
    new = reordered_document(document, table, _plan([3, 2, 1, 0]))
    members = {
        p["super_pod_id"]: [m["server_id"] for m in p["server_list"]] for p in new["super_pod_list"]
    }
    assert members == {"0": ["node-2", "node-0"], "1": ["node-3", "node-1"]}


def test_reordered_legacy_table_is_written_as_v1_0_server_list():
    document = legacy_group_list()
    table = rank_table_from_document(document, SOURCE)
    new = reordered_document(document, table, _plan([1, 2, 0]))
    assert new["version"] == "1.0" and "group_list" not in new
    assert [s["server_id"] for s in new["server_list"]] == [
        "10.19.1.72",
        "10.19.1.70",
        "10.19.1.71",
    ]
    assert [d["rank_id"] for d in new["server_list"][1]["device"]] == ["2", "3"]


@settings(max_examples=15, deadline=None)
@given(nodes=st.integers(1, 24), seed=st.integers(0, 1000), super_pods=st.booleans())
def test_serialised_table_reads_back_as_the_same_cluster(nodes, seed, super_pods):
    table, _ = synthetic_cluster(
        nodes, max(1, nodes // 4), seed=seed, npus_per_node=4, super_pods=1 if super_pods else 0
    )
    if super_pods:  # synthetic puts super pods in the topology; give the table its own
        table = RankTable(
            table.version,
            table.status,
            tuple(
                s.__class__(
                    s.server_id,
                    s.pod_index,
                    s.devices,
                    s.host_ip,
                    s.container_ip,
                    None,
                    f"sp-{s.pod_index % 2}",
                )
                for s in table.servers
            ),
        )
    back = parse_rank_table(json.dumps(rank_table_document(table)).encode(), "generated")
    assert back.version == ("1.2" if super_pods else "1.0")
    for mine, theirs in zip(table.servers, back.servers):
        assert (
            theirs.server_id,
            theirs.pod_index,
            theirs.devices,
            theirs.host_ip,
            theirs.super_pod_id,
        ) == (mine.server_id, mine.pod_index, mine.devices, mine.host_ip, mine.super_pod_id)


@pytest.mark.parametrize(
    "document",
    [
        v1_0(),
        v1_2_super_pods(),
        v1_4_cce(),
        {
            **v1_0(),
            "server_list": [
                {
                    **s,
                    "host_ip": "",
                    "device": [
                        {k: v for k, v in d.items() if k != "device_ip"} for d in s["device"]
                    ],
                }
                for s in v1_0()["server_list"]
            ],
        },
        {
            **v1_0(),
            "server_list": [
                {
                    **s,
                    "device": [
                        {**d, "super_device_id": "7"} if i == 1 else d
                        for i, d in enumerate(s["device"])
                    ],
                }
                for s in v1_0()["server_list"]
            ],
        },
        {
            **v1_0(),
            "server_list": [
                {**s, "device": s["device"][: i + 1]} for i, s in enumerate(v1_0()["server_list"])
            ],
        },
    ],
    ids=[
        "v1.0",
        "v1.2",
        "v1.4",
        "no-device-ip-empty-host-ip",
        "some-super-device-ids",
        "uneven-device-counts",
    ],
)
def test_fast_path_and_field_by_field_path_agree(document, monkeypatch):
    from npu_job.bootstrap import ranktable

    fast = rank_table_from_document(document, SOURCE)
    monkeypatch.setattr(ranktable, "_all_devices_fast", lambda server_list: None)
    assert rank_table_from_document(document, SOURCE) == fast


def test_fast_path_counts_devices_without_building_them_and_builds_the_same_ones_when_read():
    table = rank_table_from_document(v1_2_super_pods(), SOURCE)
    assert [s.device_count for s in table.servers] == [
        len(entry["device"]) for entry in v1_2_super_pods()["server_list"]
    ]
    assert all("devices" not in vars(s) for s in table.servers)
    assert table.servers[1].devices[1].super_device_id == "37748737"
    assert [d.rank_id for s in table.servers for d in s.devices] == list(
        range(sum(s.device_count for s in table.servers))
    )


@pytest.mark.parametrize("checked", [False, True], ids=["fast-path", "field-by-field"])
@pytest.mark.parametrize(
    "rank, value",
    [("0" * 5000 + "5", 5), ("9" * 18, 10**18 - 1), ("1" + "0" * 18, None), ("1" * 5000, None)],
    ids=["zero-padded", "largest", "10^18", "past-int-limit"],
)
def test_rank_ids_below_10_to_the_18_are_read_by_value_on_both_paths(
    monkeypatch, checked, rank, value
):
    from npu_job.bootstrap import ranktable

    if checked:
        monkeypatch.setattr(ranktable, "_all_devices_fast", lambda server_list: None)
    document = v1_0()
    document["server_list"][2]["device"][1]["rank_id"] = rank
    if value is None:
        with pytest.raises(
            InputError,
            match=r"^/user/config/jobstart_hccl.json: server_list\[2\]\.device\[1\]\.rank_id: "
            r"expected a non-negative integer below 10\^18, got a string '",
        ):
            parse_rank_table(as_json(document), SOURCE)
    else:
        assert parse_rank_table(as_json(document), SOURCE).servers[2].devices[1].rank_id == value


def bare_metal_v0() -> dict:
    """The bare-metal HCCL v0 layout as Ascend's TensorFlow model zoo writes it by hand: one
    instance per rank, ``rank_id`` on the instance, board and chip fields, no pod names."""
    return {
        "board_id": "0x0000",
        "chip_info": "910",
        "deploy_mode": "lab",
        "group_count": "1",
        "para_plane_nic_location": "device",
        "para_plane_nic_num": "2",
        "para_plane_nic_name": ["eth0", "eth1"],
        "status": "completed",
        "group_list": [
            {
                "device_num": "2",
                "server_num": "1",
                "group_name": "",
                "instance_count": "2",
                "instance_list": [
                    {
                        "devices": [{"device_id": str(d), "device_ip": f"192.{d + 1}.0.9"}],
                        "rank_id": str(d),
                        "server_id": "10.1.1.9",
                    }
                    for d in range(2)
                ],
            }
        ],
    }


def mindie_global_table() -> dict:
    """MindIE's global rank table (an inference deployment): ``server_group_list`` of groups."""
    return {
        "version": "1.0",
        "status": "completed",
        "server_group_list": [
            {
                "group_id": "2",
                "deploy_server": "0",
                "server_count": "1",
                "server_list": [
                    {
                        "server_id": "10.1.1.9",
                        "server_ip": "10.1.1.9",
                        "device": [{"device_id": "0", "device_ip": "192.1.0.9", "rank_id": "0"}],
                    }
                ],
            }
        ],
    }


@pytest.mark.parametrize(
    "document, layout",
    [
        (
            bare_metal_v0(),
            "the bare-metal HCCL v0 layout (board_id/chip_info, one instance per rank)",
        ),
        (mindie_global_table(), "MindIE's global rank table (server_group_list)"),
    ],
    ids=["bare-metal-v0", "mindie-global"],
)
def test_a_layout_that_lists_no_pods_of_one_job_is_refused_by_name(document, layout):
    with pytest.raises(InputError) as caught:
        parse_rank_table(as_json(document), SOURCE)
    assert caught.value.message.startswith(f"{SOURCE}: document: expected the rank table of ")
    assert layout in caught.value.message


def test_a_bare_metal_table_without_its_board_fields_is_still_known_by_its_per_rank_instances():
    document = bare_metal_v0()
    del document["board_id"], document["chip_info"]
    with pytest.raises(InputError, match="bare-metal HCCL v0 layout"):
        parse_rank_table(as_json(document), SOURCE)
