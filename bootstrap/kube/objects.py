"""Kubernetes objects as kubectl prints them and the API lists them (pure): the documents.

Reads which Nodes, Pods and HyperNodes a document holds, from

* a typed list as the API answers a LIST (``NodeList``, ``PodList``, ``HyperNodeList``; its items
  carry no ``kind``);
* kubectl's output, ``kubectl get nodes -o json`` (or ``-o yaml``): a ``v1`` ``List`` whose items
  do carry ``kind``, including the combined ``kubectl get hypernodes,nodes,pods -o json``;
* a single object (``kubectl get node n1 -o json``).

Items of other kinds are skipped. The objects' fields are read elsewhere: a Node's and a Pod's by
:mod:`.facts`, a HyperNode's by :mod:`.hypernode`, with the
field readers they share, here (:func:`object_name`, :func:`section`, :func:`string_map`...).

A bad field is one :class:`~npu_job.errors.InputError` naming the object and the field, e.g.
``nodes.json: items[3] (Node 'n3'): metadata.labels.volcano.sh/tor: expected a string, got a
number 5`` (:func:`field_path`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
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

from npu_job.errors import shown

from ..base.fields import expect_list, expect_object, expect_str, fail, join_key
from ..base.payload import decode_document

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
    return read_objects(decode_document(data, source, allow_yaml=True), source)


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


def list_continue(document: Any) -> Optional[str]:
    """``metadata.continue`` of a LIST page: the token of the next page, or None on the last."""
    metadata = document.get("metadata") if type(document) is dict else None
    token = metadata.get("continue") if type(metadata) is dict else None
    return token if type(token) is str and token else None


def kind_counts(objects: KubeObjects) -> str:
    """``"3 Nodes, 4 Pods"``: what a document held, for log lines."""
    parts = [f"{len(objects.of(kind))} {kind}s" for kind in KINDS if objects.of(kind)]
    return ", ".join(parts) if parts else "no Nodes, Pods or HyperNodes"
