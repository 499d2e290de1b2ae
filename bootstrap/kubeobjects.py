"""Kubernetes objects as kubectl prints them and the API lists them (pure): Nodes, Pods, HyperNodes.

Reads what the bootstrap needs from

* a typed list as the API answers a LIST (``NodeList``, ``PodList``, ``HyperNodeList``; its items
  carry no ``kind``);
* kubectl's output, ``kubectl get nodes -o json`` (or ``-o yaml``): a ``v1`` ``List`` whose items
  do carry ``kind``, including the combined ``kubectl get hypernodes,nodes,pods -o json``;
* a single object (``kubectl get node n1 -o json``).

Items of other kinds are skipped. Only these fields are read (Kubernetes API reference, core/v1
Node and Pod; Volcano's ``topology.volcano.sh/v1alpha1`` HyperNode is read by
:mod:`npu_job.bootstrap.hypernode`):

* Node: ``metadata.name``, ``metadata.labels``, ``status.addresses[type=InternalIP].address``;
* Pod: ``metadata.name``, ``.namespace``, ``.labels``, ``.deletionTimestamp``, ``spec.nodeName``,
  ``spec.containers[].resources.limits`` (else ``.requests``), ``status.hostIP``, ``status.phase``.

A bad field is one :class:`~npu_job.errors.InputError` naming the object and the field, e.g.
``nodes.json: items[3] (Node 'n3'): metadata.labels.volcano.sh/tor: expected a string, got a
number 5``. A big JSON list (a 4096-pod job) is decoded with msgspec into only these fields when
msgspec is installed (:func:`.jsondecode.decode_typed`); whatever it refuses is read
again in full, so messages are the same either way. A page of the API's ``PodList`` goes further
(:func:`read_pod_page`): msgspec decodes it into typed structs of just these fields, which checks
their types as it goes, and the facts are taken from them with no field-by-field checks (a pod of
a 4096-pod job lists ~5 KB, of which these fields are 300 bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from types import MappingProxyType
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

from npu_job.bootstrap.fields import expect_list, expect_object, expect_str, fail, join_key
from npu_job.bootstrap.jsondecode import decode_typed
from npu_job.bootstrap.payload import decode_document, json_text

from npu_job.errors import InputError, shown

NODE = "Node"
POD = "Pod"
HYPERNODE = "HyperNode"
KINDS = (NODE, POD, HYPERNODE)
# list kind -> the kind of its items when they carry none (what the API answers to a LIST)
LIST_KINDS: Dict[str, Optional[str]] = {
    "List": None,
    "NodeList": NODE,
    "PodList": POD,
    "HyperNodeList": HYPERNODE,
}

# Extended resources that count a pod's accelerators (device plugins' resource names): NVIDIA's
# and AMD's GPU plugins, and the Ascend plugins (huawei.com/ascend-1980 on CCE, huawei.com/Ascend910
# and friends in MindCluster).
_ACCELERATOR = re.compile(r"(?:nvidia\.com/gpu|amd\.com/gpu|huawei\.com/ascend[\w.-]*)\Z", re.I)


_NO_LABELS: Mapping[str, str] = MappingProxyType({})


class KubeObject(NamedTuple):
    """One item: its ``kind``, where it is in the document (``items[3]``, or ``""`` for a document
    that is the object itself) and the decoded item. A NamedTuple rather than a frozen dataclass:
    a 4096-pod job lists 12k of them, and a tuple is made several times faster."""

    kind: str
    where: str
    item: Dict[str, Any]


@dataclass(frozen=True)
class KubeObjects:
    """The Nodes, Pods and HyperNodes of one or more documents, in document order."""

    nodes: Tuple[KubeObject, ...] = ()
    pods: Tuple[KubeObject, ...] = ()
    hypernodes: Tuple[KubeObject, ...] = ()

    def __add__(self, other: KubeObjects) -> KubeObjects:
        return KubeObjects(
            self.nodes + other.nodes, self.pods + other.pods, self.hypernodes + other.hypernodes
        )

    def of(self, kind: str) -> Tuple[KubeObject, ...]:
        return {NODE: self.nodes, POD: self.pods, HYPERNODE: self.hypernodes}[kind]


class NodeFacts(NamedTuple):
    """A Node: its name, its ``InternalIP`` addresses and its labels. (NamedTuples like
    :class:`KubeObject`: a big cluster has thousands.)"""

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


def field_path(obj: KubeObject, name: Optional[str], path: str) -> str:
    """The field part of an error about ``obj``: ``items[3] (Node 'n3'): metadata.labels.x``, or
    the plain ``items[3].metadata.name`` when the object has no usable name."""
    return object_field(obj.kind, obj.where, name, path)


def object_field(kind: str, where: str, name: Optional[str], path: str) -> str:
    """:func:`field_path` from its parts (``where`` is ``items[3]``, or ``""`` for a document that
    is the object itself)."""
    if name is None:
        return f"{where}.{path}" if where else path
    named = f"{kind} {shown(name)}"
    return f"{where} ({named}): {path}" if where else f"{named}: {path}"


# --- documents ------------------------------------------------------------------------------------


def decode_objects(data: bytes, source: str) -> KubeObjects:
    """Decode ``data`` (JSON, base64(gzip(JSON)) or YAML, by content) and sort its items by kind."""
    return read_objects(decode_kube_document(data, source), source)


def decode_kube_document(data: bytes, source: str, *, allow_yaml: bool = True) -> Any:
    """The decoded document; a big JSON list holds only the fields this package reads (a document
    that is no list, or has keys of the other topology formats, is decoded whole)."""
    try:
        text: Optional[bytes] = json_text(data, source)
    except InputError:  # not JSON: YAML from kubectl -o yaml (decode_document says what is wrong)
        if not allow_yaml:
            raise
        text = None
    if text is not None:
        typed = decode_typed(text, _list_decoder)
        if (
            type(typed) is dict
            and type(typed.get("items")) is list
            and not _OTHER_FORMATS_KEYS.intersection(typed)
        ):
            return typed
    return decode_document(data, source, allow_yaml=allow_yaml)


# Top-level keys of the non-Kubernetes topology formats: a document with any is read in full.
_OTHER_FORMATS_KEYS = frozenset({"servers", "server_list", "tor_count"})


def read_objects(document: Any, source: str) -> KubeObjects:
    """The Nodes, Pods and HyperNodes of a decoded list (or single object) document."""
    doc = expect_object(document, source, "")
    kind = doc.get("kind")
    if "items" not in doc and kind in KINDS:  # a single object
        return _grouped([KubeObject(kind, "", doc)])
    if kind is not None and (type(kind) is not str or kind not in LIST_KINDS):  # [] is unhashable
        expected = ", ".join(sorted(LIST_KINDS)) + " or a single " + ", ".join(KINDS)
        fail(source, "kind", expected, kind)
    implied = LIST_KINDS.get(kind) if kind is not None else None
    items = expect_list(doc.get("items", []), source, "items")
    if (
        implied is not None
        and _DICT.issuperset(map(type, items))
        and not any(map(_has_kind, items))
    ):  # what the API answers: a typed list, no kind per item
        listed = tuple(
            map(
                KubeObject,
                repeat(implied, len(items)),
                [f"items[{index}]" for index in range(len(items))],
                items,
            )
        )
        return KubeObjects(**{_FIELD_OF[implied]: listed})
    objects: List[KubeObject] = []
    for index, item in enumerate(items):
        where = f"items[{index}]"
        expect_object(item, source, where)
        item_kind = item.get("kind", implied)
        if item_kind is None:
            fail(
                source, f"{where}.kind", "the kind of each item of a List (Node, Pod, HyperNode...)"
            )
        if type(item_kind) is not str:
            fail(source, f"{where}.kind", "a string", item_kind)
        if item_kind in KINDS:
            objects.append(KubeObject(item_kind, where, item))
    return _grouped(objects)


_DICT = frozenset({dict})
_FIELD_OF = {NODE: "nodes", POD: "pods", HYPERNODE: "hypernodes"}


def _has_kind(item: Dict[str, Any]) -> bool:
    return "kind" in item


def _grouped(objects: Iterable[KubeObject]) -> KubeObjects:
    by_kind: Dict[str, List[KubeObject]] = {kind: [] for kind in KINDS}
    for obj in objects:
        by_kind[obj.kind].append(obj)
    return KubeObjects(tuple(by_kind[NODE]), tuple(by_kind[POD]), tuple(by_kind[HYPERNODE]))


# --- field readers shared by the object readers ---------------------------------------------------


def object_name(obj: KubeObject, source: str) -> str:
    """``metadata.name`` of ``obj``, which must be a non-empty string."""
    metadata = expect_object(obj.item.get("metadata"), source, field_path(obj, None, "metadata"))
    name = metadata.get("name")
    if name is None:
        fail(source, field_path(obj, None, "metadata.name"), "a required field (missing)")
    return expect_str(name, source, field_path(obj, None, "metadata.name"))


def section(obj: KubeObject, name: Optional[str], key: str, source: str) -> Dict[str, Any]:
    """``obj.item[key]`` (``spec``, ``status``...), an object; ``{}`` when absent or null."""
    value = obj.item.get(key)
    if value is None:
        return {}
    return expect_object(value, source, field_path(obj, name, key))


def string_map(value: Any, source: str, path: str) -> Dict[str, str]:
    """A ``map[string]string`` (labels, matchLabels): ``{}`` when absent or null."""
    if value is None:
        return {}
    mapping = expect_object(value, source, path)
    for key, item in mapping.items():
        if type(key) is not str:
            fail(source, join_key(path, key), "keys as strings", key)
        if type(item) is not str:
            fail(source, join_key(path, key), "a string", item)
    return mapping


def optional_str(mapping: Mapping[str, Any], key: str, source: str, path: str) -> str:
    """``mapping[key]`` as a string, ``""`` when absent or null."""
    value = mapping.get(key)
    if value is None:
        return ""
    if type(value) is not str:
        fail(source, f"{path}.{key}", "a string", value)
    return value


# --- Nodes ----------------------------------------------------------------------------------------


def named_once(
    objects: Sequence[KubeObject], source: str, what: str
) -> Iterator[Tuple[KubeObject, str]]:
    """``(object, metadata.name)`` of each object; a name listed twice is an error (a list of
    cluster-scoped objects, or a hand-made List that repeats one)."""
    seen: Dict[str, str] = {}
    for obj in objects:
        name = object_name(obj, source)
        if name in seen:
            fail(
                source,
                field_path(obj, name, "metadata.name"),
                f"a {what} name unique in the list; {shown(name)} is also {seen[name]}",
            )
        seen[name] = obj.where or "the document"
        yield obj, name


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
        phase = status.get("phase")
        accelerators = _accelerators_fast(spec.get("containers"))
    except (KeyError, TypeError, AttributeError):
        return None
    if labels is None:
        labels = {}
    values = (namespace, node_name, host_ip, phase)
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
    total = _devices_of(listed)
    return total if type(containers) in _LIST_OR_NONE else None


def _devices_of(resources: Iterable[Tuple[Any, Any]]) -> Optional[int]:
    """Accelerators of the containers' ``(limits, requests)``: the limits of a known accelerator
    resource, else the requests; None: amounts that are not an object, or a count
    :func:`_device_count` refuses."""
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
    return total


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
        if type(value) is str and value.isdigit() and value.isascii() and len(value) <= 9:
            total += int(value)
        elif type(value) is int and value >= 0:
            total += value
        else:
            return None
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
    return total


def _device_count(value: Any, source: str, path: str) -> int:
    """A device quantity: a whole number, written as a number or as a string (``"8"``)."""
    if type(value) is int and value >= 0:
        return value
    if type(value) is str and value.isdigit() and value.isascii() and len(value) <= 9:
        return int(value)
    fail(source, path, "a whole number of devices", value)


# --- msgspec schema of the fields above (a big list decodes into only these) ----------------------


@lru_cache(maxsize=None)
def _list_decoder(msgspec: Any) -> Any:
    """msgspec's decoder of a list document holding only the fields read here (built once).

    TypedDicts: what decodes is plain dicts and lists, read by the same code as a full decode.
    HyperNode ``spec.members`` is small and decoded whole.
    """
    from typing import TypedDict  # Python 3.8+

    def typed(name: str, fields: Dict[str, Any]) -> Any:
        return TypedDict(name, fields, total=False)  # type: ignore[operator]

    meta = typed(
        "Meta", {"name": Any, "namespace": Any, "labels": Dict[str, str], "deletionTimestamp": Any}
    )
    resources = typed("Resources", {"limits": Dict[str, Any], "requests": Dict[str, Any]})
    container = typed("Container", {"resources": resources})
    spec = typed(
        "Spec",
        {
            "nodeName": Any,
            "containers": List[container],  # type: ignore[valid-type]
            "tier": Any,
            "tierName": Any,
            "members": Any,
        },
    )
    address = typed("Address", {"type": Any, "address": Any})
    status = typed(
        "Status",
        {"hostIP": Any, "phase": Any, "addresses": List[address]},  # type: ignore[valid-type]
    )
    item = typed("Item", {"kind": Any, "metadata": meta, "spec": spec, "status": status})
    document = typed(
        "Document",
        {
            "kind": Any,
            "apiVersion": Any,
            "metadata": Dict[str, Any],
            "items": List[item],  # type: ignore[valid-type]
            "servers": Any,
            "server_list": Any,
            "tor_count": Any,
        },
    )
    return msgspec.json.Decoder(document)


def list_continue(document: Any) -> Optional[str]:
    """``metadata.continue`` of a LIST page: the token of the next page, or None on the last."""
    metadata = document.get("metadata") if type(document) is dict else None
    token = metadata.get("continue") if type(metadata) is dict else None
    return token if type(token) is str and token else None


# --- a page of the API's PodList, read straight into PodFacts ------------------------------------


def read_pod_page(text: bytes) -> Optional[Tuple[Tuple[PodFacts, ...], Optional[str]]]:
    """``(the pods' facts, the continue token)`` of one page of the API's ``PodList`` (JSON text),
    decoded by msgspec into the fields :func:`read_pods` reads, typed, so that checking them costs
    next to nothing; None, having decided nothing, unless msgspec is loaded and the page is a
    ``PodList`` of well-formed pods without a ``kind`` (as the API answers): the caller then
    reads it the general way (:func:`decode_kube_document`, :func:`read_objects`,
    :func:`read_pods`), which reads the same facts or names what is wrong.
    """
    page = decode_typed(text, _pod_page_decoder)
    if page is None or page.kind != "PodList":
        return None
    absent = _unset()
    facts: List[PodFacts] = []
    append = facts.append
    for index, pod in enumerate(page.items):
        metadata, spec, status = pod.metadata, pod.spec, pod.status
        if pod.kind is not absent or not metadata.name:
            return None
        accelerators = _struct_accelerators(spec.containers) if spec is not None else 0
        if accelerators is None:
            return None
        append(
            PodFacts(
                metadata.name,
                metadata.namespace or "",
                {} if metadata.labels is None else metadata.labels,
                spec is not None and spec.nodeName or "",
                status is not None and status.hostIP or "",
                status is not None and status.phase or "",
                metadata.deletionTimestamp is not None,
                accelerators,
                f"items[{index}]",
            )
        )
    token = page.metadata.continue_ if page.metadata is not None else None
    return tuple(facts), token or None


def _struct_accelerators(containers: Any) -> Optional[int]:
    """:func:`_accelerators_fast` of the typed containers of :func:`read_pod_page`."""
    return _devices_of(
        (container.resources.limits, container.resources.requests)
        for container in containers or ()
        if container.resources is not None
    )


def _unset() -> Any:
    import msgspec  # loaded: read_pod_page decoded a page with it

    return msgspec.UNSET


@lru_cache(maxsize=None)
def _pod_page_decoder(msgspec: Any) -> Any:
    """msgspec's decoder of a ``PodList`` page into the fields :func:`_pod_fast` reads, each with
    the type it accepts (built once). What does not fit is refused, never coerced, and the page is
    then read the general way; unknown fields are skipped unbuilt."""
    struct = msgspec.defstruct
    text = Optional[str]
    amounts = Optional[Dict[str, Any]]
    resources = struct("Resources", [("limits", amounts, None), ("requests", amounts, None)])
    container = struct("Container", [("resources", Optional[resources], None)])
    containers = Optional[List[container]]  # type: ignore[valid-type]
    spec = struct("Spec", [("nodeName", text, None), ("containers", containers, None)])
    status = struct("Status", [("hostIP", text, None), ("phase", text, None)])
    metadata = struct(
        "Metadata",
        [
            ("name", str),
            ("namespace", text, None),
            ("labels", Optional[Dict[str, str]], None),
            ("deletionTimestamp", Any, None),
        ],
    )
    pod = struct(
        "Pod",
        [
            ("metadata", metadata),
            ("spec", Optional[spec], None),
            ("status", Optional[status], None),
            ("kind", Any, msgspec.UNSET),  # the API's items carry none
        ],
    )
    list_metadata = struct(
        "ListMeta", [("continue_", text, msgspec.field(default=None, name="continue"))]
    )
    page = struct(
        "Page",
        [
            ("items", List[pod]),  # type: ignore[valid-type]
            ("kind", Any, None),
            ("metadata", Optional[list_metadata], None),
        ],
    )
    return msgspec.json.Decoder(page)


def kind_counts(objects: KubeObjects) -> str:
    """``"3 Nodes, 4 Pods"``: what a document held, for log lines."""
    parts = [f"{len(objects.of(kind))} {kind}s" for kind in KINDS if objects.of(kind)]
    return ", ".join(parts) if parts else "no Nodes, Pods or HyperNodes"
