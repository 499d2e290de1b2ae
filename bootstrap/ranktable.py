"""Rank table reader and writers (pure): bytes -> :class:`RankTable`, and back to a document.

Formats (docs/bootstrap.md; every number is a string):

* **v1.0** ``server_list``: ``{status, version, server_count, server_list: [{server_id, device:
  [{device_id, device_ip, rank_id}], host_ip?, container_ip?}]}``.
* **v1.2** adds top-level ``super_pod_list: [{super_pod_id, server_list: [{server_id}]}]`` (the
  super pod becomes :attr:`Server.super_pod_id`, an outer switch tier) and per-device
  ``super_device_id``.
* **v1.3/v1.4** may add ``data_version``, ``dpu_ip``, ``numa_id``, ``cluster_list``...: unknown
  fields are ignored here and survive in :func:`reordered_document`.
* **legacy "v0"** ``group_list``: ``{status, group_count, group_list: [{group_name, instance_list:
  [{pod_name, server_id, devices: [{device_id, device_ip}]}]}]}``; instances arrive in any order
  and are ordered by the integer suffix of ``pod_name``; there are no rank ids.

A table whose ``status`` is not ``completed`` may have no servers yet: it is returned as a valid,
not-ready table (the waiter decides what to do). A completed table is validated fully: types,
required fields, unique server ids, unique integer rank ids; the first problem raises
:class:`~npu_job.errors.InputError` such as
``<source>: server_list[3].device[1].rank_id: expected ...``.
"""

from __future__ import annotations

import operator
from collections import deque
from itertools import accumulate, chain, repeat
from typing import Any, Dict, List, Optional, Sequence, Tuple

from npu_job.kinds.base import index_suffix
from npu_job.kinds.volcano import KIND as VOLCANO

from npu_job.errors import shown
from npu_job.parsing import COUNT_LIMIT, MAX_COUNT_DIGITS

from .base.columns import DeviceColumns, servers_from_device_columns
from .base.fields import (
    expect_count,
    expect_list,
    expect_object,
    expect_str,
    fail,
    require,
    require_list,
    require_str,
    require_unique_id,
)
from .base.model import Collective, Device, Plan, PlanStatus, RankTable, Server
from .base.payload import decode_document

LEGACY_VERSION = "0"


def parse_rank_table(data: bytes, source: str) -> RankTable:
    """Decode (JSON or base64(gzip(JSON)), by content) and validate a rank table."""
    return rank_table_from_document(decode_document(data, source), source)


def rank_table_from_document(document: Any, source: str) -> RankTable:
    """Validate an already decoded rank table document (see the module docstring)."""
    doc = expect_object(document, source, "")
    _refuse_other_layouts(doc, source)
    status = require_str(doc, "status", source, "")
    if "server_list" not in doc and "group_list" in doc:
        return _legacy_table(doc, status, source)
    version = doc.get("version")
    if version is None:
        if status != "completed" and "server_list" not in doc:
            return RankTable(version="", status=status, servers=())
        require(doc, "version", source, "")
    version = expect_str(version, source, "version")
    if "server_list" not in doc and status != "completed":
        return RankTable(version=version, status=status, servers=())
    server_list = require_list(doc, "server_list", source, "")
    super_pods = _super_pods(doc, source)
    servers = _servers(server_list, super_pods, source)
    if "server_count" in doc:
        count = expect_count(doc["server_count"], source, "server_count")
        if count != len(servers):
            fail(
                source,
                "server_count",
                f'"{len(servers)}" (the number of entries in server_list), got "{count}"',
            )
    unknown = set(super_pods) - {server.server_id for server in servers}
    if unknown:
        fail(
            source,
            "super_pod_list",
            f"only server ids of server_list, got unknown {shown(sorted(unknown)[0])}",
        )
    return RankTable(version=version, status=status, servers=servers)


def _servers(server_list: List[Any], super_pods: Dict[str, str], source: str) -> Tuple[Server, ...]:
    fast = _all_devices_fast(server_list)
    if fast is not None:
        built = _servers_fast(server_list, fast, super_pods)
        if built is not None:
            return built
    servers: List[Server] = []
    seen: Dict[str, str] = {}
    for index, entry in enumerate(server_list):
        path = f"server_list[{index}]"
        expect_object(entry, source, path)
        server_id = require_unique_id(entry, "server_id", source, path, seen)
        if fast is not None:
            devices = fast.devices_of(index)
        else:
            devices = _devices_checked(entry, f"{path}.device", source)
        servers.append(
            Server(
                server_id,
                index,
                devices,
                host_ip=_optional_str(entry, "host_ip", path, source),
                container_ip=_optional_str(entry, "container_ip", path, source),
                pod_name=_optional_str(entry, "pod_name", path, source),
                super_pod_id=super_pods.get(server_id),
            )
        )
    if fast is None:  # the fast path has checked rank ids already
        _check_unique_ranks(servers, source)
    return tuple(servers)


def _servers_fast(
    server_list: List[Any], devices: DeviceColumns, super_pods: Dict[str, str]
) -> Optional[Tuple[Server, ...]]:
    """The servers of a well-formed table, column by column; None: check one by one."""
    try:
        ids = [entry["server_id"] for entry in server_list]
    except KeyError:
        return None
    if set(map(type, ids)) != _STR or "" in ids or len(set(ids)) != len(ids):
        return None
    columns = []
    for key in ("host_ip", "container_ip", "pod_name"):
        values = [entry.get(key) for entry in server_list]
        if set(map(type, values)) not in _STR_OR_NONE:
            return None
        columns.append([value or None for value in values])
    host_ips, container_ips, pod_names = columns
    return tuple(
        servers_from_device_columns(
            ids,
            range(len(ids)),
            devices,
            host_ips,
            container_ips,
            pod_names,
            map(super_pods.get, ids),
        )
    )


_STR = {str}
_STR_OR_NONE = ({str}, {type(None)}, {str, type(None)})
_DEVICE_ID = operator.itemgetter("device_id")
_RANK_ID = operator.itemgetter("rank_id")


def _all_devices_fast(server_list: List[Any]) -> Optional[DeviceColumns]:
    """Every server's devices from a well-formed table, in a few C-speed passes; None: check each.

    A 4096-node table has 32k devices and the pod-side budget is a fraction of a second, so the
    common case must not pay for per-field error reporting; anything unusual (a missing or mistyped
    field, a duplicate rank id) returns None and the slow path finds and names the first problem.
    """
    try:
        device_lists = [entry["device"] for entry in server_list]
        if set(map(type, device_lists)) - {list}:
            return None
        counts = list(map(len, device_lists))
        if 0 in counts:
            return None
        flat = list(chain.from_iterable(device_lists))
        # required fields by key (KeyError: missing), optional ones as the slow path reads them;
        # dict.get also rejects a device that is not an object (TypeError)
        ids = list(map(_DEVICE_ID, flat))
        ranks = list(map(_RANK_ID, flat))
        ips = list(map(dict.get, flat, repeat("device_ip")))
        supers = list(map(dict.get, flat, repeat("super_device_id")))
    except (TypeError, KeyError, ValueError):
        return None
    if set(map(type, ids)) != _STR or "" in ids or set(map(type, ranks)) != _STR or "" in ranks:
        return None
    joined = "".join(ranks)
    if not (joined.isdigit() and joined.isascii()):
        return None
    if set(map(type, ips)) not in _STR_OR_NONE or set(map(type, supers)) not in _STR_OR_NONE:
        return None
    try:
        rank_ids = list(map(int, ranks))
    except ValueError:  # more digits than int() reads: the checked path names the field
        return None
    if len(set(rank_ids)) != len(rank_ids) or max(rank_ids) >= COUNT_LIMIT:
        return None
    if len(set(counts)) == 1:  # full nodes, the usual case
        offsets: Sequence[int] = range(0, len(flat) + 1, counts[0])
    else:
        offsets = [0, *accumulate(counts)]  # accumulate's initial= is Python 3.8+
    # the Device objects themselves are built only if someone reads Server.devices
    return DeviceColumns(ids, ips, rank_ids, supers, offsets)


def _devices_checked(entry: Dict[str, Any], path: str, source: str) -> Tuple[Device, ...]:
    raw = entry.get("device")
    if type(raw) is not list:
        expect_list(require(entry, "device", source, path.rsplit(".", 1)[0]), source, path)
    if not raw:
        fail(source, path, "at least one device, got an empty array")
    devices = []
    for position, item in enumerate(raw):
        here = f"{path}[{position}]"
        expect_object(item, source, here)
        device_id = require_str(item, "device_id", source, here)
        rank_id = expect_count(require(item, "rank_id", source, here), source, f"{here}.rank_id")
        device_ip = item.get("device_ip")
        if device_ip is not None:
            expect_str(device_ip, source, f"{here}.device_ip", empty_ok=True)
        super_device_id = item.get("super_device_id")
        if super_device_id is not None:
            expect_str(super_device_id, source, f"{here}.super_device_id", empty_ok=True)
        devices.append(Device(device_id, device_ip, rank_id, super_device_id))
    return tuple(devices)


def _check_unique_ranks(servers: List[Server], source: str) -> None:
    where: Dict[Optional[int], str] = {}
    for index, server in enumerate(servers):
        for position, device in enumerate(server.devices):
            here = f"server_list[{index}].device[{position}]"
            if device.rank_id in where:
                fail(
                    source,
                    f"{here}.rank_id",
                    f'a rank id unique in the table; "{device.rank_id}" is also '
                    f"{where[device.rank_id]}",
                )
            where[device.rank_id] = here


def _refuse_other_layouts(doc: Dict[str, Any], source: str) -> None:
    """Name the rank-table layouts people have that describe no pods of one job.

    * The bare-metal HCCL v0 layout (``board_id``, ``chip_info``, ``para_plane_nic_*``; one
      instance per *rank*, ``rank_id`` on the instance, no ``pod_name``) is written by hand for
      hosts started without Kubernetes: there is no pod order to plan and no pod to find itself.
    * MindIE's global rank table (``server_group_list``) describes an inference deployment of
      several server groups, not the pods of one training job.
    """
    groups = doc.get("group_list")
    first = None
    if isinstance(groups, list) and groups and isinstance(groups[0], dict):
        instances = groups[0].get("instance_list")
        if isinstance(instances, list) and instances and isinstance(instances[0], dict):
            first = instances[0]
    per_rank = first is not None and "rank_id" in first and "pod_name" not in first
    if "board_id" in doc or "chip_info" in doc or per_rank:
        fail(
            source,
            "document",
            "the rank table of a Volcano/Kubernetes job (server_list, or group_list with pod "
            "names); this is the bare-metal HCCL v0 layout (board_id/chip_info, one instance per "
            "rank), which lists hosts, not pods: there is no pod order to plan",
        )
    if "server_group_list" in doc and "server_list" not in doc:
        fail(
            source,
            "document",
            "the rank table of one training job (server_list or group_list); this is MindIE's "
            "global rank table (server_group_list), which describes an inference deployment of "
            "several server groups",
        )


def _super_pods(doc: Dict[str, Any], source: str) -> Dict[str, str]:
    """server_id -> super_pod_id from the v1.2+ ``super_pod_list`` (empty when absent)."""
    if "super_pod_list" not in doc:
        return {}
    result: Dict[str, str] = {}
    where: Dict[str, str] = {}
    for index, pod in enumerate(expect_list(doc["super_pod_list"], source, "super_pod_list")):
        path = f"super_pod_list[{index}]"
        expect_object(pod, source, path)
        pod_id = require_str(pod, "super_pod_id", source, path)
        members = require_list(pod, "server_list", source, path)
        for position, member in enumerate(members):
            here = f"{path}.server_list[{position}]"
            expect_object(member, source, here)
            server_id = require_str(member, "server_id", source, here)
            if server_id in where:
                fail(
                    source,
                    f"{here}.server_id",
                    f"each server in one super pod; {shown(server_id)} is also in "
                    f"{where[server_id]}",
                )
            where[server_id] = path
            result[server_id] = pod_id
    return result


def _legacy_table(doc: Dict[str, Any], status: str, source: str) -> RankTable:
    groups = expect_list(doc["group_list"], source, "group_list")
    if not groups and status != "completed":
        return RankTable(version=LEGACY_VERSION, status=status, servers=())
    if len(groups) != 1:
        fail(source, "group_list", f"exactly one group (one task), got {len(groups)}")
    group = expect_object(groups[0], source, "group_list[0]")
    instances = require_list(group, "instance_list", source, "group_list[0]")
    by_suffix: Dict[int, Tuple[str, Server]] = {}
    ids: Dict[str, str] = {}
    for index, instance in enumerate(instances):
        path = f"group_list[0].instance_list[{index}]"
        expect_object(instance, source, path)
        pod_name = require_str(instance, "pod_name", source, path)
        suffix = index_suffix(pod_name)  # CCE's tables list a Volcano Job's pods
        if suffix is None:
            fail(
                source,
                f"{path}.pod_name",
                f"{VOLCANO.name_expected}, below 10^{MAX_COUNT_DIGITS} (e.g. job-worker-0)",
                pod_name,
            )
        if suffix in by_suffix:
            fail(
                source,
                f"{path}.pod_name",
                f"a unique pod index; {suffix} is also {by_suffix[suffix][0]}",
            )
        server_id = require_unique_id(instance, "server_id", source, path, ids)
        raw_devices = require_list(instance, "devices", source, path)
        if not raw_devices:
            fail(source, f"{path}.devices", "at least one device, got an empty array")
        devices = []
        for position, item in enumerate(raw_devices):
            here = f"{path}.devices[{position}]"
            expect_object(item, source, here)
            device_id = require_str(item, "device_id", source, here)
            device_ip = item.get("device_ip")
            if device_ip is not None:
                expect_str(device_ip, source, f"{here}.device_ip")
            devices.append(Device(device_id, device_ip, None))
        by_suffix[suffix] = (path, Server(server_id, -1, tuple(devices), pod_name=pod_name))
    suffixes = sorted(by_suffix)
    if suffixes != list(range(len(suffixes))):
        missing = sorted(set(range(len(suffixes))) - set(suffixes))
        beyond = suffixes[-1]
        beyond_path, beyond_server = by_suffix[beyond]
        fail(
            source,
            "group_list[0].instance_list",
            f"pod name suffixes 0..{len(suffixes) - 1}, index {missing[0]} is missing "
            f"({beyond_path}.pod_name {shown(beyond_server.pod_name)} has index {beyond}: "
            f"{len(suffixes)} pods of one job are <job>-<task>-0..{len(suffixes) - 1})",
        )
    servers = tuple(
        Server(s.server_id, suffix, s.devices, pod_name=s.pod_name)
        for suffix, (_, s) in sorted(by_suffix.items())
    )
    return RankTable(version=LEGACY_VERSION, status=status, servers=servers)


def _optional_str(entry: Dict[str, Any], key: str, path: str, source: str) -> Optional[str]:
    value = entry.get(key)
    if value is None:
        return None
    return expect_str(value, source, f"{path}.{key}", empty_ok=True) or None


# --- writers (pure: they return documents) --------------------------------------------------------


def rank_table_document(table: RankTable) -> Dict[str, Any]:
    """The CCE/HCCL ``server_list`` document for ``table`` (v1.0, or v1.2 with super pods).

    Used to generate inputs for tests, benchmarks and the demo. Rank ids are written as the
    running device counter, which is ``pod_index * ndev + position`` for full nodes.
    """
    server_list = []
    next_rank = 0
    for server in table.servers:
        devices = []
        for device in server.devices:
            item: Dict[str, Any] = {"device_id": device.device_id}
            if device.device_ip is not None:
                item["device_ip"] = device.device_ip
            if device.super_device_id is not None:
                item["super_device_id"] = device.super_device_id
            item["rank_id"] = str(next_rank)
            next_rank += 1
            devices.append(item)
        entry: Dict[str, Any] = {"server_id": server.server_id, "device": devices}
        if server.host_ip is not None:
            entry["host_ip"] = server.host_ip
        if server.container_ip is not None:
            entry["container_ip"] = server.container_ip
        server_list.append(entry)
    has_super_pods = any(server.super_pod_id is not None for server in table.servers)
    version = table.version if table.version not in ("", LEGACY_VERSION) else "1.0"
    if has_super_pods and version == "1.0":
        version = "1.2"
    document: Dict[str, Any] = {
        "status": table.status,
        "version": version,
        "server_count": str(len(table.servers)),
        "server_list": server_list,
    }
    if has_super_pods:
        document["super_pod_list"] = _super_pod_list(table.servers)
    return document


def in_server_order(table: RankTable, server_ids: Sequence[str], source: str) -> Plan:
    """The plan that gives new node rank ``r`` to the server ``server_ids[r]`` of ``table``: how a
    rendezvous round's order of the nodes present (their reports' node ids) becomes the rank
    table HCCL reads (:func:`reordered_document`). An ``InputError`` naming ``source`` when
    the table does not list exactly those servers (a table the platform has not rewritten yet
    for a replaced pod)."""
    position = {server_id: rank for rank, server_id in enumerate(server_ids)}
    listed = [server.server_id for server in table.servers]
    if len(position) != len(server_ids) or sorted(position) != sorted(listed):
        missing = sorted(set(position) - set(listed))
        extra = sorted(set(listed) - set(position))
        fail(
            source,
            "server_list",
            f"exactly the round's {len(server_ids)} nodes, got {len(listed)} server(s)"
            + (f"; not listed: {', '.join(map(shown, missing[:3]))}" if missing else "")
            + (f"; not in the round: {', '.join(map(shown, extra[:3]))}" if extra else ""),
        )
    ranks = tuple(position[server_id] for server_id in listed)
    return Plan(PlanStatus.SUCCESS, ranks, Collective.RING)


def reordered_document(
    document: Dict[str, Any], table: RankTable, plan: Plan, *, in_place: bool = False
) -> Dict[str, Any]:
    """``document`` with ``server_list`` in new node-rank order and rank ids rewritten.

    The original document is edited so unknown fields survive; each device gets ``rank_id =
    new_node_rank * ndev + position`` (a running counter, the same for full nodes).
    ``super_pod_list`` members follow the new order. A legacy ``group_list`` table has no rank ids
    to reorder, so it is written in the v1.0 ``server_list`` form HCCL reads.

    By default the input is copied, not mutated. ``in_place=True`` rewrites the device entries of
    ``document`` itself (a third of the cost at 32k devices): for a caller that owns a freshly
    decoded document and only serialises the result.
    """
    order = plan.pod_of_node_rank
    if len(order) != len(table.servers):
        raise ValueError(f"plan covers {len(order)} pods, the table has {len(table.servers)}")
    if table.version == LEGACY_VERSION:
        legacy = RankTable("1.0", table.status, tuple(table.servers[pod] for pod in order))
        return rank_table_document(legacy)
    originals = document["server_list"]
    if in_place:
        server_list = [originals[pod] for pod in order]
        # every device in new order gets the running counter, at C speed (32k devices at 4096)
        devices = list(chain.from_iterable(entry["device"] for entry in server_list))
        deque(map(operator.setitem, devices, repeat("rank_id"), map(str, range(len(devices)))), 0)
    else:
        rank_texts = list(map(str, range(sum(server.device_count for server in table.servers))))
        server_list = []
        next_rank = 0
        for pod in order:
            entry = originals[pod]
            count = len(entry["device"])
            ranks = rank_texts[next_rank : next_rank + count]
            next_rank += count
            renumbered = [
                {**device, "rank_id": rank} for device, rank in zip(entry["device"], ranks)
            ]
            server_list.append({**entry, "device": renumbered})
    result = dict(document)
    result["server_list"] = server_list
    if "super_pod_list" in document:
        rank_of_server = {table.servers[pod].server_id: rank for rank, pod in enumerate(order)}
        super_pods = []
        for pod_entry in document["super_pod_list"]:
            copied = dict(pod_entry)
            copied["server_list"] = sorted(
                pod_entry["server_list"], key=lambda member: rank_of_server[member["server_id"]]
            )
            super_pods.append(copied)
        result["super_pod_list"] = super_pods
    return result


def _super_pod_list(servers: Tuple[Server, ...]) -> List[Dict[str, Any]]:
    members: Dict[str, List[Dict[str, str]]] = {}
    for server in servers:
        if server.super_pod_id is not None:
            members.setdefault(server.super_pod_id, []).append({"server_id": server.server_id})
    return [{"super_pod_id": pod_id, "server_list": members[pod_id]} for pod_id in sorted(members)]
