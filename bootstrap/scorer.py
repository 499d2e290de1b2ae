"""Measure any node order on a fabric model (docs/ordering.md); pure.

Fabric model
------------
Each node hangs off one *switch group*: its ToR, or for a node whose NICs reach several ToRs the
tuple of them (``"A+B"``, treated as one switch of its own; conservative), or for a node without
topology a switch of its own. Above the ToRs sit the outer tiers of the node's switch path
(super pod, spine group), used for counting cross-tier edges. A flow between nodes of the same
switch group stays on that switch; any other flow leaves its ToR on one of ``U`` uplinks and
enters the destination ToR on one of its ``U`` downlinks. As in a two-level leaf-spine fabric,
ECMP picks one spine per flow uniformly at random, which fixes both links. Every link carries one
node's flow at full speed; ``k`` flows on one link each get ``1/k``. Intra-switch links never
collide (each node sends and receives at most one flow per phase).

Collectives as phases of simultaneous flows (rank r -> rank s), each with the data volume one flow
carries, in units of the allreduce buffer:

* ``ring``: one pattern ``r -> r+1`` repeated ``2(n-1)`` times with ``1/n`` each (volume
  ``2(n-1)/n``, the nccl-tests busbw factor).
* ``nhr``: for ``s = 0, 1, ...`` while ``2^s < n``: ``r -> r - 2^s``, volume ``2 * 2^-(s+1)``
  (reduce-scatter and mirrored allgather; the nearest step carries the most data). This is a model
  of HCCL's NHR, whose exact block schedule is not published.
* ``rhd``: recursive halving-doubling, far-first: ``r <-> r ^ 2^k`` for ``k`` from the highest
  bit down, volume ``2 * 2^-(j+1)`` for the j-th step. For ``n`` not a power of two the first
  ``2(n-p)`` ranks fold in pairs (Rabenseifner / MPICH): even ``r`` sends its whole buffer to
  ``r+1`` before and gets it back after (volume 1 each way), and the power-of-two ``p``
  survivors run the exchange.

Metrics per phase: cross-ToR edges, flows out of / into each ToR, the best possible max link load
with perfect path control ``max_t ceil(max(out_t, in_t) / U)``, the expected number of colliding
flow pairs under uniform ECMP ``(sum_t C(out_t,2) + sum_t C(in_t,2) - sum_(s,t) C(m_st,2)) / U``
and a Monte-Carlo phase time (each phase runs at the pace of its most loaded link). The predicted
bus-bandwidth fraction is the no-contention time over the expected time: nccl-tests' busbw
``algbw * 2(n-1)/n`` scales with 1/time for a fixed n, so the fraction is the same for busbw and
algbw, and 1.0 means "as fast as with no contention at all".
"""

from __future__ import annotations

import operator
import random
from collections import Counter
from dataclasses import dataclass
from itertools import compress
from typing import Dict, List, Optional, Sequence, Tuple

from . import canonical
from .base.model import Collective, RankTable, Topology

SwitchKey = Tuple[str, ...]  # outer tiers outermost first, then the ToR group label (unique)

_UNPLACED = "\x00unplaced:"  # cannot collide with a real switch id
DEFAULT_UPLINKS = 8
DEFAULT_SAMPLES = 16


@dataclass(frozen=True)
class Phase:
    """Flows that run at the same time, each carrying ``volume`` (units of the buffer)."""

    label: str
    volume: float
    sources: Tuple[int, ...]  # flow i goes from rank sources[i] to rank targets[i]
    targets: Tuple[int, ...]

    @property
    def flows(self) -> Tuple[Tuple[int, int], ...]:
        """``(source rank, destination rank)`` pairs."""
        return tuple(zip(self.sources, self.targets))


@dataclass(frozen=True)
class PhaseScore:
    label: str
    volume: float
    cross_edges: int  # flows whose endpoints sit on different ToR groups
    max_flows_out: int  # most cross-ToR flows leaving one ToR
    max_flows_in: int
    best_max_link_load: int  # max_t ceil(max(out_t, in_t) / U); 0 without cross flows
    expected_collisions: float  # expected colliding flow pairs under uniform ECMP


@dataclass(frozen=True)
class OrderScore:
    """How an order (``rank -> pod``) fares for one collective on one fabric model."""

    collective: Collective
    nodes: int
    switches: int  # ToR groups the job touches
    uplinks: int
    ring_cross_edges: int  # cross-ToR edges of the ring r -> r+1 (whatever the collective)
    ring_lower_bound: int  # ToR groups touched when more than one, else 0
    ring_cross_edges_by_tier: Tuple[int, ...]  # outermost tier first; last entry = ToR level
    ring_lower_bound_by_tier: Tuple[int, ...]
    cross_volume: float  # sum over phases of volume * cross edges (data leaving ToRs)
    max_flows_out: int  # over all phases and ToRs
    best_max_link_load: int  # over all phases
    expected_collisions: float  # summed over phases
    # Data-weighted versions (sum of volume * phase value / sum of volume): a phase that moves
    # 1/1024 of the buffer weighs 1/1024 of one that moves all of it. Equal to the raw values
    # for the ring (one phase).
    weighted_max_flows_out: float
    weighted_collisions: float
    best_busbw_fraction: float  # with perfect path control (no hashing collisions)
    busbw_fraction: Optional[float]  # Monte-Carlo ECMP; None when samples == 0
    phases: Tuple[PhaseScore, ...]


def switch_keys(
    table: RankTable,
    topology: Optional[Topology],
    paths: Optional[Sequence[canonical.SwitchPath]] = None,
) -> Tuple[SwitchKey, ...]:
    """The switch path of every pod (indexed by pod index) as the scorer sees it.

    ``paths`` may pass precomputed :func:`~npu_job.bootstrap.canonical.switch_paths`.
    """
    if paths is None:
        paths = canonical.switch_paths(table, topology)
    keys: List[SwitchKey] = []
    for server, (tiers, tors, _slot) in zip(table.servers, paths):
        label = "+".join(tors) if tors else _UNPLACED + server.server_id
        keys.append(tiers + (label,))
    return tuple(keys)


def phases(nodes: int, collective: Collective) -> Tuple[Phase, ...]:
    """The communication phases of an allreduce of ``collective`` over ``nodes`` ranks."""
    if nodes < 2:
        return ()
    ranks = tuple(range(nodes))
    if collective is Collective.RING:
        return (Phase("ring", 2 * (nodes - 1) / nodes, ranks, ranks[1:] + ranks[:1]),)
    if collective is Collective.NHR:
        result = []
        step = 0
        while (1 << step) < nodes:
            distance = 1 << step  # r -> r - distance (mod n)
            result.append(
                Phase(
                    f"nhr d={distance}",
                    2.0 / (2 << step),
                    ranks,
                    ranks[-distance:] + ranks[:-distance],
                )
            )
            step += 1
        return tuple(result)
    return _rhd_phases(nodes)


def _rhd_phases(nodes: int) -> Tuple[Phase, ...]:
    power = 1 << (nodes.bit_length() - 1)
    extra = nodes - power
    real = tuple(
        2 * v + 1 if v < extra else v + extra for v in range(power)
    )  # virtual -> real rank
    evens = tuple(range(0, 2 * extra, 2))
    odds = tuple(range(1, 2 * extra, 2))
    result: List[Phase] = []
    if extra:
        result.append(Phase("rhd fold", 1.0, evens, odds))
    bits = power.bit_length() - 1
    for j, k in enumerate(range(bits - 1, -1, -1)):
        distance = 1 << k
        partners: List[int] = []  # real[v ^ distance] for every v, by swapping neighbouring blocks
        for start in range(0, power, 2 * distance):
            partners.extend(real[start + distance : start + 2 * distance])
            partners.extend(real[start : start + distance])
        result.append(Phase(f"rhd d={distance}", 2.0 / (2 << j), real, tuple(partners)))
    if extra:
        result.append(Phase("rhd unfold", 1.0, odds, evens))
    return tuple(result)


def ring_cross_edges(
    order: Sequence[int], switch_of_pod: Sequence[SwitchKey], depth: Optional[int] = None
) -> int:
    """Ring edges ``r -> r+1`` whose nodes differ in their switch path (up to ``depth`` levels)."""
    labels = [
        switch_of_pod[pod][:depth] if depth is not None else switch_of_pod[pod] for pod in order
    ]
    count = len(labels)
    if count < 2:
        return 0
    return sum(1 for r in range(count) if labels[r] != labels[(r + 1) % count])


def ring_lower_bound(
    pods: Sequence[int], switch_of_pod: Sequence[SwitchKey], depth: Optional[int] = None
) -> int:
    """Fewest cross edges any ring over ``pods`` can have: groups touched, or 0 for one group."""
    groups = {
        switch_of_pod[pod][:depth] if depth is not None else switch_of_pod[pod] for pod in pods
    }
    return len(groups) if len(groups) > 1 else 0


def cross_switch_volume(
    order: Sequence[int],
    switch_of_pod: Sequence[SwitchKey],
    collective: Collective,
    phase_list: Optional[Sequence[Phase]] = None,
) -> Tuple[float, float]:
    """``(data leaving ToRs, phase time with perfect paths and one uplink)``; lower is better.

    Cheap enough for the planner to compare candidate orders (no sampling; the loops run in C via
    ``map``/``Counter``); ``phase_list`` may pass precomputed :func:`phases`.
    """
    numbering: Dict[SwitchKey, int] = {}
    labels = [numbering.setdefault(switch_of_pod[pod], len(numbering)) for pod in order]
    label_of = labels.__getitem__
    volume = 0.0
    time = 0.0
    for phase in phase_list if phase_list is not None else phases(len(order), collective):
        src = list(map(label_of, phase.sources))
        dst = list(map(label_of, phase.targets))
        crossing = list(map(operator.ne, src, dst))
        out = Counter(compress(src, crossing))
        into = Counter(compress(dst, crossing))
        volume += phase.volume * sum(crossing)
        time += phase.volume * max(1, max(out.values(), default=0), max(into.values(), default=0))
    return volume, time


def score_order(
    order: Sequence[int],
    switch_of_pod: Sequence[SwitchKey],
    collective: Collective = Collective.RING,
    *,
    uplinks: int = DEFAULT_UPLINKS,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
) -> OrderScore:
    """Score ``order`` (``order[rank]`` = pod index) for ``collective`` with ``uplinks`` per ToR.

    ``samples`` Monte-Carlo ECMP draws (``random.Random(seed)``, deterministic); 0 skips them.
    """
    if uplinks < 1:
        raise ValueError(f"uplinks must be >= 1, got {uplinks}")
    labels = [switch_of_pod[pod] for pod in order]
    nodes = len(order)
    depth = max((len(label) for label in labels), default=1)
    by_tier = tuple(ring_cross_edges(order, switch_of_pod, level) for level in range(1, depth))
    bounds = tuple(ring_lower_bound(order, switch_of_pod, level) for level in range(1, depth))
    phase_list = phases(nodes, collective)
    crossing: List[List[Tuple[SwitchKey, SwitchKey]]] = []
    scores: List[PhaseScore] = []
    for phase in phase_list:
        pairs = [
            (labels[s], labels[d])
            for s, d in zip(phase.sources, phase.targets)
            if labels[s] != labels[d]
        ]
        crossing.append(pairs)
        scores.append(_phase_score(phase, pairs, uplinks))
    ideal = sum(phase.volume for phase in phase_list)
    best_time = sum(p.volume * max(1, s.best_max_link_load) for p, s in zip(phase_list, scores))
    busbw: Optional[float] = None
    if samples > 0:
        rng = random.Random(seed)
        total = 0.0
        for _ in range(samples):
            total += sum(
                p.volume * _sampled_load(pairs, uplinks, rng)
                for p, pairs in zip(phase_list, crossing)
            )
        busbw = ideal / (total / samples) if total else 1.0
    ring_edges = ring_cross_edges(order, switch_of_pod)
    return OrderScore(
        collective=collective,
        nodes=nodes,
        switches=len(set(labels)),
        uplinks=uplinks,
        ring_cross_edges=ring_edges,
        ring_lower_bound=ring_lower_bound(order, switch_of_pod),
        ring_cross_edges_by_tier=by_tier + (ring_edges,),
        ring_lower_bound_by_tier=bounds + (ring_lower_bound(order, switch_of_pod),),
        cross_volume=sum(s.volume * s.cross_edges for s in scores),
        max_flows_out=max((s.max_flows_out for s in scores), default=0),
        best_max_link_load=max((s.best_max_link_load for s in scores), default=0),
        expected_collisions=sum(s.expected_collisions for s in scores),
        weighted_max_flows_out=_weighted(phase_list, [s.max_flows_out for s in scores]),
        weighted_collisions=_weighted(phase_list, [s.expected_collisions for s in scores]),
        best_busbw_fraction=ideal / best_time if best_time else 1.0,
        busbw_fraction=busbw,
        phases=tuple(scores),
    )


def predicted_ratio(
    order: Sequence[int], switch_of_pod: Sequence[SwitchKey], collective: Collective
) -> Optional[float]:
    """The predicted busbw of ``order`` over the scheduler's (pod index order): the ratio of
    :func:`score_order`'s Monte-Carlo ``busbw_fraction`` for the two, on the model ``npu-job
    plan`` compares its "ours" and "scheduler" columns on by default (its defaults are these)."""
    scheduler = tuple(range(len(order)))
    ours, theirs = (score_order(each, switch_of_pod, collective) for each in (order, scheduler))
    if ours.busbw_fraction is None or not theirs.busbw_fraction:
        return None
    return ours.busbw_fraction / theirs.busbw_fraction


def _weighted(phase_list: Sequence[Phase], values: Sequence[float]) -> float:
    total = sum(phase.volume for phase in phase_list)
    return (
        sum(phase.volume * value for phase, value in zip(phase_list, values)) / total
        if total
        else 0.0
    )


def _pairs(count: int) -> int:
    return count * (count - 1) // 2


def _phase_score(
    phase: Phase, pairs: Sequence[Tuple[SwitchKey, SwitchKey]], uplinks: int
) -> PhaseScore:
    out: Dict[SwitchKey, int] = {}
    into: Dict[SwitchKey, int] = {}
    between: Dict[Tuple[SwitchKey, SwitchKey], int] = {}
    for src, dst in pairs:
        out[src] = out.get(src, 0) + 1
        into[dst] = into.get(dst, 0) + 1
        between[(src, dst)] = between.get((src, dst), 0) + 1
    busiest = max([*out.values(), *into.values()], default=0)
    colliding = (
        sum(map(_pairs, out.values()))
        + sum(map(_pairs, into.values()))
        - sum(map(_pairs, between.values()))
    )
    return PhaseScore(
        label=phase.label,
        volume=phase.volume,
        cross_edges=len(pairs),
        max_flows_out=max(out.values(), default=0),
        max_flows_in=max(into.values(), default=0),
        best_max_link_load=-(-busiest // uplinks),
        expected_collisions=colliding / uplinks,
    )


def _sampled_load(
    pairs: Sequence[Tuple[SwitchKey, SwitchKey]], uplinks: int, rng: random.Random
) -> int:
    """Load of the busiest link when each cross flow hashes to a uniformly random spine."""
    if not pairs:
        return 1
    up: Dict[Tuple[SwitchKey, int], int] = {}
    down: Dict[Tuple[SwitchKey, int], int] = {}
    draw = rng.random
    for src, dst in pairs:
        spine = int(draw() * uplinks)
        up[(src, spine)] = up.get((src, spine), 0) + 1
        down[(dst, spine)] = down.get((dst, spine), 0) + 1
    return max(max(up.values()), max(down.values()))
