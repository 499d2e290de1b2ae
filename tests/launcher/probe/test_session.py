"""A probe round across nodes: every node starts its probe processes, node rank 0 decides, and
every node follows the one decision it publishes; a probe that fails or runs out of time keeps the
plan on every node, and the store holds none of the probe's keys afterwards.

Real parts: a torch TCPStore on loopback, each node's part in a thread of its own with a store
client of its own (as each node's agent has), real probe processes on gloo.
"""

from __future__ import annotations

import os
import re
import threading
from datetime import timedelta

import pytest
from npu_job.launcher import torchcompat
from npu_job.launcher.probe import session, stats, worker
from npu_job.launcher.probe.stats import PLANNED, SCHEDULER

from tests.launcher.cluster import alive, descendants, is_probe_process
from tests.machine_stalls import wait_until

pytestmark = pytest.mark.torch
CAP = 180.0
PREFIX = "npu_run/test/probe/0"


@pytest.fixture
def store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=CAP))


def run_nodes(store, settings, node_ranks, devices=("cpu",)):
    """Each node's probe_round in a thread; their decisions by planned node rank."""
    import torch.distributed as dist

    decisions = {}
    errors = []

    def node(planned: int, scheduler: int) -> None:
        try:
            client = dist.TCPStore(
                "127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=CAP)
            )
            probe = session.NodeProbe(
                node_ranks={PLANNED: planned, SCHEDULER: scheduler},
                nnodes=len(node_ranks),
                nproc=len(devices),
                backend="gloo",
                devices=devices,
                store_host="127.0.0.1",
                store_port=store.port,
                prefix=PREFIX,
            )
            decisions[planned] = session.probe_round(
                client, probe, settings, predicted=2.0, digests={PLANNED: "p", SCHEDULER: "s"}
            )
        except BaseException as error:  # the test fails on it below
            errors.append(error)

    threads = [threading.Thread(target=node, args=ranks) for ranks in node_ranks]
    for thread in threads:
        thread.start()
    wait_until(lambda: not any(t.is_alive() for t in threads), CAP, "every node's probe round")
    assert not errors, errors
    return decisions


def probe_keys(store, nnodes=3):
    """The probe's keys left in the store. Before torch 2.10 no client lists keys, and the
    process groups' own keys stay (docs/launcher.md says so): there, the probe's own keys, its
    count, decision, samples, rings and each node's failure, must be gone."""
    if torchcompat.HAS_LIST_KEYS:
        return [key for key in store.list_keys() if key.startswith(PREFIX)]
    keys = session._keys(PREFIX)
    own = [*keys.values(), worker.samples_key(PREFIX), worker.rings_key(PREFIX)]
    own += [f"{keys['failed']}/{rank}" for rank in range(nnodes)]
    return [key for key in own if torchcompat.key_exists(store, key)]


SMALL = session.ProbeSettings(sizes=(4096, 16384), iterations=2, warmup=1, inner=1, budget=150)


def test_every_node_follows_node_rank_0s_one_decision_and_no_probe_key_is_left(store):
    decisions = run_nodes(store, SMALL, [(0, 1), (1, 2), (2, 0)])
    assert sorted(decisions) == [0, 1, 2]
    first = decisions[0]
    assert all(decision == first for decision in decisions.values())
    assert first.order in stats.ORDERS and [r.size for r in first.results] == [4096, 16384]
    assert first.predicted == 2.0 and dict(first.digests) == {PLANNED: "p", SCHEDULER: "s"}
    assert probe_keys(store) == []


def test_a_failed_probe_process_keeps_the_plan_on_every_node_and_says_why(store):
    # a device the CPU build of torch has not: the probe process of local rank 1 fails at once
    decisions = run_nodes(
        store,
        session.ProbeSettings(sizes=(4096,), iterations=1, warmup=0, inner=1, budget=150),
        [(0, 1), (1, 0)],
        devices=("cpu", "cuda:0"),
    )
    reasons = {decision.reason for decision in decisions.values()}
    assert all(decision.keeps_plan and not decision.results for decision in decisions.values())
    assert len(reasons) == 1, reasons
    (reason,) = reasons
    # whichever node's failure node rank 0 saw first, named by its node rank
    pattern = r"the probe failed on node rank [01]: the probe process of local rank 1 failed: "
    assert re.match(pattern, reason), reason
    assert reason.endswith(": keeping the plan")
    assert probe_keys(store) == []


def test_a_probe_past_its_budget_is_ended_and_keeps_the_plan_on_every_node(store):
    # a second is less than a probe process takes to import torch
    decisions = run_nodes(store, session.ProbeSettings(budget=1.0), [(0, 1), (1, 0)])
    assert {decision.reason for decision in decisions.values()} == {
        "did not finish within its budget: keeping the plan"
    }
    assert probe_keys(store) == []


class Stopped(BaseException):
    """What an agent's watch raises once the job has stopped (its JobStopped)."""


def test_a_stopped_job_ends_the_probe_at_once_and_kills_its_processes(store):
    """One node of two: its probe process waits for the other's, which never comes. Once the
    process runs, the agent's watch says the job stopped; probe_round raises that, well before
    the budget, and leaves no probe process behind."""
    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=CAP))
    probe = session.NodeProbe(
        node_ranks={PLANNED: 0, SCHEDULER: 1},
        nnodes=2,
        nproc=1,
        backend="gloo",
        devices=("cpu",),
        store_host="127.0.0.1",
        store_port=store.port,
        prefix=PREFIX,
    )
    children = []

    def check_stopped() -> None:
        if not children:
            children.extend(filter(is_probe_process, descendants(os.getpid())[1:]))
        if children:
            raise Stopped()

    with pytest.raises(Stopped):
        session.probe_round(client, probe, SMALL, check_stopped=check_stopped)
    assert children and all(not alive(pid) for pid in children)
