"""A small, real DDP training run that checks the launch it was given.

Start it like any torchrun script (``npu-run``, ``torchrun``); it reads torchrun's worker
environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT) and

1. checks its global rank against the plan of npu-run's rendezvous round, where npu-run left one
   (``npu_job_round.json`` beside the bootstrap's files: after a replaced pod the round's plan
   moves ranks away from what the bootstrap planned); else against the plan the pod's bootstrap
   wrote: the node rank this pod
   (``VC_TASK_INDEX``; on a job kind whose index variable train.sh unsets, the ``pod_index`` the
   bootstrap found itself at in the route plan, else ``$RANK_AFTER_ACC``, which the pod command set
   to that variable) should have is read from the route-plan JSON
   (``rank_mapping`` ``"newRank-podIndex,..."``), else from ``/tmp/RANK_AFTER_ACC``, else it is the
   pod index (scheduler order); the expected rank is ``node_rank * LOCAL_WORLD_SIZE + LOCAL_RANK``;
2. trains a tiny MLP on synthetic regression data (fixed seed, a different shard per rank) with
   DistributedDataParallel — gloo on CPU, nccl on GPU, hccl on NPU when torch_npu is present;
3. all-gathers a sha256 of the trained parameters and checks every rank holds the same model;
4. checks that the globally averaged loss went down;
5. writes ``<report-dir>/rank-<RANK>.json`` (atomically) with all of the above.

With ``--checkpoint-dir`` rank 0 saves a checkpoint every ``--checkpoint-every`` steps and a
restarted job resumes from it (the data of step ``s`` depends only on the seed, ``s`` and the
rank, so a resumed run follows the same trajectory).

Exit status: 0 when every check passed, 1 when a check failed (the report says which), and
torch's own error when the process group breaks (a peer died): never a hang, thanks to
``--timeout``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# The pod's facts as npu-job spells them (npu_job.podfacts; tests/test_podfacts.py holds these
# copies to it): like any training script, this one runs where the image has torch and no npu-job,
# which comes in the job's bundle for the bootstrap and npu-run only.
OUTPUT_DIR = "/tmp"
OUTPUT_DIR_ENV = "NPU_JOB_OUTPUT_DIR"
RANK_FILE = "RANK_AFTER_ACC"
RANK_ENV = "RANK_AFTER_ACC"
ROUTE_PLAN_FILE = "route_plan.json"
ROUND_PLAN_FILE = "npu_job_round.json"
TASK_INDEX_ENV = "VC_TASK_INDEX"

REPORT_VERSION = 1
CHECKPOINT_NAME = "checkpoint.pt"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps (default 30)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--hidden", type=int, default=32, help="hidden width of the MLP")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=1234, help="seed of model and data")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda", "npu"], default="auto")
    parser.add_argument(
        "--report-dir",
        default=os.environ.get("NPU_JOB_REPORT_DIR"),
        help="write rank-<RANK>.json here (default $NPU_JOB_REPORT_DIR; none if unset)",
    )
    parser.add_argument(
        "--route-plan",
        default=os.environ.get("NPU_JOB_ROUTE_PLAN"),
        help="the bootstrap's route-plan JSON (default "
        f"$NPU_JOB_ROUTE_PLAN, else $NPU_JOB_OUTPUT_DIR or /tmp / {ROUTE_PLAN_FILE})",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="shared directory for checkpoint/resume (rank 0 writes)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument(
        "--step-delay",
        type=float,
        default=0.0,
        help="sleep seconds after each step (to leave time for fault tests)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a collective may block before the run fails (no hangs)",
    )
    return parser.parse_args(argv)


# -- the launch we were given, and the one the plan says we should have ----------------------
def env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def parse_rank_mapping(mapping: str) -> Dict[int, int]:
    """``"newRank-podIndex,..."`` -> {pod index: new node rank}."""
    node_rank_of_pod: Dict[int, int] = {}
    for pair in mapping.split(","):
        new_rank, pod_index = pair.strip().split("-")
        node_rank_of_pod[int(pod_index)] = int(new_rank)
    return node_rank_of_pod


def route_plan_pod(route_plan: Path) -> Tuple[bool, Optional[int]]:
    """Whether the bootstrap's plan was used (``$RANK_AFTER_ACC`` is then the planned rank, not
    the pod's index), and the pod index it found this pod at (None where it says none)."""
    try:
        plan = json.loads(read_text(route_plan) or "{}")
    except ValueError:
        return False, None
    if not isinstance(plan, dict):
        return False, None
    index = plan.get("pod_index")
    found = index if isinstance(index, int) and not isinstance(index, bool) else None
    return plan.get("status") == "success", found


def round_node_rank(round_plan: Path) -> Optional[Tuple[int, str]]:
    """This node's rank in npu-run's latest rendezvous round and where it came from, or None
    where npu-run left no round plan (torchrun, or no bootstrap ran)."""
    try:
        plan = json.loads(read_text(round_plan) or "null")
    except ValueError:
        return None
    if not isinstance(plan, dict):
        return None
    rank = plan.get("node_rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        return None
    return rank, f"npu-run's round {plan.get('round')} plan {plan.get('mapping_digest')}"


def planned_node_rank(
    pod_index: Optional[int], route_plan: Path, rank_file: Path
) -> Tuple[Optional[int], str, List[str]]:
    """The node rank the bootstrap planned for this pod, where that came from, and problems."""
    problems: List[str] = []
    from_file: Optional[int] = None
    text = read_text(rank_file)
    if text:
        try:
            from_file = int(text)
        except ValueError:
            problems.append(f"{rank_file}: not an integer: {text!r}")
    plan_text = read_text(route_plan)
    if plan_text and pod_index is not None:
        try:
            plan = json.loads(plan_text)
        except ValueError as error:
            problems.append(f"{route_plan}: not JSON: {error}")
            plan = {}
        if plan.get("status") == "success" and plan.get("rank_mapping"):
            mapping = parse_rank_mapping(str(plan["rank_mapping"]))
            if pod_index not in mapping:
                problems.append(f"{route_plan}: rank_mapping has no pod index {pod_index}")
                return None, "route-plan", problems
            planned = mapping[pod_index]
            if from_file is not None and from_file != planned:
                problems.append(f"{rank_file} says {from_file} but the route plan says {planned}")
            return planned, "route-plan", problems
    if from_file is not None:
        return from_file, RANK_FILE, problems
    if pod_index is not None:
        return pod_index, "the pod index (scheduler order)", problems
    return None, "unknown (not in a pod)", problems


# -- model, data, device ----------------------------------------------------------------------
def pick_device(choice: str) -> Tuple[str, str]:
    """(torch device type, process-group backend)."""
    if choice in ("auto", "npu"):
        try:
            import torch_npu  # noqa: F401  (registers the npu device and hccl)

            if torch.npu.is_available():  # type: ignore[attr-defined]
                return "npu", "hccl"
        except ImportError as missing:
            if choice == "npu":
                raise SystemExit("--device npu: torch_npu is not installed") from missing
    if choice in ("auto", "cuda") and torch.cuda.is_available():
        return "cuda", "nccl"
    if choice == "cuda":
        raise SystemExit("--device cuda: no CUDA device")
    return "cpu", "gloo"


def make_model(hidden: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def batch(seed: int, step: int, rank: int, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Synthetic regression data: a fixed smooth target plus a little noise, per (step, rank)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    inputs = torch.randn(size, 8, generator=generator)
    weights = torch.linspace(-1.0, 1.0, 8)
    target = torch.sin(inputs @ weights).unsqueeze(1) + 0.01 * torch.randn(
        size, 1, generator=generator
    )
    return inputs, target


def evaluate(model: nn.Module, seed: int, device: torch.device) -> float:
    """MSE on a fixed held-out batch, the same on every rank and every (re)start."""
    inputs, target = batch(seed, -1, 0, 512)
    with torch.no_grad():
        return nn.functional.mse_loss(model(inputs.to(device)), target.to(device)).item()


def parameter_digest(model: nn.Module) -> str:
    """sha256 of the parameters' exact bytes (torch alone: numpy is not a dependency of torch)."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        digest.update(bytes(raw.tolist()))
    return digest.hexdigest()


# -- checkpoint -------------------------------------------------------------------------------
def load_checkpoint(directory: Optional[str], model: nn.Module) -> int:
    """Load rank 0's checkpoint (parameters reach the others via DDP's broadcast); next step."""
    if not directory:
        return 0
    path = Path(directory) / CHECKPOINT_NAME
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    return int(state["next_step"])


def write_atomic(path: Path, data: Union[str, bytes]) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: a reader (another rank,
    a restarted job) sees the old file or the new one, never half of one."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(payload)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def save_checkpoint(directory: str, model: nn.Module, next_step: int) -> None:
    import io

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "next_step": next_step}, buffer)
    write_atomic(Path(directory) / CHECKPOINT_NAME, buffer.getvalue())


# -- main -------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    env_rank = env_int("RANK")
    local_rank = env_int("LOCAL_RANK") or 0
    local_world = env_int("LOCAL_WORLD_SIZE") or 1
    group_rank = env_int("GROUP_RANK")
    output_dir = Path(os.environ.get(OUTPUT_DIR_ENV) or OUTPUT_DIR)
    route_plan = Path(args.route_plan) if args.route_plan else output_dir / ROUTE_PLAN_FILE
    pod_index = env_int(TASK_INDEX_ENV)
    if pod_index is None:  # a kind whose index variable train.sh unsets (PyTorchJob's, ...)
        planned, pod_index = route_plan_pod(route_plan)
        if pod_index is None and not planned:  # the pod command's copy of that variable
            pod_index = env_int(RANK_ENV)
    node_rank, source, problems = planned_node_rank(pod_index, route_plan, output_dir / RANK_FILE)
    in_round = round_node_rank(output_dir / ROUND_PLAN_FILE)
    if in_round is not None:  # the rendezvous planned this round: its ranks are the ones to hold
        node_rank, source = in_round

    device_type, backend = pick_device(args.device)
    if device_type != "cpu":
        getattr(torch, device_type).set_device(local_rank)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(device_type, local_rank) if device_type != "cpu" else torch.device("cpu")

    expected_rank = node_rank * local_world + local_rank if node_rank is not None else None
    if env_rank != rank:
        problems.append(f"RANK env {env_rank} != process group rank {rank}")
    if expected_rank is not None and rank != expected_rank:
        problems.append(
            f"rank {rank} but the plan ({source}) gives node rank {node_rank}, "
            f"so expected {node_rank}*{local_world}+{local_rank}={expected_rank}"
        )
    if node_rank is not None and group_rank is not None and group_rank != node_rank:
        problems.append(f"GROUP_RANK {group_rank} != planned node rank {node_rank}")
    rank_ok = not problems  # so far: reading the plan and checking the rank against it

    model = make_model(args.hidden, args.seed)
    initial_eval = evaluate(model, args.seed, torch.device("cpu"))  # the untrained model
    start_step = load_checkpoint(args.checkpoint_dir, model) if rank == 0 else 0
    box = torch.tensor([start_step], dtype=torch.int64, device=device)
    dist.broadcast(box, src=0)  # a tensor, not broadcast_object_list: that one needs numpy
    start_step = int(box.item())
    ddp = DistributedDataParallel(model.to(device))  # broadcasts rank 0's parameters
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    losses: List[float] = []
    for step in range(start_step, args.steps):
        inputs, target = batch(args.seed, step, rank, args.batch_size)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(inputs.to(device)), target.to(device))
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world)
        if rank == 0:
            print(f"train_ddp: step {step + 1}/{args.steps} loss {losses[-1]:.5f}", flush=True)
            if args.checkpoint_dir and (step + 1) % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint_dir, model, step + 1)
        if args.step_delay:
            time.sleep(args.step_delay)

    digest = parameter_digest(model)
    # The digests travel as tensors: all_gather_object would need numpy, which torch does not.
    mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    rank_digests = [bytes(tensor.cpu().tolist()).hex() for tensor in gathered]
    digests_agree = len(set(rank_digests)) == 1
    if not digests_agree:
        problems.append("parameters differ across ranks after all-reduce")
    final_eval = evaluate(model, args.seed, device)
    loss_decreased = final_eval < initial_eval
    if args.steps > 0 and not loss_decreased:
        problems.append(f"held-out loss did not go down: {initial_eval:.5f} -> {final_eval:.5f}")
    dist.barrier()
    dist.destroy_process_group()

    report = {
        "version": REPORT_VERSION,
        "rank": rank,
        "world_size": world,
        "local_rank": local_rank,
        "local_world_size": local_world,
        "group_rank": group_rank,
        "pod_index": pod_index,
        "planned_node_rank": node_rank,
        "plan_source": source,
        "expected_rank": expected_rank,
        "rank_ok": rank_ok,
        "backend": backend,
        "host": socket.gethostname(),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
        "restart_count": env_int("TORCHELASTIC_RESTART_COUNT"),
        "steps": args.steps,
        "start_step": start_step,
        "losses": losses,
        "eval_loss_initial": initial_eval,
        "eval_loss_final": final_eval,
        "loss_decreased": loss_decreased,
        "param_digest": digest,
        "digests_agree": digests_agree,
        "rank_digests": rank_digests,
        "problems": problems,
        "ok": not problems,
        "seconds": round(time.monotonic() - started, 3),
    }
    if args.report_dir:
        write_atomic(
            Path(args.report_dir) / f"rank-{rank}.json",
            json.dumps(report, indent=1, sort_keys=True) + "\n",
        )
    for problem in problems:
        print(f"train_ddp: rank {rank}: FAILED: {problem}", file=sys.stderr, flush=True)
    if rank == 0 and not problems:
        print(
            f"train_ddp: done: {world} ranks agree on parameters {digest[:12]}, "
            f"held-out loss {initial_eval:.5f} -> {final_eval:.5f}",
            flush=True,
        )
    return 0 if not problems else 1


def leave(status: int) -> None:
    """End the process with ``status`` without the interpreter's shutdown.

    DDP keeps its process group, and with it gloo's worker threads, alive until the process ends
    (``destroy_process_group`` does not free a group DDP holds). A worker thread that lets go of
    the last collective's tensors only after the interpreter has begun to shut down cannot take
    the GIL, and the process aborts (SIGABRT, "terminate called without an active exception",
    seen on Python 3.11 with torch 2.13 in about one run of 20 on a busy machine) after training
    succeeded. Everything this script writes is written and flushed by then.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    leave(main())
