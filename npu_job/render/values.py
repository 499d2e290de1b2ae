"""Helm-style spec values: YAML files merged in order, then ``--set`` assignments on top.

This module owns the *syntax* of job-spec input, not its meaning (that is ``spec.py``):

* :func:`load_yaml_values` parses one spec document (text) into a plain tree, rejecting duplicate
  keys, which PyYAML would otherwise resolve silently to the last one.
* :func:`parse_set` parses one ``--set`` / ``--set-string`` argument the way helm's ``strvals``
  does: ``a.b=c``, several assignments separated by ``,``, lists as ``a={x,y}`` or ``a[0]=x``,
  ``\\`` escaping ``.``, ``,``, ``=``, ``[``, ``{`` and ``}``; ``null`` deletes a key.
* :func:`merge_values` folds files and assignments into one tree, right-most wins; maps merge
  deeply, lists and scalars are replaced. It also records which input set each key path so that
  validation errors can say where a bad value came from.

``null`` means one thing in every input (spec, ``-f`` file, ``--set``) and at every depth of a
mapping: the key leaves the tree, so it goes back to its default. The merge also records which
key paths were last set to null (``MergedValues.nulls``), so that a key whose null has a meaning
of its own (``shm_size: null``: no /dev/shm volume) can tell "null" from "not given"; which keys
those are is the spec's business (``spec.py``), not the syntax's.

A ``--set`` scalar keeps both its raw text and helm's typed reading (:class:`SetScalar`): the
validator picks the raw text where the spec expects a string, so ``--set env.DEBUG=true`` gives
the string ``"true"`` and ``--set nodes=6`` the integer 6, without a separate ``--set-string``.
Everything here is pure: text in, values out.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from npu_job.errors import InputError

PathItem = Union[str, int]
Path = Tuple[PathItem, ...]

_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)\Z")


@dataclass(frozen=True)
class SetScalar:
    """A scalar from ``--set``: the text as typed and helm's typed reading of it."""

    raw: str
    typed: Any


@dataclass(frozen=True)
class Assignment:
    """One ``path=value`` of a ``--set`` argument; ``value`` None means "delete this key"."""

    path: Path
    value: Any
    source: str = "--set"


@dataclass(frozen=True)
class SpecInput:
    """One layer of input: a parsed YAML file (``values``) or a list of ``--set`` assignments."""

    source: str
    values: Optional[Mapping[str, Any]] = None
    assignments: Tuple[Assignment, ...] = ()


@dataclass(frozen=True)
class MergedValues:
    """The merged tree plus, for each key path that was set, the input that set it last.

    ``nulls`` maps each key path whose last word was ``null`` (and is therefore absent from
    ``tree``) to the input that said it.
    """

    tree: Dict[str, Any]
    origins: Mapping[Path, str]
    sources: Tuple[str, ...]
    nulls: Mapping[Path, str] = field(default_factory=dict)

    def origin_of(self, path: Path) -> Optional[str]:
        """The input that set ``path`` or its nearest set ancestor (None: a default)."""
        for end in range(len(path), 0, -1):
            origin = self.origins.get(path[:end])
            if origin is not None:
                return origin
        return None


# ---------------------------------------------------------------------------------------------
# YAML files


def load_yaml_values(text: str, source: str) -> Dict[str, Any]:
    """Parse one spec file's text; an empty file is ``{}``.

    Raises :class:`InputError` (naming the line) for YAML that does not parse, several documents,
    a duplicate key, or a top level that is not a mapping.
    """
    import yaml

    class _StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in seen:
                raise InputError(
                    source,
                    f"line {key_node.start_mark.line + 1}",
                    f"duplicate key {key!r} (first at line {seen[key] + 1}); each key may appear once",
                )
            seen[key] = key_node.start_mark.line
        return loader.construct_mapping(node, deep=deep)

    _StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(source, where, f"not valid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise InputError(source, "", f"not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(source, "top level", f"expected a mapping of spec keys, got a {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise InputError(source, repr(key), "spec keys must be strings")
    return data


# ---------------------------------------------------------------------------------------------
# --set


class SetSyntaxError(ValueError):
    """A ``--set`` argument that does not parse; the message says where and what was expected."""


_KEY_STOPS = {".", "[", "=", ","}


def parse_set(text: str, *, as_string: bool = False, source: str = "--set") -> Tuple[Assignment, ...]:
    """Parse one ``--set`` argument (``a.b=1,c={x,y},d[0]=z``) into assignments.

    With ``as_string`` (``--set-string``) every scalar stays a string and ``null`` is not special.
    """
    parser = _SetParser(text, as_string=as_string)
    assignments: List[Assignment] = []
    while True:
        path = parser.path()
        parser.expect("=")
        value = parser.value()
        assignments.append(Assignment(path, value, source))
        if parser.at_end():
            return tuple(assignments)
        parser.expect(",")


class _SetParser:
    def __init__(self, text: str, *, as_string: bool) -> None:
        self.text = text
        self.pos = 0
        self.as_string = as_string

    def fail(self, expected: str) -> SetSyntaxError:
        return SetSyntaxError(f"{self.text!r}: at character {self.pos + 1}: expected {expected}")

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return "" if self.at_end() else self.text[self.pos]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"'{char}'")
        self.pos += 1

    def _chars(self, stops: Sequence[str]) -> Tuple[str, bool]:
        """Read up to an unescaped stop character; return the text and whether it had escapes."""
        out: List[str] = []
        escaped = False
        while not self.at_end() and self.peek() not in stops:
            char = self.text[self.pos]
            if char == "\\" and self.pos + 1 < len(self.text):
                self.pos += 1
                char = self.text[self.pos]
                escaped = True
            out.append(char)
            self.pos += 1
        return "".join(out), escaped

    def path(self) -> Path:
        items: List[PathItem] = []
        key, _ = self._chars(_KEY_STOPS)
        if not key:
            raise self.fail("a key name (KEY=VALUE)")
        items.append(key)
        while self.peek() in (".", "["):
            if self.peek() == ".":
                self.pos += 1
                key, _ = self._chars(_KEY_STOPS)
                if not key:
                    raise self.fail("a key name after '.'")
                items.append(key)
            else:
                self.pos += 1
                digits, _ = self._chars(["]"])
                if not digits.isdigit():
                    raise self.fail("a list index such as [0]")
                self.expect("]")
                items.append(int(digits))
        return tuple(items)

    def value(self) -> Any:
        if self.peek() == "{":
            self.pos += 1
            items: List[Any] = []
            if self.peek() == "}":
                self.pos += 1
                return items
            while True:
                raw, escaped = self._chars([",", "}"])
                items.append(self.scalar(raw, escaped))
                if self.peek() == "}":
                    self.pos += 1
                    return items
                self.expect(",")
        raw, escaped = self._chars([","])
        return self.scalar(raw, escaped)

    def scalar(self, raw: str, escaped: bool) -> Any:
        if self.as_string or escaped:
            return SetScalar(raw, raw)
        if raw == "null":
            return None
        if raw in ("true", "false"):
            return SetScalar(raw, raw == "true")
        if _INTEGER.match(raw):
            return SetScalar(raw, int(raw))
        return SetScalar(raw, raw)


# ---------------------------------------------------------------------------------------------
# merging


def merge_values(inputs: Sequence[SpecInput]) -> MergedValues:
    """Fold ``inputs`` left to right (right-most wins) into one tree, recording origins."""
    tree: Dict[str, Any] = {}
    record = _Record()
    for layer in inputs:
        if layer.values is not None:
            _merge_mapping(tree, layer.values, (), layer.source, record)
        for assignment in layer.assignments:
            _assign(tree, assignment, record)
    sources = tuple(dict.fromkeys(layer.source for layer in inputs))
    return MergedValues(tree, record.origins, sources, record.nulls)


class _Record:
    """Who set each key path last: ``origins`` for values, ``nulls`` for ``null``."""

    def __init__(self) -> None:
        self.origins: Dict[Path, str] = {}
        self.nulls: Dict[Path, str] = {}

    def _forget(self, path: Path) -> None:
        """Drop what was known at and below ``path``, and any null of an ancestor (it exists now)."""
        for known in (self.origins, self.nulls):
            for below in [p for p in known if p[: len(path)] == path]:
                del known[below]
        for end in range(1, len(path)):
            self.nulls.pop(path[:end], None)

    def value(self, path: Path, source: str) -> None:
        self._forget(path)
        self.origins[path] = source

    def null(self, path: Path, source: str) -> None:
        self._forget(path)
        self.nulls[path] = source


def _merge_mapping(target: Dict[str, Any], overlay: Mapping[str, Any], prefix: Path, source: str, record: _Record) -> None:
    for key, value in overlay.items():
        path = prefix + (key,)
        if value is None:  # helm: null removes the key (back to the default)
            target.pop(key, None)
            record.null(path, source)
        elif isinstance(value, dict):
            # merged key by key even when nothing was there before, so that a null inside means
            # the same whether or not an earlier input had this mapping
            if isinstance(target.get(key), dict):
                record.origins.setdefault(path, source)
            else:
                target[key] = {}
                record.value(path, source)
            _merge_mapping(target[key], value, path, source, record)
        else:
            target[key] = copy.deepcopy(value)
            record.value(path, source)


def _assign(tree: Dict[str, Any], assignment: Assignment, record: _Record) -> None:
    node: Any = tree
    path = assignment.path
    for depth, item in enumerate(path[:-1]):
        following = path[depth + 1]
        fresh: Any = [] if isinstance(following, int) else {}
        node = _child(node, item, fresh)
    last = path[-1]
    if assignment.value is None and isinstance(node, dict):
        node.pop(last, None)
        record.null(path, assignment.source)
        return
    _store(node, last, copy.deepcopy(assignment.value))
    record.value(path, assignment.source)


def _child(node: Any, item: PathItem, fresh: Any) -> Any:
    current = _fetch(node, item)
    if not isinstance(current, type(fresh)):
        _store(node, item, fresh)
        return fresh
    return current


def _fetch(node: Any, item: PathItem) -> Any:
    if isinstance(item, int):
        return node[item] if item < len(node) else None
    return node.get(item)


def _store(node: Any, item: PathItem, value: Any) -> None:
    if isinstance(item, int):
        while len(node) <= item:  # helm pads a list set by index with nulls
            node.append(None)
    node[item] = value


def typed(value: Any) -> Any:
    """``value`` with every :class:`SetScalar` replaced by helm's typed reading (pass-through values)."""
    if isinstance(value, SetScalar):
        return value.typed
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return value


def format_path(path: Path) -> str:
    """``("labels", "app.kubernetes.io/name")`` -> ``labels.app\\.kubernetes\\.io/name`` (--set syntax)."""
    out = ""
    for item in path:
        if isinstance(item, int):
            out += f"[{item}]"
        else:
            escaped = re.sub(r"([.\[\]=,\\{}])", r"\\\1", item)
            out += f".{escaped}" if out else escaped
    return out or "(top level)"
