"""Decoding input bytes into a document, by content: the one entry point every reader uses.

The platform hands us the same data in several encodings and file names do not say which:

* plain JSON (``jobstart_hccl.json`` by default);
* base64(gzip(JSON)), StdEncoding, possibly wrapped over lines (``ranktable_tor.json`` always,
  ``jobstart_hccl.json`` with ``--rank-table-compress=true``);
* raw gzip(JSON) (what a user gets from ``base64 -d`` by hand);
* YAML, only where the caller allows it (the hand-written topology file), flow style included:
  text that starts like JSON (``{servers: {a: tor-1}}``) and is not is read again as YAML.

Everything is capped at :data:`MAX_INPUT_BYTES` (64 MiB, before and after decompression): a 16k-node
rank table is about 10 MiB of JSON, so anything bigger is a wrong file or a gzip bomb, and we would
rather say so than exhaust a pod's memory. Decoding costs memory per value, not per byte (``{},``
is 3 bytes of text and 72 decoded), so a JSON document is also capped at :data:`MAX_DECODED_BYTES`
once decoded, estimated before anything is built (:func:`decoded_size`); YAML, which costs ~20x
more per value in memory and time, at :data:`MAX_YAML_VALUES` values, :data:`MAX_YAML_DEPTH`
levels and no aliases of lists or mappings (which the readers would walk again for each use).
Within these caps the bootstrap stays under 1 GiB and 10 s with a rank table and a topology of any
content.

:func:`decode_document` is the entry point. A reader that keeps little of a big document may
instead unwrap it with :func:`json_text` and decode only what it keeps, with :func:`decode_typed`
or item by item with :func:`scan_array_member`, falling back to :func:`parse_json` (and its exact
error) whenever that declines.

**msgspec, when installed, does the heavy lifting** on big inputs (a 4096-node job's two files are
6 MB of JSON and the pod-side budget is a fraction of a second): it decodes about twice as fast as
``json``, decodes straight into typed structs without building what a reader skips (5x faster
still), and encodes 10x faster. Importing it costs ~10 ms, more than it saves on a small job, so
it is loaded only for an input of :data:`MSGSPEC_FROM_BYTES` or more. It is only ever a shortcut:

* whatever it accepts, ``json.loads`` accepts with the same meaning (UTF-8 is checked first,
  because msgspec does not check the strings it skips);
* whatever it refuses goes to the standard library, which accepts it or raises the error the user
  sees;
* both refuse ``NaN``, ``Infinity`` and numbers beyond a double: they are not JSON (RFC 8259), and
  msgspec would write them back as ``null``; and both refuse integers of more than 4300 digits
  (:data:`MAX_INT_DIGITS`, what ``int()`` reads), which no Python could print again.

So results and messages are the same with or without msgspec; the tests compare the two engines
on generated documents.

This module also holds the small field checkers (``expect_*``) the readers share, so that every
message reads ``<source>: <field path>: expected ...`` the same way.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from functools import lru_cache
from json.decoder import scanstring
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple, TypeVar

from npu_job.errors import InputError, shown
from npu_job.parsing import COUNT_LIMIT, MAX_COUNT_DIGITS, count_from_text

MAX_INPUT_BYTES = 64 * 1024 * 1024

_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_BASE64 = b"H4sI"  # base64 of 1f 8b 08, how every gzip stream starts (deflate)
_BASE64_TEXT = re.compile(rb"[A-Za-z0-9+/=\s]+")
_UTF8_BOM = b"\xef\xbb\xbf"

# Below this size the standard library is faster than importing msgspec first (~1000 nodes).
MSGSPEC_FROM_BYTES = 512 * 1024
_msgspec: Any = False  # False: not tried yet; None: not installed; else the msgspec module


def msgspec_for(size: int) -> Any:
    """The msgspec module (with ``msgspec.json``) if installed and worth loading for ``size``
    bytes of JSON; else None."""
    if size < MSGSPEC_FROM_BYTES:
        return None
    global _msgspec
    if _msgspec is False:
        try:
            import msgspec.json
        except ImportError:  # the standard library does everything, only slower
            _msgspec = None
        else:
            _msgspec = msgspec
    return _msgspec


def check_size(size: int, source: str) -> None:
    """Reject inputs over :data:`MAX_INPUT_BYTES` with a message that states the cap."""
    if size > MAX_INPUT_BYTES:
        raise InputError(source, "size", f"expected at most {_cap_text()}, got {size} bytes")


def _cap_text() -> str:
    mib, rest = divmod(MAX_INPUT_BYTES, 1 << 20)
    if mib and not rest:
        return f"{mib} MiB ({MAX_INPUT_BYTES} bytes)"
    return f"{MAX_INPUT_BYTES} bytes"


def decode_document(data: bytes, source: str, *, allow_yaml: bool = False) -> Any:
    """Decode ``data`` (JSON, base64(gzip(JSON)), gzip(JSON), or YAML if allowed) by content.

    Raises :class:`InputError` naming ``source`` and what was expected; never anything else.
    """
    if not allow_yaml:
        return parse_json(json_text(data, source), source)
    body = _body(data, source)
    if body.startswith(_GZIP_MAGIC):
        return parse_json(_gunzip(body, source, "gzip"), source)
    if body[:1] in b"{[":
        try:
            return parse_json(body, source)
        except InputError as json_error:
            return _flow_yaml(body, source, json_error)
    if _BASE64_TEXT.fullmatch(body):
        try:
            raw = _b64decode(body, source)
        except InputError:
            if not b"".join(body[:64].split()).startswith(_GZIP_BASE64):
                return _parse_yaml(body, source)  # a lone word: the reader says what it expected
            raise
        # base64 of gzip data: what is wrong inside (over the cap, truncated, not JSON) is the error
        return parse_json(_gunzip(raw, source, "base64(gzip(JSON))"), source)
    return _parse_yaml(body, source)


def _flow_yaml(body: bytes, source: str, json_error: InputError) -> Any:
    """``body`` (which starts like JSON but is not) read as YAML: ``{servers: {a: tor-1}}`` is
    flow-style YAML. When it is neither, YAML's error says where, as "expected valid JSON or
    YAML"; unless YAML's caps refused it first (a big broken JSON file): then JSON's does."""
    if isinstance(json_error, _NotUtf8) or not fits_decoded(body):
        raise json_error  # YAML would refuse it too, less clearly
    try:
        return _parse_yaml(body, source)
    except _YamlTooBig:
        raise json_error from None


def json_text(data: bytes, source: str) -> bytes:
    """The JSON text inside ``data`` (plain, gzip or base64(gzip), by content), not yet parsed.

    ``parse_json(json_text(data, source), source)`` is ``decode_document(data, source)``, errors
    included; for readers that parse part by part (:func:`scan_array_member`).
    """
    body = _body(data, source)
    if body.startswith(_GZIP_MAGIC):
        return _gunzip(body, source, "gzip")
    if body[:1] in b"{[":
        return body
    if _BASE64_TEXT.fullmatch(body):
        return _gunzip(_b64decode(body, source), source, "base64(gzip(JSON))")
    raise InputError(
        source,
        "content",
        f"expected JSON or base64(gzip(JSON)), got data starting with {_preview(body)}",
    )


def _body(data: bytes, source: str) -> bytes:
    check_size(len(data), source)
    body = data.strip()
    if body.startswith(_UTF8_BOM):
        body = body[len(_UTF8_BOM):].lstrip()
    if not body:
        raise InputError(source, "content", "expected a JSON document, got an empty input")
    return body


_T = TypeVar("_T")
_SKIP_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace, as json.decoder skips it
_SPACE = frozenset(" \t\n\r")


def scan_array_member(
    text: bytes, key: str, each: Callable[[Any], Optional[_T]]
) -> Optional[List[_T]]:
    """``[each(item) for item in json.loads(text)[key]]``, decoding one item at a time.

    For a big document of which a reader keeps little (``ranktable_tor.json``: 32k device objects
    at 4096 nodes, read for one field each), so that only ``each``'s results are ever in memory.
    Returns None, having decided nothing, unless ``text`` is well-formed JSON (exactly as
    :func:`json.loads` accepts it) holding an object with one ``key`` member that is an array, and
    ``each`` returned non-None for every item: the caller then parses the whole document the usual
    way, which names whatever is wrong.
    """
    if not fits_decoded(text):  # skipped members are built whole: parse_json says what is wrong
        return None
    try:
        string = text.decode(json.detect_encoding(text), "surrogatepass")  # as json.loads does
        return _scan_array_member(string, key, each)
    except (ValueError, StopIteration, RecursionError):  # JSONDecodeError, UnicodeDecodeError
        return None


def _scan_array_member(
    string: str, key: str, each: Callable[[Any], Optional[_T]]
) -> Optional[List[_T]]:
    """The object walk of :func:`scan_array_member`, step for step as json.decoder's JSONObject."""
    skip = _SKIP_SPACE.match
    found: Optional[List[_T]] = None
    index = skip(string, 0).end()
    if string[index:index + 1] != "{":
        return None
    index = skip(string, index + 1).end()
    while True:  # one "name": value member per turn; "{}" has no key and is left to the caller
        if string[index:index + 1] != '"':
            return None
        name, index = scanstring(string, index + 1)
        index = skip(string, index).end()
        if string[index:index + 1] != ":":
            return None
        index = skip(string, index + 1).end()
        if name != key:
            index = _DECODER.scan_once(string, index)[1]
        elif found is not None or string[index:index + 1] != "[":
            return None  # a second one (json.loads would keep the last), or not an array
        else:
            found, index = _scan_items(string, index + 1, each)
            if found is None:
                return None
        index = skip(string, index).end()
        separator = string[index:index + 1]
        index = skip(string, index + 1).end()
        if separator == "}":
            break
        if separator != ",":
            return None
    return found if index == len(string) else None  # nothing may follow the object


def _scan_items(string: str, index: int, each: Callable[[Any], Optional[_T]]
                ) -> Tuple[Optional[List[_T]], int]:
    """The array after ``[`` at ``index``, step for step as json.decoder's JSONArray.

    Whitespace is skipped only where there is some (:data:`_SPACE` is JSON's whitespace, and
    ``""`` past the end is not in it): compact files, the usual ones, skip the regex calls.
    """
    skip = _SKIP_SPACE.match
    scan = _DECODER.scan_once
    results: List[_T] = []
    append = results.append
    index = skip(string, index).end()
    if string[index:index + 1] == "]":
        return results, index + 1
    while True:
        item, index = scan(string, index)
        result = each(item)
        if result is None:
            return None, index
        append(result)
        separator = string[index:index + 1]
        if separator in _SPACE:
            index = skip(string, index).end()
            separator = string[index:index + 1]
        if separator == "]":
            return results, index + 1
        if separator != ",":
            return None, index
        index += 1
        if string[index:index + 1] in _SPACE:
            index = skip(string, index).end()


def encode_b64_gzip(document: Any) -> bytes:
    """base64(gzip(compact JSON)) with StdEncoding, as the CCE plugin writes it (deterministic)."""
    raw = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip, mtime 0
    return base64.b64encode(compressor.compress(raw) + compressor.flush())


def _b64decode(body: bytes, source: str) -> bytes:
    compact = b"".join(body.split())
    try:
        raw = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as error:
        raise InputError(
            source, "content", f"expected valid base64 (StdEncoding) of gzip(JSON): {error}"
        ) from None
    if not raw.startswith(_GZIP_MAGIC):
        raise InputError(
            source,
            "content",
            "expected base64 of gzip data (magic 1f8b), got base64 of bytes starting with "
            f"{raw[:4].hex() or 'nothing'}",
        )
    return raw


def _gunzip(raw: bytes, source: str, what: str) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(raw, MAX_INPUT_BYTES + 1)
    except zlib.error as error:
        raise InputError(source, "content", f"expected a valid {what} stream: {error}") from None
    if len(out) > MAX_INPUT_BYTES:
        raise InputError(
            source, "content", f"expected at most {_cap_text()} after decompression ({what})"
        )
    if not decompressor.eof:
        raise InputError(
            source, "content", f"expected a complete {what} stream, got a truncated one"
        )
    return out


def parse_json(text: bytes, source: str) -> Any:
    """``json.loads(text)`` (msgspec's when it agrees, see the module docstring); a syntax error is
    an :class:`InputError` naming line and column."""
    if not fits_decoded(text):
        raise InputError(
            source, "content",
            f"expected a document that decodes into at most {MAX_DECODED_BYTES >> 20} MiB (a "
            f"16k-node rank table takes about 130), got one of about "
            f"{decoded_size(text) >> 20} MiB ({_value_count(text)} values in {len(text)} bytes)")
    msgspec = msgspec_for(len(text))
    if msgspec is not None:
        try:
            return msgspec.json.decode(text)
        except (ValueError, RecursionError, msgspec.MsgspecError):  # DecodeError is a ValueError
            pass  # only from msgspec 0.21 on. Refused: the standard library decides and names it
    return _parse_json_stdlib(text, source)


# A rank table (kept to the end) and a topology are decoded in one process: with this cap, the
# measured worst of both stays under 1 GiB (800 MiB); a 16k-node rank table is estimated at 130 MiB.
MAX_DECODED_BYTES = 384 << 20
_VALUE_COST = 120  # bytes a decoded value takes, string characters aside; measured at most: a
# one-key object and its key 201 (3 values: {, : and ,), a nested one 192 (2), a short string 72
# (1) or 92 if UCS-4, an empty array or object 72 (2)
_FITS_UNCOUNTED = MAX_DECODED_BYTES // (_VALUE_COST * 2 // 3 + 4)  # 4.6 MiB: see decoded_size


def decoded_size(text: bytes) -> int:
    """About as much memory as ``json.loads(text)`` builds (at most, for every shape measured),
    estimated without building it (~0.7 ms per MB).

    Each object, array, member and item after a comma costs :data:`_VALUE_COST` bytes; the
    strings' characters 1 byte each in ASCII text, up to 4 otherwise.
    """
    return _VALUE_COST * _value_count(text) + len(text) * (1 if text.isascii() else 4)


def fits_decoded(text: bytes) -> bool:
    """``decoded_size(text) <= MAX_DECODED_BYTES``; a text of :data:`_FITS_UNCOUNTED` bytes or
    fewer (a 4096-node job's) fits uncounted, as each counted value takes 1.5 bytes at least
    (``{},``)."""
    return len(text) <= _FITS_UNCOUNTED or decoded_size(text) <= MAX_DECODED_BYTES


_STRUCTURE = b",:{["


def _value_count(text: bytes) -> int:
    """Objects, arrays, members and items after a comma in ``text`` (at most: a string may hold
    these characters too), in one pass."""
    return len(text) - len(text.translate(None, _STRUCTURE))


def _parse_json_stdlib(text: bytes, source: str) -> Any:
    try:
        return json.loads(text, **_NUMBER_HOOKS)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno} column {error.colno}"
        raise InputError(source, where, f"expected valid JSON ({error.msg})") from None
    except UnicodeDecodeError as error:
        raise _not_utf8(source, error) from None
    except RecursionError:
        raise InputError(source, "content", "expected JSON nested less deeply") from None
    except _UnreadableNumber as error:
        raise InputError(source, "content", error.args[0]) from None
    except ValueError as error:  # e.g. an integer past a -X int_max_str_digits set lower
        first = (str(error).splitlines() or [""])[0]
        raise InputError(source, "content", f"expected valid JSON ({first})") from None


class _UnreadableNumber(ValueError):
    """A number JSON cannot hold, or too long to read (raised through json.loads' hooks); its
    argument is what was expected instead."""


MAX_INT_DIGITS = 4300  # what int() reads by default (sys.get_int_max_str_digits), as msgspec does


def _not_a_number(literal: str) -> float:
    raise _UnreadableNumber(f"expected finite numbers, got {literal} (not JSON)")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if value - value != 0.0:  # inf - inf is nan; a finite value gives 0.0
        shown = literal if len(literal) <= 24 else literal[:21] + "..."
        raise _UnreadableNumber(f"expected finite numbers, got {shown} (not JSON)")
    return value


def _bounded_int(literal: str) -> int:
    """``int(literal)`` up to :data:`MAX_INT_DIGITS` digits on every Python (reading more takes
    time quadratic in the length; older interpreters have no limit of their own)."""
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise _UnreadableNumber(
            f"expected integers of at most {MAX_INT_DIGITS} digits, got one of "
            f"{len(literal.lstrip('-'))} digits")
    return int(literal)


# json.loads' settings but for numbers it cannot read or JSON cannot hold, refused (scan_once
# raises _UnreadableNumber, a ValueError). msgspec refuses the same ones (the tests check).
_NUMBER_HOOKS: Dict[str, Callable[[str], Any]] = {
    "parse_constant": _not_a_number, "parse_float": _finite_float, "parse_int": _bounded_int,
}
_DECODER = json.JSONDecoder(**_NUMBER_HOOKS)


def decode_typed(text: bytes, decoder_for: Callable[[Any], Any]) -> Any:
    """``decoder_for(msgspec).decode(text)``, or None when msgspec is not used or refuses ``text``.

    ``decoder_for`` builds (and should cache) the ``msgspec.json.Decoder`` of the reader's types
    from the msgspec module, which is loaded only for big inputs (see :func:`msgspec_for`).
    For readers that keep a few fields of a big document: the decoder builds only those. ``text``
    must be UTF-8 (which msgspec does not check in the strings it skips): anything else is refused
    too. A refusal decides nothing: the caller then reads the document the standard way, which
    accepts it or names what is wrong.

    One difference remains, in a place no reader looks: msgspec checks the syntax of the values it
    skips but not their range, so a number beyond a double in a skipped field passes here while
    :func:`parse_json` refuses it.
    """
    msgspec = msgspec_for(len(text))
    if msgspec is None or not fits_decoded(text):  # the same documents as the other readers
        return None
    try:
        if not text.isascii():
            text.decode("utf-8")  # JSON text that is not UTF-8 is json.loads' to judge
        return decoder_for(msgspec).decode(text)
    except (ValueError, RecursionError, msgspec.MsgspecError):  # DecodeError, ValidationError
        return None  # (ValueErrors only from msgspec 0.21 on), or not UTF-8


def encode_compact(document: Any) -> bytes:
    """Compact JSON (UTF-8) of a decoded document, as ``json.dumps(..., separators=(",", ":"))``
    means it: msgspec's encoder (10x faster) if a big input has loaded it already (a document
    decoded from a small input is quick to encode either way), the standard library otherwise."""
    msgspec = _msgspec or None
    if msgspec is not None:
        try:
            return msgspec.json.encode(document)
        except (TypeError, ValueError, OverflowError):  # e.g. a lone surrogate json.loads kept
            pass
    text = json.dumps(document, separators=(",", ":"), check_circular=False, allow_nan=False)
    return text.encode("ascii")  # ensure_ascii: a lone surrogate is written as \ud800


def _parse_yaml(text: bytes, source: str) -> Any:
    import yaml  # only the hand-written topology file may be YAML; keep it off the fast path

    loader = _yaml_loader(yaml)
    try:
        _check_yaml_shape(yaml, loader, text, source)
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as error:
        where = _yaml_where(getattr(error, "problem_mark", None))
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        # PyYAML's problems quote what they found: a tag, an alias or anchor name, of any length
        raise InputError(source, where,
                         f"expected valid JSON or YAML ({verbatim_or_shown(problem)})") from None
    except _BadYamlScalar as error:
        raise InputError(source, _yaml_where(error.mark), error.expected) from None
    except UnicodeDecodeError as error:
        raise _not_utf8(source, error) from None


MAX_YAML_VALUES = 250_000  # a 16k-node topology file in the long form has ~160000; ~6 us each
MAX_YAML_DEPTH = 100  # our formats nest 3-8 deep; libyaml's C composer crashes at ~30000


class _YamlTooBig(InputError):
    """Past YAML's caps of values or depth (which JSON does not have)."""


def _check_yaml_shape(yaml: Any, loader: Any, text: bytes, source: str) -> None:
    """Read ``text``'s YAML events (libyaml, no recursion, no values built) and refuse, before
    anything is built, a document of more than :data:`MAX_YAML_VALUES` values, nested deeper than
    :data:`MAX_YAML_DEPTH`, or using an alias of a list or mapping (``*name``: the readers would
    walk it once per use, and ``<<`` merges copy it, quadratic in the number of anchors)."""
    events = yaml.events
    depth = 0
    collections = set()
    for count, event in enumerate(yaml.parse(text, Loader=loader), 1):
        if count > MAX_YAML_VALUES:
            raise _YamlTooBig(source, "content", f"expected at most {MAX_YAML_VALUES} YAML values "
                              "(a hand-written topology of 16k nodes has about 160000)")
        if isinstance(event, events.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise _YamlTooBig(source, _yaml_where(event.start_mark),
                                  f"expected YAML nested at most {MAX_YAML_DEPTH} levels deep")
            if event.anchor is not None:
                collections.add(event.anchor)
        elif isinstance(event, events.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, events.AliasEvent) and event.anchor in collections:
            alias = verbatim_or_shown(event.anchor)
            raise InputError(source, _yaml_where(event.start_mark),
                             f"expected no alias of a list or mapping (*{alias}): write the value "
                             "out where it is used")


def _yaml_where(mark: Any) -> str:
    return f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else "content"


class _BadYamlScalar(Exception):
    """A YAML number or date that reads as no value (too long, out of range): where, and what was
    expected instead."""

    def __init__(self, mark: Any, expected: str) -> None:
        super().__init__(expected)
        self.mark = mark
        self.expected = expected


@lru_cache(maxsize=None)
def _yaml_loader(yaml: Any) -> Any:
    """PyYAML's safe loader (the C one if built) whose integers, floats and dates raise
    :class:`_BadYamlScalar` where PyYAML would raise a bare ValueError (an integer past 4300
    digits, month 13), and whose integers stay below ``10**4300`` whatever their base, so that
    every value can be printed."""
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    def checked(tag: str, construct: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def construct_checked(loader: Any, node: Any) -> Any:
            try:
                value = construct(loader, node)
                if tag == "int" and not -_INT_LIMIT < value < _INT_LIMIT:
                    raise ValueError("too long")
            except (ValueError, OverflowError) as error:
                if tag == "int":
                    expected = f"expected integers of at most {MAX_INT_DIGITS} digits"
                else:
                    expected = f"expected a valid {tag} ({(str(error).splitlines() or [''])[0]})"
                raise _BadYamlScalar(node.start_mark, expected) from None
            return value

        return construct_checked

    loader = type("NpuJobYamlLoader", (base,), {})
    for tag in ("int", "float", "timestamp"):
        full_tag = f"tag:yaml.org,2002:{tag}"
        loader.add_constructor(full_tag, checked(tag, base.yaml_constructors[full_tag]))
    return loader


_INT_LIMIT = 10**MAX_INT_DIGITS


class _NotUtf8(InputError):
    """Text that is not UTF-8 (so neither JSON nor YAML)."""


def _not_utf8(source: str, error: UnicodeDecodeError) -> InputError:
    reason = f"{error.reason} at byte {error.start}"
    return _NotUtf8(source, "content", f"expected UTF-8 text ({reason})")


def _preview(body: bytes) -> str:
    return repr(body[:16].decode("utf-8", "replace"))


def verbatim_or_shown(text: str) -> str:
    """Text that may hold any part of an input (a parser's problem, an HTTP reason phrase, an id
    in a report), for one line: verbatim when short and printable, else through
    :func:`~npu_job.errors.shown` (quoted, bounded)."""
    return text if len(text) <= 160 and text.isprintable() else shown(text, 160)


# --- field checkers shared by the readers ---------------------------------------------------------

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
    if (type(value) is int and value > 0) or (type(value) is str and value.isdigit()
                                              and value.isascii()):
        fail(source, path, f"a non-negative integer below 10^{MAX_COUNT_DIGITS}", value)
    fail(source, path, "a non-negative integer (as a string, e.g. \"0\")", value)


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
        fail(source, where,
             f"a unique {key.replace('_', ' ')}; {shown(value)} is also {seen[value]}")
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
