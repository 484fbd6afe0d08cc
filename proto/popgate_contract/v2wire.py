"""apache.rocketmq.v2 wire bytes of a stored message, built by hand (no v2 protobuf objects): the system
properties that never change once a message is sent, encoded once by the broker's send path (`Message.v2_system`),
and the few pieces the proxy's byte path adds per delivery (proxy/v2/convert.py `client_items`; docs/BROKER.md,
"Pop answers for the v2 byte path"). Together they read as what `proxy.v2.convert.to_client` builds —
tests/unit/proxy/test_splice.py, with hypothesis. The field numbers are apache.rocketmq.v2's
(proto/v2/definition.proto)."""

from __future__ import annotations

import hashlib
from base64 import b16encode
from collections.abc import Mapping
from functools import lru_cache

from popgate_pb import broker_pb2 as pb

from popgate_contract.wire import SMALL, field, timestamp, varint

# apache.rocketmq.v2 tags (field number << 3 | wire type). Message: topic 1, user_properties 2,
# system_properties 3, body 4. SystemProperties: tag 1, keys 2, message_id 3, body_digest 4, body_encoding 5,
# message_type 6, born_timestamp 7, born_host 8, store_timestamp 9, delivery_timestamp 11, queue_id 13,
# queue_offset 14, message_group 17, trace_context 18, priority 22. Digest: type 1 (MD5 = 2), checksum 2.
TOPIC, USER_PROPERTY, SYSTEM, BODY = b"\x0a", b"\x12", b"\x1a", b"\x22"
_TAG, _KEY, _MESSAGE_ID, _BORN_HOST, _MESSAGE_GROUP = b"\x0a", b"\x12", b"\x1a", b"\x42", b"\x8a\x01"
_TRACE_CONTEXT = b"\x92\x01"
_BORN, STORED, _DELIVERY = b"\x3a", b"\x4a", b"\x5a"
QUEUE_ID, QUEUE_OFFSET, _PRIORITY = b"\x68", b"\x70", b"\xb0\x01"
RECEIPT_HANDLE, DELIVERY_ATTEMPT = b"\x62", b"\x80\x01"
_DIGEST_HEAD = b"\x22\x24\x08\x02\x12\x20"  # body_digest {type: MD5, checksum: 32 hex digits}
_IDENTITY = b"\x28\x01"  # body_encoding IDENTITY
_NORMAL, _FIFO, _DELAY, _TRANSACTION, _PRIORITY_TYPE = (b"\x30" + bytes((t,)) for t in (1, 2, 3, 4, 6))


@lru_cache(maxsize=4096)
def topic_field(name: str, namespace: str = "") -> bytes:
    """Message.topic: a Resource of `name` in `namespace`."""
    namespaced = field(b"\x0a", namespace.encode()) if namespace else b""
    return field(TOPIC, namespaced + field(b"\x12", name.encode()))


def user_properties(properties: Mapping[str, str]) -> bytes:
    """Message.user_properties: one map entry (key 1, value 2) per property."""
    return b"".join(
        field(USER_PROPERTY, field(b"\x0a", key.encode()) + field(b"\x12", value.encode()))
        for key, value in properties.items()
    )


def static_system(m: pb.Message) -> bytes:
    """The SystemProperties of `m` that do not depend on its store or delivery (no store_timestamp, queue_id,
    queue_offset, receipt_handle, delivery_attempt), in field order: computed once, on send (broker.send), kept
    in `m.v2_system`."""
    before, after = static_parts(m)
    return before + message_id_field(m.message_id) + body_digest(m.body) + after


def static_parts(m: pb.Message) -> tuple[bytes, bytes]:
    """`static_system` of `m` but for its message id and body digest: what comes before them and after them (the
    same for every message of a run that differ only in their ids and bodies)."""
    before = _string(_TAG, m.tag) if m.HasField("tag") else b""
    for key in m.keys:
        before += _string(_KEY, key)
    deliver_at_ms = m.deliver_at_ms
    kind, group, delivery = _kind(m, deliver_at_ms)
    after = _IDENTITY + kind + timestamp(_BORN, m.born_ms)
    if m.born_host:
        after += _string(_BORN_HOST, m.born_host)
    if delivery:
        after += timestamp(_DELIVERY, deliver_at_ms)
    if group:
        after += _string(_MESSAGE_GROUP, group)
    if m.trace_context:
        after += _string(_TRACE_CONTEXT, m.trace_context)
    if m.priority:
        after += _PRIORITY + varint(m.priority)
    return before, after


def message_id_field(message_id: str) -> bytes:
    """SystemProperties.message_id (nothing for an empty id), as `static_system` puts it between its parts."""
    return _string(_MESSAGE_ID, message_id) if message_id else b""


def body_digest(body: bytes) -> bytes:
    """SystemProperties.body_digest of `body` (MD5, 32 hex digits)."""
    return _DIGEST_HEAD + b16encode(hashlib.md5(body, usedforsecurity=False).digest())


def _string(tag: bytes, text: str) -> bytes:
    data = text.encode()
    size = len(data)
    return tag + (SMALL[size] if size < 0x80 else varint(size)) + data


def _kind(m: pb.Message, deliver_at_ms: int) -> tuple[bytes, str, bool]:
    """The message type (the first that applies: PRIORITY, TRANSACTION, FIFO, DELAY, NORMAL), the message group
    to send (FIFO only) and whether to send the delivery time (DELAY only) — as `to_client` decides."""
    if m.priority:
        return _PRIORITY_TYPE, "", False
    if m.transactional:
        return _TRANSACTION, "", False
    group = m.message_group
    if group:
        return _FIFO, group, False
    if deliver_at_ms:
        return _DELAY, "", True
    return _NORMAL, "", False
