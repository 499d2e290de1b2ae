"""Probe processes, one per (simulated) device, each joins one process group per rank order over
the same store and times the collective step by step in the same sequence; the process of
planned rank 0 leaves the samples in the store for node rank 0 to decide on.

Real parts: a torch TCPStore on loopback, real child processes (``python -m
npu_job.launcher.probe.worker``), gloo process groups on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from npu_job.launcher.probe import stats
from npu_job.launcher.probe.stats import PLANNED, SCHEDULER
from npu_job.launcher.probe.worker import (
    CONFIG_ENV,
    ProbeConfig,
    rings_key,
    samples_key,
    start,
)

from tests.machine_stalls import communicate

pytestmark = pytest.mark.torch
CAP = 120.0


def probe_processes(store, collective: str, planned, scheduler, sizes=(4096, 65536)):
    """Start one probe process per rank; their (returncode, stderr) once all ended."""
    world = len(planned)
    processes = []
    for planned_rank, scheduler_rank in zip(planned, scheduler):
        config = ProbeConfig(
            store_host="127.0.0.1",
            store_port=store.port,
            prefix="npu_run/test/probe/0",
            ranks={PLANNED: planned_rank, SCHEDULER: scheduler_rank},
            world_size=world,
            backend="gloo",
            device="cpu",
            collective=collective,
            sizes=tuple(sizes),
            iterations=3,
            warmup=1,
            inner=2,
            deadline=time.time() + CAP,
        )
        processes.append(start(config))
    return [(process, communicate(process, CAP)[1]) for process in processes]


@pytest.fixture
def store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=CAP))


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather"])
def test_both_orders_are_timed_alike_and_planned_rank_0_leaves_the_samples(store, collective):
    ended = probe_processes(store, collective, planned=[0, 1, 2, 3], scheduler=[2, 0, 3, 1])
    for process, errors in ended:
        assert process.returncode == 0, errors
    samples = [
        tuple(sample) for sample in json.loads(store.get(samples_key("npu_run/test/probe/0")))
    ]
    # the scheduler's group really runs in its own order: its rank g is the process whose
    # scheduler rank is g (planned ranks 1, 3, 0, 2)
    rings = json.loads(store.get(rings_key("npu_run/test/probe/0")))
    assert rings == {PLANNED: [0, 1, 2, 3], SCHEDULER: [1, 3, 0, 2]}
    assert len(samples) == 2 * 3 * 2  # sizes x iterations x orders, the warm-up untimed
    assert {(order, size) for order, size, _ in samples} == {
        (order, size) for order in stats.ORDERS for size in (4096, 65536)
    }
    assert all(seconds > 0 for _, _, seconds in samples)
    results = stats.size_results(samples, collective, 4)
    assert [result.size for result in results] == [4096, 65536]
    assert stats.decide(results).order in stats.ORDERS


def test_a_process_without_its_config_says_so_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "npu_job.launcher.probe.worker"],
        env={key: value for key, value in os.environ.items() if key != CONFIG_ENV},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr == f"npu-run: probe: {CONFIG_ENV} is not set\n"
