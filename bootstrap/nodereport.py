"""What one node says about itself at a rendezvous, and the plan the root makes from them (pure).

The order follows the nodes that actually run. Each pod's bootstrap writes this pod's
:class:`NodeReport` (``npu_job_node.json``: its node id, scheduler pod index, device count and the
switch placement it resolved from the rank table, ToR files, HyperNodes or node labels); each
npu-run agent sends it with its join request, and the rendezvous root, once a round's membership
is final, runs :func:`plan_round` over the reports of the nodes present and publishes the
:class:`RoundPlan` through its store.

:func:`plan_round` builds a :class:`~.base.model.RankTable` and :class:`~.base.model.Topology`
from the reports and calls the bootstrap's own :func:`npu_job.bootstrap.planner.plan`, so a round
of the pods every bootstrap saw gives each one its bootstrap's node rank and mapping digest.

* **Positions.** Members are put in positions ``0..n-1`` by (pod index, unknown ones last; node
  id; member key), the planner's pod indices, whatever pod indices the members bring (a replaced
  pod, elastic joiners): the plan is a permutation of ``0..n-1``, a function of the reports alone.
* **Unknowns.** A node id of ``""`` gets a stand-in id (unplaced nodes are ordered by id); a device
  count of 0 counts as the round's full one (``full_node_devices``, else the commonest count), so
  that a node which does not know its count cannot veto the plan.
* **Bad reports never raise.** A report that does not decode is one problem line (naming the
  member, the field and what was expected) and its node is planned with nothing known but its
  member key: no placement, placed last. Two members claiming one node id, or one slot under one
  switch path, are one problem line naming both; the later one (by position) loses its placement.
  Problem lines name a member by its pod (the caller's name, else its report's), else its key.
  Reports that disagree on the collective or the full node size are one line too: the first
  member's word (by position) holds.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from npu_job.errors import InputError, shown
from npu_job.parsing import COUNT_LIMIT

from . import canonical
from .base.columns import servers_from_columns
from .base.fields import expect_list, expect_object, expect_str, fail
from .base.model import (
    Collective,
    Device,
    Placement,
    Plan,
    PlanStatus,
    RankTable,
    Topology,
    cached_property,
    rank_mapping_text,
)
from .base.payload import check_size, decode_document, verbatim_or_shown

REPORT_VERSION = 1
ROUND_PLAN_VERSION = 1
#: What one node's report may take, encoded: ids and switch names of a few hundred characters
#: each fit many times over (a real one is ~300 bytes); the root holds one per node.
MAX_REPORT_BYTES = 8192
UNKNOWN_POD_INDEX = -1


@dataclass(frozen=True)
class NodeReport:
    """What a node's bootstrap resolved for its pod; every field has an "unknown" value.

    ``node_id`` is the rank table's ``server_id`` the bootstrap matched (``""`` unknown),
    ``pod_index`` the scheduler's index (-1 unknown), ``device_count`` its devices (0 unknown),
    ``placement`` the topology's entry for it (None: none known) and ``super_pod_id`` its v1.2
    super pod, as the planner combines them (:func:`~.canonical.switch_path`). ``collective`` and
    ``full_node_devices`` are what its bootstrap planned with (``""`` / None unknown).
    """

    node_id: str = ""
    pod_index: int = UNKNOWN_POD_INDEX
    pod_name: str = ""
    device_count: int = 0
    placement: Optional[Placement] = None
    super_pod_id: Optional[str] = None
    topology_source: str = ""
    collective: str = ""
    full_node_devices: Optional[int] = None


def report_of(
    table: RankTable,
    pod_index: int,
    topology: Optional[Topology],
    topology_source: str,
    collective: Union[Collective, str] = "",
    full_node_devices: Optional[int] = None,
) -> NodeReport:
    """The report of the pod at ``pod_index`` of ``table``, placed as the planner places it."""
    server = table.servers[pod_index]
    return NodeReport(
        node_id=server.server_id,
        pod_index=pod_index,
        pod_name=server.pod_name or "",
        device_count=server.device_count,
        placement=canonical.topology_entry(server, topology)[1],
        super_pod_id=server.super_pod_id,
        topology_source=topology_source,
        collective=str(collective),
        full_node_devices=full_node_devices,
    )


def encode_report(report: NodeReport) -> bytes:
    """Compact JSON of ``report`` (``{"version": 1, ...}``); an :class:`InputError` when it
    would pass :data:`MAX_REPORT_BYTES` (ids that long came from a broken input)."""
    place = report.placement
    document = {
        "version": REPORT_VERSION,
        "node_id": report.node_id,
        "pod_index": report.pod_index,
        "pod_name": report.pod_name,
        "device_count": report.device_count,
        "placement": None
        if place is None
        else {"tiers": list(place.tiers), "tors": list(place.tors), "slot": place.slot},
        "super_pod_id": report.super_pod_id,
        "topology_source": report.topology_source,
        "collective": report.collective,
        "full_node_devices": report.full_node_devices,
    }
    data = json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    check_size(len(data), "node report", MAX_REPORT_BYTES)
    return data


def decode_report(data: bytes, who: str) -> NodeReport:
    """The report in ``data``; an :class:`InputError` naming ``who`` and the field otherwise.

    Fields it does not know are ignored (a newer npu-job may add some); a missing one is unknown.
    """
    check_size(len(data), who, MAX_REPORT_BYTES)
    try:  # UTF-8, as encode_report writes it (json.loads of bytes would guess among UTF-16/32)
        document = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        problem = (str(error).splitlines() or [""])[0]
        raise InputError(who, "content", f"expected JSON ({verbatim_or_shown(problem)})") from None
    document = expect_object(document, who, "")
    version = document.get("version")
    if version != REPORT_VERSION:
        fail(who, "version", f"{REPORT_VERSION} (a node report)", version)
    placement = document.get("placement")
    return NodeReport(
        node_id=_text(document, "node_id", who),
        pod_index=_integer(document, "pod_index", who, UNKNOWN_POD_INDEX),
        pod_name=_text(document, "pod_name", who),
        device_count=_integer(document, "device_count", who, 0),
        placement=None if placement is None else _placement(placement, who),
        super_pod_id=_optional_text(document, "super_pod_id", who),
        topology_source=_text(document, "topology_source", who),
        collective=_collective(document, who),
        full_node_devices=_optional_integer(document, "full_node_devices", who),
    )


def _text(document: Dict[str, Any], key: str, who: str) -> str:
    return expect_str(document.get(key, ""), who, key, empty_ok=True)


def _optional_text(document: Dict[str, Any], key: str, who: str) -> Optional[str]:
    value = document.get(key)
    return None if value is None else expect_str(value, who, key)


def _integer(document: Dict[str, Any], key: str, who: str, unknown: int) -> int:
    value = document.get(key, unknown)
    if type(value) is not int or not unknown <= value < COUNT_LIMIT:
        fail(who, key, f"an integer from {unknown} (unknown) up", value)
    return value


def _optional_integer(document: Dict[str, Any], key: str, who: str) -> Optional[int]:
    value = document.get(key)
    if value is not None and (type(value) is not int or not 0 < value < COUNT_LIMIT):
        fail(who, key, "a positive integer or null (unknown)", value)
    return value


def _collective(document: Dict[str, Any], who: str) -> str:
    value = _text(document, "collective", who)
    if value and value not in _COLLECTIVES:
        fail(who, "collective", f"one of {', '.join(_COLLECTIVES)} or '' (unknown)", value)
    return value


_COLLECTIVES = tuple(collective.value for collective in Collective)


def _placement(value: Any, who: str) -> Placement:
    place = expect_object(value, who, "placement")
    tiers = _names(place.get("tiers", []), who, "placement.tiers")
    tors = _names(place.get("tors", []), who, "placement.tors")
    slot = place.get("slot")
    if slot is not None and (type(slot) is not int or not 0 <= slot < COUNT_LIMIT):
        fail(who, "placement.slot", "a non-negative integer or null (unknown)", slot)
    return Placement(tiers=tiers, tors=tors, slot=slot)


def _names(value: Any, who: str, path: str) -> Tuple[str, ...]:
    items = expect_list(value, who, path)
    if not all(type(item) is str and item for item in items):  # then say which one is not
        for index, item in enumerate(items):
            expect_str(item, who, f"{path}[{index}]")
    return tuple(items)


@dataclass(frozen=True)
class RoundPlan:
    """The root's plan for one round: member keys by position, the planner's :class:`Plan` over
    those positions, and the problems found in the reports.

    ``order`` lists the member keys in node-rank order, ``node_rank`` maps each to its rank;
    ``mapping_digest`` is the plan's (of positions, so the bootstrap's when positions are the pod
    indices). ``predicted`` is the scorer's predicted busbw ratio of the plan's order over the
    scheduler's (:func:`~.scorer.predicted_ratio`, what ``npu-job plan`` reports for the same
    input), made only when asked (``npu-run --probe``) and the planner planned, else None.
    :meth:`encode` / :meth:`decode` carry it through a store.
    """

    members: Tuple[str, ...]  # member keys by position (the planner's pod index)
    plan: Plan
    problems: Tuple[str, ...] = ()
    node_ids: Tuple[str, ...] = ()  # each member's reported node id by position ("" unknown)
    predicted: Optional[float] = None  # predicted busbw ratio, plan / scheduler order

    @property
    def node_ids_in_rank_order(self) -> Tuple[str, ...]:
        """The members' node ids (rank table server ids), node rank 0 first; empty when the plan
        carries none."""
        if len(self.node_ids) != len(self.members):
            return ()
        return tuple([self.node_ids[position] for position in self.plan.pod_of_node_rank])

    @property
    def order(self) -> Tuple[str, ...]:
        members = self.members
        return tuple([members[position] for position in self.plan.pod_of_node_rank])

    @cached_property  # every agent asks its own rank once; a round of 16k members is one dict
    def node_rank(self) -> Mapping[str, int]:
        return dict(zip(self.members, self.plan.node_rank_of_pod))

    @property
    def mapping_digest(self) -> str:
        return self.plan.mapping_digest

    def in_position_order(self) -> RoundPlan:
        """The same members ranked by position (pod index order: the scheduler's order), with that
        mapping's digest: what the nodes run in when a probe keeps the scheduler's order."""
        identity = tuple(range(len(self.members)))
        digest = canonical.mapping_digest(rank_mapping_text(identity))
        plan = replace(self.plan, node_rank_of_pod=identity, mapping_digest=digest)
        return replace(self, plan=plan)

    def encode(self) -> bytes:
        """Compact JSON, for the store (:meth:`decode` reads it back, equal)."""
        plan = self.plan
        document = {
            "version": ROUND_PLAN_VERSION,
            "members": list(self.members),
            "node_rank_of_pod": list(plan.node_rank_of_pod),
            "status": plan.status.value,
            "collective": plan.collective.value,
            "reasons": list(plan.reasons),
            "input_digest": plan.input_digest,
            "mapping_digest": plan.mapping_digest,
            "problems": list(self.problems),
            "node_ids": list(self.node_ids),
            "predicted": self.predicted,
        }
        return json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    @staticmethod
    def decode(data: bytes, who: str = "round plan") -> RoundPlan:
        """The plan :meth:`encode` wrote; an :class:`InputError` naming ``who`` and the field for
        anything else (its mapping digest must be that of its ranks)."""
        check_size(len(data), who)
        try:
            document = expect_object(json.loads(data), who, "")
        except (ValueError, RecursionError) as error:
            problem = (str(error).splitlines() or [""])[0]
            raise InputError(
                who, "content", f"expected JSON ({verbatim_or_shown(problem)})"
            ) from None
        version = document.get("version")
        if version != ROUND_PLAN_VERSION:
            fail(who, "version", f"{ROUND_PLAN_VERSION} (a round plan)", version)
        members = _names(document.get("members"), who, "members")
        if len(set(members)) != len(members):
            fail(who, "members", "distinct member keys")
        ranks = expect_list(document.get("node_rank_of_pod"), who, "node_rank_of_pod")
        if len(ranks) != len(members) or any(type(rank) is not int for rank in ranks):
            fail(who, "node_rank_of_pod", f"{len(members)} integers, one per member")
        status = _choice(document, "status", PlanStatus, who)
        collective = _choice(document, "collective", Collective, who)
        reasons = _names(document.get("reasons"), who, "reasons")
        problems = _names(document.get("problems"), who, "problems")
        node_ids = tuple(  # "" for a member that reported none
            expect_str(item, who, f"node_ids[{index}]", empty_ok=True)
            for index, item in enumerate(expect_list(document.get("node_ids", []), who, "node_ids"))
        )
        if node_ids and len(node_ids) != len(members):
            fail(who, "node_ids", f"{len(members)} node ids, one per member")
        input_digest = expect_str(document.get("input_digest"), who, "input_digest", empty_ok=True)
        digest = expect_str(document.get("mapping_digest"), who, "mapping_digest")
        try:
            plan = Plan(status, tuple(ranks), collective, reasons, input_digest, digest)
        except ValueError:
            fail(who, "node_rank_of_pod", f"a permutation of 0..{len(ranks) - 1}")
        if canonical.mapping_digest(rank_mapping_text(plan.pod_of_node_rank)) != digest:
            fail(who, "mapping_digest", "the sha256 of the plan's rank mapping", digest)
        return RoundPlan(members, plan, problems, node_ids, _predicted(document, who))


def _predicted(document: Dict[str, Any], who: str) -> Optional[float]:
    """The plan's predicted ratio: a positive finite number, or null / absent (none made)."""
    value = document.get("predicted")
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 < value < math.inf:
        fail(who, "predicted", "a positive number or null (no prediction)", value)
    return float(value)


def _choice(document: Dict[str, Any], key: str, kind: Any, who: str) -> Any:
    value = document.get(key)
    try:
        return kind(value)
    except ValueError:
        fail(who, key, f"one of {', '.join(item.value for item in kind)}", value)


def member_name(key: str, pod: str = "") -> str:
    """How problem lines name a member: ``pod X`` where its pod is known, else by its key."""
    return f"pod {verbatim_or_shown(pod)}" if pod else f"member {verbatim_or_shown(key)}"


class _Problems(List[str]):
    """The round's problem lines, naming members by pod (a name two give says the keys too)."""

    pods: Mapping[str, str] = {}
    _twice: Set[str] = set()

    def name_by(self, pods: Mapping[str, str]) -> None:
        self.pods = pods
        self._twice = {pod for pod, n in Counter(filter(None, pods.values())).items() if n > 1}

    def name(self, key: str) -> str:
        pod = self.pods.get(key, "")
        return member_name(key, pod) + (f" ({member_name(key)})" if pod in self._twice else "")


def plan_round(
    reports: Mapping[str, bytes],
    *,
    collective: Union[Collective, str, None] = None,
    full_node_devices: Optional[int] = None,
    predict: bool = False,
    pods: Optional[Mapping[str, str]] = None,
) -> RoundPlan:
    """The round's plan over ``reports`` (member key -> report bytes); see the module docstring.

    ``collective`` and ``full_node_devices`` override what the reports say. ``predict`` also
    scores the plan against the scheduler's order (:attr:`RoundPlan.predicted`; it costs the
    root more than planning at thousands of nodes, so only ``npu-run --probe`` asks). ``pods``
    (member key -> pod name) names members in problem lines before their reports do. Never
    raises for a bad report: it is one of :attr:`RoundPlan.problems`.
    """
    from . import planner

    given = pods or {}
    problems = _Problems()
    problems.name_by(given)
    decoded: List[Tuple[str, NodeReport]] = []
    for key in sorted(reports):
        try:
            decoded.append((key, decode_report(reports[key], problems.name(key))))
        except InputError as error:
            problems.append(f"{error.message}; planned without placement")
            decoded.append((key, NodeReport()))
    problems.name_by({key: given.get(key) or report.pod_name for key, report in decoded})
    decoded = _by_position(decoded)
    members = tuple(key for key, _report in decoded)
    chosen = _round_collective(decoded, collective, problems)
    full = _round_full_node_devices(decoded, full_node_devices, problems)
    table, topology = _cluster(decoded, full, problems)
    result = planner.plan(table, topology, chosen, full_node_devices=full)
    node_ids = tuple(report.node_id for _key, report in decoded)
    predicted = None
    if predict and result.status is PlanStatus.SUCCESS:
        from . import scorer

        keys = scorer.switch_keys(table, topology)
        predicted = scorer.predicted_ratio(result.pod_of_node_rank, keys, result.collective)
    return RoundPlan(members, result, tuple(problems), node_ids, predicted)


def rank_table_in_round_order(data: bytes, source: str, server_ids: Sequence[str]) -> bytes:
    """The rank table ``data`` (read from ``source``) with its servers in the order of
    ``server_ids`` (a round's :attr:`RoundPlan.node_ids_in_rank_order`) and its rank ids
    renumbered, as the bootstrap's reordered copy is made; an :class:`InputError` naming
    ``source`` (field ``server_list``) when the table does not list exactly those servers."""
    from .base.jsondecode import encode_compact
    from .ranktable import in_server_order, rank_table_from_document, reordered_document

    document = decode_document(data, source)
    table = rank_table_from_document(document, source)
    plan = in_server_order(table, server_ids, source)
    return encode_compact(reordered_document(document, table, plan, in_place=True)) + b"\n"


def _by_position(decoded: List[Tuple[str, NodeReport]]) -> List[Tuple[str, NodeReport]]:
    """``decoded`` (in member key order) by (pod index, unknown ones last; node id; member key)."""
    id_rank = [0] * len(decoded)
    for rank, index in enumerate(canonical.id_order([r.node_id for _key, r in decoded])):
        id_rank[index] = rank  # ties keep the key order: the sort below is stable
    order = sorted(
        range(len(decoded)),
        key=lambda index: (
            decoded[index][1].pod_index < 0,
            decoded[index][1].pod_index,
            id_rank[index],
        ),
    )
    return [decoded[index] for index in order]


def _round_collective(
    decoded: Sequence[Tuple[str, NodeReport]],
    given: Union[Collective, str, None],
    problems: _Problems,
) -> Collective:
    if given is not None:
        return Collective(given)
    named = [(key, report.collective) for key, report in decoded if report.collective]
    return Collective(_first_word(named, "collective", problems, Collective.RING.value))


def _round_full_node_devices(
    decoded: Sequence[Tuple[str, NodeReport]], given: Optional[int], problems: _Problems
) -> Optional[int]:
    if given is not None:
        return given
    named = [(key, report.full_node_devices) for key, report in decoded]
    return _first_word(
        [item for item in named if item[1] is not None], "full_node_devices", problems, None
    )


def _first_word(
    named: Sequence[Tuple[str, Any]], what: str, problems: _Problems, default: Any
) -> Any:
    """The first member's value of ``what`` (None of them: ``default``); one problem line for
    the members that say otherwise."""
    if not named:
        return default
    first_key, value = named[0]
    others = [key for key, other in named if other != value]
    if others:
        problems.append(
            f"{len(others)} member(s) report another {what} ({_few(others, problems.name)}); "
            f"the round plans with {shown(value)}, as {problems.name(first_key)} reports"
        )
    return value


def _few(keys: Sequence[str], name: Callable[[str], str], limit: int = 3) -> str:
    listed = ", ".join(map(name, keys[:limit]))
    return listed + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def _cluster(
    decoded: Sequence[Tuple[str, NodeReport]], full: Optional[int], problems: _Problems
) -> Tuple[RankTable, Optional[Topology]]:
    """The rank table (positions as pod indices) and topology the planner sees for ``decoded``."""
    ids, twice = _node_ids(decoded, problems)
    placed = [None if p in twice else report.placement for p, (_, report) in enumerate(decoded)]
    super_pods = [
        None if p in twice else report.super_pod_id for p, (_, report) in enumerate(decoded)
    ]
    table = _table(decoded, ids, super_pods, full)
    topology = _topology(ids, placed)
    losers = _slot_contradictions(decoded, table, topology, problems)
    if losers:
        for position in losers:
            placed[position] = None
            super_pods[position] = None
        table = _table(decoded, ids, super_pods, full)
        topology = _topology(ids, placed)
    return table, topology


def _node_ids(
    decoded: Sequence[Tuple[str, NodeReport]], problems: _Problems
) -> Tuple[List[str], Set[int]]:
    """Each member's server id: its node id, or a stand-in (``?<position>``, made unique) for an
    unknown one and for the later of two members reporting one node id; and the positions of
    those later ones."""
    first: Dict[str, str] = {}
    ids: List[Optional[str]] = []
    twice: Set[int] = set()
    for key, report in decoded:
        node_id = report.node_id
        if not node_id:
            ids.append(None)
        elif node_id in first:
            problems.append(
                f"{problems.name(first[node_id])} and {problems.name(key)} both report node_id "
                f"{shown(node_id)}; {problems.name(key)} planned without placement"
            )
            twice.add(len(ids))
            ids.append(None)
        else:
            first[node_id] = key
            ids.append(node_id)
    taken = set(first)
    result: List[str] = []
    for position, given in enumerate(ids):
        if given is None:
            given = f"?{position}"
            while given in taken:
                given += "?"
            taken.add(given)
        result.append(given)
    return result, twice


_DEVICES: Dict[int, Tuple[Device, ...]] = {}


def _devices(count: int) -> Tuple[Device, ...]:
    """``count`` devices, shared by every server of that size (only their number is planned on)."""
    devices = _DEVICES.get(count)
    if devices is None:
        devices = _DEVICES[count] = tuple(Device(str(index)) for index in range(count))
    return devices


def _table(
    decoded: Sequence[Tuple[str, NodeReport]],
    ids: Sequence[str],
    super_pods: Sequence[Optional[str]],
    full: Optional[int],
) -> RankTable:
    counts = [report.device_count for _key, report in decoded]
    stand_in = full if full is not None else _commonest([count for count in counts if count]) or 1
    servers = servers_from_columns(
        ids,
        range(len(ids)),
        [_devices(count or stand_in) for count in counts],
        [None] * len(ids),
        [None] * len(ids),
        [report.pod_name or None for _key, report in decoded],
        super_pods,
    )
    return RankTable(version="1.0", status="completed", servers=tuple(servers))


def _commonest(counts: Sequence[int]) -> int:
    """The count most members report (ties: the larger); 0 for none."""
    tally: Dict[int, int] = {}
    for count in counts:
        tally[count] = tally.get(count, 0) + 1
    return max(tally, key=lambda count: (tally[count], count), default=0)


def _topology(ids: Sequence[str], placed: Sequence[Optional[Placement]]) -> Optional[Topology]:
    placements = {node_id: place for node_id, place in zip(ids, placed) if place is not None}
    return Topology(placements, source="node reports") if placements else None


def _slot_contradictions(
    decoded: Sequence[Tuple[str, NodeReport]],
    table: RankTable,
    topology: Optional[Topology],
    problems: _Problems,
) -> List[int]:
    """Positions that claim a (switch path, slot) an earlier member holds, each named with it."""
    holder: Dict[canonical.SwitchPath, int] = {}
    losers: List[int] = []
    for position, path in enumerate(canonical.switch_paths(table, topology)):
        _tiers, tors, slot = path
        if slot is None or not tors:
            continue
        if path in holder:
            first, later = decoded[holder[path]][0], decoded[position][0]
            where = "/".join(path[0] + ("+".join(tors),))
            problems.append(
                f"{problems.name(first)} and {problems.name(later)} both report slot {slot} under "
                f"{verbatim_or_shown(where)}; {problems.name(later)} planned without placement"
            )
            losers.append(position)
        else:
            holder[path] = position
    return losers
