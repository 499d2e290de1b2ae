"""An elastic job (``--nnodes=3:6``) under npu-run's ``parallel`` rendezvous, on real hosts (a
network namespace each) with real agents training with gloo.

Four pods under two ToRs start together: the root's host (pod index 0) closes round 0 once no
fifth came for ``last_call_timeout``, and the root plans it over the four reports. A fifth pod
starts later: it waits in round 1, the four see it waiting and restart their workers around it,
and round 1 runs five nodes under a new plan. Both plans are at the ring's lower bound of
cross-ToR edges, and every worker's world is its round's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Tuple

from npu_job.podfacts import ROUND_PLAN_FILE
from tests.e2e.netns import NetnsCluster, leftovers
from tests.e2e.test_replan import (
    bootstrap,
    cross_tor_edges,
    finish,
    logs,
    new_job,
    pytestmark,  # noqa: F401  (network namespaces, or a stated reason to skip)
    records,
    report,
    start_pod,
    worker_pids,
    write_bootstrap_output,
)
from tests.launcher.cluster import wait_for

# pod index -> (ToR, slot): in scheduler order the ToRs alternate, so the plan moves ranks
TORS = {0: ("tor-a", 0), 1: ("tor-b", 0), 2: ("tor-a", 1), 3: ("tor-b", 1), 4: ("tor-a", 2)}
FIRST, ALL = 4, 5
ELASTIC = "3:6"
LAST_CALL = 10  # seconds: more than the four agents' starts differ by on a busy machine
PLAN_LINE = re.compile(r"npu-run: round (\d+) plan ([0-9a-f]+): node rank (\d+) of (\d+)$", re.M)


def plans(out: Path, host: int) -> Dict[int, Tuple[str, int, int]]:
    """round -> (digest, node rank, node count) from ``host``'s log."""
    text = (out / f"host{host}.log").read_text(errors="replace")
    return {int(m[1]): (m[2], int(m[3]), int(m[4])) for m in PLAN_LINE.finditer(text)}


def worlds(out: Path) -> Dict[int, int]:
    return {rank: int(record["WORLD_SIZE"]) for rank, record in records(out).items()}


def test_an_elastic_job_plans_each_round_over_the_nodes_that_came(tmp_path):
    tag, job, out, done = new_job(tmp_path, "elastic")
    reports = [report(pod, TORS[pod]) for pod in range(ALL)]
    first_ranks, first_digest = bootstrap(reports[:FIRST])
    all_ranks, all_digest = bootstrap(reports)
    assert first_ranks != {pod: pod for pod in range(FIRST)}  # the plan is not scheduler order
    conf = f",last_call_timeout={LAST_CALL}"
    with NetnsCluster(ALL, tag=tag) as cluster:
        for pod in range(ALL):
            ranks, digest = (first_ranks, first_digest) if pod < FIRST else (all_ranks, all_digest)
            write_bootstrap_output(cluster.hosts[pod].tmp_dir, reports[pod], ranks[pod], digest)
        agents = [
            start_pod(cluster, pod, first_ranks[pod], out, done, job, 29680, ELASTIC, conf)
            for pod in range(FIRST)
        ]
        wait_for(
            lambda: len(worker_pids(out)) == FIRST or any(a.poll() is not None for a in agents),
            240,
            "the first four workers training",
        )
        assert worlds(out) == {rank: FIRST for rank in range(FIRST)}, logs(out)
        before = worker_pids(out)
        agents.append(
            start_pod(cluster, FIRST, all_ranks[FIRST], out, done, job, 29680, ELASTIC, conf)
        )
        wait_for(
            lambda: (
                (
                    len(worker_pids(out)) == ALL
                    and all(pid not in before.values() for pid in worker_pids(out).values())
                )
                or any(a.poll() is not None for a in agents)
            ),
            240,
            "five workers training",
        )
        assert worlds(out) == {rank: ALL for rank in range(ALL)}, logs(out)
        codes = finish(agents, done, job)
        left = {
            pod: json.loads((cluster.hosts[pod].tmp_dir / ROUND_PLAN_FILE).read_text())
            for pod in range(ALL)
        }
    assert leftovers(tag) == []
    assert codes == [0] * ALL, logs(out)

    found = {pod: plans(out, pod) for pod in range(ALL)}
    assert {pod: found[pod][0] for pod in range(FIRST)} == {
        pod: (first_digest, first_ranks[pod], FIRST) for pod in range(FIRST)
    }, logs(out)
    assert 0 not in found[FIRST]  # the fifth pod never ran round 0
    assert {pod: found[pod][1] for pod in range(ALL)} == {
        pod: (all_digest, all_ranks[pod], ALL) for pod in range(ALL)
    }, logs(out)
    assert {pod: (left[pod]["round"], left[pod]["nnodes"]) for pod in range(ALL)} == {
        pod: (1, ALL) for pod in range(ALL)
    }
    tor_of = {pod: TORS[pod][0] for pod in range(ALL)}
    for ranks in (first_ranks, all_ranks):
        edges, bound = cross_tor_edges(ranks, {pod: tor_of[pod] for pod in ranks})
        assert edges == bound == 2
    root_log = (out / "host0.log").read_text(errors="replace")
    assert "round 0 closed with 4 node(s)" in root_log
    assert "round 1 closed with 5 node(s)" in root_log
