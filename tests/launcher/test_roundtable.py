"""The rank table HCCL reads follows each rendezvous round's order: npu-run writes the table the
pod's bootstrap read with its servers in the round's node-rank order and the rank ids rewritten,
and refuses, naming the file, a table that does not list exactly the round's nodes. After each
round, the agent's RANK_TABLE_FILE (which its workers inherit) names that table; where it cannot
be made, one warning line names why and the variable stays as it was."""

from __future__ import annotations

import json
import logging
from pathlib import Path

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
    target = tmp_path / "out" / roundtable.ROUND_RANK_TABLE
    path = Path(roundtable.write_round_rank_table(str(original), order, str(target)))
    assert path == target
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
        roundtable.write_round_rank_table(
            str(original), change(ids), str(tmp_path / "out" / roundtable.ROUND_RANK_TABLE)
        )
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


def test_after_a_round_rank_table_file_names_the_table_in_the_rounds_order(tmp_path):
    original, ids = written_table(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "route_plan.json").write_text(json.dumps({"rank_table": str(original)}))
    env = {
        "NPU_JOB_OUTPUT_DIR": str(out),
        "RANK_TABLE_FILE": str(out / "jobstart_hccl.reordered.json"),
    }
    order = [ids[3], ids[1], ids[0], ids[2]]
    roundtable.follow_round(env, 1, order)
    assert env["RANK_TABLE_FILE"] == str(out / roundtable.ROUND_RANK_TABLE)
    table = parse_rank_table(Path(env["RANK_TABLE_FILE"]).read_bytes(), "round table")
    assert [server.server_id for server in table.servers] == order
    roundtable.follow_round(env, 2, ids)  # the next round starts from the bootstrap's table again
    table = parse_rank_table(Path(env["RANK_TABLE_FILE"]).read_bytes(), "round table")
    assert [server.server_id for server in table.servers] == ids


@pytest.mark.parametrize(
    "server_ids, words",
    [
        (lambda ids: [*ids[:3], ""], "some nodes reported no rank table server id"),
        (lambda ids: [*ids[:3], "10.9.9.9"], "not listed: '10.9.9.9'"),
    ],
    ids=["a node without a server id", "a node the table has not"],
)
def test_a_round_without_a_table_of_its_nodes_keeps_the_variable_and_says_why(
    tmp_path, caplog, server_ids, words
):
    original, ids = written_table(tmp_path)
    env = {"NPU_JOB_OUTPUT_DIR": str(tmp_path / "out"), "RANK_TABLE_FILE": str(original)}
    with caplog.at_level(logging.WARNING):
        roundtable.follow_round(env, 3, server_ids(ids))
    assert env["RANK_TABLE_FILE"] == str(original)
    (line,) = [record.getMessage() for record in caplog.records]
    assert line.startswith("round 3: ") and words in line, line
    assert line.endswith(f"RANK_TABLE_FILE={original} is left as it was")
    assert not (tmp_path / "out" / roundtable.ROUND_RANK_TABLE).exists()


def test_a_job_without_a_rank_table_gets_none(tmp_path):
    env = {"NPU_JOB_OUTPUT_DIR": str(tmp_path)}
    roundtable.follow_round(env, 0, ["a", "b"])
    assert env == {"NPU_JOB_OUTPUT_DIR": str(tmp_path)} and list(tmp_path.iterdir()) == []
