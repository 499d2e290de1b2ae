"""Volcano HyperNodes (``topology.volcano.sh/v1alpha1``): what one says, read and checked (pure).

A HyperNode is a network performance domain, usually a switch: ``spec.tier`` (0 and up; the
lowest tier holds the nodes, e.g. a ToR at tier 1) and ``spec.members``, each a ``Node`` or a
``HyperNode`` chosen by one selector (CRD ``hypernodes.topology.volcano.sh``; semantics as
Volcano's scheduler resolves them, ``pkg/util/hypernode/member_selector.go`` and
``pkg/scheduler/api/hyper_node_info.go`` of volcano-sh/volcano):

* ``exactMatch.name``: the node (or HyperNode) of that name;
* ``regexMatch.pattern``: every node whose name the pattern matches anywhere (Go's
  ``regexp.Compile`` then ``MatchString``, unanchored, in ``GetMembers`` of
  ``pkg/util/hypernode/member_selector.go``), matched in linear time by
  :mod:`~npu_job.bootstrap.goregexp` in Go's own syntax; a pattern Go refuses matches nothing,
  as in Volcano (which logs it), and is reported, as is one past that module's bounds; all the
  matching of one resolve is bounded by :data:`.hypernodetree.MAX_MATCH_STEPS`;
* ``labelMatch``: a ``metav1.LabelSelector`` over the nodes' labels (``matchLabels`` and
  ``matchExpressions`` with ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``); an empty or invalid
  selector matches nothing, as in Volcano. Label members need the nodes' labels
  (``kubectl get nodes -o json``).

HyperNode members are taken by ``exactMatch`` only (Volcano ignores the other selectors there).

How the members make a tree and where that places each node is
:mod:`~npu_job.bootstrap.kube.hypernodetree`'s.
"""

from __future__ import annotations

from typing import (
    Any,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

from npu_job.errors import shown

from ..base.fields import expect_list, expect_object, expect_str, fail
from .objects import (
    KubeObject,
    field_path,
    named_once,
    optional_str,
    section,
    string_map,
)

MEMBER_TYPES = ("Node", "HyperNode")
SELECTORS = ("exactMatch", "regexMatch", "labelMatch")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class Requirement(NamedTuple):
    """One ``matchExpressions`` entry (or a ``matchLabels`` pair, as ``In`` one value)."""

    key: str
    operator: str
    values: Tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist

    def problem(self) -> Optional[str]:
        """Why ``LabelSelectorAsSelector`` refuses this requirement (Volcano then matches no
        node), or None."""
        if self.operator not in OPERATORS:
            return f"operator {shown(self.operator)} is not one of {', '.join(OPERATORS)}"
        if self.operator in ("In", "NotIn") and not self.values:
            return f"operator {self.operator} needs at least one value"
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            return f"operator {self.operator} takes no values"
        return None


class Member(NamedTuple):
    """One ``spec.members`` entry: its type and its one selector. (A NamedTuple: a tree of a few
    thousand nodes has as many members.)"""

    type: str  # "Node" or "HyperNode"
    position: int  # its place in spec.members
    exact: Optional[str] = None
    pattern: Optional[str] = None
    labels: Optional[Tuple[Requirement, ...]] = None  # matchLabels then matchExpressions

    @property
    def path(self) -> str:
        """``spec.members[2]``, for messages."""
        return f"spec.members[{self.position}]"


class HyperNode(NamedTuple):
    name: str
    tier: int
    tier_name: str = ""
    members: Tuple[Member, ...] = ()
    where: str = ""  # items[i] in the document, for messages

    def field(self, path: str) -> str:
        return field_path(KubeObject("HyperNode", self.where, {}), self.name, path)


# --- reading --------------------------------------------------------------------------------------


def read_hypernodes(objects: Sequence[KubeObject], source: str) -> Tuple[HyperNode, ...]:
    """Every HyperNode of ``objects``, checked against the CRD's schema (a name twice is an
    error)."""
    found: List[HyperNode] = []
    for obj, name in named_once(objects, source, "HyperNode"):
        spec = section(obj, name, "spec", source)
        tier = spec.get("tier")
        if tier is None:
            fail(source, field_path(obj, name, "spec.tier"), "a required field (missing)")
        if type(tier) is not int or tier < 0:
            fail(source, field_path(obj, name, "spec.tier"), "an integer >= 0", tier)
        tier_name = optional_str(spec, "tierName", source, field_path(obj, name, "spec"))
        members = spec.get("members")
        listed = expect_list(
            [] if members is None else members, source, field_path(obj, name, "spec.members")
        )
        found.append(
            HyperNode(
                name,
                tier,
                tier_name,
                tuple(
                    _exact_member(entry, i) or _member(entry, i, obj, name, source)
                    for i, entry in enumerate(listed)
                ),
                obj.where,
            )
        )
    return tuple(found)


def selects_by_label(objects: Sequence[KubeObject]) -> bool:
    """Whether any of these (unchecked) HyperNodes may select nodes by label: then the nodes'
    labels are needed. True for anything malformed too (the reader will say what)."""
    try:
        for obj in objects:
            for member in (obj.item.get("spec") or {}).get("members") or ():
                selector = member.get("selector")
                if type(selector) is not dict or selector.get("labelMatch") is not None:
                    return True
        return False
    except (AttributeError, TypeError):
        return True


def _exact_member(entry: Any, index: int) -> Optional[Member]:
    """The usual member (by ``exactMatch``, as discovery writes them) without building a message
    per field; None: :func:`_member` checks it (and reads it the same)."""
    if type(entry) is not dict:
        return None
    kind = entry.get("type")
    selector = entry.get("selector")
    if kind not in MEMBER_TYPES or type(selector) is not dict:
        return None
    exact = selector.get("exactMatch")
    if (
        type(exact) is not dict
        or selector.get("regexMatch") is not None
        or (selector.get("labelMatch") is not None)
    ):
        return None
    name = exact.get("name")
    return Member(kind, index, exact=name) if type(name) is str and name else None


def _member(entry: Any, index: int, obj: KubeObject, name: str, source: str) -> Member:
    path = f"spec.members[{index}]"

    def at(field: str) -> str:
        return field_path(obj, name, f"{path}.{field}" if field else path)

    expect_object(entry, source, at(""))
    kind = entry.get("type")
    if kind is None:
        fail(source, at("type"), "a required field (missing)")
    if kind not in MEMBER_TYPES:
        fail(source, at("type"), "'Node' or 'HyperNode'", kind)
    selector = expect_object(entry.get("selector") or {}, source, at("selector"))
    given = [key for key in SELECTORS if selector.get(key) is not None]
    if len(given) != 1:
        fail(
            source,
            at("selector"),
            "exactly one of exactMatch, regexMatch or labelMatch"
            + (f", got {' and '.join(given)}" if given else ", got none"),
        )
    chosen = given[0]
    body = expect_object(selector[chosen], source, at(f"selector.{chosen}"))
    if chosen == "exactMatch":
        return Member(
            kind, index, exact=_required_str(body, "name", source, at("selector.exactMatch"))
        )
    if chosen == "regexMatch":
        return Member(
            kind, index, pattern=_required_str(body, "pattern", source, at("selector.regexMatch"))
        )
    return Member(kind, index, labels=_label_selector(body, source, at("selector.labelMatch")))


def _required_str(mapping: Mapping[str, Any], key: str, source: str, path: str) -> str:
    value = mapping.get(key)
    if value is None:
        fail(source, f"{path}.{key}", "a required field (missing)")
    return expect_str(value, source, f"{path}.{key}")


def _label_selector(body: Mapping[str, Any], source: str, path: str) -> Tuple[Requirement, ...]:
    labels = string_map(body.get("matchLabels"), source, f"{path}.matchLabels")
    requirements = [Requirement(key, "In", (value,)) for key, value in sorted(labels.items())]
    expressions = body.get("matchExpressions")
    here = f"{path}.matchExpressions"
    for index, expression in enumerate(
        expect_list([] if expressions is None else expressions, source, here)
    ):
        at = f"{here}[{index}]"
        expect_object(expression, source, at)
        values = expression.get("values")
        listed = expect_list([] if values is None else values, source, f"{at}.values")
        requirements.append(
            Requirement(
                _required_str(expression, "key", source, at),
                _required_str(expression, "operator", source, at),
                tuple(
                    expect_str(v, source, f"{at}.values[{i}]", empty_ok=True)
                    for i, v in enumerate(listed)
                ),
            )
        )
    return tuple(requirements)
