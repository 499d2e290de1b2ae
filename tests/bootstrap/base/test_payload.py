"""Decoding by content: JSON, base64(gzip(JSON)) with any wrapping, raw gzip, YAML only if allowed;
and every way bytes can be wrong gives one InputError naming the source and what was expected."""

import base64
import gzip
import json
import subprocess
import sys
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st
from npu_job.bootstrap.base import payload
from npu_job.bootstrap.base.payload import decode_document, encode_b64_gzip, json_text

from npu_job.errors import InputError

from ..documents import b64_gzip, v1_0

DOC = v1_0()
_GZIPPED_DOC = gzip.compress(json.dumps(DOC).encode(), mtime=0)


@pytest.mark.parametrize(
    "data",
    [
        json.dumps(DOC).encode(),
        b"\xef\xbb\xbf  \n" + json.dumps(DOC, indent=4).encode() + b"\n\n",
        b64_gzip(DOC),
        b64_gzip(DOC, wrap=76),
        b"  " + b64_gzip(DOC, wrap=64).replace(b"\n", b"\r\n") + b"\t",
        gzip.compress(json.dumps(DOC).encode()),
        encode_b64_gzip(DOC),
    ],
    ids=[
        "json",
        "bom-and-indent",
        "b64-gzip",
        "b64-gzip-wrapped-76",
        "b64-gzip-crlf",
        "raw-gzip",
        "our-encoder",
    ],
)
def test_every_encoding_is_detected_by_content(data):
    assert decode_document(data, "jobstart_hccl.json") == DOC


def test_yaml_only_where_the_caller_allows_it():
    text = b"servers:\n  '10.0.0.1': [spine-a, tor-1]\n"
    assert decode_document(text, "topo.yaml", allow_yaml=True) == {
        "servers": {"10.0.0.1": ["spine-a", "tor-1"]}
    }
    with pytest.raises(
        InputError,
        match=r"^topo.yaml: content: expected JSON or base64\(gzip\(JSON\)\), got data starting with",
    ):
        decode_document(text, "topo.yaml")


def _gzip_member(data, **header):
    import io

    buffer = io.BytesIO()
    with gzip.GzipFile(mode="wb", fileobj=buffer, mtime=0, **header) as member:
        member.write(data)
    return buffer.getvalue()


@pytest.mark.parametrize("named", [False, True], ids=["plain-header", "with-file-name"])
def test_gzip_over_tls_is_inflated_without_its_crc_and_reads_the_same(named):
    text = json.dumps(DOC).encode()
    body = _gzip_member(text, filename="doc.json") if named else gzip.compress(text)
    assert json_text(body, "api", verify_crc=False) == text == json_text(body, "api")
    damaged = bytearray(body)
    damaged[-6] ^= 1  # in the CRC-32 of the trailer: TLS, not gzip, vouches for the bytes
    assert json_text(bytes(damaged), "api", verify_crc=False) == text
    with pytest.raises(InputError, match="expected a valid gzip stream"):
        json_text(bytes(damaged), "api")


@pytest.mark.parametrize(
    "cut", [1, 8, 20], ids=["short-of-the-length", "no-trailer", "short-of-the-data"]
)
def test_an_incomplete_gzip_stream_says_so_whether_or_not_the_crc_is_checked(cut):
    body = gzip.compress(json.dumps(DOC).encode())[:-cut]
    errors = []
    for verify in (True, False):
        with pytest.raises(InputError) as caught:
            json_text(body, "api", verify_crc=verify)
        errors.append(caught.value.message)
    assert errors[0] == errors[1] and "gzip" in errors[0]


def _outcome(data, verify_crc):
    """What ``json_text`` makes of ``data``: the text, or the error."""
    try:
        return "text", json_text(data, "api", verify_crc=verify_crc)
    except InputError as error:
        return "error", str(error)


def _read_or_refused(outcome, verify_crc):
    """A stream reads to the document's text or is refused with one line: never anything else.
    Unchecked, the CRC-32 lets damaged data through, but never of another length (the trailer's
    length is still checked)."""
    kind, value = outcome
    text = json.dumps(DOC).encode()
    if kind == "text":
        assert value == text if verify_crc else len(value) == len(text), outcome
    else:
        assert kind == "error" and value.startswith("api: ") and "\n" not in value, outcome


def _streams():
    text = json.dumps(DOC).encode()
    plain = gzip.compress(text, mtime=0)
    yield "plain", plain
    yield "with-file-name", _gzip_member(text, filename="doc.json")
    yield "b64", base64.b64encode(plain)
    for cut in (1, 8, 20, len(plain) // 2):
        yield f"cut-{cut}", plain[:-cut]
    yield "trailing-garbage", plain + b"junk"
    yield "bad-crc", plain[:-8] + bytes([plain[-8] ^ 1]) + plain[-7:]
    yield "bad-length", plain[:-4] + (len(text) + 1).to_bytes(4, "little")
    yield "bad-block-type", plain[:10] + b"\xff" + plain[11:]


@pytest.mark.parametrize("verify_crc", [True, False], ids=["crc", "no-crc"])
@pytest.mark.parametrize("name, data", list(_streams()), ids=[name for name, _ in _streams()])
def test_a_damaged_gzip_stream_reads_to_the_text_or_one_error_line(name, data, verify_crc):
    _read_or_refused(_outcome(data, verify_crc), verify_crc)


@given(
    at=st.integers(min_value=10, max_value=len(_GZIPPED_DOC) - 1),
    mask=st.integers(min_value=1, max_value=255),
    verify_crc=st.booleans(),
)
def test_any_damaged_byte_reads_to_the_text_or_one_error_line(at, mask, verify_crc):
    damaged = bytearray(_GZIPPED_DOC)
    damaged[at] ^= mask
    _read_or_refused(_outcome(bytes(damaged), verify_crc), verify_crc)


@pytest.mark.parametrize("verify_crc", [True, False], ids=["crc", "no-crc"])
def test_inflating_stops_a_gzip_bomb_at_the_cap_in_bounded_memory(monkeypatch, verify_crc):
    """Inflating stops one byte past the cap: a bomb is never inflated whole."""
    monkeypatch.setattr(payload, "MAX_INPUT_BYTES", 64 << 10)
    bomb = gzip.compress(b'{"a": "' + b"x" * (16 << 20) + b'"}')  # 16 MiB in 16 KB
    tracemalloc.start()
    try:
        outcome = _outcome(bomb, verify_crc)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome == (
        "error",
        "api: content: expected at most 65536 bytes after decompression (gzip)",
    )
    assert peak < 1 << 20


_BIG_TEXT = json.dumps({"pods": ["x" * 100] * 24000}).encode()  # 2.5 MB, gzipped 8 KB


def test_big_streams_inflate_whole():
    for verify_crc in (True, False):
        assert json_text(gzip.compress(_BIG_TEXT), "api", verify_crc=verify_crc) == _BIG_TEXT


def test_our_encoder_is_deterministic_gzip_with_stdencoding():
    encoded = encode_b64_gzip(DOC)
    assert encoded == encode_b64_gzip(DOC)
    assert json.loads(gzip.decompress(base64.b64decode(encoded, validate=True))) == DOC


_GZIPPED = gzip.compress(json.dumps(DOC).encode())

BAD_INPUTS = [
    ("empty", b"  \n", "content: expected a JSON document, got an empty input"),
    ("truncated-json", json.dumps(DOC).encode()[:57], "line 1 column 58: expected valid JSON ("),
    ("trailing-garbage", json.dumps(DOC).encode() + b"}", "expected valid JSON (Extra data)"),
    (
        "garbage-base64",
        b"H4sI!!!notbase64",
        "content: expected JSON or base64(gzip(JSON)), got data starting with",
    ),
    (
        "bad-base64-padding",
        b"H4sIAAAAAAAA/w",
        "content: expected valid base64 (StdEncoding) of gzip(JSON)",
    ),
    (
        "base64-of-not-gzip",
        base64.b64encode(b"hello world"),
        "content: expected base64 of gzip data (magic 1f8b), got",
    ),
    (
        "truncated-gzip",
        base64.b64encode(_GZIPPED[: len(_GZIPPED) // 2]),
        "expected a complete base64(gzip(JSON)) stream",
    ),
    (
        "corrupt-gzip",
        base64.b64encode(_GZIPPED[:10] + b"\xff" * 40),
        "expected a valid base64(gzip(JSON)) stream",
    ),
    ("gzip-of-bad-json", base64.b64encode(gzip.compress(b'{"status": ')), "expected valid JSON ("),
    ("not-utf8", b'{"status": "\xff\xfe"}', "content: expected UTF-8 text"),
    (
        "binary",
        b"\x00\x01\x02",
        "content: expected JSON or base64(gzip(JSON)), got data starting with",
    ),
]


@pytest.mark.parametrize(
    "data, expected", [case[1:] for case in BAD_INPUTS], ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_bytes_give_one_line_naming_source_and_expectation(data, expected):
    with pytest.raises(InputError) as caught:
        decode_document(data, "/user/config/jobstart_hccl.json")
    message = caught.value.message
    assert message.startswith("/user/config/jobstart_hccl.json: ")
    assert expected in message
    assert "\n" not in message


def test_bad_yaml_names_line_and_column():
    with pytest.raises(
        InputError,
        match=r"^t.yaml: line \d+ column \d+: expected valid JSON or YAML \(did not find expected",
    ):
        decode_document(b"servers:\n  a: [b, c\n", "t.yaml", allow_yaml=True)


@pytest.mark.parametrize(
    "text",
    [b"servers: *" + b"a" * (1 << 20), b"servers: !" + b"t" * (1 << 20) + b" x"],
    ids=["alias-name", "tag"],
)
def test_a_yaml_problem_quoting_the_input_stays_one_bounded_line(text):
    """PyYAML's problems quote what they found (an alias name, a tag), however long."""
    with pytest.raises(InputError) as caught:
        decode_document(text, "t.yaml", allow_yaml=True)
    message = caught.value.message
    assert message.startswith("t.yaml: line 1 column ") and len(message) < 300, message[:300]
    assert message.isprintable()


def _merge_key_ladder(levels: int) -> bytes:
    """Each mapping merges the previous one (``<<: *name``): PyYAML copies them all, quadratically
    (6000 levels, 212 KiB: 40 s and 660 MiB)."""
    lines = [b"l0: &l0 {k0: 1}"] + [
        b"l%d: &l%d {<<: *l%d, k%d: 1}" % (i, i, i - 1, i) for i in range(1, levels)
    ]
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        (_merge_key_ladder(6000), "line 2 column 14: expected no alias of a list or mapping (*l0)"),
        (
            b"a: &rack [spine-a, tor-1]\nb: *rack\n",
            "line 2 column 4: expected no alias of a list or mapping (*rack)",
        ),
        (
            b"servers:\n" + b"  - a\n" * (payload.MAX_YAML_VALUES + 1),
            f"content: expected at most {payload.MAX_YAML_VALUES} YAML values",
        ),
        (b"- " * 101 + b"x", "line 1 column 201: expected YAML nested at most 100 levels deep"),
    ],
    ids=["merge-key-ladder", "alias-of-a-list", "too-many-values", "too-deep"],
)
def test_yaml_that_would_cost_more_than_its_bytes_is_refused_before_it_is_built(text, expected):
    with pytest.raises(InputError) as caught:
        decode_document(text, "t.yaml", allow_yaml=True)
    assert caught.value.message.startswith(f"t.yaml: {expected}")


def test_yaml_aliases_of_single_values_are_still_read():
    assert decode_document(b"a: &ip 10.0.0.1\nb: *ip\n", "t.yaml", allow_yaml=True) == {
        "a": "10.0.0.1",
        "b": "10.0.0.1",
    }


def test_yaml_nested_past_what_the_c_parser_survives_is_an_error_not_a_crash():
    """libyaml's composer recurses in C: 100000 levels (200 KB) killed the process (SIGSEGV)."""
    code = (
        "from npu_job.bootstrap.base.payload import decode_document\n"
        "try:\n    decode_document(b'- ' * 100000 + b'x', 't.yaml', allow_yaml=True)\n"
        "except Exception as error:\n    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.startswith(
        "t.yaml: line 1 column 201: expected YAML nested at most 100 levels deep"
    )


def test_huge_input_and_gzip_bomb_are_refused_at_the_cap(monkeypatch):
    monkeypatch.setattr(payload, "MAX_INPUT_BYTES", 1000)
    with pytest.raises(
        InputError, match=r"^big.json: size: expected at most 1000 bytes, got 1001 bytes$"
    ):
        decode_document(b" " * 1001, "big.json")
    bomb = base64.b64encode(gzip.compress(b'{"a": "' + b"x" * 5000 + b'"}'))
    assert len(bomb) < 1000
    with pytest.raises(
        InputError, match=r"^bomb: content: expected at most 1000 bytes after decompression"
    ):
        decode_document(bomb, "bomb")


def test_the_real_cap_is_64_mib():
    assert payload.MAX_INPUT_BYTES == 64 * 1024 * 1024
    with pytest.raises(
        InputError, match=r"size: expected at most 64 MiB \(67108864 bytes\), got 67108865 bytes"
    ):
        payload.check_size(64 * 1024 * 1024 + 1, "x")


@given(
    document=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
        ),
        max_leaves=20,
    ).filter(lambda value: isinstance(value, (dict, list))),
    wrap=st.sampled_from([0, 1, 4, 64, 76]),
)
def test_b64_gzip_round_trips_whatever_the_wrapping(document, wrap):
    encoded = encode_b64_gzip(document)
    if wrap:
        encoded = b"\n".join(encoded[i : i + wrap] for i in range(0, len(encoded), wrap))
    assert decode_document(encoded, "x") == document
