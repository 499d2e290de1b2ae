"""The small field checkers the readers share, so that every message reads the same way.

``<source>: <field path>: expected <what>, got <what was there>``: :func:`fail` raises it,
``expect_*`` check a decoded value's type, ``require*`` a mapping's member, :func:`join_key`
writes a field path with a key taken from the input.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, NoReturn

from npu_job.errors import InputError, shown
from npu_job.parsing import COUNT_LIMIT, MAX_COUNT_DIGITS, count_from_text

_JSON_TYPE_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def describe(value: Any) -> str:
    """How a JSON value looks to a user: ``a string 'x'``, ``an object``, ``null``; a string or
    number is echoed through :func:`~npu_job.errors.shown` (quoted, one line, bounded)."""
    kind = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return f"{kind} {shown(value)}"
    return kind


def fail(source: str, path: str, expected: str, value: Any = ...) -> NoReturn:
    """Raise the reader error; with ``value``, append what was found instead."""
    if value is not ...:
        expected = f"{expected}, got {describe(value)}"
    raise InputError(source, path, f"expected {expected}")


def require(mapping: Dict[str, Any], key: str, source: str, path: str) -> Any:
    """``mapping[key]``, or an error naming ``path.key`` as a missing required field."""
    try:
        return mapping[key]
    except KeyError:
        fail(source, join(path, key), "a required field (missing)")


def expect_object(value: Any, source: str, path: str) -> Dict[str, Any]:
    if type(value) is not dict:
        fail(source, path or "document", "an object", value)
    return value


def expect_list(value: Any, source: str, path: str) -> List[Any]:
    if type(value) is not list:
        fail(source, path, "an array", value)
    return value


def expect_str(value: Any, source: str, path: str, *, empty_ok: bool = False) -> str:
    if type(value) is not str:
        fail(source, path, "a string", value)
    if not empty_ok and not value:
        fail(source, path, "a non-empty string")
    return value


def expect_count(value: Any, source: str, path: str) -> int:
    """A non-negative integer written as a string (these formats quote numbers) or a number,
    below :data:`COUNT_LIMIT` (:func:`count_from_text`)."""
    if type(value) is int and 0 <= value < COUNT_LIMIT:
        return value
    if type(value) is str:
        count = count_from_text(value)
        if count is not None:
            return count
    if (type(value) is int and value > 0) or (
        type(value) is str and value.isdigit() and value.isascii()
    ):
        fail(source, path, f"a non-negative integer below 10^{MAX_COUNT_DIGITS}", value)
    fail(source, path, 'a non-negative integer (as a string, e.g. "0")', value)


def require_str(mapping: Dict[str, Any], key: str, source: str, path: str) -> str:
    """``mapping[key]``, which must be there and be a non-empty string."""
    return expect_str(require(mapping, key, source, path), source, join(path, key))


def require_list(mapping: Dict[str, Any], key: str, source: str, path: str) -> List[Any]:
    """``mapping[key]``, which must be there and be an array."""
    return expect_list(require(mapping, key, source, path), source, join(path, key))


def require_unique_id(
    mapping: Dict[str, Any], key: str, source: str, path: str, seen: Dict[str, str]
) -> str:
    """``mapping[key]``: a non-empty string not yet in ``seen`` (id -> where it was first)."""
    where = join(path, key)
    value = require_str(mapping, key, source, path)
    if value in seen:
        fail(
            source, where, f"a unique {key.replace('_', ' ')}; {shown(value)} is also {seen[value]}"
        )
    seen[value] = path
    return value


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_PLAIN_KEY = re.compile(r"[\w.:/@+-]{1,80}", re.ASCII)


def join_key(path: str, key: Any) -> str:
    """``path.key`` for a key taken from the input (a server id, an unknown field): as written
    when it is a plain name or address, else through :func:`~npu_job.errors.shown`, so that a
    field path stays one bounded line."""
    plain = type(key) is str and _PLAIN_KEY.fullmatch(key) is not None
    return join(path, key if plain else shown(key))
