"""The TCPStore wire protocol: opcodes, request and reply framing, encode/decode (pure).

Checked against torch 2.13's C++ client (``TCPStore.cpp``) and libuv server
(``TCPStoreLibUvBackend.cpp``) and by sniffing a real client talking to a real
server: little-endian; a request is ``u8 opcode`` then its fields; strings and
byte values are ``u64 length`` + bytes. There are no request ids: replies come
back in request order on each connection, except that a blocking WAIT/BARRIER
reply arrives whenever the key is ready.

Nothing here touches sockets: callers hand in bytes and get values back, so the
proxy, the raw benchmark client and the tests share one implementation. A relay that
forwards replies unchanged frames them with :class:`ReplyFramer` instead of decoding
them: it gets each reply's exact wire bytes (:class:`RawReply`), large values in
buffers of their own that the socket reads into.

The parts, each a module: the fields both directions are made of (:mod:`.fields`), the
requests and each torch release's dialect (:mod:`.requests`), the replies (:mod:`.replies`),
and a relay's framing of replies (:mod:`.framing`). Every public name is here too.
"""

from __future__ import annotations

from .fields import MAX_KEY_COUNT, MAX_KEY_LEN, MAX_PAYLOAD_LEN, ProtocolError
from .framing import DIRECT_STRING, LargeBuffers, RawReply, ReplyFramer
from .replies import (
    CheckReply,
    QueuePopReply,
    ReplyValue,
    WaitReply,
    decode_reply,
    decode_wait_byte,
    encode_reply,
    reply_complete,
)
from .requests import (
    BLOCKING_OPS,
    NEWEST,
    NO_REPLY_OPS,
    QUEUE_OPS,
    VALIDATION_MAGIC,
    WRITE_OPS,
    Dialect,
    Op,
    Request,
    complete_multi_set_prefix,
    decode_request,
    encode_request,
    make_dialect,
)

__all__ = [
    "BLOCKING_OPS",
    "DIRECT_STRING",
    "MAX_KEY_COUNT",
    "MAX_KEY_LEN",
    "MAX_PAYLOAD_LEN",
    "NEWEST",
    "NO_REPLY_OPS",
    "QUEUE_OPS",
    "VALIDATION_MAGIC",
    "WRITE_OPS",
    "CheckReply",
    "Dialect",
    "LargeBuffers",
    "Op",
    "ProtocolError",
    "QueuePopReply",
    "RawReply",
    "ReplyFramer",
    "ReplyValue",
    "Request",
    "WaitReply",
    "complete_multi_set_prefix",
    "decode_reply",
    "decode_request",
    "decode_wait_byte",
    "encode_reply",
    "encode_request",
    "make_dialect",
    "reply_complete",
]
