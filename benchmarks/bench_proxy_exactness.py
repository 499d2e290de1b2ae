"""The store proxy's exactness cases, straight to a root and through a proxy, on the installed torch.

Runs the exactness scenarios of the differential tests
(``tests/launcher/proxy/test_proxy_differential.py``), each once straight to a fresh stock torch
``TCPStore`` root and once through ``python -m npu_job.launcher.proxy`` in front of another, and
prints what every worker saw in both worlds and whether they agree. The tests assert the same;
this prints the outcomes per torch release (run it with each release's interpreter, e.g. the nox
matrix's venvs), which the tests' pass/fail does not show.

    python benchmarks/bench_proxy_exactness.py [--cases 1,2,3] [--loop uvloop|asyncio]
    ~/.cache/npu-job/nox/launcher-torch-2-1-0/bin/python benchmarks/bench_proxy_exactness.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the tests' scenarios
from _report import publish  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--cases", default="1,2,3", help="comma-separated case numbers")
    parser.add_argument("--output")
    args = parser.parse_args()

    import torch

    from tests.launcher.proxy import test_proxy_differential as scenarios

    cases: List[Tuple[str, Callable[..., object], bool]] = [
        (
            "1: two blocked poppers, one push",
            scenarios._popper_times_out_scenario,
            scenarios._has_queues(scenarios._root("default")),
        ),
        ("2: six ADDs behind a bad ADD", scenarios._bad_add_among_adds_scenario, True),
        (
            "3: set-then-delete, pool busy",
            scenarios._set_then_delete_beyond_the_pool_scenario,
            True,
        ),
    ]
    chosen = args.cases.split(",")
    if not set(chosen) <= {name.split(":")[0] for name, _, _ in cases}:
        parser.error(f"--cases: expected some of 1,2,3, got {args.cases}")
    cases = [case for case in cases if case[0].split(":")[0] in chosen]
    lines = [
        f"torch {torch.__version__}, proxy loop {args.loop}, {time.strftime('%Y-%m-%d')}\n\n",
        "| case | straight to the root | through the proxy | same |\n",
        "|---|---|---|---|\n",
    ]
    for name, scenario, runs in cases:
        if not runs:
            lines.append(f"| {name} | n/a (no queues on this root) | | |\n")
            continue
        expected, actual = scenarios._both_worlds(args.loop, scenario)
        lines.append(
            f"| {name} | {_cell(expected)} | {_cell(actual)} | "
            f"{'yes' if expected == actual else 'NO'} |\n"
        )
    publish("".join(lines), args.output)
    return 0


def _cell(outcome: object) -> str:
    return str(outcome).replace("|", "/")


if __name__ == "__main__":
    sys.exit(main())
