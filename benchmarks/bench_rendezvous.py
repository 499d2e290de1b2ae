"""Start-up store traffic, flat vs tiered: a stock torch TCPStore root alone, or behind per-node proxies.

Simulates ``nodes x workers`` ranks on this machine and replays the store traffic of a real
start-up against a stock ``torch.distributed.TCPStore`` root running in its own process:

1. agent join and rank assignment (agents always talk to the root): ADD a join counter, SET the
   node's record, the last agent SETs "closed", every agent gets "closed" and node 0's record;
2. every worker connects (VALIDATE, PING) - to the root (flat) or to its node's proxy (tiered);
3. init: every worker ADDs the init counter; NCCL-style: rank 0 SETs a 128-byte id, all get it;
4. gloo-style: every rank SETs its address and gets every other rank's (``--gloo-peers`` limits
   the peers each rank reads to ranks ``0..P-1``, the order gloo reads them in);
5. a store-based barrier: every rank ADDs "done", the last SETs "done_all", all get it.

A torch ``get`` is WAIT then GET, as torch's client sends it. Clients are raw-protocol asyncio
clients (``npu_job.launcher.storeclient``), two host processes holding half the nodes each:
one Python process per rank would need 2048 interpreters with torch (~300 MB each) on 2 cores,
and a thread per rank would serialise on the GIL; a raw client sends exactly the bytes torch's
client sends (golden-tested in ``tests/launcher/test_protocol.py``). In tiered mode each node's
proxy (``AsyncStoreProxy``, the same code ``StoreProxy`` runs) lives on its host process's loop.

Measured per case: wall time (first connect to last reply), connections the root holds (counted
in /proc/net/tcp while every client is still connected), requests reaching the root (flat: every
client request; tiered: agents' requests + proxies' upstream requests, counted by the senders),
the root process's CPU seconds (utime+stime from /proc/<pid>/stat) and its wake-ups (voluntary
context switches of its threads, /proc/<pid>/task/*/status: a busy root serves many requests per
wake-up, an idle one few, and each wake-up costs a context switch and a poll), and what the
proxies sent the root, by op. Reverse DNS: the stock
server formats each peer address on accept; every client here connects from 127.0.0.1, which
``/etc/hosts`` maps to localhost (``files`` before ``dns`` in nsswitch.conf), so no resolver is
consulted - the script measures ``getnameinfo(127.0.0.1)`` and prints it.

Also measured: the CPU seconds of the two client host processes (getrusage), so the proxies' CPU per
relayed request is (tiered - flat) / client requests on the same event loop; ``--loop asyncio uvloop``
runs both loops side by side (clients and proxies alike, so flat and tiered stay comparable), and
``--repeat N`` interleaves N runs of every variant and reports the median wall.

    python benchmarks/bench_rendezvous.py                 # 8x8, 64x8, 128x16
    python benchmarks/bench_rendezvous.py --cases 8x8 --output results.md
    python benchmarks/bench_rendezvous.py --cases 128x16 --loop asyncio uvloop --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _report import publish
from npu_job.launcher.protocol import Op, Request
from npu_job.launcher.proxy.server import AsyncStoreProxy
from npu_job.launcher.proxy.storeproxy import new_event_loop
from npu_job.launcher.storeclient import AsyncRawStoreClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the root's socket helpers live with the tests
from tests.launcher.rootsocket import established_connections  # noqa: E402

LOOPBACK = "127.0.0.1"
HOSTS = 2
PROJECT_RANKS = 16384
PROJECT_WORKERS = 16
# The root listens on an IPv4 socket handed over by fd (see root_listen_socket): on torch's default
# dual-stack "::" listener peers appear as ::ffff:127.0.0.1, whose reverse lookup goes to the DNS
# server (2-30 ms each here, serialised on the root's loop), an artefact of stock torch's server.
ROOT_CODE = (
    f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
    "import time, torch.distributed as d\n"
    "from tests.launcher.rootsocket import root_listen_socket\n"
    "sock, port = root_listen_socket()\n"
    "s = d.TCPStore('127.0.0.1', port, is_master=True, wait_for_workers=False, master_listen_fd=sock.detach())\n"
    "print(port, flush=True)\n"
    "time.sleep(3600)\n"
)


@dataclass(frozen=True)
class Case:
    nodes: int
    workers: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.workers

    def __str__(self) -> str:
        return f"{self.nodes}x{self.workers}"


@dataclass(frozen=True)
class Result:
    case: Case
    mode: str
    wall: float
    root_connections: int
    root_requests: int
    root_cpu: float
    client_requests: int
    coalesced: int
    loop: str
    host_cpu: float  # CPU seconds of the client host processes (clients, plus proxies when tiered)
    upstream_by_op: dict[str, int]  # tiered: the proxies' requests to the root, by op
    upstream_opened: int  # tiered: connections the proxies opened to the root over the run
    root_wakeups: int  # the root's voluntary context switches: each a wait for more to read


def k(text: str) -> bytes:
    return ("/" + text).encode()


# ------------------------------------------------------------------ simulated node


async def run_node(
    node: int, case: Case, root_port: int, tiered: bool, peers: int, deadline: float, keep: list
) -> tuple[int, int, int]:
    """One node: agent, optional proxy, workers. Returns (agent reqs, worker reqs, proxy upstream reqs)."""
    agent = await AsyncRawStoreClient.connect(LOOPBACK, root_port, retry_until=deadline)
    keep.append(agent)
    order = await agent.call(Request(Op.ADD, (k("rdzv/joined"),), number=1))
    await agent.call(
        Request(Op.SET, (k(f"rdzv/node/{node}"),), (f"10.0.{node // 256}.{node % 256}".encode(),))
    )
    if order == case.nodes:
        await agent.call(Request(Op.SET, (k("rdzv/closed"),), (b"1",)))
    await agent.get(k("rdzv/closed"))
    await agent.get(k("rdzv/node/0"))
    port = root_port
    proxy = None
    if tiered:
        proxy = AsyncStoreProxy(LOOPBACK, root_port, timeout=300)
        sock = socket.socket()
        sock.bind((LOOPBACK, 0))
        sock.listen(4096)
        sock.setblocking(False)
        port = sock.getsockname()[1]
        await proxy.start(sock)
        keep.append(proxy)
    clients = await asyncio.gather(
        *(
            run_worker(node * case.workers + local, case, port, peers, deadline, keep)
            for local in range(case.workers)
        )
    )
    upstream = proxy.snapshot().requests_upstream if proxy else 0
    return agent.requests_sent, sum(clients), upstream


async def run_worker(
    rank: int, case: Case, port: int, peers: int, deadline: float, keep: list
) -> int:
    c = await AsyncRawStoreClient.connect(LOOPBACK, port, retry_until=deadline)
    keep.append(c)
    await c.call(Request(Op.ADD, (k("init/count"),), number=1))
    if rank == 0:
        await c.call(Request(Op.SET, (k("nccl/id"),), (os.urandom(128),)))
    await c.get(k("nccl/id"))
    await c.call(
        Request(
            Op.SET,
            (k(f"gloo/{rank}"),),
            (f"[10.1.{rank // 256}.{rank % 256}]:{40000 + rank}".encode(),),
        )
    )
    for peer in range(min(peers, case.ranks)):
        if peer != rank:
            await c.get(k(f"gloo/{peer}"))
    done = await c.call(Request(Op.ADD, (k("done"),), number=1))
    if done == case.ranks:
        await c.call(Request(Op.SET, (k("done_all"),), (b"1",)))
    await c.get(k("done_all"))
    return c.requests_sent


def host_main(
    nodes: Sequence[int],
    case: Case,
    root_port: int,
    tiered: bool,
    peers: int,
    start_at: float,
    loop_kind: str,
    conn,
) -> None:  # type: ignore[no-untyped-def]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def main() -> None:
        keep: list = []
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        results = await asyncio.gather(
            *(run_node(n, case, root_port, tiered, peers, start_at + 600, keep) for n in nodes)
        )
        end = time.monotonic()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        proxies = [p.snapshot() for p in keep if isinstance(p, AsyncStoreProxy)]
        coalesced = sum(p.coalesced for p in proxies)
        by_op: dict[str, int] = {}
        for p in proxies:
            for op, n in p.upstream_by_op.items():
                by_op[op] = by_op.get(op, 0) + n
        conn.send(
            (
                end,
                [sum(r[i] for r in results) for i in range(3)],
                coalesced,
                usage.ru_utime + usage.ru_stime - cpu_start,
                by_op,
                sum(p.upstream_connections for p in proxies),
            )
        )
        await asyncio.get_running_loop().run_in_executor(
            None, conn.recv
        )  # hold connections until counted
        for item in keep:
            if isinstance(item, AsyncStoreProxy):
                await item.aclose()
            else:
                await item.close()

    start = resource.getrusage(resource.RUSAGE_SELF)
    cpu_start = start.ru_utime + start.ru_stime
    loop = new_event_loop(
        loop_kind
    )  # the same loop kind for flat and tiered: clients run on it too
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


# ------------------------------------------------------------------ root side


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wakeups(pid: int) -> int:
    """The voluntary context switches of every thread of ``pid``: a server thread blocks in its
    poll each time it has served everything that came, so this counts its wake-ups."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as handle:
            for line in handle:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def run_case(case: Case, tiered: bool, peers: int, loop_kind: str = "asyncio") -> Result:
    root = subprocess.Popen([sys.executable, "-c", ROOT_CODE], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout is not None
        root_port = int(root.stdout.readline())
        baseline_connections = established_connections(root_port)  # the root's own client
        ctx = multiprocessing.get_context("fork")
        start_at = time.monotonic() + 1.0
        pipes, procs = [], []
        for h in range(HOSTS):
            parent, child = ctx.Pipe()
            nodes = list(range(h, case.nodes, HOSTS))
            proc = ctx.Process(
                target=host_main,
                args=(nodes, case, root_port, tiered, peers, start_at, loop_kind, child),
            )
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        while time.monotonic() < start_at - 0.05:
            time.sleep(0.01)
        cpu_before, wakeups_before = cpu_seconds(root.pid), wakeups(root.pid)
        reports = [pipe.recv() for pipe in pipes]
        cpu_after, wakeups_after = cpu_seconds(root.pid), wakeups(root.pid)
        connections = established_connections(root_port) - baseline_connections
        for pipe in pipes:
            pipe.send("close")
        for proc in procs:
            proc.join(60)
        wall = max(r[0] for r in reports) - start_at
        agent_reqs = sum(r[1][0] for r in reports)
        worker_reqs = sum(r[1][1] for r in reports)
        upstream = sum(r[1][2] for r in reports)
        root_requests = agent_reqs + (upstream if tiered else worker_reqs)
        return Result(
            case,
            "tiered" if tiered else "flat",
            wall,
            connections,
            root_requests,
            cpu_after - cpu_before,
            agent_reqs + worker_reqs,
            sum(r[2] for r in reports),
            loop_kind,
            sum(r[3] for r in reports),
            {
                op: sum(r[4].get(op, 0) for r in reports)
                for op in sorted({o for r in reports for o in r[4]})
            },
            sum(r[5] for r in reports),
            wakeups_after - wakeups_before,
        )
    finally:
        root.kill()
        root.wait()
        if root.stdout is not None:
            root.stdout.close()


# ------------------------------------------------------------------ report


def reverse_dns_seconds(address: tuple) -> float:
    """Mean time of the reverse lookup the stock server does per accepted peer (after a warm-up)."""
    socket.getnameinfo(address, socket.NI_NUMERICSERV)
    started = time.perf_counter()
    for _ in range(20):
        socket.getnameinfo(address, socket.NI_NUMERICSERV)
    return (time.perf_counter() - started) / 20


def median_runs(results: list[Result]) -> list[tuple[Result, list[float]]]:
    """One row per (case, mode, loop): the run with the median wall time, and every run's wall."""
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((str(r.case), r.mode, r.loop), []).append(r)
    rows = []
    for runs in groups.values():
        ordered = sorted(runs, key=lambda r: r.wall)
        rows.append((ordered[(len(ordered) - 1) // 2], [r.wall for r in runs]))
    return rows


def format_table(results: list[Result], peers: int, dns: tuple[float, float]) -> str:
    rows = median_runs(results)
    by_case: dict[tuple[str, str], dict[str, Result]] = {}
    for r, _ in rows:
        by_case.setdefault((str(r.case), r.loop), {})[r.mode] = r
    lines = [
        f"# bench_rendezvous: stock torch TCPStore root, flat vs tiered (gloo peers read per rank: {peers})",
        "",
        "Each row is the median-wall run of its repetitions (all walls listed). host CPU s: the two client",
        "host processes (simulated clients, plus every node's proxy when tiered), on the loop named.",
        "",
        (
            "| case | ranks | mode | loop | wall s | walls | root conns | root requests | root CPU s "
            "| root wake-ups | requests per wake-up | host CPU s | client requests | coalesced |"
        ),
        "|---|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r, walls in rows:
        lines.append(
            f"| {r.case} | {r.case.ranks} | {r.mode} | {r.loop} | {r.wall:.2f} | {' '.join(f'{w:.2f}' for w in walls)} "
            f"| {r.root_connections} | {r.root_requests} | {r.root_cpu:.2f} | {r.root_wakeups} "
            f"| {r.root_requests / max(r.root_wakeups, 1):.1f} | {r.host_cpu:.2f} "
            f"| {r.client_requests} | {r.coalesced} |"
        )
    lines += [
        "",
        (
            "proxy CPU/request: (tiered host CPU - flat host CPU) / client requests, same loop. all CPU: "
            "host + root CPU seconds, tiered/flat - what the wall ratio follows when the two cores are "
            "the bottleneck, and steadier than wall on a shared machine."
        ),
        "",
        (
            "| case | loop | conns tiered/nodes | requests tiered/flat | root CPU tiered/flat "
            "| root wake-ups tiered/flat | wall tiered/flat | all CPU tiered/flat | proxy CPU us/request |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (name, loop), modes in by_case.items():
        if "flat" in modes and "tiered" in modes:
            f, t = modes["flat"], modes["tiered"]
            proxy_us = (t.host_cpu - f.host_cpu) / t.client_requests * 1e6
            lines.append(
                f"| {name} | {loop} | {t.root_connections / t.case.nodes:.2f} "
                f"| {t.root_requests / f.root_requests:.3f} | {_ratio(t.root_cpu, f.root_cpu)} "
                f"| {_ratio(t.root_wakeups, f.root_wakeups)} | {t.wall / f.wall:.2f} | {_ratio(t.host_cpu + t.root_cpu, f.host_cpu + f.root_cpu)} "
                f"| {proxy_us:.1f} |"
            )
    tiered_rows = [r for r, _ in rows if r.mode == "tiered"]
    ops = sorted({op for r in tiered_rows for op in r.upstream_by_op})
    if tiered_rows:
        lines += [
            "",
            "What the proxies sent the root (tiered rows; handshakes included), per node:",
            "",
            "| case | loop | connections opened | " + " | ".join(ops) + " |",
            "|---|---|---:|" + "---:|" * len(ops),
        ]
        for r in tiered_rows:
            per_node = [r.upstream_by_op.get(op, 0) / r.case.nodes for op in ops]
            lines.append(
                f"| {r.case} | {r.loop} | {r.upstream_opened / r.case.nodes:.1f} | "
                + " | ".join(f"{n:.1f}" for n in per_node)
                + " |"
            )
    largest = max(by_case.values(), key=lambda modes: next(iter(modes.values())).case.ranks)
    if "flat" in largest and "tiered" in largest:
        lines += [
            "",
            (
                f"Projection to {PROJECT_RANKS} ranks ({PROJECT_RANKS // PROJECT_WORKERS}x{PROJECT_WORKERS}), "
                f"same traffic mix (gloo peers = {peers}), from the largest case's per-rank requests and "
                "the root's measured CPU per request:"
            ),
            "",
            "| mode | root requests | root CPU s | root conns |",
            "|---|---:|---:|---:|",
        ]
        for mode in ("flat", "tiered"):
            r = largest[mode]
            requests = r.root_requests / r.case.ranks * PROJECT_RANKS
            per_request = r.root_cpu / r.root_requests if r.root_requests else 0.0
            conns = (
                PROJECT_RANKS + PROJECT_RANKS // PROJECT_WORKERS
                if mode == "flat"
                else r.root_connections / r.case.nodes * PROJECT_RANKS // PROJECT_WORKERS
            )
            lines.append(
                f"| {mode} | {requests:.0f} | {requests * per_request:.1f} | {conns:.0f} |"
            )
    lines += [
        "",
        (
            f"Reverse DNS per accepted peer: 127.0.0.1 (this root's IPv4 listener, /etc/hosts) {dns[0] * 1e3:.3f} ms; "
            f"::ffff:127.0.0.1 (torch's default dual-stack listener, goes to DNS) {dns[1] * 1e3:.3f} ms."
        ),
        "",
        f"Load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs).",
    ]
    return "\n".join(lines) + "\n"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b > 0 else "n/a"


def parse_case(text: str) -> Case:
    nodes, _, workers = text.partition("x")
    if not nodes.isdigit() or not workers.isdigit():
        raise argparse.ArgumentTypeError(f"expected NODESxWORKERS like 64x8, got {text!r}")
    return Case(int(nodes), int(workers))


def main(argv: Sequence[str] | None = None) -> int:  # type: ignore[assignment]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        nargs="+",
        type=parse_case,
        default=[Case(8, 8), Case(64, 8), Case(128, 16)],
        help="NODESxWORKERS cases (default: 8x8 64x8 128x16)",
    )
    parser.add_argument(
        "--gloo-peers",
        type=int,
        default=64,
        help="peers each rank reads in the gloo phase (default 64; all = the ranks count)",
    )
    parser.add_argument(
        "--modes", nargs="+", choices=["flat", "tiered"], default=["flat", "tiered"]
    )
    parser.add_argument(
        "--loop",
        nargs="+",
        choices=["asyncio", "uvloop"],
        default=["asyncio"],
        help="event loop of the client host processes (clients and proxies) - several run side "
        "by side (default asyncio; uvloop must be installed)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per case, mode and loop; the median is shown"
    )
    parser.add_argument("--output", help="also write the table to this file")
    args = parser.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = []
    for case in args.cases:
        for repetition in range(
            args.repeat
        ):  # interleaved, so drifting machine load hits every variant
            for loop_kind in args.loop:
                for mode in args.modes:
                    print(
                        f"running {case} {mode} {loop_kind} ({repetition + 1}/{args.repeat}) ...",
                        file=sys.stderr,
                        flush=True,
                    )
                    results.append(run_case(case, mode == "tiered", args.gloo_peers, loop_kind))
    dns = (reverse_dns_seconds((LOOPBACK, 1)), reverse_dns_seconds(("::ffff:127.0.0.1", 1, 0, 0)))
    table = format_table(results, args.gloo_peers, dns)
    publish(table, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
