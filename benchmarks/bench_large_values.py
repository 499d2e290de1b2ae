"""Large values through the store proxy: one MULTI_GET of 8-96 MiB, straight to the root and via a proxy.

A stock torch ``TCPStore`` root (in this process, on an IPv4 loopback listener below the
ephemeral range, so the per-accept reverse lookup reads /etc/hosts), holding ``size / 8 MiB`` keys
of 8 MiB each (the libuv server's largest value). One unmodified torch client reads them all with
one ``multi_get``, straight to the root and through ``python -m npu_job.launcher.proxy`` (a child
process, as npu-run runs it), interleaved, ``--repeat`` times. Reported: median seconds, MB/s, the
proxy/direct ratio, and the proxy's CPU seconds per relayed GiB (the steady figure).

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
    proxy = subprocess.Popen(
        [sys.executable, "-m", "npu_job.launcher.proxy", f"127.0.0.1:{port}", "--dialect", "torch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        proxy_port = json.loads(proxy.stdout.readline())["port"]

        def client(to: int):  # type: ignore[no-untyped-def]
            return dist.TCPStore(
                "127.0.0.1",
                to,
                is_master=False,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=300),
            )

        direct, proxied = client(port), client(proxy_port)
        rows = []
        for size in sizes:
            wanted = keys[: size * (1 << 20) // VALUE]
            times: dict[str, list[float]] = {"direct": [], "proxy": []}
            cpu = []
            for _ in range(args.repeat):
                for name, store in (("direct", direct), ("proxy", proxied)):
                    before = _cpu_seconds(proxy.pid)
                    start = time.perf_counter()
                    values = store.multi_get(wanted)
                    times[name].append(time.perf_counter() - start)
                    assert sum(len(v) for v in values) == len(wanted) * VALUE
                    if name == "proxy":
                        cpu.append(_cpu_seconds(proxy.pid) - before)
            d, p = statistics.median(times["direct"]), statistics.median(times["proxy"])
            gib = size / 1024
            rows.append(
                f"| {size} | {d:.3f} | {size * 1.048576 / d:.0f} | {p:.3f} "
                f"| {size * 1.048576 / p:.0f} | {p / d:.1f} | {statistics.median(cpu) / gib:.2f} |"
            )
    finally:
        if proxy.poll() is None:
            assert proxy.stdin is not None
            proxy.stdin.write("stop\n")
            proxy.stdin.close()
            proxy.wait(30)
    text = (
        f"## One MULTI_GET of 8 MiB values, straight to the root vs via the proxy "
        f"(median of {args.repeat})\n\n"
        "| MiB | direct s | direct MB/s | proxy s | proxy MB/s | proxy/direct | proxy CPU s/GiB |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    publish(text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
