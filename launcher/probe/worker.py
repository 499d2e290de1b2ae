"""One probe process (the edge): times the job's collective on one device under both rank orders.

npu-run starts one per device, as it starts the workers, with :data:`CONFIG_ENV` holding a
:class:`ProbeConfig` (``python -m npu_job.launcher.probe.worker``). Each process joins two
process groups of the job's backend over the same store, one per order (:data:`~.stats.ORDERS`),
each under its own key prefix and with this process's rank in that order (each group's ring,
the processes by planned rank in its rank order, is gathered first), then runs
:func:`~.stats.schedule`'s steps in the same sequence on every process: a barrier on the step's
group, ``inner`` collectives back to back, the device synchronised, and the slowest rank's time
(an all_reduce MAX on that group, untimed). The process of planned rank 0 writes the samples
(:func:`samples_key`) and the rings (:func:`rings_key`) to the store as JSON, for node rank 0
to decide on.

The groups are built with the backend's own ``ProcessGroup`` class, not
``init_process_group``: the default group stays untouched, and two orders live side by side (a
``new_group`` sorts its ranks, so it cannot change the ring's order). Their timeout is the time
left of the probe's budget, so no process outlives it in a collective; npu-run kills any that
does.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Tuple

import npu_job

from . import stats

CONFIG_ENV = "NPU_RUN_PROBE_CONFIG"


@dataclass(frozen=True)
class ProbeConfig:
    """What one probe process needs, passed as JSON in :data:`CONFIG_ENV`."""

    store_host: str
    store_port: int
    prefix: str  # the store keys of this probe (per rendezvous round)
    ranks: Dict[str, int]  # this process's global rank in each order
    world_size: int
    backend: str  # gloo, nccl or hccl
    device: str  # "cpu", "cuda:<i>" or "npu:<i>"
    collective: str
    sizes: Tuple[int, ...]  # bytes
    iterations: int
    warmup: int
    inner: int  # collectives back to back in one timed step
    deadline: float  # time.time() by which the probe must be over

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProbeConfig:
        values = json.loads(text)
        values["sizes"] = tuple(values["sizes"])
        return cls(**values)


def child_env(config: ProbeConfig, environ: Dict[str, str]) -> Dict[str, str]:
    """The probe process's environment: ``environ`` with ``config``, and, where npu-run runs from
    the job's bundle (``npu_job`` is imported from a file, ``.../npu-job.pyz/npu_job``), that file
    first on ``PYTHONPATH``, since a fresh interpreter finds the bundle's modules only there."""
    env = {**environ, CONFIG_ENV: config.to_json()}
    bundle = os.path.dirname(os.path.dirname(os.path.abspath(npu_job.__file__)))
    if os.path.isfile(bundle):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [bundle, environ.get("PYTHONPATH")]))
    return env


def start(config: ProbeConfig) -> subprocess.Popen:
    """One probe process for ``config`` (its stderr a pipe, for the reason of a failure)."""
    return subprocess.Popen(
        [sys.executable, "-m", "npu_job.launcher.probe.worker"],
        env=child_env(config, dict(os.environ)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def samples_key(prefix: str) -> str:
    return f"{prefix}/samples"


def rings_key(prefix: str) -> str:
    """Each order's processes by their planned rank, in that order's rank order (JSON)."""
    return f"{prefix}/rings"


def _ring(group: Any, planned_rank: int, world: int, device: Any) -> List[int]:
    """The planned ranks of the group's processes, in the group's rank order."""
    import torch

    mine = torch.tensor([planned_rank], device=device)
    everyone = [torch.zeros(1, dtype=mine.dtype, device=device) for _ in range(world)]
    group.allgather([everyone], [mine]).wait()
    return [int(rank.item()) for rank in everyone]


def _group(backend: str, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    import torch.distributed as dist

    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    if backend == "nccl":
        # the constructor takes its timeout in its options
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    if backend == "hccl":
        import torch_npu

        hccl = torch_npu._C._distributed_c10d
        options = hccl.ProcessGroupHCCL.Options()
        options._timeout = timeout
        return hccl.ProcessGroupHCCL(store, rank, size, options)
    raise ValueError(f"backend must be gloo, nccl or hccl, got {backend!r}")


def _collective(group: Any, collective: str, tensor: Any, outputs: List[Any]) -> Any:
    if collective == "all_reduce":
        return group.allreduce([tensor])
    if collective == "all_gather":
        return group.allgather([outputs], [tensor])
    if collective == "reduce_scatter":
        return group.reduce_scatter([tensor], [outputs])
    if collective == "broadcast":
        return group.broadcast([tensor])
    raise ValueError(f"collective must be one of {', '.join(stats.COLLECTIVES)}")


def _buffers(collective: str, size: int, world: int, device: Any) -> Tuple[Any, List[Any]]:
    """The tensor and the per-rank list of one step, ``size`` bytes as nccl-tests counts them
    (float32): the whole output of all_gather, the whole input of reduce_scatter."""
    import torch

    elements = max(1, size // 4)
    if collective in ("all_gather", "reduce_scatter"):
        per_rank = max(1, elements // world)
        return torch.ones(per_rank, device=device), [
            torch.ones(per_rank, device=device) for _ in range(world)
        ]
    return torch.ones(elements, device=device), []


def run(config: ProbeConfig) -> List[Tuple[str, int, float]]:
    """Run every step of the schedule; the samples (order, size, slowest rank's seconds per
    collective) of the timed steps."""
    import torch
    import torch.distributed as dist

    device = torch.device(config.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    left = max(1.0, config.deadline - time.time())
    timeout = datetime.timedelta(seconds=left)
    store = dist.TCPStore(config.store_host, config.store_port, is_master=False, timeout=timeout)
    groups = {
        order: _group(
            config.backend,
            dist.PrefixStore(f"{config.prefix}/{order}", store),
            config.ranks[order],
            config.world_size,
            timeout,
        )
        for order in stats.ORDERS
    }
    rings = {
        order: _ring(group, config.ranks[stats.PLANNED], config.world_size, device)
        for order, group in groups.items()
    }
    maximum = dist.AllreduceOptions()
    maximum.reduceOp = dist.ReduceOp.MAX  # type: ignore[assignment]  # pybind converts it
    samples: List[Tuple[str, int, float]] = []
    buffers = {
        size: _buffers(config.collective, size, config.world_size, device) for size in config.sizes
    }
    for order, size, timed in stats.schedule(config.sizes, config.iterations, config.warmup):
        group = groups[order]
        tensor, outputs = buffers[size]
        group.barrier().wait()
        start = time.perf_counter()
        for _ in range(config.inner):
            _collective(group, config.collective, tensor, outputs).wait()
        if device.type != "cpu":
            getattr(torch, device.type).synchronize(device)
        elapsed = torch.tensor([(time.perf_counter() - start) / config.inner], device=device)
        group.allreduce([elapsed], maximum).wait()
        if timed:
            samples.append((order, size, float(elapsed.item())))
    if config.ranks[stats.PLANNED] == 0:
        store.set(rings_key(config.prefix), json.dumps(rings, sort_keys=True))
        store.set(samples_key(config.prefix), json.dumps(samples))
    return samples


def main() -> int:
    text = os.environ.get(CONFIG_ENV)
    if not text:
        print(f"npu-run: probe: {CONFIG_ENV} is not set", file=sys.stderr)
        return 2
    run(ProbeConfig.from_json(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
