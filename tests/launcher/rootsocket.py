"""A root store's listening socket and a count of its connections, for tests and benchmarks.

The tests and the benchmarks host stock ``TCPStore`` roots on a socket of their own (an IPv4
listener below the ephemeral port range, handed over by fd) and count the connections the root
holds from ``/proc/net/tcp``; npu-run needs neither.
"""

from __future__ import annotations

import random
import socket
from typing import Tuple


def root_listen_socket(host: str = "127.0.0.1", backlog: int = 4096) -> Tuple[socket.socket, int]:
    """A listening IPv4 socket for a test/benchmark root store, on a port below the ephemeral range.

    Hand its fd to ``TCPStore(..., master_listen_fd=sock.detach())``. IPv4 keeps the stock server's
    per-accept reverse lookup on /etc/hosts (its default dual-stack listener sees
    ``::ffff:127.0.0.1`` and asks the DNS server). A port outside the ephemeral range means no
    outgoing connection elsewhere on the machine can share it, so counting the root's
    connections by local port in /proc/net/tcp is exact.
    """
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            low = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
            sock.listen(backlog)
            return sock, port
        except OSError:
            sock.close()
    raise OSError(f"no free port below {low} on {host}")


def established_connections(port: int) -> int:
    """Server-side sockets of a local listener on ``port`` in ESTABLISHED state (/proc/net/tcp*)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                        count += 1
        except FileNotFoundError:
            continue
    return count
