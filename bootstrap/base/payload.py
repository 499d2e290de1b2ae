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
rather say so than exhaust a pod's memory. Decoding costs memory per value, not per byte, so a JSON
document is also capped once decoded (``jsondecode.MAX_DECODED_BYTES``, estimated before anything
is built); YAML, which costs ~20x more per value in memory and time, at :data:`MAX_YAML_VALUES`
values, :data:`MAX_YAML_DEPTH` levels and no aliases of lists or mappings (which the readers would
walk again for each use). Within these caps the bootstrap stays under 1 GiB and 10 s with a rank
table and a topology of any content.

:func:`decode_document` is the entry point. A reader that keeps little of a big document may
instead unwrap it with :func:`json_text` and decode only what it keeps (``jsondecode``: the JSON
engines, msgspec as a shortcut). The readers check the fields of what they decoded with
``fields``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from functools import lru_cache
from typing import Any, Callable, Optional

from npu_job.errors import InputError, shown

from .jsondecode import MAX_INT_DIGITS, NotUtf8, fits_decoded, not_utf8, parse_json

MAX_INPUT_BYTES = 64 * 1024 * 1024

_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_BASE64 = b"H4sI"  # base64 of 1f 8b 08, how every gzip stream starts (deflate)
_BASE64_TEXT = re.compile(rb"[A-Za-z0-9+/=\s]+")
_UTF8_BOM = b"\xef\xbb\xbf"


def check_size(size: int, source: str, limit: Optional[int] = None) -> None:
    """Reject inputs over ``limit`` bytes (:data:`MAX_INPUT_BYTES` unless told) with a message
    that states the cap."""
    # The cap is read when called, not when defined, so one module constant governs every caller.
    limit = MAX_INPUT_BYTES if limit is None else limit
    if size > limit:
        raise InputError(source, "size", f"expected at most {_cap_text(limit)}, got {size} bytes")


def _cap_text(limit: Optional[int] = None) -> str:
    limit = MAX_INPUT_BYTES if limit is None else limit
    mib, rest = divmod(limit, 1 << 20)
    if mib and not rest:
        return f"{mib} MiB ({limit} bytes)"
    return f"{limit} bytes"


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
    if isinstance(json_error, NotUtf8) or not fits_decoded(body):
        raise json_error  # YAML would refuse it too, less clearly
    try:
        return _parse_yaml(body, source)
    except _YamlTooBig:
        raise json_error from None


def json_text(data: bytes, source: str, *, verify_crc: bool = True) -> bytes:
    """The JSON text inside ``data`` (plain, gzip or base64(gzip), by content), not yet parsed.

    ``parse_json(json_text(data, source), source)`` is ``decode_document(data, source)``, errors
    included; for readers that decode only what they keep (:func:`.jsondecode.decode_typed`).
    ``verify_crc=False``: a gzip body's CRC-32 is not computed, for data whose transport already
    authenticated it (TLS: ~40% of decompressing; see :func:`_inflate_unverified`).
    """
    body = _body(data, source)
    if body.startswith(_GZIP_MAGIC):
        if not verify_crc:
            text = _inflate_unverified(body)
            if text is not None:
                return text
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
        body = body[len(_UTF8_BOM) :].lstrip()
    if not body:
        raise InputError(source, "content", "expected a JSON document, got an empty input")
    return body


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


def _inflate_unverified(raw: bytes) -> Optional[bytes]:
    """:func:`_gunzip` of a one-member gzip stream (RFC 1952) without its CRC-32, which TLS makes
    redundant (it authenticates every record); the length in the trailer is still checked. None,
    having decided nothing, for anything but a complete stream within the cap: :func:`_gunzip`
    then says what is wrong (or accepts it)."""
    if len(raw) < 18 or raw[2] != 8 or raw[3] & 0xE0:  # deflate, no reserved flag
        return None
    flags, start = raw[3], 10
    if flags & 4:  # FEXTRA: a length, then that much
        start += 2 + int.from_bytes(raw[start : start + 2], "little")
    for flag in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & flag:
            end = raw.find(b"\0", start)
            if end < 0:
                return None
            start = end + 1
    if flags & 2:  # FHCRC
        start += 2
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        out = inflater.decompress(memoryview(raw)[start:], MAX_INPUT_BYTES + 1)
    except zlib.error:
        return None
    trailer = inflater.unused_data
    if (
        not inflater.eof
        or len(out) > MAX_INPUT_BYTES
        or len(trailer) < 8
        or int.from_bytes(trailer[4:8], "little") != len(out) & 0xFFFFFFFF
    ):
        return None
    return out


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
        raise InputError(
            source, where, f"expected valid JSON or YAML ({verbatim_or_shown(problem)})"
        ) from None
    except _BadYamlScalar as error:
        raise InputError(source, _yaml_where(error.mark), error.expected) from None
    except UnicodeDecodeError as error:
        raise not_utf8(source, error) from None


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
            raise _YamlTooBig(
                source,
                "content",
                f"expected at most {MAX_YAML_VALUES} YAML values "
                "(a hand-written topology of 16k nodes has about 160000)",
            )
        if isinstance(event, events.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise _YamlTooBig(
                    source,
                    _yaml_where(event.start_mark),
                    f"expected YAML nested at most {MAX_YAML_DEPTH} levels deep",
                )
            if event.anchor is not None:
                collections.add(event.anchor)
        elif isinstance(event, events.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, events.AliasEvent) and event.anchor in collections:
            alias = verbatim_or_shown(event.anchor)
            raise InputError(
                source,
                _yaml_where(event.start_mark),
                f"expected no alias of a list or mapping (*{alias}): write the value "
                "out where it is used",
            )


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

    loader: Any = type("NpuJobYamlLoader", (base,), {})  # a subclass of the module's loader
    for tag in ("int", "float", "timestamp"):
        full_tag = f"tag:yaml.org,2002:{tag}"
        loader.add_constructor(full_tag, checked(tag, base.yaml_constructors[full_tag]))
    return loader


_INT_LIMIT = 10**MAX_INT_DIGITS


def _preview(body: bytes) -> str:
    return repr(body[:16].decode("utf-8", "replace"))


def verbatim_or_shown(text: str) -> str:
    """Text that may hold any part of an input (a parser's problem, an HTTP reason phrase, an id
    in a report), for one line: verbatim when short and printable, else through
    :func:`~npu_job.errors.shown` (quoted, bounded)."""
    return text if len(text) <= 160 and text.isprintable() else shown(text, 160)
