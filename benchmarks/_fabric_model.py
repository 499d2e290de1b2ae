"""The pure parts of the emulated-fabric benchmark (bench_fabric.py): shapes, the link model,
the send/recv schedules of halving-doubling and NHR, bandwidth formulas and counter parsing.

Nothing here touches the machine; the tests run all of it (tests/test_bench_fabric.py).

The fabric is a tree of links, each a full-duplex pair of one-way links:

* every node hangs off its ToR by a node link (``node-up`` / ``node-down``);
* every ToR has one uplink (``tor-up`` / ``tor-down``) into the layer above: one non-blocking
  core, or with spine groups its spine (ToRs split into contiguous groups, as
  :func:`npu_job.demo.synthetic.synthetic_cluster` does with ``spine_groups``);
* every spine has one uplink (``spine-up`` / ``spine-down``) into the core, as fast as its ToRs'
  uplinks together divided by the oversubscription.

A flow crosses the links on its path; the flows of a phase share each link equally and the phase
lasts as long as its most loaded link needs (the scorer's "perfect path control" with one uplink
per ToR, extended to the spine tier). With one uplink per ToR there is no hashing to model, so
for shapes without spines :func:`predict` agrees with :func:`npu_job.bootstrap.scorer.score_order`
(``uplinks=1``) exactly; a test holds them to it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from npu_job.bootstrap.base.model import Collective
from npu_job.bootstrap.scorer import phases

MAX_NODES = 64  # one namespace and one torch process per node on a small machine
Link = Tuple[str, int]  # ("node-up", pod), ("tor-down", tor), ("spine-up", spine), ...

_SHAPE = re.compile(
    r"^(?P<nodes>\d{1,4})(?:x(?P<tors>\d{1,4})|:(?P<sizes>\d{1,4}(?:,\d{1,4})*))"
    r"(?:/(?P<spines>\d{1,4})(?:@(?P<over>\d{1,3}(?:\.\d{1,3})?))?)?$"
)
SHAPE_SYNTAX = (
    "NODESxTORS or NODES:SIZE,SIZE,... (one size per ToR), optionally /SPINES[@OVERSUBSCRIPTION],"
    " e.g. 12x4, 16:6,4,4,2, 16x4/2@2"
)


@dataclass(frozen=True)
class Shape:
    """A fabric: nodes per ToR, and optionally spine groups with oversubscribed uplinks."""

    text: str
    tor_sizes: Tuple[int, ...]
    spines: int = 0  # spine groups; 0: the ToR uplinks meet in one non-blocking core
    oversubscription: float = 1.0

    @property
    def nodes(self) -> int:
        return sum(self.tor_sizes)

    @property
    def tors(self) -> int:
        return len(self.tor_sizes)

    def spine_of_tor(self, tor: int) -> int:
        """The spine group of ToR ``tor`` (the synthetic generator's rule); 0 without spines."""
        return tor * self.spines // self.tors if self.spines else 0

    def tors_under_spine(self, spine: int) -> int:
        return sum(1 for tor in range(self.tors) if self.spine_of_tor(tor) == spine)


def parse_shape(text: str) -> Shape:
    """``12x4``, ``16:6,4,4,2``, ``16x4/2@2`` -> :class:`Shape`; a ``ValueError`` says what is
    wrong."""
    match = _SHAPE.match(text.strip())
    if match is None:
        raise ValueError(f"shape {text!r}: expected {SHAPE_SYNTAX}")
    nodes = int(match["nodes"])
    if match["sizes"] is not None:
        sizes = tuple(int(size) for size in match["sizes"].split(","))
        if sum(sizes) != nodes:
            raise ValueError(f"shape {text!r}: the ToR sizes add up to {sum(sizes)}, not {nodes}")
    else:
        tors = int(match["tors"])
        if not 1 <= tors <= nodes:
            raise ValueError(f"shape {text!r}: expected 1 to {nodes} ToRs, got {tors}")
        sizes = tuple(nodes // tors + (1 if tor < nodes % tors else 0) for tor in range(tors))
    if min(sizes) < 1:
        raise ValueError(f"shape {text!r}: every ToR needs at least one node")
    if not 3 <= nodes <= MAX_NODES:
        raise ValueError(
            f"shape {text!r}: expected 3 to {MAX_NODES} nodes (the planner needs at least 3),"
            f" got {nodes}"
        )
    spines = int(match["spines"]) if match["spines"] is not None else 0
    if match["spines"] is not None and not 2 <= spines <= len(sizes):
        raise ValueError(f"shape {text!r}: expected 2 to {len(sizes)} spine groups, got {spines}")
    over = float(match["over"]) if match["over"] is not None else 1.0
    if over < 1:
        raise ValueError(f"shape {text!r}: an oversubscription is at least 1, got {over:g}")
    return Shape(text.strip(), sizes, spines, over)


# ---------------------------------------------------------------------------------------------
# the link model
# ---------------------------------------------------------------------------------------------
def path(shape: Shape, tor_of_pod: Sequence[int], source: int, target: int) -> Tuple[Link, ...]:
    """The one-way links a flow from pod ``source`` to pod ``target`` crosses."""
    if source == target:
        return ()
    links: List[Link] = [("node-up", source)]
    up, down = tor_of_pod[source], tor_of_pod[target]
    if up != down:
        links.append(("tor-up", up))
        spine_up, spine_down = shape.spine_of_tor(up), shape.spine_of_tor(down)
        if shape.spines and spine_up != spine_down:
            links += [("spine-up", spine_up), ("spine-down", spine_down)]
        links.append(("tor-down", down))
    links.append(("node-down", target))
    return tuple(links)


def link_rate(shape: Shape, link: Link, rate: float) -> float:
    """Bytes (or bits) per second of ``link`` when node links and ToR uplinks run at ``rate``."""
    kind, index = link
    if kind.startswith("spine-"):
        return rate * shape.tors_under_spine(index) / shape.oversubscription
    return rate


def uplinks(shape: Shape) -> Tuple[Link, ...]:
    """The links above the ToRs, in a fixed order (ToRs, then spines; up before down)."""
    links: List[Link] = []
    for tor in range(shape.tors):
        links += [("tor-up", tor), ("tor-down", tor)]
    for spine in range(shape.spines):
        links += [("spine-up", spine), ("spine-down", spine)]
    return tuple(links)


@dataclass(frozen=True)
class Prediction:
    seconds: float  # one allreduce of ``nbytes``
    link_bytes: Mapping[Link, float]  # payload bytes each one-way link carries


def predict(
    shape: Shape,
    tor_of_pod: Sequence[int],
    order: Sequence[int],
    collective: Collective,
    nbytes: float,
    rate: float,
) -> Prediction:
    """Time and bytes per link of one allreduce of ``nbytes`` under ``order`` (rank -> pod).

    ``rate`` in bytes per second. Phases are the scorer's (:func:`npu_job.bootstrap.scorer.phases`).
    """
    seconds = 0.0
    link_bytes: Dict[Link, float] = {}
    for phase in phases(len(order), collective):
        load: Dict[Link, int] = {}
        for source, target in phase.flows:
            for link in path(shape, tor_of_pod, order[source], order[target]):
                load[link] = load.get(link, 0) + 1
        flow_bytes = phase.volume * nbytes
        for link, flows in load.items():
            link_bytes[link] = link_bytes.get(link, 0.0) + flows * flow_bytes
        seconds += max(
            (flows * flow_bytes / link_rate(shape, link, rate) for link, flows in load.items()),
            default=0.0,
        )
    return Prediction(seconds, link_bytes)


# ---------------------------------------------------------------------------------------------
# bandwidth (nccl-tests' definitions)
# ---------------------------------------------------------------------------------------------
def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth: the buffer size over the time of one collective."""
    return nbytes / seconds


def allreduce_busbw(algorithm_bandwidth: float, nodes: int) -> float:
    """Bus bandwidth of an allreduce: ``algbw * 2(n-1)/n``, what each rank's link must carry."""
    return algorithm_bandwidth * 2 * (nodes - 1) / nodes


# ---------------------------------------------------------------------------------------------
# send/recv schedules
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Transfer:
    """``source`` sends its ``blocks`` of the buffer to ``target``, which adds them into its own
    (``reduce``) or overwrites its own with them."""

    source: int
    target: int
    blocks: Tuple[int, ...]
    reduce: bool


@dataclass(frozen=True)
class Step:
    label: str
    distance: int  # 0 for the fold / unfold steps
    transfers: Tuple[Transfer, ...]


@dataclass(frozen=True)
class Schedule:
    """An allreduce as steps of simultaneous transfers over a buffer cut into ``blocks`` blocks.

    ``exact`` is False for a traffic pattern that moves the right volumes between the right ranks
    but does not compute a sum (NHR on a node count that is not a power of two).
    """

    collective: Collective
    nodes: int
    blocks: int
    exact: bool
    steps: Tuple[Step, ...] = field(repr=False)


def rhd_schedule(nodes: int) -> Schedule:
    """Recursive halving-doubling, far-first: pairs ``v ^ d`` for ``d = p/2 ... 1`` (reduce-scatter
    by halving), then ``d = 1 ... p/2`` (allgather by doubling). With ``n`` not a power of two,
    ranks ``2i`` fold into ``2i + 1`` for ``i < n - p`` first and get the result back last
    (Rabenseifner); the scorer's ``rhd`` phases, in the same rank numbering."""
    power = 1 << (nodes.bit_length() - 1)
    extra = nodes - power
    real = [2 * v + 1 if v < extra else v + extra for v in range(power)]
    everything = tuple(range(power))
    steps: List[Step] = []
    if extra:
        steps.append(
            Step(
                "fold", 0, tuple(Transfer(2 * i, 2 * i + 1, everything, True) for i in range(extra))
            )
        )
    low = [0] * power
    size = power
    distance = power // 2
    while distance:
        half = size // 2
        transfers = []
        kept = []
        for v in range(power):
            keep_low = not v & distance
            give = low[v] + half if keep_low else low[v]
            kept.append(low[v] if keep_low else low[v] + half)
            transfers.append(
                Transfer(real[v], real[v ^ distance], tuple(range(give, give + half)), True)
            )
        steps.append(Step(f"reduce-scatter d={distance}", distance, tuple(transfers)))
        low, size, distance = kept, half, distance // 2
    distance = 1
    while distance < power:
        transfers = [
            Transfer(real[v], real[v ^ distance], tuple(range(low[v], low[v] + size)), False)
            for v in range(power)
        ]
        steps.append(Step(f"allgather d={distance}", distance, tuple(transfers)))
        low = [min(low[v], low[v ^ distance]) for v in range(power)]
        size, distance = size * 2, distance * 2
    if extra:
        steps.append(
            Step(
                "unfold",
                0,
                tuple(Transfer(2 * i + 1, 2 * i, everything, False) for i in range(extra)),
            )
        )
    return Schedule(Collective.RHD, nodes, power, True, tuple(steps))


def nhr_schedule(nodes: int) -> Schedule:
    """HCCL's NHR as the scorer models it: every rank sends to ``r - 2^s``, the nearest step
    carrying the most data (half the buffer at distance 1, a quarter at 2, ...), in a
    reduce-scatter (nearest first) and a mirrored allgather (farthest first).

    For ``n`` a power of two this is an exact allreduce: at distance ``D`` rank ``r`` hands
    ``r - D`` the partial sums of the blocks ``{r - D - 2mD}``, the time reversal of a
    recursive-doubling allgather. HCCL's schedule for other ``n`` is not published: there the
    schedule moves the model's volumes between the model's pairs and ``exact`` is False.
    """
    steps_count = max(1, (nodes - 1).bit_length())  # distances 2^s < n
    if nodes & (nodes - 1) == 0:
        return Schedule(Collective.NHR, nodes, nodes, True, _nhr_exact(nodes))
    blocks = 1 << steps_count
    reduce_scatter = [
        Step(
            f"reduce-scatter d={1 << s}",
            1 << s,
            tuple(
                Transfer(r, (r - (1 << s)) % nodes, tuple(range(blocks >> (s + 1))), True)
                for r in range(nodes)
            ),
        )
        for s in range(steps_count)
    ]
    allgather = [
        Step(
            f"allgather d={1 << s}",
            1 << s,
            tuple(
                Transfer(r, (r - (1 << s)) % nodes, tuple(range(blocks >> (s + 1))), False)
                for r in range(nodes)
            ),
        )
        for s in reversed(range(steps_count))
    ]
    return Schedule(Collective.NHR, nodes, blocks, False, tuple(reduce_scatter + allgather))


def _nhr_exact(nodes: int) -> Tuple[Step, ...]:
    levels = nodes.bit_length() - 1

    def below(level: int, rank: int) -> Tuple[int, ...]:  # {rank - m * n / 2^level}
        stride = nodes >> level
        return tuple(sorted((rank - m * stride) % nodes for m in range(1 << level)))

    def above(level: int, rank: int) -> Tuple[int, ...]:  # {rank + m * n / 2^level}
        stride = nodes >> level
        return tuple(sorted((rank + m * stride) % nodes for m in range(1 << level)))

    steps: List[Step] = []
    for level in range(levels, 0, -1):  # distance 1, 2, ..., n/2
        distance = nodes >> level
        steps.append(
            Step(
                f"reduce-scatter d={distance}",
                distance,
                tuple(
                    Transfer(r, (r - distance) % nodes, below(level - 1, r - distance), True)
                    for r in range(nodes)
                ),
            )
        )
    for level in range(1, levels + 1):  # distance n/2, ..., 1
        distance = nodes >> level
        steps.append(
            Step(
                f"allgather d={distance}",
                distance,
                tuple(
                    Transfer(r, (r - distance) % nodes, above(level - 1, r), False)
                    for r in range(nodes)
                ),
            )
        )
    return tuple(steps)


def schedule(collective: Collective, nodes: int) -> Schedule:
    if collective is Collective.RHD:
        return rhd_schedule(nodes)
    if collective is Collective.NHR:
        return nhr_schedule(nodes)
    raise ValueError(f"no send/recv schedule for {collective} (gloo's own all_reduce is the ring)")


def simulate(plan: Schedule) -> List[List[Dict[int, int]]]:
    """Run ``plan`` on contributor counts: ``result[rank][block]`` maps each rank to how many
    times its contribution reached that block (an exact allreduce gives 1 for every rank)."""
    state = [[{rank: 1} for _ in range(plan.blocks)] for rank in range(plan.nodes)]
    for step in plan.steps:
        sent = [(t, [dict(state[t.source][b]) for b in t.blocks]) for t in step.transfers]
        for transfer, values in sent:
            for block, value in zip(transfer.blocks, values):
                mine = state[transfer.target][block]
                if transfer.reduce:
                    for rank, count in value.items():
                        mine[rank] = mine.get(rank, 0) + count
                else:
                    state[transfer.target][block] = value
    return state


# ---------------------------------------------------------------------------------------------
# counters
# ---------------------------------------------------------------------------------------------
_SS_ADDRESS = re.compile(r"^(?:[A-Z][A-Z0-9-]*\s+)?\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)")
_SS_FIELD = re.compile(r"\b(bytes_acked|bytes_received):(\d+)")


@dataclass(frozen=True)
class Socket:
    local: str
    local_port: int
    peer: str
    peer_port: int
    bytes_acked: int  # sent and acknowledged
    bytes_received: int


def parse_ss(text: str) -> Tuple[Socket, ...]:
    """``ss -tinH`` output (a socket's line, then its indented info line) -> :class:`Socket`.

    The state column is there unless ``ss`` was asked for one state only."""
    sockets: List[Socket] = []
    current: Optional[re.Match] = None
    for line in text.splitlines():
        head = _SS_ADDRESS.match(line)
        if head is not None:
            current = head
            continue
        if current is not None and line[:1].isspace():
            fields = dict(_SS_FIELD.findall(line))
            sockets.append(
                Socket(
                    current[1].strip("[]"),
                    int(current[2]),
                    current[3].strip("[]"),
                    int(current[4]),
                    int(fields.get("bytes_acked", 0)),
                    int(fields.get("bytes_received", 0)),
                )
            )
            current = None
    return tuple(sockets)


def sent_by_peer(
    before: Iterable[Socket], after: Iterable[Socket], ignore_ports: Sequence[int] = ()
) -> Dict[str, int]:
    """Bytes sent to each peer address between two ``ss`` snapshots of one host."""
    start = {(s.local_port, s.peer, s.peer_port): s.bytes_acked for s in before}
    sent: Dict[str, int] = {}
    for sock in after:
        if sock.local_port in ignore_ports or sock.peer_port in ignore_ports:
            continue
        delta = sock.bytes_acked - start.get((sock.local_port, sock.peer, sock.peer_port), 0)
        if delta > 0:
            sent[sock.peer] = sent.get(sock.peer, 0) + delta
    return sent


@dataclass(frozen=True)
class RingCheck:
    """Where each rank's bytes went during gloo's all_reduce, in one order."""

    direction: int  # +1: rank r sends to r+1; -1: to r-1; 0: neither dominates
    worst_share: float  # the smallest share of a rank's bytes that went to that neighbour
    bytes_per_rank: float  # mean bytes a rank sent


def ring_check(sent: Mapping[int, Mapping[int, int]], order: Sequence[int]) -> RingCheck:
    """``sent[pod][peer pod]`` bytes -> whether the traffic followed the ring of ``order``."""
    nodes = len(order)
    rank_of = {pod: rank for rank, pod in enumerate(order)}
    best = (0, 0.0)
    for direction in (1, -1):
        shares = []
        for pod, peers in sent.items():
            total = sum(peers.values())
            neighbour = order[(rank_of[pod] + direction) % nodes]
            shares.append(peers.get(neighbour, 0) / total if total else 0.0)
        worst = min(shares, default=0.0)
        if worst > best[1]:
            best = (direction, worst)
    mean = sum(sum(peers.values()) for peers in sent.values()) / max(1, len(sent))
    return RingCheck(best[0] if best[1] > 0.5 else 0, best[1], mean)


def link_tx_bytes(ip_json: str) -> Dict[str, int]:
    """``ip -j -s link show`` -> transmitted bytes per interface name."""
    return {
        entry["ifname"]: int(entry["stats64"]["tx"]["bytes"])
        for entry in json.loads(ip_json)
        if "stats64" in entry
    }


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
