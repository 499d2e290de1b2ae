"""JSON decoding on the pod: msgspec is a shortcut that must mean what
``json.loads`` means, refuse what it refuses (numbers JSON cannot hold), and write what
``json.dumps`` writes."""

import json
import re
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from npu_job.bootstrap.base import jsondecode
from npu_job.bootstrap.base.accelerator import MSGSPEC

from npu_job.errors import InputError

from ..engines import ENGINES, json_engine

# --- msgspec is a shortcut: whatever it accepts means what json.loads makes of it ---------------


def _outcome(text, engine):
    """What parse_json makes of ``text`` under ``engine``: ("ok", repr of the value) or
    ("error", message). repr tells 1 from 1.0 and -0.0 from 0.0, which == would not."""
    with json_engine(engine):
        try:
            return "ok", repr(jsondecode.parse_json(text, "f.json"))
        except InputError as error:
            return "error", error.message


_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    document=_ANY_JSON,
    indent=st.sampled_from([None, 0, 2, "\t"]),
    ascii_only=st.booleans(),
    cut=st.integers(0, 200),
    mutation=st.sampled_from(
        [
            "",
            "x",
            ",",
            "]",
            "}",
            " ",
            '"',
            "\\",
            "\\u",
            "\\ud800",
            "\x01",
            "\xff",
            "é",
            "1e999",
            "-",
            "0",
            "NaN",
            "\n",
        ]
    ),
)
def test_msgspec_and_the_standard_library_agree_on_every_text(
    document, indent, ascii_only, cut, mutation
):
    text = json.dumps(document, indent=indent, ensure_ascii=ascii_only)
    for candidate in (text, text[:cut] + mutation + text[cut:], text[:cut]):
        data = candidate.encode("utf-8", "surrogatepass")
        assert _outcome(data, "msgspec") == _outcome(data, "stdlib"), candidate


@pytest.mark.parametrize(
    "data, expected",
    [
        (b'{"a": NaN}', "f.json: content: expected finite numbers, got NaN (not JSON)"),
        (b"[Infinity]", "f.json: content: expected finite numbers, got Infinity (not JSON)"),
        (b"[-Infinity]", "f.json: content: expected finite numbers, got -Infinity (not JSON)"),
        (b'{"a": [1e400]}', "f.json: content: expected finite numbers, got 1e400 (not JSON)"),
        (
            b"[" + b"9" * 5000 + b"]",
            "f.json: content: expected integers of at most 4300 digits, got one of 5000 digits",
        ),
        (
            b"[-" + b"9" * 4301 + b"]",
            "f.json: content: expected integers of at most 4300 digits, got one of 4301 digits",
        ),
    ],
    ids=[
        "nan",
        "infinity",
        "minus-infinity",
        "overflow",
        "int-too-long",
        "negative-int-one-digit-too-long",
    ],
)
@pytest.mark.parametrize("engine", ENGINES)
def test_numbers_json_cannot_hold_are_refused_by_both_engines(engine, data, expected):
    kind, message = _outcome(data, engine)
    assert kind == "error" and message.startswith(expected)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_longest_integer_both_engines_read_has_4300_digits(engine):
    assert _outcome(b"[" + b"9" * 4300 + b"]", engine) == ("ok", repr([10**4300 - 1]))


@pytest.mark.parametrize(
    "data",
    [b'["\\ud800"]', '["\u00e9\u2028"]'.encode(), "[1]".encode("utf-16"), b'["\xed\xa0\x80"]'],
    ids=["lone-surrogate-escape", "non-ascii", "utf-16", "surrogate-bytes"],
)
def test_what_only_the_standard_library_accepts_still_decodes_under_msgspec(data):
    assert _outcome(data, "msgspec") == _outcome(data, "stdlib")
    assert _outcome(data, "msgspec")[0] == "ok"


def test_without_msgspec_big_inputs_use_the_standard_library(monkeypatch):
    monkeypatch.setattr(MSGSPEC, "module", False)
    monkeypatch.setitem(sys.modules, "msgspec", None)  # what an image without msgspec looks like
    monkeypatch.setattr(MSGSPEC, "from_bytes", 0)
    assert MSGSPEC.for_size(10**9) is None
    assert jsondecode.parse_json(b'{"a": [1, 2]}', "f") == {"a": [1, 2]}
    assert (
        jsondecode.decode_typed(b"{}", lambda msgspec: pytest.fail("no msgspec, no decoder"))
        is None
    )
    assert jsondecode.encode_compact({"a": "\u00e9"}) == b'{"a":"\\u00e9"}'


def test_decode_typed_checks_utf8_that_msgspec_skips():
    def decoder_for(msgspec):
        return msgspec.json.Decoder(msgspec.defstruct("Only", [("a", int)]))

    with json_engine("msgspec"):
        assert jsondecode.decode_typed(b'{"a": 1, "b": "ok"}', decoder_for).a == 1
        assert (
            jsondecode.decode_typed(b'{"a": 1, "b": "\xff"}', decoder_for) is None
        )  # json.loads refuses it
        assert (
            jsondecode.decode_typed(b'{"a": "1"}', decoder_for) is None
        )  # a wrong type decides nothing
        assert jsondecode.decode_typed(b'{"a": 1', decoder_for) is None
    with json_engine("stdlib"):
        assert jsondecode.decode_typed(b'{"a": 1}', decoder_for) is None


_STRING_LITERAL = re.compile(rb'"(?:[^"\\]|\\.)*"')
_WHITESPACE = re.compile(rb"[ \t\n\r]")


@settings(max_examples=200, deadline=None)
@given(
    document=_ANY_JSON.filter(
        lambda value: "NaN" not in json.dumps(value) and "Infinity" not in json.dumps(value)
    )
)
@example({"0: ": None})  # a separator's bytes inside a string are not a separator
def test_encode_compact_writes_what_json_dumps_means(document):
    for engine in ENGINES:
        with json_engine(engine):
            encoded = jsondecode.encode_compact(document)
        assert json.loads(encoded) == document
        assert not _WHITESPACE.search(_STRING_LITERAL.sub(b'""', encoded))  # compact: no spaces


def test_encode_compact_falls_back_for_what_msgspec_cannot_write():
    with json_engine("msgspec"):
        document = jsondecode.parse_json(b'{"a": "\\ud800", "b": ' + b"7" * 30 + b"}", "f")
        assert jsondecode.encode_compact(document) == b'{"a":"\\ud800","b":' + b"7" * 30 + b"}"
