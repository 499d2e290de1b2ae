"""What a probe's timings mean (pure): bandwidths as nccl-tests defines them, the interleaved
schedule, the decision between the two orders, its verdict line and ``probe.json``.

The probe times one collective over the job's own devices under two rank orders, the
scheduler's and the plan's (:data:`ORDERS`). nccl-tests' definitions (its ``doc/PERFORMANCE.md``):
``algbw = size / time``, and the bus bandwidth ``busbw = algbw * factor``, the factor being what
each rank's link must carry for that collective with ``n`` ranks (:func:`bus_factor`:
``2(n-1)/n`` for all_reduce). ``size`` is the collective's buffer in bytes: the input of
all_reduce and broadcast, the whole output of all_gather, the input of reduce_scatter.

The two orders run interleaved (A B A B ...) after a warm-up of each, so that whatever else the
fabric carries at the time hits both alike (:func:`schedule`). Node rank 0 decides from the
medians (:func:`decide`): it keeps the plan unless the plan's bus bandwidth at the largest size
(the bandwidth-bound case the order changes) is below the scheduler order's by more than the
margin. A negative margin asks more of the plan: it is kept only where it is faster than the
scheduler's order by more than that fraction.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

PLANNED, SCHEDULER = "planned", "scheduler"
ORDERS = (PLANNED, SCHEDULER)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DEFAULT_MARGIN = 0.05  # the plan is kept unless slower than the scheduler's order by more
JSON_VERSION = 1


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` over ``ranks`` ranks."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if collective == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if collective in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    if collective == "broadcast":
        return 1.0
    raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {collective!r}")


def algbw(size: int, seconds: float) -> float:
    """Bytes per second of one collective of ``size`` bytes that took ``seconds``."""
    return size / seconds if seconds > 0 else math.inf


def schedule(
    sizes: Sequence[int], iterations: int, warmup: int
) -> Tuple[Tuple[str, int, bool], ...]:
    """``(order, size, timed)`` steps: per size, ``warmup`` untimed runs of each order, then
    ``iterations`` timed runs of each, alternating planned, scheduler, planned, ..."""
    steps: List[Tuple[str, int, bool]] = []
    for size in sizes:
        for timed, count in ((False, warmup), (True, iterations)):
            for _ in range(count):
                steps.extend((order, size, timed) for order in ORDERS)
    return tuple(steps)


@dataclass(frozen=True)
class SizeResult:
    """The medians of one message size: seconds and bus bandwidth (bytes/s) of each order."""

    size: int
    seconds: Mapping[str, float]
    busbw: Mapping[str, float]

    @property
    def ratio(self) -> float:
        """Planned busbw over the scheduler order's (above 1: the plan is faster)."""
        return self.busbw[PLANNED] / self.busbw[SCHEDULER]


def size_results(
    samples: Sequence[Tuple[str, int, float]], collective: str, ranks: int
) -> Tuple[SizeResult, ...]:
    """Medians per size of ``(order, size, seconds)`` samples, each the slowest rank's time of
    one timed step; sizes ascending. Every size must have samples of both orders."""
    seconds: Dict[int, Dict[str, List[float]]] = {}
    for order, size, elapsed in samples:
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        seconds.setdefault(size, {name: [] for name in ORDERS})[order].append(elapsed)
    factor = bus_factor(collective, ranks)
    results = []
    for size in sorted(seconds):
        missing = [name for name in ORDERS if not seconds[size][name]]
        if missing:
            raise ValueError(f"size {size}: no sample of the {' and '.join(missing)} order")
        medians = {name: statistics.median(seconds[size][name]) for name in ORDERS}
        results.append(
            SizeResult(
                size,
                medians,
                {name: algbw(size, medians[name]) * factor for name in ORDERS},
            )
        )
    return tuple(results)


@dataclass(frozen=True)
class Decision:
    """Node rank 0's decision, which every node follows: the order the workers start in."""

    order: str  # PLANNED or SCHEDULER
    reason: str  # why, in a few words (the verdict line's tail)
    results: Tuple[SizeResult, ...] = ()
    margin: float = DEFAULT_MARGIN
    predicted: Optional[float] = None  # npu-job plan's predicted busbw ratio for the same input
    digests: Mapping[str, str] = field(default_factory=dict)  # mapping digest of each order

    @property
    def keeps_plan(self) -> bool:
        return self.order == PLANNED


def decide(
    results: Sequence[SizeResult],
    margin: float = DEFAULT_MARGIN,
    *,
    predicted: Optional[float] = None,
    digests: Optional[Mapping[str, str]] = None,
) -> Decision:
    """Keep the plan unless its busbw at the largest size is below the scheduler order's by more
    than ``margin`` (a fraction: 0.05 is 5%; -0.1 keeps it only where it is 10% faster)."""
    if not -1 < margin < 1:
        raise ValueError(f"margin must be within (-1, 1), got {margin}")
    known = dict(digests or {})
    if not results:
        return Decision(PLANNED, "no timing: keeping the plan", (), margin, predicted, known)
    largest = results[-1]
    if largest.ratio < 1 - margin:
        order, why = (
            SCHEDULER,
            (
                f"the plan is slower by more than {margin:.0%}: keeping the scheduler's order"
                if margin >= 0
                else f"the plan is not faster by more than {-margin:.0%}: keeping the "
                "scheduler's order"
            ),
        )
    else:
        order, why = PLANNED, "keeping the plan"
    return Decision(order, why, tuple(results), margin, predicted, known)


def failed(reason: str, *, predicted: Optional[float] = None) -> Decision:
    """The decision when the probe could not finish (timeout, a failed group): keep the plan."""
    return Decision(PLANNED, f"{reason}: keeping the plan", (), DEFAULT_MARGIN, predicted)


def gigabytes(value: float) -> str:
    return f"{value / 1e9:.3g} GB/s"


def verdict_line(decision: Decision, collective: str, algorithm: str = "ring") -> str:
    """The one line every node logs, e.g. ``probe: ring all_reduce busbw planned 10.9 GB/s,
    scheduler 3.6 GB/s (x3.03, predicted x3.00): keeping the plan``."""
    if not decision.results:
        return f"probe: {decision.reason}"
    largest = decision.results[-1]
    predicted = "" if decision.predicted is None else f", predicted ×{decision.predicted:.2f}"
    return (
        f"probe: {algorithm} {collective} busbw planned {gigabytes(largest.busbw[PLANNED])}, "
        f"scheduler {gigabytes(largest.busbw[SCHEDULER])} (×{largest.ratio:.2f}{predicted}) "
        f"at {largest.size} bytes: {decision.reason}"
    )


def probe_document(
    decision: Decision, collective: str, ranks: int, backend: str, seconds: float
) -> Dict[str, Any]:
    """``probe.json``: the decision, both orders' mapping digests, per-size medians and busbw of
    each order, their ratio, and the prediction."""
    return {
        "version": JSON_VERSION,
        "order": decision.order,
        "reason": decision.reason,
        "collective": collective,
        "backend": backend,
        "ranks": ranks,
        "margin": decision.margin,
        "predicted_ratio": decision.predicted,
        "mapping_digests": dict(decision.digests),
        "seconds": seconds,
        "sizes": [
            {
                "bytes": result.size,
                "seconds": dict(result.seconds),
                "busbw_bytes_per_s": dict(result.busbw),
                "ratio": result.ratio,
            }
            for result in decision.results
        ],
    }
