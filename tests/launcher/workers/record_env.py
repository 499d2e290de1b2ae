"""Test worker: joins the default process group the way an unmodified script does, then records.

``dist.init_process_group("gloo")`` with env:// and no ``rank=``/``world_size=`` (the call
torch_npu_run's tiered store cannot serve), one ``all_reduce`` of ``RANK + 1``, then
``<out_dir>/<RANK>.json`` with the worker's torchrun environment, the sum and its node's
``NPU_JOB_OUTPUT_DIR`` (which pod it runs on). Like torch's own
launcher tests, the test asserts these files from outside.

Options (after the output directory):
  --fail-rank R        raise on global rank R while TORCHELASTIC_RESTART_COUNT is 0 (before
                       joining the group), to exercise the agent's group restart;
  --hold-until PATH    after writing the record, keep the process group (and so its store
                       connections) open until PATH exists, so the test can count connections;
  --killed-recording R global rank R truncates its error file, as ``@record`` does first when it
                       writes one, and SIGKILLs itself: a worker killed in mid-write (by the OOM
                       killer, or by its agent stopping it while it was failing too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
)


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--hold-until", default="")
    parser.add_argument("--killed-recording", type=int, default=-1)
    options = parser.parse_args()

    rank = int(os.environ["RANK"])
    if rank == options.killed_recording:
        open(os.environ["TORCHELASTIC_ERROR_FILE"], "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == options.fail_rank and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        raise RuntimeError(f"worker rank {rank} fails on purpose before restart 1")

    dist.init_process_group("gloo")
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    record_ = {name: os.environ.get(name) for name in TORCHRUN_VARIABLES}
    record_.update(
        pid=os.getpid(),
        sum=value.item(),
        pg_rank=dist.get_rank(),
        pg_world_size=dist.get_world_size(),
        output_dir=os.environ.get("NPU_JOB_OUTPUT_DIR"),  # which node (pod) this worker is on
    )
    path = os.path.join(options.out_dir, f"{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record_, handle)
    os.replace(path + ".tmp", path)
    if options.hold_until:
        deadline = time.monotonic() + 60
        while not os.path.exists(options.hold_until) and time.monotonic() < deadline:
            time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)
