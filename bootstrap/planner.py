"""The routing-affine node order (docs/ordering.md): rank table + switch topology -> :class:`Plan`.

Pure and deterministic: every pod runs :func:`plan` alone on the same inputs and must reach the
same answer, so inputs are put in canonical order first (see :mod:`npu_job.bootstrap.canonical`)
and every sort key is total and ends in the unique server id. No ``hash()``, no set or dict
iteration order, no clock.

Ordering rules
--------------
*Switch groups.* A node's group is its switch path: outer tiers outermost first (the rank table's
super pod, then the topology's tiers), then the sorted tuple of its ToRs. Groups are ordered by
that path with :func:`~npu_job.bootstrap.canonical.id_sort_key` (IPs numerically, other ids
naturally). A node whose NICs reach several ToRs forms a group of its own tuple, e.g.
``(A, B)``; tuple order places it right after ToR ``A``'s group and before ``B``'s, so the ring
walks ``A… → AB… → B…`` and the multi-ToR nodes bridge the two switches they share. Nodes without
any placement go last, each its own group, by server id.

*Inside a group* nodes are sorted by slot (slice id; unknown slots after known ones), then server
id — MindCluster's ToR-major, slot-sorted numbering, so boundary flows line up.

*Ring / NHR* use the switch-contiguous order: each group's nodes get consecutive ranks, which for a
ring reaches the lower bound of cross-switch edges (one per group touched, none for one group).

*RHD* (halving-doubling, far-first) wants the big early steps ``r <-> r ^ n/2``, ``r ^ n/4``...
inside a ToR. Three candidates are scored with
:func:`npu_job.bootstrap.scorer.cross_switch_volume` (data crossing ToRs, then the phase time with
perfect path control) and the cheapest wins, ties going to the earlier one:

1. the switch-contiguous order above;
2. the interleaved order: deal one node from each ToR group in turn (``rank = slot_in_tor * T +
   tor`` when all T groups are equal), so the ToR index sits in the low bits of the rank; groups
   that run empty drop out of the deal;
3. the bit-reversed contiguous order (:func:`bit_reversed`): far-first XOR steps seen in
   bit-reversed rank space pair contiguous neighbours, so every big step stays inside a group
   except at group boundaries, whatever the group sizes — the one that wins on uneven ToRs.

Nodes without placement stay last in every candidate except the bit-reversed one, which permutes
the whole contiguous order.

Preconditions (platform rule): at least 3 nodes, full nodes (equal device counts, none empty, and
``full_node_devices`` when given), a completed rank table with pod indices 0..n-1 and unique
server ids, and a topology that places at least one server. Otherwise the plan is the identity
with ``status=failed`` and every reason found. A successful plan may carry notes in ``reasons``
too (e.g. servers without topology that were placed last).
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Tuple

from npu_job.errors import shown
from npu_job.podfacts import MIN_NODES

from . import canonical
from .base.model import (
    Collective,
    Plan,
    PlanStatus,
    RankTable,
    Topology,
    rank_mapping_text,
)

log = logging.getLogger(__name__)


def precondition_failures(
    table: RankTable,
    topology: Optional[Topology],
    *,
    full_node_devices: Optional[int] = None,
    paths: Optional[Sequence[canonical.SwitchPath]] = None,
) -> Tuple[str, ...]:
    """Every reason the platform rule forbids reordering ``table``; empty when planning may go on.

    ``paths`` may pass precomputed :func:`~npu_job.bootstrap.canonical.switch_paths`.
    """
    if paths is None:
        paths = canonical.switch_paths(table, topology)
    reasons: List[str] = []
    servers = table.servers
    count = len(servers)
    if not table.is_completed:
        reasons.append(f"rank table status is {shown(table.status)}, not 'completed'")
    if count < MIN_NODES:
        reasons.append(
            f"only {count} node(s); reordering needs at least {MIN_NODES} (platform rule)"
        )
    if [server.pod_index for server in servers] != list(range(count)):
        reasons.append(f"pod indices are not 0..{count - 1} in order")
    if len({server.server_id for server in servers}) != count:  # name each one given twice
        first_pod: Dict[str, int] = {}
        for server in servers:
            if server.server_id in first_pod:
                reasons.append(
                    f"duplicate server_id {shown(server.server_id)} (pod indices "
                    f"{first_pod[server.server_id]} and {server.pod_index})"
                )
            else:
                first_pod[server.server_id] = server.pod_index
    reasons.extend(_partial_node_reasons(table, full_node_devices))
    placed = any(tiers or tors for tiers, tors, _slot in paths)  # stops at the first
    if count and topology is not None and topology.placements:
        # a topology that places none of the servers is never "used" (even with super pods)
        if not any(canonical.topology_entry(server, topology)[1] for server in servers):
            reasons.append(
                f"topology ({topology.source}) has no entry for any of the {count} servers"
                f" (looked up by {', '.join(canonical.ADDRESS_FIELDS)})"
            )
    elif count and not placed:
        reasons.append("no switch topology available")
    return tuple(reasons)


def _matched_by_note(table: RankTable, topology: Optional[Topology]) -> List[str]:
    """Say which address found the topology entries, when it was not the server_id."""
    if topology is None or all(
        map(topology.placements.__contains__, [server.server_id for server in table.servers])
    ):
        return []  # no entries, or every one by server_id (the usual case, at C speed)
    fields: Dict[str, int] = {}
    for server in table.servers:
        field = canonical.topology_entry(server, topology)[0]
        if field is not None:
            fields[field] = fields.get(field, 0) + 1
    if set(fields) <= {"server_id"}:
        return []
    found = ", ".join(f"{fields[f]} by {f}" for f in canonical.ADDRESS_FIELDS if f in fields)
    return [
        f"topology entries found for {sum(fields.values())} of {len(table.servers)} servers: "
        f"{found}"
    ]


def _partial_node_reasons(table: RankTable, full_node_devices: Optional[int]) -> List[str]:
    servers = table.servers
    device_counts = table.device_counts
    sizes = set(device_counts)
    if len(sizes) <= 1 and 0 not in sizes and full_node_devices in (None, *sizes):
        return []  # the common case: all nodes full, nothing to list
    empty = [server.server_id for server, size in zip(servers, device_counts) if not size]
    reasons: List[str] = []
    if empty:
        reasons.append(f"partial nodes: {len(empty)} server(s) list no devices ({_few(empty)})")
    counts: Dict[int, List[str]] = {}
    for server, size in zip(servers, device_counts):
        if size:
            counts.setdefault(size, []).append(server.server_id)
    if full_node_devices is not None:
        short = sorted(
            (sid for size, ids in counts.items() if size != full_node_devices for sid in ids),
            key=canonical.id_sort_key,
        )
        if short:
            reasons.append(
                f"partial nodes: {len(short)} server(s) do not have the full {full_node_devices}"
                f" devices ({_few(short)})"
            )
    elif len(counts) > 1:
        full = max(counts)
        short = sorted(
            (sid for size, ids in counts.items() if size != full for sid in ids),
            key=canonical.id_sort_key,
        )
        spread = ", ".join(
            f"{size} on {len(counts[size])}" for size in sorted(counts, reverse=True)
        )
        reasons.append(f"partial nodes: device counts differ ({spread}; short: {_few(short)})")
    return reasons


def _few(ids: Sequence[str], limit: int = 3) -> str:
    listed = ", ".join(map(shown, ids[:limit]))
    return listed + (f", ... ({len(ids) - limit} more)" if len(ids) > limit else "")


def switch_groups(
    table: RankTable,
    topology: Optional[Topology],
    paths: Optional[Sequence[canonical.SwitchPath]] = None,
) -> Tuple[Tuple[Tuple[int, ...], ...], int]:
    """The switch-contiguous grouping: ``(groups, placed)``.

    ``groups`` lists groups of pod indices in rank order (each group's members in rank order);
    the first ``placed`` groups are switch groups, the rest are the singletons of servers without
    any placement, by server id.
    """
    if paths is None:
        paths = canonical.switch_paths(table, topology)
    servers = table.servers
    # One sort by server id; grouping and the stable slot sort below keep that order for ties.
    by_id = canonical.id_order([server.server_id for server in servers])
    keyed: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], List[int]] = {}
    unplaced: List[int] = []
    for index in by_id:
        tiers, tors, _slot = paths[index]
        if tiers or tors:
            keyed.setdefault((tiers, tors), []).append(index)
        else:
            unplaced.append(index)
    # Switch ids repeat across many servers: build each group's sort key once.
    switch_key: Dict[str, canonical.IdKey] = {}
    for tiers, tors in keyed:
        for switch in tiers + tors:
            if switch not in switch_key:
                switch_key[switch] = canonical.id_sort_key(switch)
    group_order = sorted(
        keyed,
        key=lambda path: (
            tuple(switch_key[t] for t in path[0]),
            tuple(sorted(switch_key[t] for t in path[1])),
        ),
    )
    pods = [server.pod_index for server in servers]
    if any(path[2] is not None for path in paths):
        # known slots first, in slot order; the sort is stable, so ties keep the id order
        slot_keys = [(slot is None, 0 if slot is None else slot) for _tiers, _tors, slot in paths]
        members = [sorted(keyed[path], key=slot_keys.__getitem__) for path in group_order]
    else:  # no slots at all (e.g. CCE ranktable_tor.json): id order it is
        members = [keyed[path] for path in group_order]
    groups = [tuple([pods[i] for i in group]) for group in members]
    groups.extend((pods[i],) for i in unplaced)
    return tuple(groups), len(keyed)


def interleave(groups: Sequence[Sequence[int]]) -> Tuple[int, ...]:
    """Deal one member of each group in turn (``rank = index_in_group * T + group`` when even)."""
    rounds: List[List[int]] = []
    for group in groups:
        for index, pod in enumerate(group):
            if index == len(rounds):
                rounds.append([])
            rounds[index].append(pod)
    return tuple(pod for members in rounds for pod in members)


def plan(
    table: RankTable,
    topology: Optional[Topology],
    collective: Collective = Collective.RING,
    *,
    full_node_devices: Optional[int] = None,
) -> Plan:
    """The routing-affine order for ``table`` on ``topology``, optimised for ``collective``.

    Never raises for "cannot plan": returns a FAILED identity plan with the reasons instead.
    ``full_node_devices`` (optional) is the device count of a full node for this job.
    """
    paths = canonical.switch_paths(table, topology)
    digest = canonical.input_digest(table, topology, collective, paths)
    count = len(table.servers)
    reasons = precondition_failures(
        table, topology, full_node_devices=full_node_devices, paths=paths
    )
    if reasons:
        return _finish(PlanStatus.FAILED, tuple(range(count)), collective, reasons, digest)

    groups, placed = switch_groups(table, topology, paths)
    contiguous = tuple(pod for group in groups for pod in group)
    order = contiguous
    notes: List[str] = []
    unplaced = len(groups) - placed
    if unplaced:
        notes.append(f"{unplaced} of {count} servers have no topology entry; placed last")
    notes.extend(_matched_by_note(table, topology))
    if collective is Collective.RHD and placed > 1:
        order = _better_for_rhd(table, topology, paths, contiguous, groups, placed, notes)
    return _finish(PlanStatus.SUCCESS, order, collective, tuple(notes), digest)


def bit_reversed(contiguous: Sequence[int]) -> Tuple[int, ...]:
    """The contiguous order seen through RHD's far-first steps (rank ``r`` <- position ``rev(r)``).

    Far-first halving-doubling pairs ``r`` with ``r ^ n/2`` first; in bit-reversed rank space that
    is ``m`` with ``m ^ 1``, i.e. neighbours of the contiguous order, so each big early step stays
    inside a switch group except at group boundaries, whatever the group sizes. For ``n`` not a
    power of two (``p`` survivors, ``e = n - p`` folded pairs, see the scorer), the contiguous order
    is cut into ``p`` units, two-node units exactly at the positions that bit-reverse to a virtual
    rank below ``e`` (those fold into real ranks ``2v, 2v+1``), one-node units elsewhere.
    """
    count = len(contiguous)
    if count < 2:
        return tuple(contiguous)
    power = 1 << (count.bit_length() - 1)
    extra = count - power
    bits = power.bit_length() - 1

    def reverse(value: int) -> int:
        return int(format(value, f"0{bits}b")[::-1], 2) if bits else 0

    virtual_at = [0] * power  # unit position m -> virtual rank v with reverse(v) == m
    for virtual in range(power):
        virtual_at[reverse(virtual)] = virtual
    order = [0] * count
    cursor = 0
    for position in range(power):
        virtual = virtual_at[position]
        if virtual < extra:  # a folded pair: real ranks 2v (sends first) and 2v+1 (survives)
            order[2 * virtual] = contiguous[cursor]
            order[2 * virtual + 1] = contiguous[cursor + 1]
            cursor += 2
        else:
            order[virtual + extra] = contiguous[cursor]
            cursor += 1
    return tuple(order)


def _better_for_rhd(
    table: RankTable,
    topology: Optional[Topology],
    paths: Sequence[canonical.SwitchPath],
    contiguous: Tuple[int, ...],
    groups: Sequence[Sequence[int]],
    placed: int,
    notes: List[str],
) -> Tuple[int, ...]:
    """The cheapest of the contiguous, interleaved and bit-reversed orders (ties: earlier)."""
    from . import scorer  # only RHD plans pay for the scorer import

    unplaced_tail = tuple(pod for group in groups[placed:] for pod in group)
    candidates = (
        ("contiguous", contiguous),
        ("interleaved", interleave(groups[:placed]) + unplaced_tail),
        ("bit-reversed", bit_reversed(contiguous)),
    )
    switch_of_pod = scorer.switch_keys(table, topology, paths)
    phase_list = scorer.phases(len(contiguous), Collective.RHD)
    costs = [
        scorer.cross_switch_volume(order, switch_of_pod, Collective.RHD, phase_list)
        for _name, order in candidates
    ]
    best = min(range(len(candidates)), key=lambda index: (costs[index], index))
    name, order = candidates[best]
    notes.append(
        f"rhd: {name} order chosen"
        f" (cross-ToR data {costs[best][0]:g} vs contiguous {costs[0][0]:g})"
    )
    return order


def _finish(
    status: PlanStatus,
    order: Sequence[int],
    collective: Collective,
    reasons: Tuple[str, ...],
    digest: str,
) -> Plan:
    """The :class:`Plan` for ``order`` (``order[rank]`` = pod index), with its mapping digest."""
    node_rank_of_pod = [0] * len(order)
    for rank, pod in enumerate(order):
        node_rank_of_pod[pod] = rank
    mapping = rank_mapping_text(order)
    result = Plan(
        status,
        tuple(node_rank_of_pod),
        collective,
        reasons,
        digest,
        canonical.mapping_digest(mapping),
    )
    # What the plan would work out again when first asked (the route plan asks): its caches.
    cache = vars(result)
    cache["pod_of_node_rank"] = tuple(order)
    cache["rank_mapping"] = mapping
    log.debug(
        "plan %s for %d nodes (%s): input sha256 %s, mapping sha256 %s",
        result.status,
        len(order),
        result.collective,
        result.input_digest,
        result.mapping_digest,
    )
    return result
