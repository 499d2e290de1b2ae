"""The facts the bootstrap reads of Nodes and Pods (pure): :class:`NodeFacts`, :class:`PodFacts`.

Only these fields are read (Kubernetes API reference, core/v1 Node and Pod), of the objects
:mod:`npu_job.bootstrap.kube.objects` found in a document:

* Node: ``metadata.name``, ``metadata.labels``, ``status.addresses[type=InternalIP].address``;
* Pod: ``metadata.name``, ``.namespace``, ``.labels``, ``.deletionTimestamp``, ``spec.nodeName``,
  ``spec.containers[].resources.limits`` (else ``.requests``), ``status.hostIP``, ``status.podIP``
  (how a pod of a kind without DNS names is reached), ``status.phase``.

Each object is read twice over if need be: a fast reader takes a well-formed one at C speed, and
whatever it declines is read field by field, which accepts it or names the first wrong field
(``items[3] (Pod 'p3'): spec.nodeName: expected a string...``); so both paths read the same (the
tests compare them on damaged copies). A pod counts its accelerators from the extended resources
of the device plugins (:func:`devices_of`).
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from npu_job.parsing import count_from_text

from ..base.fields import expect_list, expect_object, expect_str, fail, join_key
from .objects import (
    KubeObject,
    field_path,
    named_once,
    object_name,
    optional_str,
    section,
    string_map,
)

# Extended resources that count a pod's accelerators (device plugins' resource names): NVIDIA's
# and AMD's GPU plugins, and the Ascend plugins (huawei.com/ascend-1980 on CCE, huawei.com/Ascend910
# and friends in MindCluster).
_ACCELERATOR = re.compile(r"(?:nvidia\.com/gpu|amd\.com/gpu|huawei\.com/ascend[\w.-]*)\Z", re.I)


_NO_LABELS: Mapping[str, str] = MappingProxyType({})


class NodeFacts(NamedTuple):
    """A Node: its name, its ``InternalIP`` addresses and its labels. (NamedTuples like
    :class:`~.objects.KubeObject`: a big cluster has thousands.)"""

    name: str
    addresses: Tuple[str, ...] = ()
    labels: Mapping[str, str] = _NO_LABELS
    where: str = ""  # items[i] in the document it came from, for messages


class PodFacts(NamedTuple):
    """A Pod: where the scheduler put it (``node_name`` is ``""`` until it is scheduled) and how
    many accelerators its containers ask for."""

    name: str
    namespace: str = ""
    labels: Mapping[str, str] = _NO_LABELS
    node_name: str = ""
    host_ip: str = ""
    phase: str = ""
    deleting: bool = False  # metadata.deletionTimestamp is set: the pod is going away
    accelerators: int = 0
    where: str = ""  # items[i] in the document it came from, for messages
    # last, so that PodFacts(name, namespace, labels, node, host, phase, ...) by position means
    # what it meant before pods had it
    pod_ip: str = ""  # status.podIP: "" until the pod's network is set up


# --- Nodes ----------------------------------------------------------------------------------------


def read_nodes(objects: Sequence[KubeObject], source: str) -> Tuple[NodeFacts, ...]:
    """The facts of every Node; a node name listed twice is an error."""
    nodes = [_node_fast(obj) for obj in objects]
    names = [node.name for node in nodes if node is not None]
    if len(names) == len(nodes) and len(set(names)) == len(names):
        return tuple(nodes)  # type: ignore[arg-type]  # none is None
    return tuple(_nodes_checked(objects, source))  # names what is wrong


def _node_fast(obj: KubeObject) -> Optional[NodeFacts]:
    """The facts of a well-formed Node at C speed where it can; None: check it field by field
    (which accepts it or names what is wrong), so both paths read the same."""
    try:
        metadata = obj.item["metadata"]
        name = metadata["name"]
        labels = metadata.get("labels")
        status = obj.item.get("status")
        if status is None:
            status = {}
        addresses = status.get("addresses")
        internal = tuple(
            [
                address["address"]
                for address in addresses or ()
                if address.get("type") == "InternalIP"
            ]
        )
    except (KeyError, TypeError, AttributeError):
        return None
    if labels is None:
        labels = {}
    if (
        type(name) is not str
        or not name
        or type(metadata) is not dict
        or type(status) is not dict
        or not _string_map_ok(labels)
        or type(addresses) not in _LIST_OR_NONE
        or not _STR.issuperset(map(type, internal))
        or "" in internal
    ):
        return None
    return NodeFacts(name, internal, labels, obj.where)


_STR = frozenset({str})
_LIST_OR_NONE = frozenset({list, type(None)})


def _string_map_ok(value: Any) -> bool:
    return (
        type(value) is dict
        and _STR.issuperset(map(type, value))
        and _STR.issuperset(map(type, value.values()))
    )


def _nodes_checked(objects: Sequence[KubeObject], source: str) -> List[NodeFacts]:
    nodes: List[NodeFacts] = []
    for obj, name in named_once(objects, source, "node"):
        metadata = obj.item["metadata"]
        labels = string_map(
            metadata.get("labels"), source, field_path(obj, name, "metadata.labels")
        )
        status = section(obj, name, "status", source)
        here = field_path(obj, name, "status.addresses")
        internal: List[str] = []
        addresses = status.get("addresses")
        for position, address in enumerate(
            expect_list([] if addresses is None else addresses, source, here)
        ):
            at = f"{here}[{position}]"
            expect_object(address, source, at)
            if address.get("type") == "InternalIP":
                value = address.get("address")
                if value is None:
                    fail(source, f"{at}.address", "a required field (missing)")
                internal.append(expect_str(value, source, f"{at}.address"))
        nodes.append(NodeFacts(name, tuple(internal), labels, obj.where))
    return nodes


# --- Pods -----------------------------------------------------------------------------------------


def read_pods(objects: Sequence[KubeObject], source: str) -> Tuple[PodFacts, ...]:
    """The facts of every Pod, in document order (the caller decides what belongs to its job)."""
    return tuple([_pod_fast(obj) or _pod_checked(obj, source) for obj in objects])


def _pod_fast(obj: KubeObject) -> Optional[PodFacts]:
    """:func:`_pod_checked`'s result for a well-formed Pod, read without building a message for
    every field; None: check it field by field."""
    try:
        item = obj.item
        metadata = item["metadata"]
        name = metadata["name"]
        labels = metadata.get("labels")
        namespace = metadata.get("namespace")
        spec = item.get("spec")
        status = item.get("status")
        if spec is None:
            spec = {}
        if status is None:
            status = {}
        node_name = spec.get("nodeName")
        host_ip = status.get("hostIP")
        pod_ip = status.get("podIP")
        phase = status.get("phase")
        accelerators = _accelerators_fast(spec.get("containers"))
    except (KeyError, TypeError, AttributeError):
        return None
    if labels is None:
        labels = {}
    values = (namespace, node_name, host_ip, pod_ip, phase)
    if (
        accelerators is None
        or type(name) is not str
        or not name
        or type(metadata) is not dict
        or type(spec) is not dict
        or type(status) is not dict
        or not _string_map_ok(labels)
        or not _STR_OR_NONE.issuperset(map(type, values))
    ):
        return None
    return PodFacts(
        name,
        namespace or "",
        labels,
        node_name or "",
        host_ip or "",
        phase or "",
        metadata.get("deletionTimestamp") is not None,
        accelerators,
        obj.where,
        pod_ip or "",
    )


_STR_OR_NONE = frozenset({str, type(None)})


def _accelerators_fast(containers: Any) -> Optional[int]:
    """:func:`_accelerators` of well-formed containers; None: check them one by one."""
    listed = []
    for container in containers or ():
        resources = container.get("resources")
        if resources is None:
            continue
        if type(resources) is not dict:
            return None
        listed.append((resources.get("limits"), resources.get("requests")))
    total = devices_of(listed)
    return total if type(containers) in _LIST_OR_NONE else None


def devices_of(resources: Iterable[Tuple[Any, Any]]) -> Optional[int]:
    """Accelerators of the containers' ``(limits, requests)``: the limits of a known accelerator
    resource, else the requests; None: amounts that are not an object, a count
    :func:`_device_count` refuses, or more than :data:`MAX_DEVICES` in all."""
    total = 0
    for limits, requests in resources:
        for amounts in (limits, requests):
            if not amounts:
                continue
            if type(amounts) is not dict:
                return None
            counted = _devices_fast(amounts)
            if counted is None:
                return None
            if counted[1]:
                total += counted[0]
                break
    return total if total <= MAX_DEVICES else None


def _devices_fast(amounts: Dict[Any, Any]) -> Optional[Tuple[int, bool]]:
    """(devices, whether any accelerator resource is listed) of a well-formed ``limits`` or
    ``requests``; None: a count :func:`_device_count` refuses."""
    total = 0
    listed = False
    known = _ACCELERATOR_NAMES
    for key, value in amounts.items():
        accelerator = known.get(key)
        if accelerator is None:
            accelerator = type(key) is str and _ACCELERATOR.match(key) is not None
            if type(key) is str and len(known) < 1024:
                known[key] = accelerator
        if not accelerator:
            continue
        listed = True
        count = _quantity_count(value)
        if count is None:
            return None
        total += count
    return total, listed


# resource name -> whether it counts accelerators: the same few names (cpu, memory,
# nvidia.com/gpu...) come back in every pod, and a lookup is cheaper than the pattern
_ACCELERATOR_NAMES: Dict[Any, bool] = {}


def _pod_checked(obj: KubeObject, source: str) -> PodFacts:
    """A Pod's facts, each field checked: the first wrong one raises, naming it."""
    name = object_name(obj, source)
    metadata = obj.item["metadata"]
    meta_path = field_path(obj, name, "metadata")
    namespace = optional_str(metadata, "namespace", source, meta_path)
    labels = string_map(metadata.get("labels"), source, f"{meta_path}.labels")
    spec = section(obj, name, "spec", source)
    status = section(obj, name, "status", source)
    return PodFacts(
        name=name,
        namespace=namespace,
        labels=labels,
        node_name=optional_str(spec, "nodeName", source, field_path(obj, name, "spec")),
        host_ip=optional_str(status, "hostIP", source, field_path(obj, name, "status")),
        pod_ip=optional_str(status, "podIP", source, field_path(obj, name, "status")),
        phase=optional_str(status, "phase", source, field_path(obj, name, "status")),
        deleting=metadata.get("deletionTimestamp") is not None,
        accelerators=_accelerators(spec, source, field_path(obj, name, "spec.containers")),
        where=obj.where,
    )


def _accelerators(spec: Mapping[str, Any], source: str, path: str) -> int:
    """Accelerators the pod's containers ask for: their limits of a known accelerator resource
    (extended resources are requested through limits; requests where a container has no limits)."""
    containers = spec.get("containers")
    total = 0
    for position, container in enumerate(
        expect_list([] if containers is None else containers, source, path)
    ):
        here = f"{path}[{position}]"
        expect_object(container, source, here)
        resources = container.get("resources") or {}
        expect_object(resources, source, f"{here}.resources")
        for kind in ("limits", "requests"):
            amounts = resources.get(kind)
            if not amounts:
                continue
            expect_object(amounts, source, f"{here}.resources.{kind}")
            counted = [
                (key, value)
                for key, value in amounts.items()
                if type(key) is str and _ACCELERATOR.match(key)
            ]
            for key, value in counted:
                total += _device_count(value, source, join_key(f"{here}.resources.{kind}", key))
            if counted:
                break
    if total > MAX_DEVICES:
        fail(source, path, f"{_AT_MOST} in all (the server's accelerators), got {total}")
    return total


def _device_count(value: Any, source: str, path: str) -> int:
    """A device quantity: a whole number, written as a number or as a string (``"8"``)."""
    count = _quantity_count(value)
    if count is None:
        fail(source, path, f"a whole number of devices, {_AT_MOST}", value)
    return count


# The most accelerators one server (one pod, all its containers) may ask for. The roster builds an
# object per device, so a count is checked against this before anything is built: a pod asking
# for 10**12 GPUs would otherwise take every pod of the job past its memory. The largest real
# nodes have 16 accelerators (Atlas A3 super-pod nodes; 8 on DGX/HGX); 1024 leaves room for
# 64x that (and for fractional-device plugins that count slices) at ~100 KB per server.
MAX_DEVICES = 1024
DEVICE_DIGITS = len(str(MAX_DEVICES))  # a count's digits past leading zeros, checked first
_AT_MOST = f"at most {MAX_DEVICES}"


def _quantity_count(value: Any) -> Optional[int]:
    """A device quantity as a count up to :data:`MAX_DEVICES`: an int, or its ASCII digits
    (``"8"``); else None. An int is compared, never printed or converted (O(1) memory whatever
    its size), and text is refused by its length before it is read as a number."""
    if type(value) is int:
        return value if 0 <= value <= MAX_DEVICES else None
    count = count_from_text(value, DEVICE_DIGITS) if type(value) is str else None
    return count if count is not None and count <= MAX_DEVICES else None
