"""``npu-run --rdzv_backend=c10d``: torch's own c10d rendezvous, ranks from the nodes' reports.

torch's c10d ranks the nodes of a round by their sorted ``--local_addr`` (host name), so the
agents here take 127.0.0.1-3 in an order that the switch placement in their bootstrap reports
(``npu_job_node.json``) contradicts: every node must run with the planned rank, log the same plan,
and still meet its peers in a gloo all_reduce. The exchange itself (missing reports, nodes that
plan differently) runs over a real ``TCPStore`` with one thread per node.
"""

from __future__ import annotations

import datetime
import json
import re
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
from npu_job.bootstrap.base.model import Placement
from npu_job.bootstrap.nodereport import NodeReport, encode_report
from npu_job.launcher.rendezvous import c10d
from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError, dynamic_rendezvous

from npu_job.errors import LaunchError
from npu_job.podfacts import NODE_REPORT_FILE

from ..cluster import LocalCluster, free_port, wait_exits, wait_for

NPROC = 2
LAUNCH_CAP = 180  # seconds of a loaded 2-core machine for 3 agents and 6 workers to finish

# name -> (--local_addr, pod index, ToR, slot under it). c10d ranks by address: a=0, c=1, b=2;
# the ring plan puts the ToRs' nodes together, tor-a first: b=0, then tor-b's by slot: a=1, c=2.
NODES = {
    "a": ("127.0.0.1", 0, "tor-b", 0),
    "b": ("127.0.0.3", 1, "tor-a", 0),
    "c": ("127.0.0.2", 2, "tor-b", 1),
}
C10D_RANK = {"a": 0, "c": 1, "b": 2}
PLANNED_RANK = {"b": 0, "a": 1, "c": 2}
PLAN_LINE = re.compile(
    r"npu-run: c10d round (\d+) plan ([0-9a-f]{64}): node rank (\d+) of (\d+) "
    r"\(torch's c10d gave (\d+)\)"
)


def write_report(directory: Path, name: str) -> None:
    _addr, pod_index, tor, slot = NODES[name]
    report = NodeReport(
        node_id=f"10.0.0.{pod_index + 1}",
        pod_index=pod_index,
        device_count=NPROC,
        placement=Placement(tiers=("spine-0",), tors=(tor,), slot=slot),
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / NODE_REPORT_FILE).write_bytes(encode_report(report))


def launch_three(
    tmp_path: Path,
    cluster: LocalCluster,
    *,
    reports: bool,
    env: Optional[Dict[str, str]] = None,
    worker_args: Sequence[str] = (),
    launcher_args: Sequence[str] = (),
) -> Dict[str, Path]:
    """Start nodes c, a, b (so neither arrival nor address order is the plan's); each node's
    workers record into a directory of their own."""
    endpoint = f"127.0.0.1:{free_port()}"
    records = {}
    for name in ("c", "a", "b"):
        addr = NODES[name][0]
        output = tmp_path / f"bootstrap-{name}"
        if reports:
            write_report(output, name)
        records[name] = tmp_path / f"records-{name}"
        records[name].mkdir()
        cluster.start(
            "0",  # c10d ignores --node_rank; the reports say where each node belongs
            "record_env.py",
            [str(records[name]), *worker_args],
            launcher_args=[
                *launcher_args,
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                "--rdzv_id=c10d-plan",
                f"--local_addr={addr}",
                "--rdzv_conf=join_timeout=120",
            ],
            env={"NPU_JOB_OUTPUT_DIR": str(output), **(env or {})},
        )
    return records


def worker_records(directory: Path) -> List[dict]:
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


def plan_lines(log: str) -> List[tuple]:
    return [match.groups() for match in PLAN_LINE.finditer(log)]


@pytest.fixture
def cluster(tmp_path):
    made = LocalCluster(tmp_path, nnodes=3, nproc_per_node=NPROC)
    yield made
    made.kill_all()


# torch's c10d handler shares its store with the workers from 2.5 (2.4 has the property, False)
SHARES_BY_DEFAULT = "use_agent_store" in vars(dynamic_rendezvous.DynamicRendezvousHandler)
SHARED = pytest.param({}, id="agent-store-shared")
UNSHARED = pytest.param(
    {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    id="agent-store-not-shared",
    marks=pytest.mark.skipif(
        not SHARES_BY_DEFAULT, reason="torch before 2.5 shares no agent store"
    ),
)


@pytest.mark.parametrize("env", [SHARED, UNSHARED])
def test_workers_rank_by_the_plan_not_by_c10d(tmp_path, cluster, env):
    """Every worker's RANK is planned node rank * nproc + LOCAL_RANK, every node logs the same
    plan digest and the rank c10d would have given, and all six meet in one all_reduce. The
    workers' store stays where torch's agent puts it: with the agent store shared (torch 2.5+),
    on c10d rank 0's node, which now runs as node rank 1; without it, global rank 0 hosts it on
    the planned rank 0's address."""
    records = launch_three(tmp_path, cluster, reports=True, env=env)
    assert wait_exits(cluster.nodes, LAUNCH_CAP) == [0, 0, 0], cluster.logs()

    world = 3 * NPROC
    shares_store = SHARES_BY_DEFAULT and not env
    store_host = NODES["a"][0] if shares_store else NODES["b"][0]  # c10d's rank 0 / planned 0
    digests = set()
    for node, name in zip(cluster.nodes, ("c", "a", "b")):  # launch_three's order
        lines = plan_lines(node.log())
        assert len(lines) == 1, node.log()
        number, digest, rank, size, c10d_rank = lines[0]
        assert (number, rank, size, c10d_rank) == (
            "0",
            str(PLANNED_RANK[name]),
            "3",
            str(C10D_RANK[name]),
        )
        digests.add(digest)
        found = worker_records(records[name])
        assert sorted(int(r["LOCAL_RANK"]) for r in found) == list(range(NPROC))
        for record in found:
            assert record["GROUP_RANK"] == str(PLANNED_RANK[name])
            assert int(record["RANK"]) == PLANNED_RANK[name] * NPROC + int(record["LOCAL_RANK"])
            assert record["pg_rank"] == int(record["RANK"])
            assert record["sum"] == world * (world + 1) / 2  # the all_reduce of RANK + 1
            assert record["MASTER_ADDR"] == store_host
            assert record["TORCHELASTIC_USE_AGENT_STORE"] == str(shares_store)
    assert len(digests) == 1


def test_a_restart_round_is_planned_again_with_the_same_ranks(tmp_path, cluster):
    """Global rank 2 (node a's first worker, by the plan) fails once: torch's c10d runs a new
    round, whose keys start clean under its own prefix; every node plans it again, to the same
    ranks and digest, and the restarted workers all meet.

    The workers' store is not the shared agent store here: torch 2.5+ keeps that one store
    across restarts with nothing per attempt (pytorch/pytorch#135712), so restarted gloo ranks
    can read their dead peers' addresses under torch's c10d with or without npu-run.
    """
    fail_rank = PLANNED_RANK["a"] * NPROC
    records = launch_three(
        tmp_path,
        cluster,
        reports=True,
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
        worker_args=["--fail-rank", str(fail_rank)],
        launcher_args=["--max_restarts=1"],
    )
    assert wait_exits(cluster.nodes, LAUNCH_CAP) == [0, 0, 0], cluster.logs()
    digests = set()
    for node, name in zip(cluster.nodes, ("c", "a", "b")):
        lines = plan_lines(node.log())
        assert [(number, rank) for number, _, rank, _, _ in lines] == [
            ("0", str(PLANNED_RANK[name])),
            ("1", str(PLANNED_RANK[name])),
        ], node.log()
        digests.update(digest for _, digest, _, _, _ in lines)
        for record in worker_records(records[name]):
            assert record["GROUP_RANK"] == str(PLANNED_RANK[name])
            assert record["sum"] == 3 * NPROC * (3 * NPROC + 1) / 2
    assert len(digests) == 1


def test_an_elastic_job_is_planned_again_over_the_nodes_of_each_round(tmp_path, cluster):
    """``--nnodes=2:3``: nodes c and a start, and c10d closes a round of two at its last call;
    both plan it (a=0, c=1: one ToR, by slot) and train. Node b joins later: torch's agents stop
    their workers for a round of three, which every node plans again over the three reports, so
    b (alone under tor-a) goes first and the others keep their ToR together: b=0, a=1, c=2.

    Nothing here sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``: npu-run unshares the workers' store
    of an elastic c10d job itself, since torch's shared agent store (2.5+) cannot take a late node
    (docs/launcher.md, "Under c10d"). A worker writes ``<RANK>.json``, so a node's directory keeps
    its records of the round of two beside those of the round of three."""
    endpoint = f"127.0.0.1:{free_port()}"
    go = tmp_path / "go"
    records: Dict[str, Path] = {}
    nodes = {}

    def start(name: str) -> None:
        output = tmp_path / f"bootstrap-{name}"
        write_report(output, name)
        records[name] = tmp_path / f"records-{name}"
        records[name].mkdir()
        nodes[name] = cluster.start(
            "0",
            "record_env.py",
            [str(records[name]), "--hold-until", str(go)],
            launcher_args=[
                "--nnodes=2:3",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}",
                "--rdzv_id=c10d-elastic",
                f"--local_addr={NODES[name][0]}",
                "--rdzv_conf=join_timeout=120,last_call_timeout=1",
            ],
            env={"NPU_JOB_OUTPUT_DIR": str(output)},
        )

    def of_round(size: int) -> Dict[str, List[dict]]:
        return {
            name: [r for r in worker_records(d) if r["pg_world_size"] == size * NPROC]
            for name, d in records.items()
        }

    def workers_in_round(size: int) -> int:
        return sum(len(found) for found in of_round(size).values())

    start("c")
    start("a")
    wait_for(lambda: workers_in_round(2) == 2 * NPROC, LAUNCH_CAP, "a round of two")
    start("b")
    wait_for(lambda: workers_in_round(3) == 3 * NPROC, LAUNCH_CAP, "a round of three")
    go.write_text("go")
    assert wait_exits(cluster.nodes, LAUNCH_CAP) == [0, 0, 0], cluster.logs()

    planned = {
        name: [(rank, size) for _, _, rank, size, _ in plan_lines(node.log())]
        for name, node in nodes.items()
    }
    assert planned["a"][0] == ("0", "2") and planned["c"][0] == ("1", "2"), cluster.logs()
    assert {name: lines[-1] for name, lines in planned.items()} == {
        name: (str(rank), "3") for name, rank in PLANNED_RANK.items()
    }, cluster.logs()
    last_digests = {plan_lines(node.log())[-1][1] for node in nodes.values()}
    assert len(last_digests) == 1
    for name, found in of_round(3).items():
        assert len(found) == NPROC
        for record in found:
            assert record["GROUP_RANK"] == str(PLANNED_RANK[name])
            assert record["sum"] == 3 * NPROC * (3 * NPROC + 1) / 2


def test_an_elastic_c10d_job_unshares_the_workers_store_unless_the_user_chose():
    environ: Dict[str, str] = {}
    c10d.unshare_store_for_late_nodes(environ)
    assert environ == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    chosen = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
    c10d.unshare_store_for_late_nodes(chosen)
    assert chosen == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}


def test_without_reports_c10d_order_is_kept_and_said(tmp_path, cluster):
    """No node has a report and all give --node_rank 0: nothing tells them apart, so c10d's
    order stands, and every node says so in one warning line (never silently)."""
    records = launch_three(tmp_path, cluster, reports=False)
    assert wait_exits(cluster.nodes, LAUNCH_CAP) == [0, 0, 0], cluster.logs()
    for node, name in zip(cluster.nodes, ("c", "a", "b")):
        log = node.log()
        warnings = [line for line in log.splitlines() if "keep torch's c10d order" in line]
        assert len(warnings) == 1, log
        assert warnings[0].startswith("npu-run: warning: c10d round 0: 3 of 3 node(s)")
        ((_number, _digest, rank, _size, c10d_rank),) = plan_lines(log)
        assert rank == c10d_rank == str(C10D_RANK[name])
        for record in worker_records(records[name]):
            assert record["GROUP_RANK"] == str(C10D_RANK[name])


# -- the exchange over a real store, one thread per node ----------------------------------------


@pytest.fixture
def round_store():
    server = TCPStore(
        "127.0.0.1", 0, None, True, datetime.timedelta(seconds=30), wait_for_workers=False
    )
    stores = []

    def client() -> PrefixStore:
        made = TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=30))
        stores.append(made)
        return PrefixStore("torch.rendezvous.run.0", made)

    yield client
    stores.clear()


def run_nodes(count: int, body) -> Dict[int, BaseException]:
    """``body(rank)`` on ``count`` threads; what each raised."""
    raised: Dict[int, BaseException] = {}

    def run(rank: int) -> None:
        try:
            body(rank)
        except BaseException as error:  # noqa: BLE001  (the test asserts what it was)
            raised[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return raised


def test_reports_reach_every_node_keyed_by_c10d_rank(round_store):
    got: Dict[int, Dict[str, bytes]] = {}

    def node(rank: int) -> None:
        exchange = c10d.RoundExchange(round_store(), rank, 3, 0, timeout=30)
        got[rank] = exchange.reports(f"report of {rank}".encode())

    assert run_nodes(3, node) == {}
    expected = {c10d.member_key(rank, 3): f"report of {rank}".encode() for rank in range(3)}
    assert got == {0: expected, 1: expected, 2: expected}


def test_a_node_that_plans_otherwise_stops_every_node(round_store):
    """Node 2 plans another order (another npu-job, say): every node fails, not only node 2."""

    def node(rank: int) -> None:
        exchange = c10d.RoundExchange(round_store(), rank, 3, 4, timeout=30)
        exchange.agree("1" * 64 if rank == 2 else "0" * 64)

    raised = run_nodes(3, node)
    assert sorted(raised) == [0, 1, 2]
    assert all(isinstance(error, c10d.PlanMismatchError) for error in raised.values())
    assert str(raised[0]).startswith(
        "c10d round 4: 1 of 3 node(s) planned another node order than torch's c10d rank 0"
    )


def test_a_missing_report_times_out_naming_its_c10d_rank(round_store):
    """Ranks 0 and 2 publish, rank 1 never does: both fail at the join timeout, naming rank 1."""

    def node(rank: int) -> None:
        if rank != 1:
            c10d.RoundExchange(round_store(), rank, 3, 0, timeout=0.5).reports(b"{}")

    raised = run_nodes(3, node)
    assert sorted(raised) == [0, 2]
    for error in raised.values():
        assert isinstance(error, RendezvousTimeoutError)
        assert str(error) == (
            "c10d round 0: node reports from 2 of 3 node(s) within join_timeout (0.5s): "
            "missing torch's c10d ranks [1]"
        )


def test_a_launcher_it_cannot_hook_is_refused_in_one_line(monkeypatch):
    """A torch whose launcher builds its handler elsewhere: npu-run refuses c10d (exit 8) rather
    than let the nodes run in host-name order."""
    from torch.distributed.launcher import api

    monkeypatch.delattr(api, "rdzv_registry")
    with pytest.raises(LaunchError) as refused:
        with c10d.ranked_c10d():
            pass
    assert refused.value.exit_code == 8
    assert refused.value.message.startswith(
        "--rdzv_backend=c10d: this torch's launcher (torch.distributed.launcher.api) does not "
        "build its rendezvous handler through rdzv_registry"
    )


def test_only_c10d_handlers_are_wrapped_while_hooked():
    from torch.distributed.launcher import api

    original = api.rdzv_registry
    with c10d.ranked_c10d():
        assert api.rdzv_registry is not original
        assert api.rdzv_registry.RendezvousParameters is original.RendezvousParameters
    assert api.rdzv_registry is original


# -- pure parts ----------------------------------------------------------------------------------


def test_member_keys_sort_as_c10d_ranks():
    keys = [c10d.member_key(rank, 12) for rank in range(12)]
    assert keys == sorted(keys)
    assert keys[3] == "c10d-03"


def test_only_nodes_nothing_tells_apart_keep_c10d_order():
    unknown = encode_report(NodeReport(pod_index=0, device_count=2))
    reports = {
        "c10d-0": unknown,
        "c10d-1": encode_report(NodeReport(pod_index=1, device_count=2)),
        "c10d-2": unknown,
        "c10d-3": encode_report(NodeReport(node_id="10.0.0.9", pod_index=0)),
        "c10d-4": b"not a report",
    }
    assert c10d.c10d_ordered(reports) == ["c10d-0", "c10d-2"]
