"""One plan per rendezvous round, on real hosts (a network namespace each) with real agents.

Six pods under three ToRs train with gloo (``tests/launcher/workers/faulty.py``) under npu-run's
``parallel`` rendezvous. Each pod's bootstrap output is written into its private /tmp as the
bootstrap leaves it: ``npu_job_node.json`` (its report: node, pod index, ToR and slot) and
``route_plan.json`` (the rank it planned over every pod), into the host's own directory (its
``$NPU_JOB_OUTPUT_DIR``), and npu-run is started with that rank, as train.sh passes it, and the
master address of pod index 0.

* A pod is replaced by one on another node under another ToR: its agent is SIGKILLed, and a
  fresh one starts on a seventh host with the new report. Every node logs one new plan digest,
  the new order is at the ring's lower bound of cross-ToR edges (the scorer's rule), and training
  goes on within the restart budget. HCCL's rank table follows: each round's workers get a
  ``RANK_TABLE_FILE`` listing the servers in that round's order.
* A pod whose bootstrap fell back (its report has no placement, it comes as its pod index): the
  job runs in one order the root chose, and the root's log names that pod.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import pytest
from npu_job.bootstrap import scorer
from npu_job.bootstrap.base.model import Placement
from npu_job.bootstrap.nodereport import NodeReport, encode_report, plan_round
from npu_job.bootstrap.ranktable import parse_rank_table, rank_table_document
from npu_job.demo.synthetic import synthetic_cluster

from npu_job.podfacts import NODE_REPORT_FILE, ROUND_PLAN_FILE, ROUTE_PLAN_FILE
from tests.e2e.netns import NetnsCluster, leftovers, netns_unavailable_reason
from tests.launcher.cluster import TAG_VARIABLE, tagged_processes, training_node_argv, wait_for
from tests.machine_stalls import Cap, rerun_after_machine_stall, wait_process

PODS = 6
INTERVAL, ATTEMPTS = 1.0, 60  # a liveness window long enough for a replacement to start torch
REASON = netns_unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
    rerun_after_machine_stall(longer_than=INTERVAL * (ATTEMPTS - 1)),
]
# pod index -> (ToR, slot): each ToR's pods are not neighbours in scheduler order
TORS = {0: ("tor-c", 0), 1: ("tor-a", 0), 2: ("tor-b", 0), 3: ("tor-a", 1), 4: ("tor-b", 1)}
TORS[5] = ("tor-c", 1)
RANK_TABLE = "hccl.json"  # where the platform mounts the job's rank table (here: the host's /tmp)
PLAN_LINE = re.compile(r"npu-run: round (\d+) plan ([0-9a-f]+): node rank (\d+) of (\d+)$", re.M)


def report(pod: int, tor: Optional[Tuple[str, int]], node: str = "") -> NodeReport:
    return NodeReport(
        node_id=node or f"node-{pod}",
        pod_index=pod,
        pod_name=f"job-worker-{pod}",
        device_count=1,
        placement=None if tor is None else Placement(tors=(tor[0],), slot=tor[1]),
    )


def bootstrap(reports: Sequence[NodeReport]) -> Tuple[Dict[int, int], str]:
    """Every pod's planned rank and the mapping digest, as each pod's bootstrap computes them
    over all the pods (nodereport's tests hold plan_round to the bootstrap's own plan)."""
    planned = plan_round({str(r.pod_index): encode_report(r) for r in reports})
    return {r.pod_index: planned.node_rank[str(r.pod_index)] for r in reports}, (
        planned.mapping_digest
    )


def write_rank_table(tmp_dir: Path, node_ids: Sequence[str]) -> None:
    """The job's rank table as the platform mounts it on a pod: one server per node, by pod
    index (rewritten when a pod is replaced)."""
    table, _ = synthetic_cluster(len(node_ids), 1, npus_per_node=1, seed=0, job_name="job")
    servers = tuple(replace(s, server_id=n) for s, n in zip(table.servers, node_ids))
    document = rank_table_document(replace(table, servers=servers))
    (tmp_dir / RANK_TABLE).write_text(json.dumps(document))


def write_bootstrap_output(
    tmp_dir: Path, mine: NodeReport, rank: int, digest: Optional[str]
) -> None:
    """What a pod's bootstrap leaves in /tmp (None digest: it could not plan)."""
    (tmp_dir / NODE_REPORT_FILE).write_bytes(encode_report(mine))
    route_plan = {
        "status": "failed" if digest is None else "success",
        "mapping_digest": digest,
        "node_rank": rank,
        "pod_index": mine.pod_index,
        "rank_table": str(tmp_dir / RANK_TABLE),
    }
    (tmp_dir / ROUTE_PLAN_FILE).write_text(json.dumps(route_plan))


def servers_of(path: str) -> List[str]:
    return [server.server_id for server in parse_rank_table(Path(path).read_bytes(), path).servers]


def start_pod(
    cluster: NetnsCluster,
    host: int,
    rank: int,
    out: Path,
    done: Path,
    tag: str,
    port: int,
    nnodes: str = str(PODS),
    rdzv_conf: str = "",
) -> subprocess.Popen:
    """npu-run on ``host`` as pod ``rank``'s agent (``nnodes``: ``--nnodes``, MIN:MAX for an
    elastic job; ``rdzv_conf``: more ``--rdzv_conf`` settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("VC_TASK_INDEX", None)
    env.pop("RANK_AFTER_ACC", None)
    env.update(
        {
            TAG_VARIABLE: tag,
            "GLOO_SOCKET_IFNAME": "eth0",
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5",
            # the host's own directory for the bootstrap's files (its /tmp in a pod)
            "NPU_JOB_OUTPUT_DIR": str(cluster.hosts[host].tmp_dir),
        }
    )
    with open(out / f"host{host}.log", "ab") as log:
        return subprocess.Popen(
            [
                *cluster.prefix(host),
                *training_node_argv(
                    nnodes,
                    rank,
                    cluster.hosts[0].ip,  # pod index 0's stable address
                    port,
                    f"join_timeout=120,timeout=60,keep_alive_interval={INTERVAL:g},"
                    f"keep_alive_max_attempt={ATTEMPTS}{rdzv_conf}",
                    out,
                    done,
                    extra=["--max_restarts=2"],
                ),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def finish(agents: Sequence[subprocess.Popen], done: Path, job: str) -> List[int]:
    """Tell the workers to finish; every agent's exit code, once none of the job's processes is
    left."""
    done.write_text("go")
    finished = Cap(90)
    codes = [wait_process(agent, finished) for agent in agents]
    wait_for(lambda: not tagged_processes(job), 30, "the job's processes to end")
    return codes


def records(out: Path) -> Dict[int, Dict[str, str]]:
    """What each rank's worker recorded of its start (the latest attempt's)."""
    found = {}
    for rank in range(PODS):
        path = out / f"{rank}.json"
        if path.exists():
            found[rank] = json.loads(path.read_text())
    return found


def worker_pids(out: Path) -> Dict[int, int]:
    return {rank: int(record["pid"]) for rank, record in records(out).items()}


def logs(out: Path) -> str:
    return "\n".join(
        f"--- {path.name} ---\n{path.read_text(errors='replace')}"
        for path in sorted(out.glob("host*.log"))
    )


def plans(out: Path, host: int) -> Dict[int, Tuple[str, int]]:
    """round -> (digest, node rank) from the plan lines of ``host``'s log."""
    text = (out / f"host{host}.log").read_text(errors="replace")
    return {int(m[1]): (m[2], int(m[3])) for m in PLAN_LINE.finditer(text)}


def cross_tor_edges(rank_of: Mapping[int, int], tor_of: Mapping[int, str]) -> Tuple[int, int]:
    """The ring's cross-ToR edges of the order, and the lower bound (scorer's rules)."""
    pods = sorted(rank_of)
    keys = [(tor_of[pod],) for pod in pods]
    order = sorted(range(len(pods)), key=lambda position: rank_of[pods[position]])
    return (
        scorer.ring_cross_edges(order, keys),
        scorer.ring_lower_bound(range(len(pods)), keys),
    )


def new_job(tmp_path: Path, name: str) -> Tuple[str, str, Path, Path]:
    """A test job's tag (its namespaces' and processes' mark), name, output directory (made) and
    the file whose existence tells its workers to finish."""
    tag = f"{name[0]}{os.getpid() % 10000}"
    out, done = tmp_path / "out", tmp_path / "done"
    out.mkdir()
    return tag, f"{name}-{tag}", out, done


def test_a_replaced_pod_under_another_tor_is_replanned_and_training_goes_on(tmp_path):
    tag, job, out, done = new_job(tmp_path, "replan")
    reports = [report(pod, TORS[pod]) for pod in range(PODS)]
    ranks, digest = bootstrap(reports)
    victim = next(pod for pod, rank in ranks.items() if rank == 2)
    moved = report(victim, ("tor-c", 2), node="node-spare")  # another node, another ToR
    new_ranks, new_digest = bootstrap([moved if r.pod_index == victim else r for r in reports])
    assert new_digest != digest
    with NetnsCluster(PODS + 1, tag=tag) as cluster:
        node_ids = [r.node_id for r in reports]
        new_node_ids = [moved.node_id if pod == victim else node_ids[pod] for pod in range(PODS)]
        for pod in range(PODS):
            write_bootstrap_output(cluster.hosts[pod].tmp_dir, reports[pod], ranks[pod], digest)
            write_rank_table(cluster.hosts[pod].tmp_dir, node_ids)
        write_bootstrap_output(cluster.hosts[PODS].tmp_dir, moved, new_ranks[victim], new_digest)
        write_rank_table(cluster.hosts[PODS].tmp_dir, new_node_ids)
        agents = {
            pod: start_pod(cluster, pod, ranks[pod], out, done, job, 29660) for pod in range(PODS)
        }
        wait_for(
            lambda: (
                len(worker_pids(out)) == PODS or any(a.poll() is not None for a in agents.values())
            ),
            240,
            "every worker training",
        )
        before = worker_pids(out)
        assert len(before) == PODS, logs(out)
        assert {pod: plans(out, pod)[0] for pod in range(PODS)} == {
            pod: (digest, ranks[pod]) for pod in range(PODS)
        }, logs(out)

        first_tables = {
            rank: servers_of(record["RANK_TABLE_FILE"]) for rank, record in records(out).items()
        }
        agents[victim].send_signal(signal.SIGKILL)  # the pod is gone with its node
        assert wait_process(agents[victim], Cap(30)) == -signal.SIGKILL
        for pod in range(PODS):  # the platform rewrites the table for the new set of nodes
            write_rank_table(cluster.hosts[pod].tmp_dir, new_node_ids)
        agents[victim] = start_pod(cluster, PODS, new_ranks[victim], out, done, job, 29660)
        wait_for(
            lambda: (
                all(pid not in before.values() for pid in worker_pids(out).values())
                or any(a.poll() is not None for a in agents.values())
            ),
            240,
            "every worker training again",
        )
        alive = {pod: agent.poll() for pod, agent in agents.items()}
        assert all(code is None for code in alive.values()), (alive, logs(out))
        last_tables = {  # each worker's rank table, read while the hosts' files are there
            rank: servers_of(record["RANK_TABLE_FILE"]) for rank, record in records(out).items()
        }
        codes = finish(list(agents.values()), done, job)
        left = {  # what each node left for its workers
            host: json.loads((cluster.hosts[host].tmp_dir / ROUND_PLAN_FILE).read_text())
            for host in range(PODS + 1)
        }
    assert leftovers(tag) == []
    assert codes == [0] * PODS, logs(out)

    hosts = {pod: pod for pod in range(PODS)}
    hosts[victim] = PODS
    last = {pod: max(plans(out, host)) for pod, host in hosts.items()}
    replanned = {pod: plans(out, host)[last[pod]] for pod, host in hosts.items()}
    assert len(set(last.values())) == 1 and last[0] >= 1, logs(out)
    assert {found_digest for found_digest, _ in replanned.values()} == {new_digest}
    assert {pod: rank for pod, (_, rank) in replanned.items()} == new_ranks
    assert {  # the last round's plan, as each node's log says
        pod: (left[host]["round"], left[host]["mapping_digest"], left[host]["node_rank"])
        for pod, host in hosts.items()
    } == {pod: (last[pod], new_digest, new_ranks[pod]) for pod in hosts}
    # HCCL's rank table follows the ranks: every worker of the first round read it in the
    # bootstrap's order, every worker after the replacement in the new round's order
    in_order = sorted(range(PODS), key=lambda pod: ranks[pod])
    assert first_tables == {rank: [node_ids[pod] for pod in in_order] for rank in range(PODS)}
    new_order = [new_node_ids[pod] for pod in sorted(range(PODS), key=lambda pod: new_ranks[pod])]
    assert last_tables == {rank: new_order for rank in range(PODS)}
    tor_of = {pod: (moved if pod == victim else reports[pod]).placement.tors[0] for pod in hosts}
    edges, bound = cross_tor_edges(new_ranks, tor_of)
    assert edges == bound == 3


def test_a_pod_whose_bootstrap_fell_back_runs_in_the_roots_order_and_is_named(tmp_path):
    tag, job, out, done = new_job(tmp_path, "fallback")
    reports = [report(pod, TORS[pod]) for pod in range(PODS)]
    ranks, digest = bootstrap(reports)
    fallen = 3  # its bootstrap could not plan: no placement, its pod index as its rank
    reports[fallen] = report(fallen, None)
    with NetnsCluster(PODS, tag=tag) as cluster:
        for pod in range(PODS):
            write_bootstrap_output(
                cluster.hosts[pod].tmp_dir,
                reports[pod],
                fallen if pod == fallen else ranks[pod],
                None if pod == fallen else digest,
            )
        agents = [
            start_pod(cluster, pod, fallen if pod == fallen else ranks[pod], out, done, job, 29670)
            for pod in range(PODS)
        ]
        wait_for(
            lambda: len(worker_pids(out)) == PODS or any(a.poll() is not None for a in agents),
            240,
            "every worker training",
        )
        assert len(worker_pids(out)) == PODS, logs(out)
        codes = finish(agents, done, job)
    assert leftovers(tag) == []
    assert codes == [0] * PODS, logs(out)
    round_0 = [plans(out, pod)[0] for pod in range(PODS)]
    assert len({found for found, _ in round_0}) == 1, logs(out)
    assert sorted(rank for _, rank in round_0) == list(range(PODS))
    root_log = (out / "host0.log").read_text(errors="replace")
    (named,) = [line for line in root_log.splitlines() if "re-ranked" in line]
    assert f"pod job-worker-{fallen} (its bootstrap did not plan: scheduler order" in named
