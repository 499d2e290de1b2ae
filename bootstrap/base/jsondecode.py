"""JSON text -> document: the standard library, msgspec as a shortcut, and the caps they share.

``payload`` finds the JSON text inside an input (plain, gzip, base64(gzip)); this module decodes
it. :func:`parse_json` is ``json.loads`` with an error naming line and column. A reader that keeps
little of a big document may decode only what it keeps, with :func:`decode_typed`, falling back to
:func:`parse_json` (and its exact error) whenever that declines.

Decoding costs memory per value, not per byte (``{},`` is 3 bytes of text and 72 decoded), so a
document is capped at :data:`MAX_DECODED_BYTES` once decoded, estimated before anything is built
(:func:`decoded_size`).

**msgspec, when installed, does the heavy lifting** on big inputs (a 4096-node job's two files are
6 MB of JSON and the pod-side budget is a fraction of a second): it decodes about twice as fast as
``json``, decodes straight into typed structs without building what a reader skips (5x faster
still), and encodes 10x faster. Importing it costs ~10 ms, more than it saves on a small job, so
it is loaded only for an input of ``MSGSPEC.from_bytes`` or more (and then serves the smaller
ones too). It is only ever a shortcut:

* whatever it accepts, ``json.loads`` accepts with the same meaning (UTF-8 is checked first,
  because msgspec does not check the strings it skips);
* whatever it refuses goes to the standard library, which accepts it or raises the error the user
  sees;
* both refuse ``NaN``, ``Infinity`` and numbers beyond a double: they are not JSON (RFC 8259), and
  msgspec would write them back as ``null``; and both refuse integers of more than 4300 digits
  (:data:`MAX_INT_DIGITS`, what ``int()`` reads), which no Python could print again.

So results and messages are the same with or without msgspec; the tests compare the two engines
on generated documents.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Optional

from npu_job.errors import InputError

from .accelerator import MSGSPEC


def parse_json(text: bytes, source: str) -> Any:
    """``json.loads(text)`` (msgspec's when it agrees, see the module docstring); a syntax error is
    an :class:`InputError` naming line and column."""
    if not fits_decoded(text):
        raise InputError(
            source,
            "content",
            f"expected a document that decodes into at most {MAX_DECODED_BYTES >> 20} MiB (a "
            f"16k-node rank table takes about 130), got one of about "
            f"{decoded_size(text) >> 20} MiB ({_value_count(text)} values in {len(text)} bytes)",
        )
    msgspec = MSGSPEC.for_size(len(text))
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
        raise not_utf8(source, error) from None
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
            f"{len(literal.lstrip('-'))} digits"
        )
    return int(literal)


# json.loads' settings but for numbers it cannot read or JSON cannot hold, refused (scan_once
# raises _UnreadableNumber, a ValueError). msgspec refuses the same ones (the tests check).
if TYPE_CHECKING:  # typing.TypedDict is Python 3.8+; the pod side runs on 3.7
    from typing import TypedDict  # novermin: for the type checker only

    class _NumberHooks(TypedDict):
        parse_constant: Callable[[str], Any]
        parse_float: Callable[[str], Any]
        parse_int: Callable[[str], Any]


_NUMBER_HOOKS: _NumberHooks = {
    "parse_constant": _not_a_number,
    "parse_float": _finite_float,
    "parse_int": _bounded_int,
}


def decode_typed(
    text: bytes, decoder_for: Callable[[Any], Any], *, builds_at_most: Optional[int] = None
) -> Any:
    """``decoder_for(msgspec).decode(text)``, or None when msgspec is not used or refuses ``text``.

    ``decoder_for`` builds (and should cache) the ``msgspec.json.Decoder`` of the reader's types
    from the msgspec module, which is loaded only for big inputs (:data:`~.accelerator.MSGSPEC`).
    For readers that keep a few fields of a big document: the decoder builds only those. ``text``
    must be UTF-8 (which msgspec does not check in the strings it skips): anything else is refused
    too. A refusal decides nothing: the caller then reads the document the standard way, which
    accepts it or names what is wrong.

    A text is decoded when the whole document would fit decoded (:func:`fits_decoded`, as for
    the other readers), or when ``builds_at_most`` (bytes the decoder's types build per byte of
    text at most, measured by the reader's tests) keeps what it builds under the same cap. The
    second test is free; the first counts every value of a big text (~12 instructions a byte,
    more than decoding it), which is what a reader of the API's one-page lists (20 MB of pods)
    would pay. So such a reader also reads a document too big to decode whole, of which it
    builds a few fields.

    One difference remains, in a place no reader looks: msgspec checks the syntax of the values it
    skips but not their range, so a number beyond a double in a skipped field passes here while
    :func:`parse_json` refuses it.
    """
    msgspec = MSGSPEC.for_size(len(text))
    if msgspec is None:
        return None
    if builds_at_most is None or len(text) * builds_at_most > MAX_DECODED_BYTES:
        if not fits_decoded(text):  # the same documents as the other readers
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
    msgspec = MSGSPEC.module or None
    if msgspec is not None:
        try:
            return msgspec.json.encode(document)
        except (TypeError, ValueError, OverflowError):  # e.g. a lone surrogate json.loads kept
            pass
    text = json.dumps(document, separators=(",", ":"), check_circular=False, allow_nan=False)
    return text.encode("ascii")  # ensure_ascii: a lone surrogate is written as \ud800


class NotUtf8(InputError):
    """Text that is not UTF-8 (so neither JSON nor YAML)."""


def not_utf8(source: str, error: UnicodeDecodeError) -> InputError:
    reason = f"{error.reason} at byte {error.start}"
    return NotUtf8(source, "content", f"expected UTF-8 text ({reason})")
