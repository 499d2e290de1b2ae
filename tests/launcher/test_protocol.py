"""The TCPStore wire protocol: golden bytes sniffed from torch 2.13's client and server, round trips.

Every golden frame below was captured by relaying a real ``torch.distributed.TCPStore`` client to
a real server and printing the bytes both ways (keys carry the client's ``/`` prefix).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from npu_job.launcher.protocol import (
    MAX_KEY_LEN,
    NO_REPLY_OPS,
    VALIDATION_MAGIC,
    LargeBuffers,
    Op,
    ProtocolError,
    QueuePopReply,
    RawReply,
    ReplyFramer,
    Request,
    complete_multi_set_prefix,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
)

# (id, request, request bytes, reply value, reply bytes) as seen on the wire
GOLDEN = [
    ("validate", Request(Op.VALIDATE, number=VALIDATION_MAGIC), "00cef7853c", None, ""),
    ("ping", Request(Op.PING, number=0x1968A3), "0da3681900", 0x1968A3, "a3681900"),
    (
        "set",
        Request(Op.SET, (b"/k",), (b"v",)),
        "0102000000000000002f6b010000000000000076",
        None,
        "",
    ),
    ("wait", Request(Op.WAIT, (b"/k",)), "06010000000000000002000000000000002f6b", 0, "00"),
    ("get", Request(Op.GET, (b"/k",)), "0302000000000000002f6b", b"v", "010000000000000076"),
    (
        "append",
        Request(Op.APPEND, (b"/k",), (b"w",)),
        "0902000000000000002f6b010000000000000077",
        None,
        "",
    ),
    (
        "compare_set",
        Request(Op.COMPARE_SET, (b"/k",), (b"vw", b"z")),
        "0202000000000000002f6b0200000000000000767701000000000000007a",
        b"z",
        "01000000000000007a",
    ),
    (
        "add",
        Request(Op.ADD, (b"/c",), number=5),
        "0402000000000000002f630500000000000000",
        5,
        "0500000000000000",
    ),
    (
        "check",
        Request(Op.CHECK, (b"/k", b"/c")),
        "05020000000000000002000000000000002f6b02000000000000002f63",
        0,
        "00",
    ),
    ("getnumkeys", Request(Op.GETNUMKEYS), "07", 2, "0200000000000000"),
    (
        "delete_key",
        Request(Op.DELETE_KEY, (b"/k",)),
        "0802000000000000002f6b",
        1,
        "0100000000000000",
    ),
    (
        "multi_set",
        Request(Op.MULTI_SET, (b"/a", b"/b"), (b"1", b"2")),
        "0b020000000000000002000000000000002f6101000000000000003102000000000000002f62010000000000000032",
        None,
        "",
    ),
    (
        "multi_get",
        Request(Op.MULTI_GET, (b"/a", b"/b")),
        "0a020000000000000002000000000000002f6102000000000000002f62",
        (b"1", b"2"),
        "010000000000000031010000000000000032",
    ),
    ("list_keys", Request(Op.LIST_KEYS), "11", (b"/a",), "010000000000000002000000000000002f61"),
    (
        "queue_push",
        Request(Op.QUEUE_PUSH, (b"/q",), (b"x",)),
        "0e02000000000000002f71010000000000000078",
        None,
        "",
    ),
    ("queue_len", Request(Op.QUEUE_LEN, (b"/q",)), "1002000000000000002f71", 2, "0200000000000000"),
    (
        "queue_pop",
        Request(Op.QUEUE_POP, (b"/q",)),
        "0f02000000000000002f71",
        QueuePopReply(2, b"x"),
        "0200000000000000010000000000000078",
    ),
    (
        "queue_pop_empty",
        Request(Op.QUEUE_POP, (b"/q",)),
        "0f02000000000000002f71",
        QueuePopReply(0),
        "0000000000000000",
    ),
    ("cancel_wait", Request(Op.CANCEL_WAIT), "0c", 1, "01"),
    (
        "barrier",
        Request(Op.BARRIER, (b"/bar",), number=1),
        "1204000000000000002f6261720100000000000000",
        0,
        "00",
    ),
]


@pytest.mark.parametrize(
    "request_, wire, value, reply", [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN]
)
def test_golden_frames_match_torch(request_, wire, value, reply):
    assert encode_request(request_).hex() == wire
    assert decode_request(bytes.fromhex(wire)) == (request_, len(wire) // 2)
    assert encode_reply(request_.op, value).hex() == reply
    assert decode_reply(request_, bytes.fromhex(reply)) == (value, len(reply) // 2)


@pytest.mark.parametrize(
    "request_, wire", [(g[1], g[2]) for g in GOLDEN], ids=[g[0] for g in GOLDEN]
)
def test_every_truncation_of_a_request_is_incomplete_not_an_error(request_, wire):
    data = bytes.fromhex(wire)
    for cut in range(len(data)):
        assert decode_request(data[:cut]) is None


def test_pipelined_requests_decode_one_after_another():
    frames = [encode_request(g[1]) for g in GOLDEN]
    data = b"".join(frames)
    pos, seen = 0, []
    while pos < len(data):
        request, pos = decode_request(data, pos)
        seen.append(request)
    assert seen == [g[1] for g in GOLDEN]


@pytest.mark.parametrize(
    "wire, message",
    [
        ("63", "unknown opcode 99"),
        ("00efbeadde", "bad validation magic"),
        ("03" + (MAX_KEY_LEN + 1).to_bytes(8, "little").hex(), "key of 8193 bytes"),
        ("06" + (1 << 40).to_bytes(8, "little").hex(), "keys exceed"),
    ],
    ids=["unknown-opcode", "bad-magic", "oversize-key", "too-many-keys"],
)
def test_bytes_no_stock_client_sends_are_rejected(wire, message):
    with pytest.raises(ProtocolError, match=message):
        decode_request(bytes.fromhex(wire))


keys = st.binary(max_size=40)
values = st.binary(max_size=200)
requests = st.one_of(
    st.builds(lambda n: Request(Op.PING, number=n), st.integers(0, 2**32 - 1)),
    st.sampled_from([Request(Op.GETNUMKEYS), Request(Op.CANCEL_WAIT), Request(Op.LIST_KEYS)]),
    st.builds(
        lambda op, k: Request(op, (k,)),
        st.sampled_from([Op.GET, Op.DELETE_KEY, Op.QUEUE_POP, Op.QUEUE_LEN]),
        keys,
    ),
    st.builds(
        lambda op, k, v: Request(op, (k,), (v,)),
        st.sampled_from([Op.SET, Op.APPEND, Op.QUEUE_PUSH]),
        keys,
        values,
    ),
    st.builds(lambda k, a, b: Request(Op.COMPARE_SET, (k,), (a, b)), keys, values, values),
    st.builds(
        lambda op, k, n: Request(op, (k,), number=n),
        st.sampled_from([Op.ADD, Op.BARRIER]),
        keys,
        st.integers(-(2**63), 2**63 - 1),
    ),
    st.builds(
        lambda op, ks: Request(op, tuple(ks)),
        st.sampled_from([Op.CHECK, Op.WAIT, Op.MULTI_GET]),
        st.lists(keys, max_size=5),
    ),
    st.builds(
        lambda kv: Request(Op.MULTI_SET, tuple(k for k, _ in kv), tuple(v for _, v in kv)),
        st.lists(st.tuples(keys, values), max_size=5),
    ),
)


@given(requests, st.binary(max_size=8))
def test_any_request_round_trips_and_leaves_following_bytes_alone(request_, trailer):
    data = encode_request(request_) + trailer
    assert decode_request(data) == (request_, len(data) - len(trailer))


@given(st.lists(values, max_size=5))
def test_multi_get_reply_round_trips(vals):
    request_ = Request(Op.MULTI_GET, tuple(b"/k%d" % i for i in range(len(vals))))
    wire = encode_reply(Op.MULTI_GET, tuple(vals))
    assert decode_reply(request_, wire) == (tuple(vals), len(wire))
    assert decode_reply(request_, wire[:-1]) is None or not vals


def test_the_complete_pairs_of_a_multi_set_cut_short_are_recovered():
    full = encode_request(Request(Op.MULTI_SET, (b"/a", b"/b"), (b"1", b"22")))
    first_pair_end = 1 + 8 + (8 + 2 + 8 + 1)
    assert complete_multi_set_prefix(full[: first_pair_end - 1]) is None
    assert complete_multi_set_prefix(full[:first_pair_end]) == Request(
        Op.MULTI_SET, (b"/a",), (b"1",)
    )
    assert complete_multi_set_prefix(full[: len(full) - 1]) == Request(
        Op.MULTI_SET, (b"/a",), (b"1",)
    )
    assert complete_multi_set_prefix(full) == Request(Op.MULTI_SET, (b"/a", b"/b"), (b"1", b"22"))
    assert complete_multi_set_prefix(encode_request(Request(Op.SET, (b"/a",), (b"1",)))) is None


# ---------------------------------------------------------------- framing replies for a relay


def frame(requests_, chunks, direct, buffers=None):
    """The replies a ReplyFramer cuts from ``chunks`` as a socket would deliver them."""
    framer = ReplyFramer(direct, buffers)
    waiting = [r for r in requests_ if r.op not in NO_REPLY_OPS]
    replies = []

    def take() -> None:
        while waiting:
            reply = framer.next(waiting[0])
            if reply is None:
                break
            replies.append(reply)
            waiting.pop(0)

    for chunk in chunks:
        data = memoryview(chunk)
        while data:
            target = framer.buffer()
            assert len(target) > 0
            size = min(len(target), len(data))
            target[:size] = data[:size]
            framer.received(size)
            data = data[size:]
            take()
    take()  # replies of no bytes at all (a MULTI_GET of no keys)
    assert not waiting and not framer.pending
    return replies


def _reply_for(request_, draw_value):
    op = request_.op
    if op in (Op.GET, Op.COMPARE_SET):
        return draw_value()
    if op == Op.MULTI_GET:
        return tuple(draw_value() for _ in request_.keys)
    if op == Op.LIST_KEYS:
        return tuple(draw_value() for _ in range(len(draw_value()) % 4))
    if op == Op.QUEUE_POP:
        value = draw_value()
        return QueuePopReply(len(value) % 3, value if len(value) % 3 else None)
    if op == Op.PING:
        return request_.number
    if op in (Op.CHECK, Op.WAIT, Op.BARRIER, Op.CANCEL_WAIT):
        return len(request_.keys) % 2
    return len(request_.keys) * 7 - 3  # ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN: an i64


@given(
    st.lists(requests, max_size=8),
    st.data(),
    st.sampled_from([1, 3, 16, 1 << 16]),
)
def test_framed_replies_are_the_wire_bytes_and_decode_to_the_values(requests_, data, direct):
    """Pipelined replies cut at random points: each string reply comes back as exactly its wire
    bytes (long strings, in buffers of their own), each fixed-size one as its value."""
    values = [
        None if r.op in NO_REPLY_OPS else _reply_for(r, lambda: data.draw(values_st))
        for r in requests_
    ]
    wire = b"".join(encode_reply(r.op, v) for r, v in zip(requests_, values))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)])]
    replies = frame(requests_, chunks, direct)
    answered = [(r, v) for r, v in zip(requests_, values) if r.op not in NO_REPLY_OPS]
    assert len(replies) == len(answered)
    for (request_, value), reply in zip(answered, replies):
        if isinstance(reply, RawReply):
            assert b"".join(reply.parts) == encode_reply(request_.op, value)
            assert _decoded(reply, request_) == value
            views = [part for part in reply.parts if isinstance(part, memoryview)]
            assert [bytes(view) for view in views] == _long_strings(value, direct)
        else:
            assert reply == value


values_st = st.binary(max_size=40)


def _long_strings(value, direct):
    strings = value.value if isinstance(value, QueuePopReply) else value
    strings = [strings] if isinstance(strings, bytes) else list(strings or ())
    return [string for string in strings if len(string) >= direct]


def test_a_large_value_is_read_into_a_buffer_of_its_own():
    value = bytes(range(256)) * 1024  # 256 KiB
    wire = encode_reply(Op.MULTI_GET, (b"a", value, b"b"))
    framer = ReplyFramer()
    request_ = Request(Op.MULTI_GET, (b"/x", b"/y", b"/z"))
    framer.buffer()[:20] = wire[:20]  # the first string and the large one's length, 3 bytes
    framer.received(20)
    assert framer.next(request_) is None
    target = framer.buffer()
    assert len(target) == len(value) - 3  # the rest of the value, straight into its buffer
    target[:] = wire[20 : 20 + len(target)]
    framer.received(len(target))
    framer.buffer()[:9] = wire[-9:]
    framer.received(9)
    reply = framer.next(request_)
    assert isinstance(reply, RawReply)
    assert [bytes(part) for part in reply.parts] == [wire[:17], value, wire[-9:]]
    assert isinstance(reply.parts[1], memoryview) and reply.parts[1].readonly
    assert reply.count == 0 and reply.size == len(wire)


def test_a_large_buffer_is_reused_only_once_no_view_of_it_lives():
    buffers = LargeBuffers(keep=1 << 20)
    first = buffers.take(1000)
    owner = id(first.obj)  # not the object: a reference would keep it from being reused
    first[:] = b"a" * 1000
    held = first[10:20].toreadonly()  # what a reply, or a transport writing it, keeps
    del first
    assert id(buffers.take(1000).obj) != owner  # a view of it lives: a fresh buffer
    del held
    again = buffers.take(900)
    assert id(again.obj) == owner and len(again) == 900  # nothing refers to it: reused, cut
    del again
    assert id(buffers.take(400).obj) != owner  # not for a string under half its size


def test_buffers_kept_for_reuse_stay_within_their_bound():
    buffers = LargeBuffers(keep=10_000)
    live = [buffers.take(3000) for _ in range(5)]  # all in use: only three are kept
    assert buffers.kept == 9000
    del live[:]
    bigger = buffers.take(6000)  # room is made by dropping free ones
    assert buffers.kept <= 10_000 and bigger.obj is not None


@given(st.lists(st.tuples(st.binary(min_size=16, max_size=48), st.booleans()), max_size=12))
def test_reused_buffers_never_change_a_reply_still_held(values_kept):
    """Large strings framed one after another through one shared pool of buffers, some replies
    dropped at once and some held: every reply held has its own bytes at the end."""
    buffers = LargeBuffers(keep=256)
    get = Request(Op.GET, (b"/k",))
    held = []
    for value, keep in values_kept:
        (reply,) = frame([get], [encode_reply(Op.GET, value)], 16, buffers)
        if keep:
            held.append((value, reply))
    for value, reply in held:
        assert b"".join(reply.parts) == encode_reply(Op.GET, value)


def _decoded(reply: RawReply, request: Request) -> object:
    """What the framed bytes decode to."""
    decoded = decode_reply(request, b"".join(reply.parts))
    assert decoded is not None, "a framed reply is complete"
    return decoded[0]


def test_queue_pop_and_list_keys_replies_carry_their_count():
    pop = Request(Op.QUEUE_POP, (b"/q",))
    listing = Request(Op.LIST_KEYS)
    wire = encode_reply(Op.QUEUE_POP, QueuePopReply(2, b"item")) + encode_reply(
        Op.QUEUE_POP, QueuePopReply(0)
    )
    wire += encode_reply(Op.LIST_KEYS, (b"/a", b"/b"))
    first, empty, keys_ = frame([pop, pop, listing], [wire], 1 << 16)
    assert (first.count, empty.count, keys_.count) == (2, 0, 2)
    assert _decoded(empty, pop) == QueuePopReply(0)


def test_a_string_length_no_store_could_hold_is_refused():
    framer = ReplyFramer()
    framer.buffer()[:8] = (1 << 62).to_bytes(8, "little")
    framer.received(8)
    with pytest.raises(ProtocolError, match="not a store"):
        framer.next(Request(Op.GET, (b"/k",)))
