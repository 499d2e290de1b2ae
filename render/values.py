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

No input may make the tree (or the list of problems about it) huge: a ``--set`` list index is at
most :data:`MAX_LIST_INDEX` (helm's cap), and all ``--set`` indices of a merge together may leave
at most that many list items empty; a key path or a YAML document nests at most
:data:`MAX_DEPTH` levels; and a YAML document may expand (its aliases counted at each use) to at
most :data:`MAX_VALUES` values.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Container, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from npu_job.errors import SHOWN_LIMIT, InputError, shown
from npu_job.parsing import count_from_text

PathItem = Union[str, int]
Path = Tuple[PathItem, ...]

_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)\Z")

#: the largest ``--set`` list index (helm's strvals cap), and the most list items all ``--set``
#: indices of one merge may leave empty (null) on the way to theirs
MAX_LIST_INDEX = 65536
#: the deepest a ``--set`` key path or a spec document may nest (Kubernetes volume sources, the
#: deepest part of a spec, need fewer than 10)
MAX_DEPTH = 64
#: the most values (scalars, lists, mappings) one spec document may expand to, each use of a
#: YAML alias counted in full, as every later step walks it in full
MAX_VALUES = 1_000_000


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
    argument: str = ""  # the whole --set argument this came from, to name it in errors


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


def _sized_integer(text: str) -> int:
    """An integer with as many digits as ``text`` (and its sign), for a number too long for
    ``int()``: no spec key takes one, and a message describes it by its size."""
    digits = sum(c.isdigit() for c in text)
    return (-1 if text.lstrip().startswith("-") else 1) * 10 ** max(digits - 1, 0)


def load_yaml_values(text: str, source: str) -> Dict[str, Any]:
    """Parse one spec file's text; an empty file is ``{}``.

    Raises :class:`InputError` (naming the line) for YAML that does not parse, several documents,
    a duplicate or non-string key, or a top level that is not a mapping.
    """
    import yaml

    class _StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(
        loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False
    ) -> Any:
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):  # Kubernetes and the spec know string keys only
                raise InputError(
                    source,
                    f"line {key_node.start_mark.line + 1}",
                    f"expected a string key, got {shown(key)} (quote it)",
                )
            if key in seen:
                raise InputError(
                    source,
                    f"line {key_node.start_mark.line + 1}",
                    f"duplicate key {key!r} (first at line {seen[key] + 1}); each key may appear "
                    "once",
                )
            seen[key] = key_node.start_mark.line
        return loader.construct_mapping(node, deep=deep)

    def construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        try:
            return loader.construct_yaml_int(node)
        except ValueError:  # past int()'s 4300-digit limit: its size is all validation needs
            return _sized_integer(node.value)

    _StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    _StrictLoader.add_constructor("tag:yaml.org,2002:int", construct_int)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # PyYAML's parser recurses per level; it gets here far beyond MAX_DEPTH
        raise InputError(source, "", f"nested deeper than {MAX_DEPTH} levels") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(
            source, where, f"not valid YAML: {error.problem or error.context}"
        ) from None
    except yaml.YAMLError as error:
        raise InputError(source, "", f"not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(
            source, "top level", f"expected a mapping of spec keys, got a {type(data).__name__}"
        )
    _check_size(data, source)
    return data


def _check_size(document: Dict[str, Any], source: str) -> None:
    """Raise :class:`InputError` if ``document`` nests deeper than MAX_DEPTH or expands to more
    than MAX_VALUES values. Linear in the document as parsed: a node aliases share is measured once
    (its values and levels), then checked where each alias puts it."""
    measured: Dict[int, Tuple[int, int]] = {}

    def too_deep(path: Path) -> InputError:
        return InputError(source, format_path(path), f"nested deeper than {MAX_DEPTH} levels")

    def measure(node: Any, path: Path) -> Tuple[int, int]:
        """(values, levels of containers) of ``node`` at ``path``."""
        if not isinstance(node, (dict, list)):
            return 1, 0
        known = measured.get(id(node))
        if known is not None:
            if len(path) + known[1] > MAX_DEPTH:
                raise too_deep(path)
            return known
        if len(path) >= MAX_DEPTH:  # also ends an alias that contains itself
            raise too_deep(path)
        total, levels = 1, 0
        for key, child in node.items() if isinstance(node, dict) else enumerate(node):
            values, below = measure(child, path + (key,))
            total, levels = total + values, max(levels, below)
        if total > MAX_VALUES:
            raise InputError(
                source,
                "",
                f"expands to more than {MAX_VALUES} values (YAML aliases repeating a large value?)",
            )
        measured[id(node)] = (total, levels + 1)
        return total, levels + 1

    measure(document, ())


# ---------------------------------------------------------------------------------------------
# --set


class SetSyntaxError(ValueError):
    """A ``--set`` argument that does not parse; the message says where and what was expected."""


_KEY_STOPS = {".", "[", "=", ","}


def parse_set(
    text: str, *, as_string: bool = False, source: str = "--set"
) -> Tuple[Assignment, ...]:
    """Parse one ``--set`` argument (``a.b=1,c={x,y},d[0]=z``) into assignments.

    With ``as_string`` (``--set-string``) every scalar stays a string and ``null`` is not special.
    """
    parser = _SetParser(text, as_string=as_string)
    assignments: List[Assignment] = []
    while True:
        path = parser.path()
        parser.expect("=")
        value = parser.value()
        assignments.append(Assignment(path, value, source, text))
        if parser.at_end():
            return tuple(assignments)
        parser.expect(",")


class _SetParser:
    def __init__(self, text: str, *, as_string: bool) -> None:
        self.text = text
        self.pos = 0
        self.as_string = as_string

    def fail(self, expected: str, at: Optional[int] = None) -> SetSyntaxError:
        where = self.pos if at is None else at
        return SetSyntaxError(f"{shown(self.text)}: at character {where + 1}: expected {expected}")

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return "" if self.at_end() else self.text[self.pos]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"'{char}'")
        self.pos += 1

    def _chars(self, stops: Container[str]) -> Tuple[str, bool]:
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
            if len(items) == MAX_DEPTH:
                raise self.fail(f"at most {MAX_DEPTH} nested keys")
            if self.peek() == ".":
                self.pos += 1
                key, _ = self._chars(_KEY_STOPS)
                if not key:
                    raise self.fail("a key name after '.'")
                items.append(key)
            else:
                self.pos += 1
                start = self.pos
                digits, _ = self._chars(["]"])
                if not digits.isascii() or not digits.isdigit():
                    raise self.fail("a list index such as [0]", at=start)
                index = count_from_text(digits)
                if index is None or index > MAX_LIST_INDEX:
                    raise self.fail(f"a list index from 0 to {MAX_LIST_INDEX}", at=start)
                self.expect("]")
                items.append(index)
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
            try:
                return SetScalar(raw, int(raw))
            except ValueError:  # past int()'s 4300-digit limit
                return SetScalar(raw, _sized_integer(raw))
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


class _PathMap:
    """Key path -> input, with an index of what lies below each path, so that forgetting a
    subtree costs its size, not the size of everything known (a spec with 10^5 keys stays
    linear)."""

    def __init__(self) -> None:
        self.items: Dict[Path, str] = {}
        self._below: Dict[Path, set] = {}

    def set(self, path: Path, source: str) -> None:
        self.items[path] = source
        for end in range(len(path)):
            self._below.setdefault(path[:end], set()).add(path[end])

    def drop(self, path: Path) -> None:
        """Forget ``path`` and everything below it."""
        if path:
            self._below.get(path[:-1], set()).discard(path[-1])
        stack = [path]
        while stack:
            known = stack.pop()
            self.items.pop(known, None)
            stack.extend(known + (item,) for item in self._below.pop(known, ()))


class _Record:
    """Who set each key path last: ``origins`` for values, ``nulls`` for ``null``."""

    def __init__(self) -> None:
        self._origins = _PathMap()
        self._nulls = _PathMap()
        self.origins = self._origins.items
        self.nulls = self._nulls.items
        self.empty_items = 0  # list items --set indices padded with null so far

    def _forget(self, path: Path) -> None:
        """Drop what was known at and below ``path``, and a null of an ancestor (it exists now)."""
        self._origins.drop(path)
        self._nulls.drop(path)
        for end in range(1, len(path)):
            self.nulls.pop(path[:end], None)

    def value(self, path: Path, source: str) -> None:
        self._forget(path)
        self._origins.set(path, source)

    def merged_into(self, path: Path, source: str) -> None:
        """A mapping at ``path`` got keys from ``source``: it is that input's unless it was set
        before."""
        if path not in self.origins:
            self._origins.set(path, source)

    def null(self, path: Path, source: str) -> None:
        self._forget(path)
        self._nulls.set(path, source)

    def padded(self, path: Path, start: int, end: int, assignment: Assignment) -> None:
        """The list at ``path`` gets nulls at ``start..end-1`` for the index ``end``."""
        self.empty_items += end - start
        if self.empty_items > MAX_LIST_INDEX:
            key = format_path(path)
            raise InputError(
                f"{assignment.source} {shown(assignment.argument)}",
                format_path(path + (end,)),
                f"expected at most {MAX_LIST_INDEX} list items left empty (null) in all by "
                f"{assignment.source} list indices; give the list whole instead ({key}={{x,y}})",
            )
        for index in range(start, end):
            self._origins.set(path + (index,), assignment.source)


def _merge_mapping(
    target: Dict[str, Any], overlay: Mapping[str, Any], prefix: Path, source: str, record: _Record
) -> None:
    for key, value in overlay.items():
        path = prefix + (key,)
        if value is None:  # helm: null removes the key (back to the default)
            target.pop(key, None)
            record.null(path, source)
        elif isinstance(value, dict):
            # merged key by key even when nothing was there before, so that a null inside means
            # the same whether or not an earlier input had this mapping
            if isinstance(target.get(key), dict):
                record.merged_into(path, source)
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
    for depth in range(len(path) - 1):
        following = path[depth + 1]
        fresh: Any = [] if isinstance(following, int) else {}
        node = _child(node, path[: depth + 1], fresh, assignment, record)
    last = path[-1]
    if assignment.value is None and isinstance(node, dict):
        node.pop(last, None)
        record.null(path, assignment.source)
        return
    _store(node, path, copy.deepcopy(assignment.value), assignment, record)
    record.value(path, assignment.source)


def _child(node: Any, path: Path, fresh: Any, assignment: Assignment, record: _Record) -> Any:
    current = _fetch(node, path[-1])
    if not isinstance(current, type(fresh)):
        _store(node, path, fresh, assignment, record)
        return fresh
    return current


def _fetch(node: Any, item: PathItem) -> Any:
    if isinstance(item, int):
        return node[item] if item < len(node) else None
    return node.get(item)


def _store(node: Any, path: Path, value: Any, assignment: Assignment, record: _Record) -> None:
    """Store ``value`` at the last item of ``path`` in ``node`` (the container at ``path[:-1]``)."""
    item = path[-1]
    if isinstance(item, int) and item > len(node):  # helm pads a list set by index with nulls
        record.padded(path[:-1], len(node), item, assignment)
        node.extend([None] * (item - len(node)))
    if isinstance(item, int) and item == len(node):
        node.append(value)
    else:
        node[item] = value


def typed(value: Any) -> Any:
    """``value`` with every :class:`SetScalar` replaced by helm's typed reading (pass-through
    values)."""
    if isinstance(value, SetScalar):
        return value.typed
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    return value


def format_path(path: Path) -> str:
    """``("labels", "app.kubernetes.io/name")`` -> ``labels.app\\.kubernetes\\.io/name`` (--set
    syntax).

    A key that could not be written back in that syntax on one short line (control characters,
    or longer than an error may echo) is shown quoted and shortened (``errors.shown``) instead:
    the path names a key in a one-line error.
    """
    out = ""
    for item in path:
        if isinstance(item, int):
            out += f"[{item}]"
            continue
        if len(item) > SHOWN_LIMIT or not item.isprintable():
            escaped = shown(item)
        else:
            escaped = re.sub(r"([.\[\]=,\\{}])", r"\\\1", item)
        out += f".{escaped}" if out else escaped
    return out or "(top level)"
