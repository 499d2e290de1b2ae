"""Every benchmark still runs, on its smallest case, the way the README says to run it.

The benchmarks carry the performance targets, so a benchmark that no longer starts is a target
nobody checks. Each one runs here as a script (``python benchmarks/<name>.py``, as the README
says), in a fresh process, on a case small enough for the test suite; the test asserts that it
finished, printed its table and its verdict, and wrote the same table to ``--output``. It asserts
no speed: timing belongs to the benchmarks themselves, not to tests on a shared machine.
"""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CASES = [
    ("bench_bootstrap.py", ["--sizes", "64,128", "--repeat", "1"],
     ["bash bootstrap.sh", "without msgspec", "target (128 nodes within 0.15 s"]),
    ("bench_bootstrap_api.py", ["--sizes", "8,16", "--repeat", "1"],
     ["bash bootstrap.sh", "target (16 pods within 0.15 s of bare start-up, once the API", "cpu:  median excess"]),
    ("bench_order.py", ["--max-nodes", "16", "--samples", "2"],
     ["violations (ours worse than scheduler on a metric, or above the ring bound): 0"]),
    ("bench_plan_scaling.py", ["--sizes", "64,256", "--repeat", "1"],
     ["growth exp", "ring: time per n*log2(n) ", "from 64 to 256 nodes", "rhd: time per n*log2(n) "]),
    pytest.param("bench_rendezvous.py", ["--cases", "2x2", "--repeat", "1", "--gloo-peers", "2"],
                 ["| 2x2 | 4 | flat |", "| 2x2 | 4 | tiered |", "Projection to 16384 ranks"],
                 marks=pytest.mark.torch),
]


@pytest.mark.parametrize("script, arguments, expected", CASES,
                         ids=lambda value: value if isinstance(value, str) else "")
def test_benchmark_runs_and_writes_its_table(tmp_path, script, arguments, expected):
    output = tmp_path / "table.txt"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *arguments, "--output", str(output)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for text in expected:
        assert text in done.stdout, f"{text!r} missing from:\n{done.stdout}"
    assert output.read_text() == done.stdout
