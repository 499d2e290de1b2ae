"""Faults: how fast npu-run and stock ``torchrun --rdzv_backend=c10d`` notice them, and what
liveness costs.

Three parts, each printed as a table:

1. **Detection.** 3 nodes x 1 worker on loopback run a small gloo training loop (an all_reduce
   every 0.1 s), once under ``npu-run --rdzv_backend=parallel --enable_tiered_parallel_tcpstore=true``
   and once under ``torchrun --rdzv_backend=c10d``, both with ``--rdzv_conf timeout=20,
   join_timeout=30`` (npu-run also with ``keep_alive_interval``/``keep_alive_max_attempt`` from
   ``--keep-alive``). One fault is injected once every worker trains; the time is from the fault
   until the last surviving node exited (``>cap`` when some node still ran at ``--cap`` s; then
   every process is killed). Also shown: the exit codes and whether every survivor's last error line
   names the node at fault (its node rank, or for the squatter the master port).
   Faults: ``agent-kill`` (SIGKILL to node 1's agent), ``root-kill`` (SIGKILL to node 0's agent,
   the store's host), ``root-freeze`` (SIGSTOP to node 0's agent until the others end or the cap),
   ``squatter`` (a socket on the master port that accepts and never answers, present from the
   start; timed from the launch), ``worker-fails`` (rank 1 raises on every attempt,
   ``--max_restarts=2``; timed from the launch).
2. **Heartbeat cost.** ``--beat-nodes`` simulated agents (raw clients on one asyncio loop, sending
   exactly the watch's requests: ADD to their counter and CHECK of the verdict key) and one
   simulated node rank 0 (MULTI_GET of every counter and ADD 0 of the failure count) run against a
   stock ``TCPStore`` root in its own process for ``--beat-seconds``, one round per
   ``--beat-interval`` each, spread over the interval. Reported: requests and bytes per node per
   second, and the root process's CPU (utime+stime) as a share of one core.
3. **Workers die with their agent.** The parent-death wrapper (``launcher/pdeath.py``): the time
   from SIGKILL of a parent to the death of its wrapped child (in a session of its own, as torch
   starts workers), and what the wrapper adds to a worker's start (``python -c pass`` with and
   without it, interleaved; medians of ``--repeat``).

    python benchmarks/bench_faults.py                     # everything, 5 s x 3 heartbeats, 4096 nodes
    python benchmarks/bench_faults.py --faults agent-kill root-freeze --keep-alive 1x3
    python benchmarks/bench_faults.py --output results.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from _report import publish
from npu_job.launcher import pdeath
from npu_job.launcher.protocol import Op, Request, encode_reply, encode_request
from npu_job.launcher.storeclient import AsyncRawStoreClient

FAULTS = ("agent-kill", "root-kill", "root-freeze", "squatter", "worker-fails")
LAUNCHERS = ("npu-run", "torchrun")
NODES = 3
ROOT_CODE = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})\n"
    "import time, torch.distributed as d\n"
    "from tests.launcher.rootsocket import root_listen_socket\n"
    "sock, port = root_listen_socket()\n"
    "s = d.TCPStore('127.0.0.1', port, is_master=True, wait_for_workers=False, master_listen_fd=sock.detach())\n"
    "print(port, flush=True)\n"
    "time.sleep(3600)\n"
)
WORKER = """
import os, sys, time, torch, torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    rank = int(os.environ["RANK"])
    if sys.argv[2] == "fail" and rank == 1:
        raise RuntimeError(f"worker rank {rank} fails on purpose")
    dist.init_process_group("gloo")
    open(os.path.join(sys.argv[1], f"{rank}.ready"), "w").close()
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.1)

main()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ------------------------------------------------------------------ 1. detection


@dataclass(frozen=True)
class Detection:
    fault: str
    launcher: str
    seconds: Optional[float]  # None: some node still ran at the cap
    codes: Tuple[Optional[int], ...]
    named: bool


def _command(
    launcher: str,
    rank: int,
    port: int,
    worker: Path,
    workdir: Path,
    mode: str,
    keep_alive: Tuple[float, int],
    restarts: int,
) -> List[str]:
    conf = "timeout=20,join_timeout=30"
    common = [
        f"--nnodes={NODES}",
        "--nproc_per_node=1",
        "--monitor_interval=0.1",
        f"--max_restarts={restarts}",
    ]
    if launcher == "npu-run":
        interval, attempts = keep_alive
        return [
            sys.executable,
            "-m",
            "npu_job.launcher",
            *common,
            f"--node_rank={rank}",
            "--rdzv_backend=parallel",
            "--enable_tiered_parallel_tcpstore=true",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            f"--rdzv_conf={conf},keep_alive_interval={interval:g},keep_alive_max_attempt={attempts}",
            str(worker),
            str(workdir),
            mode,
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *common,
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        "--rdzv_id=bench",
        f"--rdzv_conf={conf}",
        str(worker),
        str(workdir),
        mode,
    ]


def _kill_tree(processes: Sequence[subprocess.Popen], tag: str) -> None:
    for process in processes:
        if process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGCONT)
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    needle = f"BENCH_FAULTS_TAG={tag}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            pass


class _Squatter:
    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.bind(("0.0.0.0", port))
        self.sock.listen(64)
        self.held: List[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self.held:
            conn.close()


def detect(fault: str, launcher: str, keep_alive: Tuple[float, int], cap: float) -> Detection:
    port = free_port()
    tag = f"{os.getpid()}-{random.getrandbits(32)}"
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        workdir = Path(tmp)
        worker = workdir / "worker.py"
        worker.write_text(WORKER)
        mode = "fail" if fault == "worker-fails" else "train"
        restarts = 2 if fault == "worker-fails" else 0
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
        env.update(BENCH_FAULTS_TAG=tag, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5", LOGLEVEL="WARNING")
        squatter = _Squatter(port) if fault == "squatter" else None
        processes: List[subprocess.Popen] = []
        logs = [open(workdir / f"node{rank}.log", "w+") for rank in range(NODES)]
        try:
            started = time.monotonic()
            for rank in range(NODES):
                processes.append(
                    subprocess.Popen(
                        _command(launcher, rank, port, worker, workdir, mode, keep_alive, restarts),
                        stdout=logs[rank],
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )
            survivors = list(range(NODES))
            if fault in ("agent-kill", "root-kill", "root-freeze"):
                deadline = time.monotonic() + 120
                while sum(1 for p in workdir.glob("*.ready")) < NODES:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                        return Detection(
                            fault, launcher, None, tuple(p.poll() for p in processes), False
                        )
                    time.sleep(0.05)
                victim = 1 if fault == "agent-kill" else 0
                os.kill(
                    processes[victim].pid,
                    signal.SIGSTOP if fault == "root-freeze" else signal.SIGKILL,
                )
                started = time.monotonic()
                survivors.remove(victim)
            deadline = started + cap
            while time.monotonic() < deadline and any(
                processes[r].poll() is None for r in survivors
            ):
                time.sleep(0.05)
            ended = all(processes[r].poll() is not None for r in survivors)
            seconds = time.monotonic() - started if ended else None
            codes = tuple(p.poll() for p in processes)
        finally:
            _kill_tree(processes, tag)
            if squatter is not None:
                squatter.close()
        culprit = {
            "agent-kill": "node rank 1",
            "root-kill": "node rank 0",
            "root-freeze": "node rank 0",
            "squatter": str(port),
            "worker-fails": "node rank 1",
        }[fault]
        lasts = []
        for rank in survivors:  # each one's last error line (a TIP line may follow it)
            logs[rank].seek(0)
            lines = [line for line in logs[rank].read().splitlines() if "error" in line.lower()]
            lasts.append(lines[-1] if lines else "")
            logs[rank].close()
        named = ended and all(culprit in line for line in lasts)
        return Detection(fault, launcher, seconds, codes, named)


def detection_table(results: Sequence[Detection], cap: float, keep_alive: Tuple[float, int]) -> str:
    interval, attempts = keep_alive
    rows = [
        f"## Detection (3 nodes x 1 worker, loopback; timeout=20, join_timeout=30; npu-run "
        f"keep_alive {interval:g} s x {attempts}; cap {cap:g} s)",
        "",
        "| fault | launcher | time to every node stopped | exit codes (node 0, 1, 2) "
        "| last error lines name the cause |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        time_text = f"{r.seconds:.1f} s" if r.seconds is not None else f">{cap:g} s (still running)"
        codes = ", ".join("running" if c is None else str(c) for c in r.codes)
        rows.append(
            f"| {r.fault} | {r.launcher} | {time_text} | {codes} | {'yes' if r.named else 'no'} |"
        )
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------ 2. heartbeat cost


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _k(text: str) -> bytes:
    return b"/" + text.encode()


async def _beats(
    nodes: int, port: int, interval: float, seconds: float, connected: Callable[[], None]
) -> Tuple[int, int, int]:
    """Connect, call ``connected``, then run the agents' and the judge's rounds for ``seconds``;
    returns (requests, bytes on the wire, judge rounds)."""
    base = "npu_run/bench"
    clients = []
    for _ in range(nodes + 1):
        clients.append(await AsyncRawStoreClient.connect("127.0.0.1", port))
    for rank in range(1, nodes + 1):
        await clients[rank].call(Request(Op.ADD, keys=(_k(f"{base}/alive/{rank}"),), number=1))
    verdict_check = Request(Op.CHECK, keys=(_k(f"{base}/verdict"),))
    judge_read = Request(
        Op.MULTI_GET, keys=tuple(_k(f"{base}/alive/{r}") for r in range(1, nodes + 1))
    )
    failures = Request(Op.ADD, keys=(_k(f"{base}/failures_count"),), number=0)
    totals = [0, 0, 0]
    connected()
    end = asyncio.get_running_loop().time() + seconds

    async def agent(rank: int) -> None:
        beat = Request(Op.ADD, keys=(_k(f"{base}/alive/{rank}"),), number=1)
        loop = asyncio.get_running_loop()
        await asyncio.sleep(random.uniform(0, interval))
        while loop.time() < end:
            value, ready = await clients[rank].pipeline(beat, verdict_check)  # as the watch sends
            totals[0] += 2
            totals[1] += (
                len(encode_request(beat))
                + len(encode_reply(Op.ADD, value))
                + len(encode_request(verdict_check))
                + len(encode_reply(Op.CHECK, ready))
            )
            await asyncio.sleep(interval)

    async def judge() -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < end:
            ready, values, count = await clients[0].pipeline(verdict_check, judge_read, failures)
            totals[0] += 3
            totals[1] += (
                len(encode_request(judge_read))
                + len(encode_reply(Op.MULTI_GET, values))
                + len(encode_request(failures))
                + len(encode_reply(Op.ADD, count))
                + len(encode_request(verdict_check))
                + len(encode_reply(Op.CHECK, ready))
            )
            totals[2] += 1
            await asyncio.sleep(interval)

    await asyncio.gather(judge(), *(agent(rank) for rank in range(1, nodes + 1)))
    for client in clients:
        await client.close()
    return totals[0], totals[1], totals[2]


@dataclass(frozen=True)
class BeatCost:
    nodes: int
    interval: float
    seconds: float
    requests: int
    wire_bytes: int
    root_cpu: float
    judge_rounds: int


def beat_cost(nodes: int, interval: float, seconds: float) -> BeatCost:
    root = subprocess.Popen([sys.executable, "-c", ROOT_CODE], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout is not None
        port = int(root.stdout.readline())
        loop = asyncio.new_event_loop()
        mark: Dict[str, float] = {}

        def connected() -> None:  # the connections' set-up is not the heartbeat's cost
            mark.update(cpu=cpu_seconds(root.pid), at=time.monotonic())

        requests, wire, rounds = loop.run_until_complete(
            _beats(nodes, port, interval, seconds, connected)
        )
        elapsed = time.monotonic() - mark["at"]
        cpu = cpu_seconds(root.pid) - mark["cpu"]
        loop.close()
        return BeatCost(nodes, interval, elapsed, requests, wire, cpu, rounds)
    finally:
        root.kill()
        root.wait()
        if root.stdout is not None:
            root.stdout.close()


def beat_table(cost: BeatCost) -> str:
    per_node = cost.requests / cost.nodes / cost.seconds
    bytes_per_node = cost.wire_bytes / cost.nodes / cost.seconds
    share = 100 * cost.root_cpu / cost.seconds
    rows = [
        f"## Heartbeat cost ({cost.nodes} nodes, one round each per {cost.interval:g} s, "
        f"{cost.seconds:.0f} s measured, stock TCPStore root)",
        "",
        "| nodes | interval | requests / node / s | bytes / node / s | root requests / s "
        "| root CPU (share of one core) | judge rounds |",
        "|---|---|---|---|---|---|---|",
        f"| {cost.nodes} | {cost.interval:g} s | {per_node:.3f} | {bytes_per_node:.1f} | "
        f"{cost.requests / cost.seconds:.0f} | {share:.1f}% | {cost.judge_rounds} |",
    ]
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------ 3. workers die with their agent

PARENT = """
import os, subprocess, sys, time
from npu_job.launcher import pdeath
entry, args = pdeath.wrap(sys.executable, ["-c", "import time; time.sleep(600)"], os.getpid())
child = subprocess.Popen([entry, *args], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def death_delay() -> float:
    """Seconds from SIGKILL of a parent to the death of its wrapped child."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(0.3)  # the child has exec'd by now (it sleeps)
    pidfd = os.pidfd_open(child)
    try:
        killed = time.monotonic()
        os.kill(parent.pid, signal.SIGKILL)
        import select

        select.select([pidfd], [], [], 10)
        return time.monotonic() - killed
    finally:
        os.close(pidfd)
        parent.wait()
        parent.stdout.close()
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_cost(repeat: int) -> Tuple[float, float]:
    """Median seconds to run ``python -c pass`` directly and through the wrapper, interleaved."""
    plain, wrapped = [], []
    entry, args = pdeath.wrap(sys.executable, ["-c", "pass"], os.getpid())
    for _ in range(repeat):
        for command, times in (([sys.executable, "-c", "pass"], plain), ([entry, *args], wrapped)):
            started = time.monotonic()
            subprocess.run(command, check=True)
            times.append(time.monotonic() - started)
    return statistics.median(plain), statistics.median(wrapped)


def pdeath_table(delays: List[float], plain: float, wrapped: float) -> str:
    rows = [
        "## Workers die with their agent (parent-death signal wrapper)",
        "",
        "| measure | median | range |",
        "|---|---|---|",
        f"| SIGKILL of the agent to its worker's death | {1000 * statistics.median(delays):.1f} ms | "
        f"{1000 * min(delays):.1f}-{1000 * max(delays):.1f} ms |",
        f"| `python -c pass`, plain | {1000 * plain:.1f} ms | |",
        f"| the same through the wrapper | {1000 * wrapped:.1f} ms "
        f"| +{1000 * (wrapped - plain):.1f} ms per worker start |",
    ]
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------ main


def parse_keep_alive(text: str) -> Tuple[float, int]:
    interval, _, attempts = text.partition("x")
    try:
        return float(interval), int(attempts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected INTERVALxATTEMPTS like 5x3, got {text!r}"
        ) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", nargs="*", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=list(LAUNCHERS))
    parser.add_argument(
        "--keep-alive",
        type=parse_keep_alive,
        default=(5.0, 3),
        help="npu-run's keep_alive_interval x keep_alive_max_attempt (default 5x3)",
    )
    parser.add_argument(
        "--cap", type=float, default=60.0, help="seconds before a run counts as hung"
    )
    parser.add_argument("--beat-nodes", type=int, default=4096)
    parser.add_argument("--beat-interval", type=float, default=5.0)
    parser.add_argument("--beat-seconds", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=7, help="samples of the wrapper's costs")
    parser.add_argument("--output", help="also write the tables to this file")
    args = parser.parse_args(argv)

    parts = []
    results = [
        detect(fault, launcher, args.keep_alive, args.cap)
        for fault in args.faults
        for launcher in args.launchers
    ]
    if results:
        parts.append(detection_table(results, args.cap, args.keep_alive))
    parts.append(beat_table(beat_cost(args.beat_nodes, args.beat_interval, args.beat_seconds)))
    delays = [death_delay() for _ in range(args.repeat)]
    plain, wrapped = start_cost(args.repeat)
    parts.append(pdeath_table(delays, plain, wrapped))
    publish("\n".join(parts), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
