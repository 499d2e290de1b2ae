"""Large values through the store proxy: one MULTI_GET of 8-96 MiB, straight to the root, via a
plain relay and via a proxy.

A stock torch ``TCPStore`` root (in this process, on an IPv4 loopback listener below the
ephemeral range, so the per-accept reverse lookup reads /etc/hosts), holding ``size / 8 MiB`` keys
of 8 MiB each (the libuv server's largest value). One unmodified torch client per path reads them
all with one ``multi_get``: straight to the root, through a minimal byte-copying relay
(``_relay.py``: what relaying alone costs) and through ``python -m npu_job.launcher.proxy``, both
child processes on the same event loop kind (``--loop``), interleaved, ``--repeat`` times.
Reported: median seconds, the proxy/direct and relay/direct ratios, and the proxy's and the
relay's CPU seconds per relayed GiB over all runs (the steady figure).

    python benchmarks/bench_large_values.py
    python benchmarks/bench_large_values.py --sizes 8,32 --repeat 3 --output results.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the root's socket: the tests'
from _report import publish  # noqa: E402

VALUE = 8 << 20  # the libuv server's largest value


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32,64,96", help="MiB per MULTI_GET, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--output")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    import torch.distributed as dist
    from npu_job.launcher.torchcompat import host_tcpstore

    from tests.launcher.rootsocket import root_listen_socket

    sock, port = root_listen_socket("127.0.0.1")
    root = host_tcpstore("127.0.0.1", port, 120.0, sock.detach())
    keys = [f"v{i}" for i in range(max(sizes) * (1 << 20) // VALUE)]
    for i, key in enumerate(keys):
        root.set(key, bytes([65 + i % 26]) * VALUE)
    env = {**os.environ, "NPU_JOB_PROXY_LOOP": args.loop}
    children = {
        name: subprocess.Popen(
            [sys.executable, *command, f"127.0.0.1:{port}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name, command in (
            ("relay", [str(Path(__file__).resolve().parent / "_relay.py")]),
            ("proxy", ["-m", "npu_job.launcher.proxy", "--dialect", "torch"]),
        )
    }
    try:
        ports = {}
        for name, child in children.items():
            assert child.stdout is not None
            ports[name] = json.loads(child.stdout.readline())["port"]

        def client(to: int):  # type: ignore[no-untyped-def]
            return dist.TCPStore(
                "127.0.0.1",
                to,
                is_master=False,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=300),
            )

        stores = {"direct": client(port), **{name: client(ports[name]) for name in children}}
        rows = []
        for size in sizes:
            wanted = keys[: size * (1 << 20) // VALUE]
            times: dict[str, list[float]] = {name: [] for name in stores}
            cpu: dict[str, list[float]] = {name: [] for name in children}
            for _ in range(args.repeat):
                for name, store in stores.items():
                    pid = children[name].pid if name in children else None
                    before = _cpu_seconds(pid) if pid else 0.0
                    start = time.perf_counter()
                    values = store.multi_get(wanted)
                    times[name].append(time.perf_counter() - start)
                    assert sum(len(v) for v in values) == len(wanted) * VALUE
                    if pid:
                        cpu[name].append(_cpu_seconds(pid) - before)
            d, r, p = (statistics.median(times[name]) for name in ("direct", "relay", "proxy"))
            gib = size / 1024 * args.repeat  # CPU over every run: the clock ticks are 10 ms
            rows.append(
                f"| {size} | {d:.3f} | {r:.3f} | {p:.3f} | {p / d:.2f} | {r / d:.2f} "
                f"| {sum(cpu['proxy']) / gib:.2f} | {sum(cpu['relay']) / gib:.2f} |"
            )
    finally:
        for child in children.values():
            if child.poll() is None:
                assert child.stdin is not None
                child.stdin.write("stop\n")
                child.stdin.close()
                child.wait(30)
    loop = args.loop if args.loop != "auto" else "uvloop if installed"
    text = (
        f"## One MULTI_GET of 8 MiB values: straight to the root, via a plain relay, via the proxy "
        f"(median of {args.repeat}, loop {loop}, load {os.getloadavg()[0]:.1f})\n\n"
        "| MiB | direct s | relay s | proxy s | proxy/direct | relay/direct "
        "| proxy CPU s/GiB | relay CPU s/GiB |\n"
        "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    publish(text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
