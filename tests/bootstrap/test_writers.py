"""Output files: atomic, identical on re-run, shell-safe, and a fallback leaves no rank files."""

import json
import os
import subprocess

import pytest
from npu_job.bootstrap.base.model import Collective, Plan, PlanStatus
from npu_job.bootstrap.writers import (
    ENV_FILE,
    MASTER_FILE,
    RANK_FILE,
    RANK_TABLE_COPY,
    ROUTE_PLAN_FILE,
    env_file_text,
    route_plan_document,
    write_fallback_outputs,
    write_plan_outputs,
)

PLAN = Plan(
    PlanStatus.SUCCESS, (2, 0, 1), Collective.RING, ("a note",), "in" * 32, "map" * 21 + "m"
)
HOSTILE = '/tmp/it\'s a "dir" $(touch /tmp/pwned) `id`\nnext line/table.json'


def _write(out, **overrides):
    arguments = dict(
        node_rank=2,
        master_index=1,
        reordered_table={"server_list": []},
        route_plan=route_plan_document(
            PLAN, node_count=3, pod_index=0, rank_table="r", topology="t"
        ),
    )
    arguments.update(overrides)
    return write_plan_outputs(str(out), **arguments)


def test_success_writes_all_five_files_rank_last(tmp_path):
    written = _write(tmp_path)
    assert [p.name for p in written] == [
        RANK_TABLE_COPY,
        ENV_FILE,
        ROUTE_PLAN_FILE,
        MASTER_FILE,
        RANK_FILE,
    ]
    assert (tmp_path / RANK_FILE).read_text() == "2"
    assert (tmp_path / MASTER_FILE).read_text() == "1"
    assert json.loads((tmp_path / RANK_TABLE_COPY).read_text()) == {"server_list": []}
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in written), (
        "no temp files left behind"
    )


def test_rerun_gives_byte_identical_files(tmp_path):
    _write(tmp_path)
    first = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    _write(tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == first


def test_route_plan_document_has_version_status_mapping_reasons_and_digests():
    document = route_plan_document(
        PLAN, node_count=3, pod_index=0, rank_table="/r.json", topology="/t (cce)"
    )
    assert document["version"] == 1
    assert document["status"] == "success"
    assert document["rank_mapping"] == "0-1,1-2,2-0"
    assert document["node_rank"] == 2 and document["master_index"] == 1
    assert document["reasons"] == ["a note"] and document["reason"] == "a note"
    assert (
        document["input_digest"] == PLAN.input_digest
        and document["mapping_digest"] == PLAN.mapping_digest
    )
    assert document["collective"] == "ring" and document["node_count"] == 3


def test_failed_plan_and_errors_are_failed_route_plans():
    failed = Plan(PlanStatus.FAILED, (0, 1), Collective.RING, ("only 2 node(s)",))
    document = route_plan_document(failed, node_count=2, pod_index=1)
    assert document["status"] == "failed" and document["rank_mapping"] == "0-0,1-1"
    assert document["node_rank"] is None and document["master_index"] is None
    assert document["reason"] == "only 2 node(s)"
    no_plan = route_plan_document(None, error="rank table: location: expected ...")
    assert no_plan["status"] == "failed" and no_plan["rank_mapping"] is None
    assert no_plan["reasons"] == ["rank table: location: expected ..."]


def test_env_file_values_reach_the_shell_exactly(tmp_path):
    env_file = tmp_path / "env.sh"
    env_file.write_text(env_file_text(5, 3, HOSTILE))
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'. {env_file} && printf "%s\\0%s\\0%s" "$NODE_RANK" "$MASTER_INDEX" "$RANK_TABLE_FILE"',
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert out.stdout.split("\0") == ["5", "3", HOSTILE]
    assert not os.path.exists("/tmp/pwned")


def test_the_masters_address_reaches_the_shell_exactly_and_only_when_known(tmp_path):
    """NPU_JOB_MASTER_ADDR: the address of the new rank 0's pod, for a kind without DNS names."""
    env_file = tmp_path / "env.sh"
    read = f'. {env_file} && printf "%s" "${{NPU_JOB_MASTER_ADDR-unset}}"'
    for address, expected in [("10.0.0.7", "10.0.0.7"), (HOSTILE, HOSTILE), (None, "unset")]:
        env_file.write_text(env_file_text(5, 3, None, address))
        out = subprocess.run(["bash", "-c", read], capture_output=True, text=True, check=True)
        assert out.stdout == expected
    assert not os.path.exists("/tmp/pwned")
    planned = route_plan_document(PLAN, node_count=3, pod_index=0, master_addr="10.0.0.7")
    assert planned["master_addr"] == "10.0.0.7"
    assert "master_addr" not in route_plan_document(PLAN, node_count=3, pod_index=0)
    failed = Plan(PlanStatus.FAILED, (0, 1), Collective.RING, ("only 2 node(s)",))
    assert "master_addr" not in route_plan_document(failed, pod_index=0, master_addr="10.0.0.7")
    _write(tmp_path / "out", master_addr="10.0.0.7")
    assert "export NPU_JOB_MASTER_ADDR=10.0.0.7\n" in (tmp_path / "out" / ENV_FILE).read_text()


def test_fallback_removes_stale_rank_files_and_writes_a_failed_plan(tmp_path):
    _write(tmp_path)
    written = write_fallback_outputs(
        str(tmp_path), route_plan_document(None, error="x: y: expected z")
    )
    assert [p.name for p in written] == [ROUTE_PLAN_FILE]
    assert sorted(os.listdir(tmp_path)) == [ROUTE_PLAN_FILE]
    assert json.loads((tmp_path / ROUTE_PLAN_FILE).read_text())["status"] == "failed"


def test_fallback_in_an_empty_directory_is_fine(tmp_path):
    write_fallback_outputs(str(tmp_path / "new"), route_plan_document(None, error="e"))
    assert os.listdir(tmp_path / "new") == [ROUTE_PLAN_FILE]


def test_never_overwrites_the_input_rank_table(tmp_path):
    original = tmp_path / RANK_TABLE_COPY
    original.write_text("{}")
    with pytest.raises(ValueError, match="refusing to overwrite the input rank table"):
        _write(tmp_path, original_rank_table=str(original))
    assert original.read_text() == "{}"
