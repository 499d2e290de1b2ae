"""Test worker for the torchrun parity tests: records how it was started, and fails on request.

Writes ``<out_dir>/<RANK>.json``: its ``__name__``, ``sys.argv``, pid and parent pid, torchrun's
worker variables and ``sys.executable``, then prints ``worker <RANK> ran``. It imports torch only when asked (``--init-method``),
so that a launch of several workers stays cheap.

Options (after the output directory):
  --init-method URL  join a gloo group through URL (``env://``, ``tcp://host:port``), all_reduce
                     RANK + 1 and record the sum and torch.distributed.is_torchelastic_launched();
  --fail-rank R      global rank R fails (the others finish);
  --record           ... with its main under ``@record`` (so it leaves torch's error file);
  --hold             block until killed, after writing the record (the orphan test), deaf to
                     SIGINT: a worker stuck in C code (a collective that never returns) never
                     runs Python's SIGINT handler either.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TEST_SENTINEL_PARENT",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--init-method", default="")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--hold", action="store_true")
    options, _ = parser.parse_known_args()
    rank = int(os.environ["RANK"])
    found = {
        "name": __name__,
        "argv": sys.argv,
        "executable": sys.executable,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "env": {name: os.environ.get(name) for name in VARIABLES},
    }
    if options.init_method:
        import torch
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=options.init_method,
            rank=rank,
            world_size=int(os.environ["WORLD_SIZE"]),
        )
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        found.update(sum=value.item(), elastic=dist.is_torchelastic_launched())
        dist.destroy_process_group()
    path = os.path.join(options.out_dir, f"{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(found, handle)
    os.replace(path + ".tmp", path)
    print(f"worker {rank} ran", flush=True)
    if rank == options.fail_rank:
        raise RuntimeError(f"worker rank {rank} fails on purpose")
    if options.hold:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    while options.hold:
        time.sleep(1)


if __name__ == "__main__":
    if "--record" in sys.argv:
        from torch.distributed.elastic.multiprocessing.errors import record

        record(main)()
    else:
        main()
