"""The rank table HCCL reads follows each rendezvous round's order: npu-run writes the table the
pod's bootstrap read with its servers in the round's node-rank order and the rank ids rewritten,
and refuses, naming the file, a table that does not list exactly the round's nodes."""

from __future__ import annotations

import json

import pytest
from npu_job.bootstrap.ranktable import parse_rank_table, rank_table_document
from npu_job.demo.synthetic import synthetic_cluster
from npu_job.launcher import roundtable

from npu_job.errors import InputError


def written_table(tmp_path, nodes=4):
    table, _ = synthetic_cluster(nodes, 2, npus_per_node=2, seed=3, job_name="job")
    path = tmp_path / "jobstart_hccl.json"
    path.write_text(json.dumps(rank_table_document(table)))
    return path, [server.server_id for server in table.servers]


def test_the_rounds_table_lists_the_servers_in_the_rounds_order_with_rank_ids_renumbered(tmp_path):
    original, ids = written_table(tmp_path)
    order = [ids[2], ids[0], ids[3], ids[1]]
    path = roundtable.write_round_rank_table(str(original), order, str(tmp_path / "out"))
    assert path.name == roundtable.ROUND_RANK_TABLE
    table = parse_rank_table(path.read_bytes(), str(path))
    assert [server.server_id for server in table.servers] == order
    assert [device.rank_id for server in table.servers for device in server.devices] == list(
        range(8)
    )
    before = {s.server_id: s.devices for s in parse_rank_table(original.read_bytes(), "o").servers}
    for server in table.servers:  # each server keeps its own devices, only the rank ids move
        assert [d.device_id for d in server.devices] == [
            d.device_id for d in before[server.server_id]
        ]


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda ids: ids[:3], "exactly the round's 3 nodes, got 4 server(s); not in the round: "),
        (lambda ids: [*ids[:3], "10.9.9.9"], "not listed: '10.9.9.9'"),
        (lambda ids: [ids[0], *ids[:3]], "exactly the round's 4 nodes"),
    ],
    ids=["a node fewer", "a node the table has not", "one node twice"],
)
def test_a_table_without_exactly_the_rounds_nodes_is_refused_naming_it(tmp_path, change, words):
    original, ids = written_table(tmp_path)
    with pytest.raises(InputError) as error:
        roundtable.write_round_rank_table(str(original), change(ids), str(tmp_path / "out"))
    assert error.value.source == str(original) and error.value.field == "server_list"
    assert words in str(error.value)
    assert not (tmp_path / "out" / roundtable.ROUND_RANK_TABLE).exists()


def test_the_table_to_start_from_is_the_bootstraps_else_the_jobs_own(tmp_path):
    env = {"NPU_JOB_OUTPUT_DIR": str(tmp_path)}
    assert roundtable.original_rank_table(env) is None
    assert roundtable.original_rank_table({**env, "RANK_TABLE_FILE": "/user/config/t.json"}) == (
        "/user/config/t.json"
    )
    copy = f"{tmp_path}/jobstart_hccl.reordered.json"  # the bootstrap's copy is never a start
    assert roundtable.original_rank_table({**env, "RANK_TABLE_FILE": copy}) is None
    (tmp_path / "route_plan.json").write_text(json.dumps({"rank_table": "/user/config/read.json"}))
    assert roundtable.original_rank_table({**env, "RANK_TABLE_FILE": copy}) == (
        "/user/config/read.json"
    )
