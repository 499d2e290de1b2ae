"""npu-run as several nodes of one job: real agents, real gloo workers, real sockets on loopback.

Each test starts ``npu-run`` processes (one per simulated node) with ``--rdzv_backend=parallel``;
the workers (``workers/record_env.py``) join the default process group the way unmodified scripts
do and write ``<dir>/<rank>.json`` with their environment, which the tests check from outside.
Every test kills all its processes in ``finally`` (see ``cluster.LocalCluster.kill_all``).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Dict, List

import pytest
from npu_job.launcher import torchcompat

from tests.machine_stalls import Cap

from .cluster import LocalCluster, connections_to, descendants, port_is_free, wait_for

NPROC = 2
TORCH_WORKER_GRACE = 30  # PContext.close's timeout: seconds from SIGTERM to SIGKILL for a worker
NNODES = 3
# the agent's client (launcher/rendezvous/rootclient.py) and the proxy's three
MAX_ROOT_CONNECTIONS_PER_NODE = 4
# the root's host also hosts the root: torch's TCPStore server object is a client of itself too
ROOT_HOST_OWN_CONNECTION = 1


@pytest.fixture
def cluster_factory(tmp_path):
    made: List[LocalCluster] = []

    def make(nnodes: int = NNODES, nproc_per_node: int = NPROC) -> LocalCluster:
        cluster = LocalCluster(tmp_path, nnodes=nnodes, nproc_per_node=nproc_per_node)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.kill_all()


def read_records(directory: Path, world_size: int) -> Dict[int, dict]:
    return {
        rank: json.loads((directory / f"{rank}.json").read_text()) for rank in range(world_size)
    }


def records_written(directory: Path, world_size: int) -> bool:
    return all((directory / f"{rank}.json").exists() for rank in range(world_size))


def tiered_flag(tiered: bool) -> str:
    return f"--enable_tiered_parallel_tcpstore={'true' if tiered else 'false'}"


@pytest.mark.parametrize(
    "tiered, by_auto",
    [
        pytest.param(False, False, id="flat-explicit-node-rank"),
        pytest.param(True, True, id="tiered-node-rank-auto"),
    ],
)
def test_three_nodes_get_torchrun_env_in_node_rank_order(
    cluster_factory, tmp_path, tiered, by_auto
):
    """Nodes started in the order 2, 0, 1 still get RANK = node_rank * nproc + LOCAL_RANK.

    In the ``auto`` case each node finds its rank in a different place: the RANK_AFTER_ACC
    variable, the bootstrap's file, and VC_TASK_INDEX (which the other two must outrank). The
    root's host is pod index 0: there, the node whose VC_TASK_INDEX is 0 (node rank 2), whatever
    rank it runs as; without a pod index, node rank 0.
    """
    cluster = cluster_factory()
    out = tmp_path / "records"
    out.mkdir()
    release = tmp_path / "release"
    bootstrap_dir = tmp_path / "bootstrap-out"
    bootstrap_dir.mkdir()
    (bootstrap_dir / "RANK_AFTER_ACC").write_text("0")
    auto_env = {
        2: {"RANK_AFTER_ACC": "2", "VC_TASK_INDEX": "0"},
        0: {"NPU_JOB_OUTPUT_DIR": str(bootstrap_dir), "VC_TASK_INDEX": "1"},
        1: {"VC_TASK_INDEX": "1"},
    }
    nodes = {}
    try:
        for node_rank in (2, 0, 1):
            nodes[node_rank] = cluster.start(
                "auto" if by_auto else str(node_rank),
                "record_env.py",
                [str(out), "--hold-until", str(release)],
                launcher_args=[
                    tiered_flag(tiered),
                    "--rdzv_id=job-42",
                    "--rdzv_conf=join_timeout=60",
                ],
                env=auto_env[node_rank] if by_auto else None,
            )
        wait_for(
            lambda: (
                records_written(out, NNODES * NPROC)
                or any(n.process.poll() is not None for n in cluster.nodes)
            ),
            90,
            "all workers' records",
        )
        assert records_written(out, NNODES * NPROC), cluster.logs()

        # While every worker still holds its process group: who is connected to the root's host's
        # stores (the root; on torch without list_keys also the store global rank 0 hosts)?
        root_side = {cluster.master_port}
        if not torchcompat.HAS_LIST_KEYS:
            root_side.add(int(read_records(out, NNODES * NPROC)[0]["MASTER_PORT"]))
        per_node = {
            rank: sum(connections_to(port, descendants(node.process.pid)) for port in root_side)
            for rank, node in nodes.items()
        }
        release.write_text("go")
        assert cluster.wait_all(60) == [0] * NNODES, cluster.logs()
    finally:
        cluster.kill_all()

    records = read_records(out, NNODES * NPROC)
    root_host = 2 if by_auto else 0
    for rank, record in records.items():
        node_rank, local_rank = divmod(rank, NPROC)
        assert record["RANK"] == str(rank)
        assert record["LOCAL_RANK"] == str(local_rank)
        assert record["GROUP_RANK"] == str(node_rank)
        assert record["ROLE_RANK"] == str(rank) and record["ROLE_NAME"] == "default"
        assert record["WORLD_SIZE"] == record["ROLE_WORLD_SIZE"] == str(NNODES * NPROC)
        assert record["LOCAL_WORLD_SIZE"] == str(NPROC)
        assert record["GROUP_WORLD_SIZE"] == str(NNODES)
        assert record["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert record["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert record["TORCHELASTIC_RUN_ID"] == "job-42"
        # True: workers are clients of the root (or proxy); else global rank 0 hosts their store
        assert record["TORCHELASTIC_USE_AGENT_STORE"] == str(torchcompat.HAS_LIST_KEYS)
        assert record["pg_rank"] == rank and record["pg_world_size"] == NNODES * NPROC
        assert record["sum"] == sum(range(1, NNODES * NPROC + 1))
        assert record["MASTER_ADDR"] == "127.0.0.1"
    store_ports = {rank: records[rank]["MASTER_PORT"] for rank in records}
    if tiered:
        for node_rank in range(NNODES):  # one proxy per node, shared by its workers, not the root
            ports = {store_ports[node_rank * NPROC + local] for local in range(NPROC)}
            if node_rank == 0 and not torchcompat.HAS_LIST_KEYS:
                continue  # global rank 0 hosts the workers' store: its node uses it directly
            assert len(ports) == 1 and ports != {str(cluster.master_port)}
        assert len(set(store_ports.values())) == NNODES
        assert all(
            count <= MAX_ROOT_CONNECTIONS_PER_NODE + (rank == root_host) * ROOT_HOST_OWN_CONNECTION
            for rank, count in per_node.items()
        ), per_node
    else:  # torchrun's fan-in: the agent and every worker connect to the root
        assert len(set(store_ports.values())) == 1
        if torchcompat.HAS_LIST_KEYS:  # else a store of the round's own, beside the root
            assert set(store_ports.values()) == {str(cluster.master_port)}
        expected = {
            rank: 1 + NPROC + (rank == root_host) * ROOT_HOST_OWN_CONNECTION
            for rank in range(NNODES)
        }
        assert per_node == expected, per_node
    if by_auto:
        log = cluster.logs()
        assert "node rank 2 (--node_rank=auto: from environment RANK_AFTER_ACC)" in log
        assert (
            f"node rank 0 (--node_rank=auto: from bootstrap file {bootstrap_dir / 'RANK_AFTER_ACC'})"
            in log
        )
        assert "node rank 1 (--node_rank=auto: from environment VC_TASK_INDEX" in log


def test_tiered_root_connections_do_not_grow_with_workers_per_node(cluster_factory, tmp_path):
    """4 workers on a node: flat would open 5 root connections from it; tiered stays <= 4 (plus
    node rank 0's own handle on the root it hosts, in both cases).

    One node keeps the test cheap; node rank 0's workers use its proxy like any other node's.
    """
    nproc = 4
    cluster = cluster_factory(nnodes=1, nproc_per_node=nproc)
    out = tmp_path / "records"
    out.mkdir()
    release = tmp_path / "release"
    try:
        node = cluster.start(
            "0",
            "record_env.py",
            [str(out), "--hold-until", str(release)],
            launcher_args=[tiered_flag(True)],
        )
        wait_for(
            lambda: records_written(out, nproc) or node.process.poll() is not None,
            90,
            "all workers' records",
        )
        assert records_written(out, nproc), cluster.logs()
        root_connections = connections_to(cluster.master_port, descendants(node.process.pid))
        release.write_text("go")
        assert cluster.wait_all(60) == [0], cluster.logs()
    finally:
        cluster.kill_all()
    assert 1 <= root_connections <= MAX_ROOT_CONNECTIONS_PER_NODE + ROOT_HOST_OWN_CONNECTION
    # fewer than the flat fan-in from the same node (agent, its own handle, one per worker)
    assert root_connections < 1 + ROOT_HOST_OWN_CONNECTION + nproc, root_connections


def test_worker_crash_restarts_the_whole_group_with_the_same_ranks(cluster_factory, tmp_path):
    """Rank 3 (node rank 1) fails on its first run; with --max_restarts=1 the job succeeds.

    Node rank 1's agent restarts its workers (restart count 1); node rank 0's agent sees it
    waiting in the next round and restarts its own (as under torch's c10d backend, that does not
    use up its restarts, so its workers still see restart count 0).
    """
    cluster = cluster_factory(nnodes=2)
    out = tmp_path / "records"
    out.mkdir()
    try:
        for node_rank in (1, 0):
            cluster.start(
                str(node_rank),
                "record_env.py",
                [str(out), "--fail-rank", "3"],
                launcher_args=[
                    tiered_flag(True),
                    "--max_restarts=1",
                    "--rdzv_conf=join_timeout=60",
                ],
            )
        codes = cluster.wait_all(120)
    finally:
        cluster.kill_all()
    assert codes == [0, 0], cluster.logs()
    records = read_records(out, 2 * NPROC)
    assert {rank: r["TORCHELASTIC_RESTART_COUNT"] for rank, r in records.items()} == {
        0: "0",
        1: "0",
        2: "1",
        3: "1",
    }
    assert all(r["sum"] == 10 and r["RANK"] == str(rank) for rank, r in records.items())
    log = cluster.logs()
    assert "worker rank 3 fails on purpose before restart 1" in log
    if torchcompat.HAS_LIST_KEYS:
        assert "round 1: cleared" in log
        assert log.count("store proxy listening on") == 2  # each node's proxy survived the restart
    else:  # global rank 0 hosts each round's store; node 1 proxies to each in turn
        assert "round 1: global rank 0 hosts the workers' store" in log
        assert log.count("store proxy listening on") == 2


def test_missing_node_fails_every_node_naming_it(cluster_factory):
    """Node rank 1 of 3 never starts: both others fail within join_timeout (and the start-up of
    npu-run before it) and name rank 1."""
    cluster = cluster_factory()
    join_timeout = 3
    try:
        within = Cap(27, fixed=join_timeout)
        for node_rank in (2, 0):
            cluster.start(
                str(node_rank),
                "record_env.py",
                ["/nonexistent"],
                launcher_args=[f"--rdzv_conf=join_timeout={join_timeout}"],
            )
        codes = cluster.wait_all(within)
    finally:
        cluster.kill_all()
    assert codes == [8, 8], cluster.logs()
    for node in cluster.nodes:
        log = node.log()
        assert "missing node ranks [1] of --nnodes=3" in log, log
        assert f"127.0.0.1:{cluster.master_port}" in log
        assert "Traceback" not in log, log


def test_sigterm_stops_workers_and_proxy_and_peers_fail_naming_the_root(cluster_factory, tmp_path):
    """SIGTERM to node rank 0 (root host): it tells the others why, stops its workers and proxy
    and frees its ports; node rank 1 fails naming node rank 0 and the signal as the cause,
    stopping its own workers."""
    cluster = cluster_factory(nnodes=2)
    out = tmp_path / "records"
    out.mkdir()
    never = tmp_path / "never-created"
    try:
        root, other = [
            cluster.start(
                str(rank),
                "record_env.py",
                [str(out), "--hold-until", str(never)],
                launcher_args=[tiered_flag(True)],
            )
            for rank in (0, 1)
        ]
        wait_for(
            lambda: records_written(out, 2 * NPROC) or root.process.poll() is not None,
            90,
            "all workers' records",
        )
        assert records_written(out, 2 * NPROC), cluster.logs()
        records = read_records(out, 2 * NPROC)
        root_tree = descendants(root.process.pid)
        other_tree = descendants(other.process.pid)
        proxy_ports = {int(records[rank]["MASTER_PORT"]) for rank in records}
        assert len(root_tree) >= 1 + NPROC and len(other_tree) >= 1 + NPROC

        root.process.send_signal(signal.SIGTERM)
        # torch's agent gives its workers 30 s after SIGTERM before it SIGKILLs them, so a node
        # may take that long and still stop right; waiting exactly 30 s failed once in CI (torch
        # 2.9.1, loaded machine), the node still waiting on its workers when the test gave up
        assert root.wait(Cap(15, fixed=TORCH_WORKER_GRACE)) == 128 + signal.SIGTERM, root.log()
        other_code = other.wait(Cap(15, fixed=TORCH_WORKER_GRACE))
        survivors = [pid for pid in root_tree + other_tree if _alive(pid)]
    finally:
        cluster.kill_all()
    assert survivors == [], cluster.logs()
    assert other_code == 8, other.log()
    last_line = other.log().strip().splitlines()[-1]
    assert last_line.startswith("npu-run: error: the job stopped: node rank 0 (pod "), last_line
    assert last_line.endswith("was stopped by SIGTERM"), last_line
    assert "received SIGTERM" in root.log()
    assert port_is_free(cluster.master_port)
    assert all(port_is_free(port) for port in proxy_ports), proxy_ports


def test_sigint_stops_a_single_node_like_ctrl_c(cluster_factory, tmp_path):
    """Ctrl-C on an interactive npu-run: exit 130, no worker, proxy or root port left behind."""
    cluster = cluster_factory(nnodes=1)
    out = tmp_path / "records"
    out.mkdir()
    try:
        node = cluster.start(
            "0",
            "record_env.py",
            [str(out), "--hold-until", str(tmp_path / "never")],
            launcher_args=[tiered_flag(True)],
        )
        wait_for(
            lambda: records_written(out, NPROC) or node.process.poll() is not None, 90, "records"
        )
        assert records_written(out, NPROC), cluster.logs()
        tree = descendants(node.process.pid)
        proxy_port = int(read_records(out, NPROC)[0]["MASTER_PORT"])
        node.process.send_signal(signal.SIGINT)
        code = node.wait(30)
        survivors = [pid for pid in tree if _alive(pid)]
    finally:
        cluster.kill_all()
    assert code == 128 + signal.SIGINT, node.log()
    assert survivors == []
    assert port_is_free(cluster.master_port) and port_is_free(proxy_port)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
