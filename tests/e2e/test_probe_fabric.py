"""``npu-run --probe`` on the emulated fabric: real agents in network namespaces, real links.

The fabric is bench_fabric's (``benchmarks/_fabric_net.py``): every node a network namespace,
every switch a Linux bridge, every link a veth pair shaped by ``tc`` to 100 Mbit/s, so the links
and not the two CPUs set the pace. The shape is the smallest where the order of a ring matters:
four nodes under two ToRs, each ToR one uplink as fast as a node's link. A ring whose every
edge crosses the ToRs puts two flows on each uplink; one with two crossing edges, one flow.

Each node runs npu-run (``parallel`` rendezvous, root on pod index 0, one gloo device per node)
with ``--probe``, from what its bootstrap leaves in its output directory: its report (the node,
its pod index, its ToR and slot as the ToR file said) and its planned rank, as train.sh passes it.
The root plans the round from the reports; the probe then times all_reduce in the plan's order
and in the scheduler's (pod index) order over the shaped links.

* **True topology:** the bridges are bench_fabric's 4x2 wiring (pods 0 and 2 under one ToR, 1
  and 3 under the other: the scheduler's ring crosses the ToRs on every edge) and the reports
  say so. The probe keeps the plan, and its measured busbw ratio is within 15% of what
  bench_fabric itself measures for 4x2 (run here, on a fabric of its own, right after).
* **Lying topology:** the bridges hold pods 0 and 1 under one ToR, 2 and 3 under the other (the
  scheduler's ring is already at the bound) while the reports give the 4x2 wiring above. The plan
  they make crosses the ToRs on every edge of the real wiring: the probe measures it slower,
  keeps the scheduler's order, and the workers' ranks are the pod indexes.
* **A node dies during the probe:** its npu-run's process group is SIGKILLed while the probe
  processes run; every other node's log names it within the probe's budget.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

from tests.e2e.netns import fabric_unavailable_reason
from tests.launcher.cluster import (
    TAG_VARIABLE,
    WORKERS,
    is_probe_process,
    tagged_processes,
    wait_for,
)
from tests.machine_stalls import Cap, communicate, wait_process

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _fabric_model as model  # noqa: E402
import _fabric_net as net  # noqa: E402
import _probe_job as probe_job  # noqa: E402

REASON = fabric_unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.torch,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]
SHAPE = model.parse_shape("4x2")
RATE_MBIT = 100.0
SCATTERED = (0, 1, 0, 1)  # bench_fabric's 4x2: its scheduler order alternates the ToRs
STACKED = (0, 0, 1, 1)  # the scheduler's ring already crosses the ToRs only twice
BUDGET = 120  # seconds: room for a busy machine (a probe past it would keep the plan)
RATIO_TOLERANCE = 0.15
VERDICT = re.compile(r"npu-run: round 0 (probe: .*)$", re.M)


class Job:
    """The job's agents on ``fabric`` (each reading ``read``), their workers recording."""

    def __init__(self, fabric: net.Fabric, read: Sequence[int], workdir: Path) -> None:
        assert probe_job.TAG_VARIABLE == TAG_VARIABLE  # tagged_processes finds the job
        self.records = workdir / "records"
        self.records.mkdir()
        self.tag = f"probe-fabric-{os.getpid()}-{workdir.name}"
        self.job = probe_job.start(
            fabric,
            read,
            workdir,
            [str(WORKERS / "record_env.py"), str(self.records)],
            probe=str(BUDGET),
            tag=self.tag,
        )
        self.ranks = self.job.ranks
        self.agents = self.job.agents
        self.log, self.logs = self.job.log, self.job.logs

    def finish(self, cap: float = 240) -> List[int]:
        """Every agent's exit code (their workers record and leave)."""
        until = Cap(cap)
        return [wait_process(agent, until) for agent in self.agents]

    def probe_document(self, pod: int) -> dict:
        document = self.job.probe_document(pod)
        assert document is not None, self.logs()
        return document

    def verdicts(self) -> List[str]:
        found = [VERDICT.findall(self.log(pod)) for pod in range(SHAPE.nodes)]
        assert all(len(lines) == 1 for lines in found), self.logs()
        return [lines[0] for lines in found]

    def node_rank_of_pod(self) -> Dict[int, int]:
        """Each pod's node rank as its worker saw it (RANK = GROUP_RANK: one worker a node)."""
        ranks = {}
        for path in sorted(self.records.glob("*.json")):
            record = json.loads(path.read_text())
            assert record["RANK"] == record["GROUP_RANK"] == path.stem, record
            assert record["WORLD_SIZE"] == str(SHAPE.nodes), record
            ranks[int(Path(record["output_dir"]).name.split("-")[1])] = int(record["RANK"])
        return ranks


def probe_processes(tag: str) -> List[int]:
    """Living probe processes of the job tagged ``tag``."""
    return [pid for pid in tagged_processes(tag) if is_probe_process(pid)]


def largest(document: dict) -> dict:
    return max(document["sizes"], key=lambda size: size["bytes"])


def bench_fabric_ratio(workdir: Path, nbytes: int) -> float:
    """bench_fabric's measured planned ÷ scheduler busbw of ring allreduce on 4x2."""
    output = workdir / "bench_fabric.txt"
    process = subprocess.Popen(
        [
            sys.executable,
            str(BENCHMARKS / "bench_fabric.py"),
            "--shapes",
            SHAPE.text,
            "--collectives",
            "ring",
            "--rate",
            f"{RATE_MBIT:g}",
            "--size",
            str(nbytes),
            "--rounds",
            "3",
            "--output",
            str(output),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    _, err = communicate(process, 180)
    assert process.returncode == 0, err[-2000:]
    table = output.read_text()
    (row,) = [line for line in table.splitlines() if line.startswith("| 4x2 | ring | planned |")]
    return float(row.split("|")[11])  # "x measured"


@pytest.fixture
def fabric(request):
    wiring = request.param
    net.remove_stale()  # what a run killed with SIGKILL left
    with net.Fabric(SHAPE, wiring, RATE_MBIT) as made:
        yield made


@pytest.mark.parametrize("fabric", [SCATTERED], indirect=True)
def test_with_the_true_topology_the_probe_keeps_the_plan_and_measures_what_bench_fabric_does(
    fabric, tmp_path
):
    from bench_fabric import make_job

    assert make_job(SHAPE, 0).tor_of_pod == SCATTERED  # the very shape bench_fabric measures
    job = Job(fabric, SCATTERED, tmp_path)
    assert job.finish() == [0] * SHAPE.nodes, job.logs()
    lines = job.verdicts()
    assert len(set(lines)) == 1 and lines[0].endswith(": keeping the plan"), lines
    assert job.node_rank_of_pod() == job.ranks != {pod: pod for pod in range(SHAPE.nodes)}
    document = job.probe_document(0)
    assert document["order"] == "planned", document
    measured = largest(document)
    fabric.close()  # bench_fabric builds its own, on the same machine

    expected = bench_fabric_ratio(tmp_path, measured["bytes"])
    assert measured["ratio"] > 1.5, document  # the plan clearly wins here
    assert abs(measured["ratio"] / expected - 1) <= RATIO_TOLERANCE, (measured, expected)


@pytest.mark.parametrize("fabric", [STACKED], indirect=True)
def test_with_a_lying_topology_the_probe_keeps_the_schedulers_order_and_the_workers_follow(
    fabric, tmp_path
):
    job = Job(fabric, SCATTERED, tmp_path)  # the reports describe bench_fabric's 4x2 wiring
    assert job.ranks != {pod: pod for pod in range(SHAPE.nodes)}
    assert job.finish() == [0] * SHAPE.nodes, job.logs()
    lines = job.verdicts()
    assert len(set(lines)) == 1 and lines[0].endswith("keeping the scheduler's order"), lines
    document = job.probe_document(0)
    assert document["order"] == "scheduler", document
    assert largest(document)["ratio"] < 1 - document["margin"], document
    assert job.node_rank_of_pod() == {pod: pod for pod in range(SHAPE.nodes)}, job.logs()


@pytest.mark.parametrize("fabric", [SCATTERED], indirect=True)
def test_a_node_that_dies_during_the_probe_is_named_by_every_other_node(fabric, tmp_path):
    """The victim is neither pod 0 (the root's host) nor node rank 0 (who decides). Every other
    node's probe waits on it (its probe processes are gone with it); the root's host finds it
    silent for the liveness window, and every other node ends its probe on that verdict, which
    names it, rather than at the probe's budget."""
    job = Job(fabric, SCATTERED, tmp_path)
    victim = next(pod for pod, rank in job.ranks.items() if pod != 0 and rank != 0)
    wait_for(
        lambda: (
            len(probe_processes(job.tag)) == SHAPE.nodes
            or any(agent.poll() is not None for agent in job.agents)
        ),
        180,
        "every node's probe process",
    )
    assert all(agent.poll() is None for agent in job.agents), job.logs()
    os.killpg(job.agents[victim].pid, signal.SIGKILL)
    others = [pod for pod in range(SHAPE.nodes) if pod != victim]
    named = f"node rank {job.ranks[victim]} (pod "
    host = f", host {net.pod_ip(victim)}) stopped: no heartbeat"
    wait_for(
        lambda: all(named in job.log(pod) and host in job.log(pod) for pod in others),
        BUDGET,
        f"every other node naming {named}...{host}",
    )
    codes = [wait_process(job.agents[pod], Cap(60)) for pod in others]
    assert all(code != 0 for code in codes), job.logs()
    assert "within its budget" not in job.logs()  # the verdict ended the probe, not its budget
