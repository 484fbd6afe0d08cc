"""The frames of the Session stream (popgate.ext.v1 Messaging.Session, proto/ext/messaging.proto), sans-IO: a
request encoded by hand around its serialized v2 body, requests queued together joined into one stream message
(`sdk/_joining.py` joins sends of one topic, acks of one topic and group, and receives into one request each), and the
size bounds a message keeps. `sdk/_session.py` does the stream's I/O around them.
"""

from __future__ import annotations

from typing import Any

from popgate_contract.wire import varint

from . import _joining, errors
from ._joining import Part
from ._transport import MAX_MESSAGE_BYTES
from ._waiting import Waiting

# SessionRequest's fields (proto/ext/messaging.proto): a request is encoded by hand around its serialized body.
_ID = b"\x08"  # SessionRequest.id: field 1, a varint
_TIMEOUT_MS = b"\x10"  # SessionRequest.timeout_ms: field 2, a varint
_CANCEL = b"\x18\x01"  # SessionRequest.cancel: field 3, true
MORE = 15  # SessionRequest.more: repeated, length-delimited
MAX_FIFO = b"\x48"  # SessionRequest.max_fifo (9, varint)
# The writer sends the requests queued when it gets to them as one stream message (`more`), up to this many bytes
# (a larger request goes alone); the rest follows in the next message, once grpc took this one. Many requests
# queued at once (sends of many tasks) so reach the proxy in parts and the proxy starts on the first while the next
# is written, rather than SDK, proxy and broker each handling the whole lot in turn (docs/PROXY.md, "Session stream") —
# tests/unit/sdk/test_session.py::test_requests_queued_together_are_joined_up_to_the_write_limit.
MAX_WRITE_BYTES = 48 * 1024
KINDS = {
    "send": 4,
    "receive": 5,
    "ack": 6,
    "change_invisible": 7,
    "send_shared": 8,
    "end_transaction": 10,
    "change_invisible_many": 11,
}


def encode(request_id: int, kind: str, body: bytes, timeout_ms: int = 0, max_fifo: int = 0) -> bytes:
    """A SessionRequest carrying the serialized v2 request `body` as `kind` (a receive with at most `max_fifo` FIFO
    messages when > 0) — tests/unit/sdk/test_session.py::test_a_hand_encoded_request_reads_as_the_generated_message."""
    head = _ID + varint(request_id)
    if timeout_ms:
        head += _TIMEOUT_MS + varint(timeout_ms)
    tail = MAX_FIFO + varint(max_fifo) if max_fifo else b""
    return head + varint(KINDS[kind] << 3 | 2) + varint(len(body)) + body + tail


def encode_cancel(request_id: int) -> bytes:
    return _ID + varint(request_id) + _CANCEL


def join(first: bytes, more: list[bytes]) -> bytes:
    """One SessionRequest carrying `first` and then `more` (each an encoded request) —
    tests/unit/sdk/test_session.py::test_requests_joined_in_one_message_read_as_each_in_order."""
    tag = varint(MORE << 3 | 2)
    return first + b"".join(tag + varint(len(request)) + request for request in more)


Queued = bytes | Part  # an encoded request (or cancel), or a request that may be joined with others (sdk/_joining.py)


def size_of(item: Queued) -> int:
    return len(item) if isinstance(item, bytes) else len(item.body) + 16


def with_queued(
    first: Queued, outbox: Any, waiting: Waiting, most: int = MAX_WRITE_BYTES
) -> tuple[bytes | None, Queued | None]:
    """`first` and the requests queued behind it in `outbox` as one message of at most `most` bytes
    (MAX_WRITE_BYTES, less where the proxy reads less: `sdk/_session.py`), or `first` alone, and the request taken
    that did not fit (to go first in the next message); the end marker (None), if met, is queued again to be seen
    after this message. Sends to one topic queued together go as one request, and so do acks of one topic and group
    (`Waiting.join`); a part whose caller stopped waiting before it was written is not sent (None: nothing left to
    send) — tests/unit/sdk/test_joining.py."""
    items = [first]
    size = size_of(first)
    carried: Queued | None = None
    while not outbox.empty():
        queued = outbox.get_nowait()
        if queued is None:
            outbox.put_nowait(None)
            break
        if size + size_of(queued) + 16 > most:
            carried = queued
            break
        items.append(queued)
        size += size_of(queued) + 16
    requests = [r for group in _joining.groups(items) if (r := _encoded_group(group, waiting)) is not None]
    if not requests:
        return None, carried
    return (join(requests[0], requests[1:]) if len(requests) > 1 else requests[0]), carried


def _encoded_group(group: bytes | list[Part], waiting: Waiting) -> bytes | None:
    if isinstance(group, bytes):
        return group
    parts = [p for p in group if p.request_id in waiting]
    if not parts:
        return None
    if len(parts) == 1:
        return alone(parts[0])
    timeout_ms = max(p.timeout_ms for p in parts)
    body = _joining.joined_body(parts)
    return encode(waiting.join(parts), parts[0].kind, body, timeout_ms, _joining.joined_max_fifo(parts))


def alone(part: Part) -> bytes:
    """The SessionRequest of `part` alone, under its own id."""
    return encode(part.request_id, part.kind, part.body, part.timeout_ms)


def encoded(
    request_id: int, kind: str, body: Any, within_s: float, receive_batch: int = 0, most: int = MAX_MESSAGE_BYTES
) -> Queued:
    """The SessionRequest for `body` (a send's or an ack's, or a receive's where the proxy takes joined receives of
    `receive_batch` messages: a Part, encoded when written, maybe joined with others); MessageBodyTooLarge (not
    retried, nothing sent) past `most` bytes (gRPC's message limit, or the proxy's once it said it), as the unary
    call fails: sent, it would end the stream for every request on it."""
    data = body.SerializeToString()
    timeout_ms = max(1, int(within_s * 1000))  # 0 would be no deadline at all
    if len(encode(request_id, kind, b"", timeout_ms)) + len(varint(len(data))) + len(data) > most:
        raise too_large(kind, len(data), most)
    if kind in _joining.JOINED_KINDS and (receive_batch or kind != "receive"):
        return _joining.part(request_id, kind, body, data, timeout_ms, receive_batch)
    return encode(request_id, kind, data, timeout_ms)


def too_large(kind: str, size: int, most: int) -> errors.MessageBodyTooLarge:
    whose = "gRPC" if most >= MAX_MESSAGE_BYTES else "the proxy's"
    return errors.MessageBodyTooLarge(
        f"a {kind} request of {size} bytes is larger than {whose} message limit ({most})",
        code_name="RESOURCE_EXHAUSTED",
    )


def id_of(request: bytes) -> int:
    """The id of an encoded SessionRequest (`encode`: its first field)."""
    value = shift = 0
    for byte in request[len(_ID) :]:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    return value
