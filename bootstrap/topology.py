"""Switch topology readers (pure): bytes in one of four formats -> :class:`Topology`.

Formats (docs/bootstrap.md), detected by content unless ``fmt`` names one:

``cce-ranktable-tor``
    CCE ``ranktable_tor.json`` (ConfigMap ``torlist-<job>``; always base64(gzip(JSON)), but plain
    JSON is accepted too). A server's ToRs are the set of its devices' ``tor_ip``.
``basic-tor-node-cm``
    MindCluster ``tor_info`` (``{version, tor_count, server_list: [{tor_id, tor_ip, server:
    [{server_ip, npu_count, slice_id}]}]}``), or the whole ``basic-tor-node-cm`` ConfigMap as
    ``kubectl get cm -o json|yaml`` prints it (``data.tor_info``, optional ``data.tor_level``).
    ``tor_count`` is the number of server slots per ToR (NOT the number of ToRs); ``slice_id`` is
    the slot and must be below it. The ToR id is its ``tor_ip`` (``tor-<tor_id>`` without one).
``k8s-node-labels``
    A Kubernetes ``NodeList`` (``GET /api/v1/nodes``, or kubectl's ``List``). A node is keyed by
    its ``InternalIP`` (the rank table's ``server_id``) and by its name; its placement comes from
    its topology labels (:mod:`npu_job.bootstrap.kube.labels` knows the keys).
``volcano-hypernodes``
    Volcano's HyperNodes (``kubectl get hypernodes -o json`` or ``-o yaml``, or a ``List`` that
    holds Nodes and Pods too): each node's path in their tree (:mod:`.kube.hypernode`),
    with the Nodes of the same document (or of ``context``) for label members and addresses.
``file``
    The plain topology file users write (YAML or JSON)::

        version: 1                      # optional
        servers:
          "10.0.0.1": [spine-a, tor-1]  # short form: switch path, outermost first, last = ToR
          "10.0.0.2": {path: [spine-a, tor-1], slot: 3}
          "10.0.0.3": {path: [spine-a], tors: [tor-1, tor-2]}  # NICs on two ToRs
          "10.0.0.4": tor-2             # a lone ToR id

    ``path`` lists the tiers outermost first and ends with the ToR, unless ``tors`` is given, in
    which case ``path`` lists only the tiers above the ToRs. ``slot`` (a non-negative integer) is
    the server's position under its ToR.

Serialisers for ``ranktable_tor.json`` are here too (tests, benchmarks and the demo generate it).
"""

from __future__ import annotations

import logging
import operator
from functools import lru_cache
from itertools import chain
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from npu_job.errors import shown

from .base.fields import (
    expect_count,
    expect_list,
    expect_object,
    expect_str,
    fail,
    join_key,
    require,
    require_list,
    require_str,
    require_unique_id,
)
from .base.jsondecode import decode_typed, parse_json
from .base.model import (
    BASIC_TOR_NODE_CM,
    CCE_RANKTABLE_TOR,
    K8S_NODE_LABELS,
    PLAIN_FILE,
    TOPOLOGY_FORMATS,
    VOLCANO_HYPERNODES,
    Placement,
    RankTable,
    Topology,
)
from .base.payload import decode_document, encode_b64_gzip, json_text

logger = logging.getLogger(__name__)

KUBE_FORMATS = (K8S_NODE_LABELS, VOLCANO_HYPERNODES)  # read by npu_job.bootstrap.kube.topology


def parse_topology(
    data: bytes, source: str, fmt: Optional[str] = None, *, context: Any = None
) -> Topology:
    """Decode ``data`` and read it as ``fmt``, a name of :data:`~.base.model.TOPOLOGY_FORMATS`
    (None: detected by content).

    ``context`` (a :class:`~npu_job.bootstrap.kube.topology.KubeContext`, or a function that makes
    one when asked) serves the Kubernetes formats: more Nodes, the servers that matter, the label
    keys to read.
    """
    if fmt is not None and fmt not in TOPOLOGY_FORMATS:
        raise ValueError(f"unknown topology format {fmt!r}")
    if fmt == CCE_RANKTABLE_TOR:
        text = json_text(data, source)
        # 4096 nodes: 32k device objects, read for one field each
        servers = _cce_servers_fast(text)
        if servers is not None and len(dict(servers)) == len(servers):  # ids unique
            return _cce_topology(servers)
        return _read_cce(parse_json(text, source), source)  # names what is wrong, if anything
    # formats people write or kubectl prints may be YAML; the API's NodeList is JSON
    yaml_ok = fmt in (None, PLAIN_FILE, BASIC_TOR_NODE_CM, VOLCANO_HYPERNODES)
    document = decode_document(data, source, allow_yaml=yaml_ok)
    return topology_from_document(document, source, fmt, context=context)


def topology_from_document(
    document: Any, source: str, fmt: Optional[str] = None, *, context: Any = None
) -> Topology:
    chosen = fmt or detect_format(document, source)
    if chosen in KUBE_FORMATS:
        from .kube import topology as kube_topology

        if callable(context):
            context = context()
        found = kube_topology.topology_from_document(document, source, chosen, context)
        for note in found.notes:
            logger.info("topology: note: %s", note)
        return found.topology
    return _READERS[chosen](document, source)


def detect_format(document: Any, source: str) -> str:
    """Which format ``document`` is in, by its shape; an error lists what each format looks like."""
    if type(document) is dict:
        items = document.get("items")
        if document.get("kind") == "HyperNodeList" or (
            type(items) is list
            and "servers" not in document
            and any(type(item) is dict and item.get("kind") == "HyperNode" for item in items)
        ):
            return VOLCANO_HYPERNODES
        if document.get("kind") == "NodeList" or (
            type(items) is list and "servers" not in document
        ):
            return K8S_NODE_LABELS
        if document.get("kind") == "ConfigMap" or "tor_count" in document:
            return BASIC_TOR_NODE_CM
        if "servers" in document:
            return PLAIN_FILE
        server_list = document.get("server_list")
        if type(server_list) is list:
            first = server_list[0] if server_list else {}
            if type(first) is dict and "server" in first:
                return BASIC_TOR_NODE_CM
            return CCE_RANKTABLE_TOR
    fail(
        source,
        "document",
        "a topology: CCE ranktable_tor.json (server_list[].device[].tor_ip), basic-tor-node-cm "
        "tor_info (tor_count, server_list[].server[]), a Kubernetes NodeList or HyperNodeList "
        "(items) or a plain file ({servers: {<server_id>: [<tier>..., <tor>]}})",
    )


# --- CCE ranktable_tor.json ----------------------------------------------------------------------


def _read_cce(document: Any, source: str) -> Topology:
    doc = expect_object(document, source, "")
    server_list = require_list(doc, "server_list", source, "")
    tor_sets = _cce_tor_sets_fast(server_list)
    if tor_sets is None:
        tor_sets = _cce_tor_sets_checked(server_list, source)
    return _cce_topology(tor_sets)


def _cce_topology(tor_sets: List[Tuple[str, FrozenSet[str]]]) -> Topology:
    """The topology of checked ``(server_id, ToR set)`` pairs (unique server ids)."""
    placements: Dict[str, Placement] = {}
    shared: Dict[FrozenSet[str], Placement] = {}  # placements are immutable: one per ToR set
    for server_id, tors in tor_sets:
        if "" in tors:  # "" = the plugin did not know this NIC's switch
            tors = tors - _UNKNOWN_TOR
        if tors:
            placement = shared.get(tors)
            if placement is None:
                placement = shared[tors] = Placement(tors=tuple(tors))
            placements[server_id] = placement
    return Topology(placements, source=CCE_RANKTABLE_TOR)


_UNKNOWN_TOR = frozenset({""})
_TOR_IP = operator.itemgetter("tor_ip")
_TOR_IP_FIELD = operator.attrgetter("tor_ip")


def _cce_servers_fast(text: bytes) -> Optional[List[Tuple[str, FrozenSet[str]]]]:
    """(server_id, tor_ip set) of every entry of a well-formed file, decoded by msgspec (big files)
    into only those two fields: the other four fields of each device are checked but never built,
    5x faster than a full decode. None: read it in full.

    Kept with msgspec optional: msgspec's plain decode into builtins instead costs the
    whole rank-table bootstrap 8.6% more instructions at 4096 nodes (1,023.6 M against 942.4 M,
    callgrind side by side), 11% past what it took before, more than the 10% the rule allows."""
    document = decode_typed(text, _cce_decoder)
    if document is None:
        return None
    servers = document.server_list
    ids = [server.server_id for server in servers]
    if "" in ids:
        return None
    return list(zip(ids, [frozenset(map(_TOR_IP_FIELD, server.device)) for server in servers]))


@lru_cache(maxsize=None)
def _cce_decoder(msgspec: Any) -> Any:
    """msgspec's decoder of the two fields :func:`_cce_servers_fast` reads (built once)."""
    device = msgspec.defstruct("CceDevice", [("tor_ip", str)])
    # device and server are classes made at run time: mypy cannot check them as types
    server = msgspec.defstruct("CceServer", [("server_id", str), ("device", List[device])])  # type: ignore[valid-type]
    document = msgspec.defstruct("CceDocument", [("server_list", List[server])])  # type: ignore[valid-type]
    return msgspec.json.Decoder(document)


def _cce_tor_sets_fast(server_list: List[Any]) -> Optional[List[Tuple[str, FrozenSet[str]]]]:
    """(server_id, tor_ip set) per entry of a well-formed file at C speed; None: check each."""
    try:
        ids = [entry["server_id"] for entry in server_list]
        device_lists = [entry["device"] for entry in server_list]
        if set(map(type, device_lists)) - {list}:
            return None
        tor_sets = [frozenset(map(_TOR_IP, devices)) for devices in device_lists]
        tor_types = set(map(type, chain.from_iterable(tor_sets)))
    except (TypeError, KeyError):  # also a device that is not an object
        return None
    if set(map(type, ids)) - _STR or "" in ids or len(set(ids)) != len(ids) or tor_types - _STR:
        return None
    return list(zip(ids, tor_sets))


def _cce_tor_sets_checked(server_list: List[Any], source: str) -> List[Tuple[str, FrozenSet[str]]]:
    result = []
    seen: Dict[str, str] = {}
    for index, entry in enumerate(server_list):
        path = f"server_list[{index}]"
        expect_object(entry, source, path)
        server_id = require_unique_id(entry, "server_id", source, path, seen)
        result.append((server_id, frozenset(_tor_ips_checked(entry, path, source))))
    return result


_STR = {str}


def _tor_ips_checked(entry: Dict[str, Any], path: str, source: str) -> Set[str]:
    devices = require_list(entry, "device", source, path)
    tors: Set[str] = set()
    for position, device in enumerate(devices):
        here = f"{path}.device[{position}]"
        expect_object(device, source, here)
        tor_ip = require(device, "tor_ip", source, here)
        tors.add(expect_str(tor_ip, source, f"{here}.tor_ip", empty_ok=True))
    return tors


def ranktable_tor_document(
    table: RankTable, topology: Topology, pod_names: Optional[Callable[[int], str]] = None
) -> Dict[str, Any]:
    """The CCE ``ranktable_tor.json`` document for ``table`` placed by ``topology``.

    Each device gets its server's ToR (devices are dealt round-robin over several ToRs);
    ``pod_names(i)`` names pod ``i`` (default ``job-worker-<i>``).
    """
    name_of = pod_names or (lambda index: f"job-worker-{index}")
    server_list = []
    for server in table.servers:
        placement = topology.placement_of(server.server_id)
        tors = placement.tors if placement is not None and placement.tors else ("",)
        devices = []
        for position, device in enumerate(server.devices):
            devices.append(
                {
                    "device_id": device.device_id,
                    "device_ip": device.device_ip or "",
                    "rank_id": "",
                    "tor_ip": tors[position % len(tors)],
                    "tor_port": f"200GE1/0/{position + 1}",
                }
            )
        server_list.append(
            {
                "pod_name": name_of(server.pod_index),
                "server_id": server.server_id,
                "device": devices,
            }
        )
    return {
        "status": "completed",
        "version": "1.0",
        "server_count": str(len(server_list)),
        "server_list": server_list,
    }


def encode_ranktable_tor(
    table: RankTable, topology: Topology, pod_names: Optional[Callable[[int], str]] = None
) -> bytes:
    """``ranktable_tor.json`` bytes exactly as CCE mounts them: base64(gzip(JSON))."""
    return encode_b64_gzip(ranktable_tor_document(table, topology, pod_names))


# --- MindCluster basic-tor-node-cm ----------------------------------------------------------------


def _read_tor_info(document: Any, source: str) -> Topology:
    doc = expect_object(document, source, "")
    if doc.get("kind") == "ConfigMap":  # the whole ConfigMap, as kubectl prints it
        data = expect_object(require(doc, "data", source, ""), source, "data")
        raw = require_str(data, "tor_info", source, "data")
        level = data.get("tor_level")
        if level is not None:
            expect_str(level, source, "data.tor_level")
        inner = decode_document(raw.encode("utf-8"), f"{source}: data.tor_info")
        inner_source = f"{source}: data.tor_info"
        return _tor_info(expect_object(inner, inner_source, ""), inner_source)
    return _tor_info(doc, source)


def _tor_info(doc: Dict[str, Any], source: str) -> Topology:
    slots = expect_count(require(doc, "tor_count", source, ""), source, "tor_count")
    tor_list = require_list(doc, "server_list", source, "")
    tors_of: Dict[str, Set[str]] = {}
    slot_of: Dict[str, int] = {}
    seen_tor: Dict[str, str] = {}
    listed_at: Dict[Tuple[str, str], str] = {}  # (ToR, server_ip) -> where it was first listed
    for index, tor in enumerate(tor_list):
        path = f"server_list[{index}]"
        expect_object(tor, source, path)
        tor_id = _switch_id(require(tor, "tor_id", source, path), source, f"{path}.tor_id")
        tor_ip = tor.get("tor_ip")
        if tor_ip is not None:
            name = expect_str(tor_ip, source, f"{path}.tor_ip")
        else:
            name = f"tor-{tor_id}"
        if name in seen_tor:
            fail(source, f"{path}.tor_id", f"a unique ToR; {shown(name)} is also {seen_tor[name]}")
        seen_tor[name] = path
        members = require_list(tor, "server", source, path)
        for position, member in enumerate(members):
            here = f"{path}.server[{position}]"
            expect_object(member, source, here)
            server_ip = require_str(member, "server_ip", source, here)
            slot = expect_count(
                require(member, "slice_id", source, here), source, f"{here}.slice_id"
            )
            if slot >= slots:
                fail(
                    source,
                    f"{here}.slice_id",
                    f"a slot below tor_count ({slots} slots per ToR), got {slot}",
                )
            first = listed_at.setdefault((name, server_ip), here)
            if first != here:  # MindCluster's own doc example does this (placeholder addresses)
                logger.warning(
                    "%s: %s.server_ip: server %s is listed twice under ToR %s (also %s); its "
                    "entries are merged, taking the lower slot",
                    source,
                    here,
                    shown(server_ip),
                    shown(name),
                    first,
                )
            tors_of.setdefault(server_ip, set()).add(name)
            slot_of[server_ip] = min(slot, slot_of.get(server_ip, slot))
    placements = {ip: Placement(tors=tuple(tors), slot=slot_of[ip]) for ip, tors in tors_of.items()}
    return Topology(placements, source=BASIC_TOR_NODE_CM)


# --- the plain topology file ----------------------------------------------------------------------


def _read_plain(document: Any, source: str) -> Topology:
    doc = expect_object(document, source, "")
    unknown = sorted(set(doc) - {"version", "servers"}, key=str)  # YAML keys: any type
    if unknown:
        fail(
            source,
            join_key("", unknown[0]),
            "only the keys 'version' and 'servers' at the top level",
        )
    servers = expect_object(require(doc, "servers", source, ""), source, "servers")
    placements: Dict[str, Placement] = {}
    for server_id, spec in servers.items():
        path = join_key("servers", server_id)
        if type(server_id) is not str:
            fail(source, path, "server ids as strings (quote them in YAML)", server_id)
        placements[server_id] = _plain_placement(spec, source, path)
    return Topology(placements, source=PLAIN_FILE)


def _plain_placement(spec: Any, source: str, path: str) -> Placement:
    if type(spec) in (str, int):
        return Placement(tors=(_switch_id(spec, source, path),))
    if type(spec) is list:
        switches = _switch_path(spec, source, path)
        return Placement(tiers=switches[:-1], tors=switches[-1:])
    if type(spec) is not dict:
        fail(
            source,
            path,
            "a switch path list, a ToR id, or {path: [...], slot: N, tors: [...]}",
            spec,
        )
    unknown = sorted(set(spec) - {"path", "slot", "tors"}, key=str)
    if unknown:
        fail(source, join_key(path, unknown[0]), "only the keys 'path', 'slot' and 'tors'")
    slot = spec.get("slot")
    if slot is not None:
        slot = expect_count(slot, source, f"{path}.slot")
    if "tors" in spec:
        tors = _switch_path(spec["tors"], source, f"{path}.tors")
        tiers: Tuple[str, ...] = ()
        if "path" in spec:
            tiers = _switch_path(spec["path"], source, f"{path}.path", empty_ok=True)
        return Placement(tiers=tiers, tors=tors, slot=slot)
    switches = _switch_path(require(spec, "path", source, path), source, f"{path}.path")
    return Placement(tiers=switches[:-1], tors=switches[-1:], slot=slot)


def _switch_path(value: Any, source: str, path: str, *, empty_ok: bool = False) -> Tuple[str, ...]:
    items: List[Any] = expect_list(value, source, path)
    if not items and not empty_ok:
        fail(source, path, "at least one switch id (the ToR last)")
    return tuple(_switch_id(item, source, f"{path}[{i}]") for i, item in enumerate(items))


def _switch_id(value: Any, source: str, path: str) -> str:
    if type(value) is int:
        return str(value)
    return expect_str(value, source, path)


_READERS: Dict[str, Callable[[Any, str], Topology]] = {
    CCE_RANKTABLE_TOR: _read_cce,
    BASIC_TOR_NODE_CM: _read_tor_info,
    PLAIN_FILE: _read_plain,
}
