"""What does ``npu-run --probe`` cost, and what does it find? Measured on the emulated fabric.

For each shape (``--shapes``, bench_fabric's syntax: ``12x4`` = 12 nodes under 4 ToRs), the
fabric of bench_fabric (``_fabric_net``: a network namespace per node, Linux bridges as ToRs,
``tc``-shaped links at ``--rate`` Mbit/s) is wired as bench_fabric places that shape (its
scheduler order scattered over the ToRs), and every node runs npu-run (``parallel`` rendezvous,
one gloo device per node) from its bootstrap's report of that true wiring (``_probe_job``), with
a worker that does nothing. Each shape's job runs ``--repeat`` times with ``--probe`` and as
often without it, interleaved (off, on, off, on, ...).

Reported per shape and message size: each order's busbw (nccl-tests: algbw * 2(n-1)/n, the
median of the probe's samples, as node rank 0 read them), their ratio beside the link model's
(``_fabric_model``: the ring's busiest link) and the decision; per shape: the probe's wall time
(the longest any node spent in it, from probe.json) and the job's wall time from the agents'
start to their exit, with the probe and without it.

Needs root, ``ip``/``tc``/``ss`` (iproute2) and ``unshare``; without them it says why and exits
77. It removes every namespace, bridge and process it made, also on Ctrl-C and on errors.

Usage: ``python benchmarks/bench_probe.py [--shapes 3x2 6x3 12x4 16x4] [--rate 100]
[--budget 120] [--repeat 1] [--output FILE]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

try:
    import _fabric_model as model
    import _fabric_net as net
    import _probe_job as probe_job
    from _report import publish
    from bench_fabric import _positive, _shape, make_job
    from npu_job.bootstrap.base.model import Collective
except ImportError:
    if os.geteuid() != 0:  # as bench_fabric: a root-owned install may not even be readable
        print(
            "bench_probe: cannot build the emulated fabric: needs root (network namespaces, "
            "bridges and tc)",
            file=sys.stderr,
        )
        sys.exit(77)
    raise

EXIT_UNAVAILABLE = 77
EXIT_FAILED = 1
DEFAULT_SHAPES = ("3x2", "6x3", "12x4", "16x4")
STARTED = time.monotonic()


def log(message: str) -> None:
    print(
        f"bench_probe: {time.monotonic() - STARTED:5.0f} s: {message}", file=sys.stderr, flush=True
    )


@dataclass
class ShapeResult:
    shape: model.Shape
    tor_of_pod: Sequence[int]
    ranks: Dict[int, int]  # pod -> planned node rank
    documents: List[dict] = field(default_factory=list)  # node rank 0's probe.json, per run
    probe_seconds: List[float] = field(default_factory=list)  # the longest node's, per run
    job_with: List[float] = field(default_factory=list)
    job_without: List[float] = field(default_factory=list)


def run_job(
    fabric: net.Fabric,
    tor_of_pod: Sequence[int],
    workdir: Path,
    probe: Optional[str],
    cap: float,
) -> probe_job.ProbeJob:
    """One job to its end; its agents' exit codes must be 0 (RuntimeError otherwise)."""
    script = workdir.parent / "worker.py"
    if not script.exists():
        script.write_text("")  # the workers: nothing to do
    job = probe_job.start(
        fabric,
        tor_of_pod,
        workdir,
        [str(script)],
        probe=probe,
        tag=f"bench-probe-{os.getpid()}-{workdir.name}",
    )
    deadline = time.monotonic() + cap
    for agent in job.agents:
        try:
            agent.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            tail = job.logs()[-3000:]
            raise RuntimeError(f"the job did not end within {cap:.0f} s:\n{tail}") from None
    codes = [agent.returncode for agent in job.agents]
    if any(codes):
        raise RuntimeError(f"agents exited {codes}:\n{job.logs()[-3000:]}")
    return job


def measure_shape(shape: model.Shape, args: argparse.Namespace, workspace: Path) -> ShapeResult:
    tor_of_pod = make_job(shape, args.seed).tor_of_pod
    result = ShapeResult(shape, tor_of_pod, probe_job.planned_ranks(tor_of_pod))
    with net.Fabric(shape, tor_of_pod, args.rate) as fabric:
        log(
            f"{shape.text}: fabric up ({shape.nodes} nodes, {shape.tors} ToRs, {args.rate:g} Mbit/s)"
        )
        for index in range(args.repeat):
            for probe in (None, f"{args.budget:g}"):
                name = f"{shape.text}-{index}-{'on' if probe else 'off'}"
                started = time.monotonic()
                job = run_job(fabric, tor_of_pod, workspace / name, probe, args.budget + 240)
                wall = time.monotonic() - started
                if probe is None:
                    result.job_without.append(wall)
                    continue
                result.job_with.append(wall)
                documents = [job.probe_document(pod) for pod in range(shape.nodes)]
                missing = [pod for pod, document in enumerate(documents) if document is None]
                if missing:
                    raise RuntimeError(f"{name}: pods {missing} wrote no probe.json")
                root = next(pod for pod, rank in result.ranks.items() if rank == 0)
                result.documents.append(documents[root])
                result.probe_seconds.append(max(d["seconds"] for d in documents))
                log(f"{name}: {documents[root]['order']} ({documents[root]['reason']})")
    return result


def link_ratio(shape: model.Shape, tor_of_pod: Sequence[int], ranks: Dict[int, int]) -> float:
    """The link model's planned ÷ scheduler busbw of a ring allreduce (any size: it is linear)."""
    planned = tuple(sorted(ranks, key=ranks.__getitem__))
    scheduler = tuple(range(shape.nodes))
    nbytes, rate = 1 << 20, 1e6

    def seconds(order: Sequence[int]) -> float:
        return model.predict(shape, tor_of_pod, order, Collective.RING, nbytes, rate).seconds

    return seconds(scheduler) / seconds(planned)


def table_lines(results: Sequence[ShapeResult], args: argparse.Namespace) -> List[str]:
    lines = [
        f"bench_probe: npu-run --probe={args.budget:g} on the emulated fabric, {args.rate:g} Mbit/s"
        f" links, one gloo CPU device per node, the true topology; {args.repeat} run(s) with the"
        " probe and as many without, interleaved",
        "busbw = median of the probe's samples (nccl-tests: algbw * 2(n-1)/n); x = planned ÷"
        " scheduler busbw, measured and by the link model; probe s = the longest node's time in"
        " the probe (probe.json); job s = the agents' start to their exit",
        "",
        "| shape | nodes | bytes | planned MB/s | scheduler MB/s | x measured | x links | decision |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        links = link_ratio(result.shape, result.tor_of_pod, result.ranks)
        for run, document in enumerate(result.documents):
            tag = f" (run {run + 1})" if len(result.documents) > 1 else ""
            if not document["sizes"]:
                lines.append(
                    f"| {result.shape.text}{tag} | {result.shape.nodes} | - | - | - | - |"
                    f" {links:.2f} | {document['order']}: {document['reason']} |"
                )
            for size in document["sizes"]:
                busbw = size["busbw_bytes_per_s"]
                lines.append(
                    f"| {result.shape.text}{tag} | {result.shape.nodes} | {size['bytes']} |"
                    f" {busbw['planned'] / 1e6:.2f} | {busbw['scheduler'] / 1e6:.2f} |"
                    f" {size['ratio']:.2f} | {links:.2f} | {document['order']} |"
                )
    lines += [
        "",
        "| shape | nodes | probe s | job s with --probe | job s without | difference s |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        with_, without = statistics.median(result.job_with), statistics.median(result.job_without)
        lines.append(
            f"| {result.shape.text} | {result.shape.nodes} |"
            f" {statistics.median(result.probe_seconds):.1f} | {with_:.1f} | {without:.1f} |"
            f" {with_ - without:+.1f} |"
        )
    return lines


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=f"Exit status: 0 done, 1 a job failed, 2 bad flags, {EXIT_UNAVAILABLE} cannot"
        " build the fabric here (needs root and ip netns), 130 interrupted.",
    )
    defaults = " ".join(DEFAULT_SHAPES)
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=_shape,
        metavar="SHAPE",
        default=[model.parse_shape(text) for text in DEFAULT_SHAPES],
        help=f"{model.SHAPE_SYNTAX} (default: {defaults})",
    )
    parser.add_argument(
        "--rate",
        type=_positive(float),
        default=100.0,
        metavar="MBIT",
        help="link rate (default 100)",
    )
    parser.add_argument(
        "--budget",
        type=_positive(float),
        default=120.0,
        metavar="SECONDS",
        help="--probe's budget (default 120: room for a busy 2-core machine)",
    )
    parser.add_argument(
        "--repeat",
        type=_positive(int),
        default=1,
        help="runs with the probe, and as many without (default 1)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the placement (default 0)")
    parser.add_argument("--output", metavar="FILE", help="also write the table to FILE")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    args = parse_args(argv)
    if not net.begin("bench_probe", log):
        return EXIT_UNAVAILABLE
    workspace = Path(
        tempfile.mkdtemp(prefix=f"{net.PREFIX}{os.getpid()}-", dir=str(net.WORKSPACES))
    )
    results: List[ShapeResult] = []
    try:
        for shape in args.shapes:
            results.append(measure_shape(shape, args, workspace))
    except KeyboardInterrupt:
        log("interrupted; everything it made is removed")
        return 130
    except (RuntimeError, OSError) as error:
        log(f"error: {error}; everything it made is removed")
        return EXIT_FAILED
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    publish("\n".join(table_lines(results, args)) + "\n", args.output)
    return 0  # a probe that failed is a result (its row says why), not a failed benchmark


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
