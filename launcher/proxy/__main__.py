"""``python -m npu_job.launcher.proxy HOST:PORT``: one store proxy on its own (tests, debugging)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping
from typing import List, Optional

from ..protocol import NEWEST
from .server import DEFAULT_WAIT_CONNECTIONS
from .storeproxy import StoreProxy


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m npu_job.launcher.proxy HOST:PORT``: serve one proxy (tests, debugging).

    Prints ``{"version": 1, "port": N}`` once listening; then each ``stats`` line on stdin
    prints the counters as JSON; EOF or ``stop`` stops it.
    """
    parser = argparse.ArgumentParser(
        prog="python -m npu_job.launcher.proxy", description=main.__doc__
    )
    parser.add_argument("upstream", help="root store address, HOST:PORT (literal IP preferred)")
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to keep retrying the root"
    )
    parser.add_argument("--wait-connections", type=int, default=DEFAULT_WAIT_CONNECTIONS)
    parser.add_argument(
        "--dialect",
        choices=("newest", "torch"),
        default="newest",
        help="store protocol to speak: the newest, or the installed torch's (probed)",
    )
    args = parser.parse_args(argv)
    host, sep, port = args.upstream.rpartition(":")
    if not sep or not port.isdigit():
        parser.error(f"upstream: expected HOST:PORT, got {args.upstream!r}")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    dialect = NEWEST
    if args.dialect == "torch":
        from ..torchcompat import store_dialect

        dialect = store_dialect()
    with StoreProxy(
        host.strip("[]"),
        int(port),
        listen_host=args.listen_host,
        listen_port=args.listen_port,
        timeout=args.timeout,
        wait_connections=args.wait_connections,
        dialect=dialect,
    ) as proxy:
        print(json.dumps({"version": 1, "port": proxy.port}), flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "stop":
                break
            if command == "stats":
                stats = proxy.stats
                payload = {name: getattr(stats, name) for name in stats.__dataclass_fields__}
                payload = {k: dict(v) if isinstance(v, Mapping) else v for k, v in payload.items()}
                print(json.dumps({"version": 1, **payload}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
