"""Test worker for the fault tests: trains (all_reduce every 0.1 s) until told to stop or fail.

``dist.init_process_group("gloo")`` with env://, then ``<out_dir>/<RANK>.json`` with the
worker's pid and store address, then all_reduce rounds until a file appears. Every round also
agrees on whether to stop (a max all_reduce), so all ranks leave the loop together. With
``@record``, a failure leaves torch's error file, as in a real training script.

Options (after the output directory):
  --hold-until PATH   train until PATH exists on any rank, then finish cleanly;
  --fail-rank R       the rank that fails;
  --fail-when PATH    ... during training once PATH exists (first attempt only);
  --always            ... on every attempt, before joining the group (--fail-when unset);
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def fail(rank: int, attempt: str) -> None:
    raise RuntimeError(f"worker rank {rank} fails on purpose (attempt {attempt})")


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--hold-until", default="")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-when", default="")
    parser.add_argument("--always", action="store_true")
    options = parser.parse_args()

    rank = int(os.environ["RANK"])
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    mine = rank == options.fail_rank
    if mine and options.always:
        fail(rank, attempt)
    dist.init_process_group("gloo")
    record_ = {
        "pid": os.getpid(),
        "attempt": attempt,
        "MASTER_PORT": os.environ["MASTER_PORT"],
        "WORLD_SIZE": os.environ["WORLD_SIZE"],
        "RANK_TABLE_FILE": os.environ.get("RANK_TABLE_FILE", ""),
    }
    path = os.path.join(options.out_dir, f"{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record_, handle)
    os.replace(path + ".tmp", path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if mine and attempt == "0" and options.fail_when and os.path.exists(options.fail_when):
            fail(rank, attempt)
        done = torch.tensor(
            [float(bool(options.hold_until) and os.path.exists(options.hold_until))]
        )
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item() > 0:
            break
        time.sleep(0.1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)
