"""Faults in a running job, those of docs/launcher.md's Faults table, on real npu-run nodes.

Each test starts ``npu-run`` processes on loopback (one per simulated node, real gloo workers from
``workers/faulty.py``), injects one fault from outside (a signal, a squatter on the master port,
a broken proxy socket, a failing worker), and asserts what an operator would check: how long
until every node stopped (only as "before the timeout that applies, plus a margin": a shared
2-core machine is slow, so the margin is a :class:`~tests.machine_stalls.Cap` that grows with its
slowness while the timeout does not; the times themselves are in ``benchmarks/bench_faults.py``),
the last line of every node's log, the exit codes, and that no process of the job and none of its
ports is left. Liveness knobs are short here (1 s heartbeats, 3 missed = dead), as
``--rdzv_conf`` allows; so a stop of the whole machine longer than two beats looks like a frozen
node, and a test that failed while the machine stalled that long runs again
(:mod:`tests.machine_stalls`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
from pathlib import Path
from typing import Dict, List

import pytest
from npu_job.launcher import torchcompat

from tests.machine_stalls import Cap, rerun_after_machine_stall

from ..cluster import (
    LocalCluster,
    alive,
    port_is_free,
    shut_down_sockets,
    tagged_processes,
    wait_exits,
    wait_for,
)

NPROC = 2
INTERVAL = 1.0
ATTEMPTS = 3
WINDOW = INTERVAL * ATTEMPTS
MARGIN = 25.0  # start-up of torch in each worker, workers' shutdown, a loaded machine
STARTUP = 30.0  # three npu-run processes importing torch at once on two cores
CLOSE_TIMEOUT = 3.0
BIND_GRACE = 2.0  # rootstore.BIND_GRACE: node rank 0 retries a busy port close_timeout + this
CONF = (
    f"--rdzv_conf=join_timeout=60,close_timeout={CLOSE_TIMEOUT:g},timeout=20,"
    f"keep_alive_interval={INTERVAL:g},keep_alive_max_attempt={ATTEMPTS}"
)
pytestmark = rerun_after_machine_stall(longer_than=WINDOW - INTERVAL)


@pytest.fixture
def cluster_factory(tmp_path):
    made: List[LocalCluster] = []

    def make(nnodes: int = 3) -> LocalCluster:
        cluster = LocalCluster(tmp_path, nnodes=nnodes, nproc_per_node=NPROC)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.kill_all()


def start_job(
    cluster: LocalCluster, out: Path, *worker_args: str, tiered: bool = True, extra: tuple = ()
) -> list:
    out.mkdir(exist_ok=True)
    return [
        cluster.start(
            str(rank),
            "faulty.py",
            [str(out), *worker_args],
            launcher_args=[
                f"--enable_tiered_parallel_tcpstore={str(tiered).lower()}",
                CONF,
                *extra,
            ],
        )
        for rank in range(cluster.nnodes)
    ]


def records(out: Path, world: int) -> Dict[int, dict]:
    found = {}
    for rank in range(world):
        path = out / f"{rank}.json"
        if path.exists():
            found[rank] = json.loads(path.read_text())
    return found


def await_training(cluster: LocalCluster, out: Path) -> Dict[int, dict]:
    world = cluster.nnodes * NPROC
    wait_for(
        lambda: (
            len(records(out, world)) == world
            or any(n.process.poll() is not None for n in cluster.nodes)
        ),
        120,
        "every worker training",
    )
    found = records(out, world)
    assert len(found) == world, cluster.logs()
    return found


def last_line(node) -> str:
    lines = node.log().strip().splitlines()
    return lines[-1] if lines else ""


def assert_nothing_left(cluster: LocalCluster, ports=()) -> None:
    """No process of the job (agents, workers) and no listener on its ports."""
    wait_for(lambda: not tagged_processes(cluster.tag), 15, "every process of the job to end")
    for port in (cluster.master_port, *ports):
        assert port_is_free(port), port


def test_a_sigkilled_agent_is_named_by_every_other_node_and_its_workers_die(
    cluster_factory, tmp_path
):
    """Node rank 1's agent is SIGKILLed: its workers die with it (parent-death signal), the other
    nodes stop within the liveness window naming node rank 1, its pod and host."""
    cluster = cluster_factory()
    out = tmp_path / "out"
    nodes = start_job(cluster, out, "--hold-until", str(tmp_path / "never"))
    found = await_training(cluster, out)
    victims = [found[rank]["pid"] for rank in (2, 3)]
    within = Cap(MARGIN, fixed=WINDOW + INTERVAL)  # from the kill: the window, then a margin
    os.kill(nodes[1].process.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(pid) for pid in victims), 5, "node 1's workers to die with it")
    codes = wait_exits([nodes[0], nodes[2]], within)
    assert codes == [8, 8], cluster.logs()
    for node in (nodes[0], nodes[2]):
        line = last_line(node)
        assert line.startswith("npu-run: error: the job stopped: node rank 1 (pod "), cluster.logs()
        assert "host 127.0.0.1) stopped: no heartbeat for " in line, line
        assert re.search(
            r"\(its heartbeat counter last seen moving at \d\d:\d\d:\d\d\.\d{3} by node rank "
            rf"0's poll, every {INTERVAL:g}s\)$",
            line,
        ), line
    assert_nothing_left(cluster)


def test_a_sigkilled_root_host_is_named_at_once(cluster_factory, tmp_path):
    """Node rank 0 (the root's host) is SIGKILLed: the others find its root gone and name it."""
    cluster = cluster_factory()
    out = tmp_path / "out"
    nodes = start_job(cluster, out, "--hold-until", str(tmp_path / "never"))
    found = await_training(cluster, out)
    within = Cap(MARGIN, fixed=INTERVAL)
    os.kill(nodes[0].process.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(found[rank]["pid"]) for rank in (0, 1)), 5, "node 0's workers")
    codes = wait_exits(nodes[1:], within)
    assert codes == [8, 8], cluster.logs()
    for node in nodes[1:]:
        line = last_line(node)
        assert line.startswith(
            f"npu-run: error: the job stopped: lost the root store "
            f"127.0.0.1:{cluster.master_port} of node rank 0 (pod "
        ), cluster.logs()
    assert_nothing_left(cluster)


def test_a_frozen_root_is_reported_within_the_call_deadline_and_the_root_ends_after(
    cluster_factory, tmp_path
):
    """SIGSTOP on node rank 0 (the root freezes, the kernel still accepts connections): the
    others report that the root has not answered, within the call deadline (the liveness window,
    shorter than timeout=20); once thawed, node rank 0 ends too, naming its own stall."""
    cluster = cluster_factory()
    out = tmp_path / "out"
    nodes = start_job(cluster, out, "--hold-until", str(tmp_path / "never"))
    await_training(cluster, out)
    within = Cap(MARGIN, fixed=WINDOW + INTERVAL)
    os.kill(nodes[0].process.pid, signal.SIGSTOP)
    try:
        codes = wait_exits(nodes[1:], within)
    finally:
        os.kill(nodes[0].process.pid, signal.SIGCONT)
    assert codes == [8, 8], cluster.logs()
    for node in nodes[1:]:
        line = last_line(node)
        assert f"lost the root store 127.0.0.1:{cluster.master_port} of node rank 0" in line, line
        assert "has not answered for" in line, line
    assert nodes[0].wait(MARGIN + 10) == 8, nodes[0].log()
    assert "node rank 0 (pod " in last_line(nodes[0]) and "was stalled for" in last_line(nodes[0])
    assert_nothing_left(cluster)


class Squatter:
    """Something else on the master port: accepts connections and never answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", port))
        self.sock.listen(64)
        self.held: List[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept; close alone would not
        self.sock.close()
        self._thread.join(5)
        for conn in self.held:
            conn.close()


def test_a_squatter_on_the_master_port_is_refused_by_every_node(cluster_factory, tmp_path):
    cluster = cluster_factory()
    squatter = Squatter(cluster.master_port)
    try:
        within = Cap(STARTUP + MARGIN, fixed=max(WINDOW, CLOSE_TIMEOUT + BIND_GRACE))
        nodes = start_job(cluster, tmp_path / "out")
        codes = wait_exits(nodes, within)
    finally:
        squatter.close()
    assert codes == [8, 8, 8], cluster.logs()
    assert f"cannot host the root store on port {cluster.master_port}" in nodes[0].log()
    for node in nodes[1:]:
        line = last_line(node)
        assert (
            f"the process at 127.0.0.1:{cluster.master_port} accepts connections but did not "
            "answer as a store" in line
        ), line
    assert_nothing_left(cluster)


def test_a_store_of_another_job_is_not_taken_for_the_root(cluster_factory, tmp_path):
    """A stock TCPStore (another job's) holds the port: the joining nodes refuse it by run id."""
    cluster = cluster_factory(nnodes=2)
    other = torchcompat.host_tcpstore("127.0.0.1", cluster.master_port, 30, None)
    try:
        node = cluster.start("1", "faulty.py", [str(tmp_path)], launcher_args=[CONF])
        assert node.wait(Cap(STARTUP + MARGIN, fixed=WINDOW)) == 8, node.log()
    finally:
        del other
    line = last_line(node)
    assert (
        f"127.0.0.1:{cluster.master_port} answers as a store but is not npu-run's root of run"
        in line
    )
    assert_nothing_left(cluster)


def test_a_worker_failing_every_attempt_is_named_by_every_node_with_one_summary(
    cluster_factory, tmp_path
):
    """Rank 3 (node rank 1) fails before joining on every attempt, --max_restarts=2: node rank 1
    prints torch's failure summary (with the @record traceback) and exits 1; the others exit 8;
    every node's last line names node rank 1, worker rank 3 and its error."""
    cluster = cluster_factory()
    nodes = start_job(
        cluster, tmp_path / "out", "--fail-rank", "3", "--always", extra=("--max_restarts=2",)
    )
    codes = wait_exits(nodes, 120)
    assert codes == [8, 1, 8], cluster.logs()
    for node in nodes:
        line = last_line(node)
        assert line.startswith("npu-run: error: the job stopped: node rank 1 (pod "), cluster.logs()
        assert (
            "worker rank 3 (local rank 1, pid " in line
            and "failed with exit code 1: RuntimeError: worker rank 3 fails on purpose (attempt 2)"
            in line
        ), line
    summaries = [node.log().count("Root Cause (first observed failure)") for node in nodes]
    assert summaries == [0, 1, 0], summaries
    assert "Traceback" in nodes[1].log().split("Root Cause (first observed failure)")[1]
    assert_nothing_left(cluster)


def test_a_worker_failing_mid_training_is_named_although_its_peers_fail_too(
    cluster_factory, tmp_path
):
    """Rank 3 raises while all ranks train; its peers' collectives break and they fail as well.
    The root cause is the earliest failure: every node names node rank 1's worker rank 3."""
    cluster = cluster_factory()
    out = tmp_path / "out"
    trigger = tmp_path / "fail-now"
    nodes = start_job(cluster, out, "--fail-rank", "3", "--fail-when", str(trigger))
    await_training(cluster, out)
    trigger.write_text("go")
    codes = wait_exits(nodes, Cap(MARGIN, fixed=2 * WINDOW))
    assert codes == [8, 1, 8], cluster.logs()
    for node in nodes:
        assert "node rank 1 (pod " in last_line(node) and "worker rank 3 " in last_line(node), (
            cluster.logs()
        )
    assert [node.log().count("Root Cause (first observed failure)") for node in nodes] == [0, 1, 0]
    assert_nothing_left(cluster)


def test_a_dead_proxy_is_restarted_on_its_port_before_the_workers_restart(
    cluster_factory, tmp_path
):
    """Node rank 1's proxy loses its listener and connections; its agent restarts it on the same
    port; then a worker fails and the restarted workers find their store there: the job ends
    well (the issue's run ended after ~150 s naming the wrong ranks)."""
    if not torchcompat.HAS_LIST_KEYS:
        pytest.skip("before list_keys each round gets a new proxy anyway (a new workers' store)")
    cluster = cluster_factory()
    out = tmp_path / "out"
    trigger, done = tmp_path / "fail-now", tmp_path / "done"
    nodes = start_job(
        cluster,
        out,
        "--hold-until",
        str(done),
        "--fail-rank",
        "3",
        "--fail-when",
        str(trigger),
        extra=("--max_restarts=1",),
    )
    found = await_training(cluster, out)
    proxy_port = int(found[2]["MASTER_PORT"])
    assert shut_down_sockets(nodes[1].process.pid, proxy_port) >= 1
    restarted = f"node rank 1: restarted the store proxy on 127.0.0.1:{proxy_port}"
    wait_for(lambda: restarted in nodes[1].log(), Cap(MARGIN, fixed=INTERVAL), "the proxy restart")
    for path in out.iterdir():
        path.unlink()
    trigger.write_text("go")
    wait_for(lambda: len(records(out, 3 * NPROC)) == 3 * NPROC, 120, "the restarted workers")
    again = records(out, 3 * NPROC)
    assert {again[rank]["attempt"] for rank in again} == {"1"} or again[3]["attempt"] == "1"
    assert int(again[2]["MASTER_PORT"]) == proxy_port
    done.write_text("go")
    assert wait_exits(nodes, 60) == [0, 0, 0], cluster.logs()
    assert_nothing_left(cluster, [proxy_port])
