"""Network partitions between real hosts (one network namespace each): npu-run's liveness rule.

Three npu-run nodes, each in its own namespace on a shared bridge, train with gloo
(``tests/launcher/workers/faulty.py``). Taking a host's link down drops its packets without
resetting any connection, as a partition does. The rule (README, Faults): a cut shorter than the
liveness window survives; a longer one ends the job, and the node that was cut off is named.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import List

import pytest

from tests.e2e.netns import NetnsCluster, leftovers, netns_unavailable_reason
from tests.launcher.cluster import TAG_VARIABLE, tagged_processes, training_node_argv, wait_for
from tests.machine_stalls import Cap, rerun_after_machine_stall, wait_process

NODES = 3
INTERVAL, ATTEMPTS = 1.0, 4
WINDOW = INTERVAL * ATTEMPTS

REASON = netns_unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
    rerun_after_machine_stall(longer_than=WINDOW - INTERVAL),
]
MARGIN = 25.0


def start(cluster: NetnsCluster, out: Path, done: Path, tag: str) -> List[subprocess.Popen]:
    master = cluster.hosts[0].ip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(
        {TAG_VARIABLE: tag, "GLOO_SOCKET_IFNAME": "eth0", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}
    )
    processes = []
    for host in cluster.hosts:
        log = open(out / f"node{host.index}.log", "wb")
        processes.append(
            subprocess.Popen(
                [
                    *cluster.prefix(host.index),
                    *training_node_argv(
                        NODES,
                        host.index,
                        master,
                        29650,
                        f"join_timeout=60,timeout=30,keep_alive_interval={INTERVAL:g},"
                        f"keep_alive_max_attempt={ATTEMPTS}",
                        out,
                        done,
                    ),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        log.close()
    return processes


def training(out: Path) -> bool:
    return all((out / f"{rank}.json").exists() for rank in range(NODES))


def running_job(cluster: NetnsCluster, workdir: Path):
    """A fresh job, once every worker trains: (its log dir, its finish file, tag, processes)."""
    out, done = workdir / "out", workdir / "done"
    out.mkdir(parents=True)
    job = uuid.uuid4().hex
    processes = start(cluster, out, done, job)
    wait_for(lambda: training(out) or any(p.poll() is not None for p in processes), 120, "training")
    assert training(out), logs(out)
    return out, done, job, processes


def last_line(out: Path, index: int) -> str:
    lines = (out / f"node{index}.log").read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def link(cluster: NetnsCluster, index: int, state: str) -> None:
    subprocess.run(
        ["ip", "-n", cluster.hosts[index].namespace, "link", "set", "eth0", state], check=True
    )


def logs(out: Path) -> str:
    return "\n".join((out / f"node{i}.log").read_text(errors="replace") for i in range(NODES))


def test_a_blip_shorter_than_the_window_survives_and_a_longer_cut_names_the_node(tmp_path):
    tag = f"p{os.getpid() % 10000}"
    with NetnsCluster(NODES, tag=tag) as cluster:
        # a blip: host 2 unreachable for a quarter of the window; the job goes on and finishes
        out, done, job, processes = running_job(cluster, tmp_path / "blip")
        link(cluster, 2, "down")
        time.sleep(WINDOW / 4)
        link(cluster, 2, "up")
        time.sleep(2 * INTERVAL)
        assert all(p.poll() is None for p in processes), logs(out)
        done.write_text("go")
        finished = Cap(60)
        assert [wait_process(p, finished) for p in processes] == [0, 0, 0], logs(out)
        wait_for(lambda: not tagged_processes(job), 15, "the blip job's processes to end")

        # a cut: host 2 unreachable for good; every node stops, naming what it can see
        out, _, job, processes = running_job(cluster, tmp_path / "cut")
        within = Cap(MARGIN, fixed=WINDOW + INTERVAL)  # from the cut: the window, then a margin
        link(cluster, 2, "down")
        codes = [wait_process(p, within) for p in processes]
        assert codes == [8, 8, 8], logs(out)
        for index in (0, 1):
            line = last_line(out, index)
            assert line.startswith("npu-run: error: the job stopped: node rank 2 (pod "), logs(out)
            assert f"host {cluster.hosts[2].ip}) stopped: no heartbeat for" in line, line
        assert f"lost the root store {cluster.hosts[0].ip}:29650 of node rank 0" in last_line(
            out, 2
        )
        wait_for(lambda: not tagged_processes(job), 15, "the cut job's processes to end")
    assert leftovers(tag) == []
