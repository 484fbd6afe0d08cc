"""apache.rocketmq.v2 messages <-> broker protocol messages, with the §5 checks on the way in."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2

from popgate_contract import errors
from popgate_contract.gzip_body import NotGzip, gunzip
from popgate_contract.v2wire import (
    BODY,
    DELIVERY_ATTEMPT,
    QUEUE_ID,
    QUEUE_OFFSET,
    RECEIPT_HANDLE,
    STORED,
    SYSTEM,
    static_system,
    topic_field,
    user_properties,
)
from popgate_contract.wire import SMALL, timestamp, varint
from proxy import validate
from proxy.validate import outside

_MAX_SECONDS = 10 * 365 * 24 * 3600  # anything beyond is nonsense, not a duration
_MAX_TIMESTAMP_S = 253_402_300_799  # 9999-12-31T23:59:59Z, protobuf Timestamp's own upper bound
# RocketMQ's proxy's maxTransactionRecoverySecond: a TRANSACTION message asking more is BAD_REQUEST.
MAX_TRANSACTION_RECOVERY_S = 3600
SERVED_TYPES = frozenset((v2.MESSAGE_TYPE_UNSPECIFIED, v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION, v2.PRIORITY))
_ENCODINGS = frozenset((v2.ENCODING_UNSPECIFIED, v2.IDENTITY, v2.GZIP))  # unspecified: plain bytes


@dataclass(frozen=True, slots=True)
class SendLimits:
    max_body_bytes: int
    max_delay_s: float


def seconds(duration: Duration, *, what: str, error: type[errors.DomainError] = errors.BadRequest) -> float:
    """A protobuf Duration as float seconds; `error` when it is not a sane duration."""
    if abs(duration.seconds) > _MAX_SECONDS or abs(duration.nanos) >= 1_000_000_000:
        raise error(f"{what} is not a valid duration ({duration.seconds} s, {duration.nanos} ns)")
    return duration.seconds + duration.nanos / 1e9


def body_of(body: bytes, encoding: int, limit: int, room: int | None) -> bytes:
    """A message's `body` as stored (`encoding`: its body_encoding), inflated when GZIP; `room`: inflated bytes its
    request may still grow by."""
    if encoding not in _ENCODINGS:  # a newer client's encoding, stored as if it were plain bytes, reaches
        # consumers as garbage: refused instead
        raise errors.BadRequest(f"body_encoding {encoding} is not one the proxy reads (IDENTITY or GZIP)")
    if encoding != v2.GZIP:
        return validate.body(body, limit=limit)
    validate.body(body, limit=limit)  # the compressed body is held to the limit too
    cap = limit if room is None else max(0, min(limit, room))
    try:
        inflated = gunzip(body, cap)
    except NotGzip as exc:
        raise errors.BadRequest(f"message body is declared GZIP but does not inflate: {exc}") from None
    if inflated is None and cap == limit:
        raise errors.MessageBodyTooLarge(
            f"message body inflates to more than {limit} bytes; the limit is {limit} bytes"
        )
    if inflated is None:
        raise errors.MessageBodyTooLarge(
            "the GZIP bodies of one SendMessage inflate to more than the largest request the proxy takes"
            " (max_message_bytes): send fewer compressed messages per request"
        )
    return validate.body(inflated, limit=limit)


def to_broker(
    message: v2.Message,
    limits: SendLimits,
    *,
    now_s: float,
    room: int | None = None,
    topics: dict[tuple[str, str], str] | None = None,
) -> bpb.Message:
    """A client's message as the broker stores it; raises the §5 error for the first violation. `room`: how
    many bytes a GZIP body may inflate to within its request (None: up to the body limit). `topics`: the stored
    names of the (namespace, topic) pairs already checked, shared by the messages of one request (each pair is
    checked once; a refused one is checked again, so it fails each message alike)."""
    props = message.system_properties
    message_type = props.message_type
    if message_type not in SERVED_TYPES:  # LITE: not stored as if it were NORMAL
        known = message_type in v2.MessageType.values()
        kind = v2.MessageType.Name(message_type) if known else f"message_type {message_type}:"
        raise errors.Unsupported(
            f"{kind} messages are not supported by popgate (NORMAL, FIFO, DELAY, TRANSACTION and PRIORITY are)"
        )
    resource = message.topic
    key = (resource.resource_namespace, resource.name)
    topic = None if topics is None else topics.get(key)
    if topic is None:
        topic = validate.publish_topic(validate.topic_in(*key))
        if topics is not None:
            topics[key] = topic
    # Fields set one by one, and only when not their default: what a constructor of the same fields stores —
    # tests/unit/proxy/test_v2_edge.py::test_empty_tag_or_group_is_refused_other_defaults_store_as_unset.
    out = bpb.Message()
    out.topic = topic
    out.message_id = validate.message_id(props.message_id)
    out.body = body_of(message.body, props.body_encoding, limits.max_body_bytes, room)
    keys = props.keys
    if keys:
        out.keys.extend(validate.keys(keys[:]))  # a slice: a repeated field's quickest copy to a list
    born_host = props.born_host
    if born_host:
        out.born_host = born_host[:256]
    if props.HasField("tag"):  # set to "" is refused, unset is not
        out.tag = validate.tag(props.tag)
    user_properties = message.user_properties
    if user_properties or keys or out.tag:
        validate.properties(user_properties, tag=out.tag, keys=out.keys)
        if user_properties:
            out.properties.update(user_properties)
    group = validate.message_group(props.message_group) if props.HasField("message_group") else ""
    if group:
        out.message_group = group
    trace_context = props.trace_context  # RocketMQ keeps one set to "" as none
    if trace_context:
        out.trace_context = validate.trace_context(trace_context)
    born_ms = _born_ms(props.born_timestamp)
    if born_ms:
        out.born_ms = born_ms
    deliver_at_ms = _deliver_at_ms(props, group, limits, now_s) if props.HasField("delivery_timestamp") else 0
    if deliver_at_ms:
        out.deliver_at_ms = deliver_at_ms
    _kind(out, message_type, props.priority, group, deliver_at_ms)
    if message_type == v2.TRANSACTION and props.HasField("orphaned_transaction_recovery_duration"):
        _check_recovery(props.orphaned_transaction_recovery_duration)
    return out


def _born_ms(born: Timestamp) -> int:
    """Unset, a born_timestamp reads as 0 s: a time, and born_ms 0, what the broker takes for an unset one —
    tests/unit/proxy/test_v2_edge.py::test_empty_tag_or_group_is_refused_other_defaults_store_as_unset."""
    born_s, born_ns = born.seconds, born.nanos
    if not 0 <= born_s <= _MAX_TIMESTAMP_S or not 0 <= born_ns < 1_000_000_000:
        raise errors.BadRequest(
            f"born_timestamp {born_s} s {born_ns} ns is not a time (0..{_MAX_TIMESTAMP_S} s, nanos 0..999999999)"
        )
    return born_s * 1000 + born_ns // 1_000_000


def _deliver_at_ms(props: v2.SystemProperties, group: str, limits: SendLimits, now_s: float) -> int:
    ts = props.delivery_timestamp
    if ts.seconds < 0 or not 0 <= ts.nanos < 1_000_000_000:  # too late is told below (with a ms hint)
        raise errors.IllegalDeliveryTime(
            f"delivery_timestamp {ts.seconds} s {ts.nanos} ns is not a time (seconds from 0, nanos 0..999999999)"
        )
    at = validate.delivery_time(ts.seconds + ts.nanos / 1e9, now_s=now_s, max_delay_s=limits.max_delay_s)
    if group and at > now_s:  # checked here too: a request's groups go to brokers apart
        raise errors.BadRequest("a FIFO message (message_group) cannot also have a future delivery_timestamp")
    # Kept when already past (the broker stores it visible at once), as RocketMQ keeps it: the consumer gets back
    # the delivery_timestamp its producer set.
    return int(at * 1000)


def _kind(out: bpb.Message, message_type: int, priority: int, group: str, deliver_at_ms: int) -> None:
    """Priority and transaction, checked against the rest as RocketMQ's clients check them (the broker checks
    again: a request's messages may go to brokers apart). `priority`: 0 when unset, as when set to 0."""
    if priority:
        if priority < 0:
            raise errors.BadRequest(f"priority {priority} is negative")
        out.priority = priority
    if message_type == v2.TRANSACTION:
        if group or deliver_at_ms or priority:
            raise errors.BadRequest("a TRANSACTION message cannot also have a message group, delivery time or priority")
        out.transactional = True
    elif priority and (group or deliver_at_ms):
        raise errors.BadRequest("a PRIORITY message cannot also have a message group or a delivery time")


def _check_recovery(duration: Duration) -> None:
    """Refused past MAX_TRANSACTION_RECOVERY_S whole seconds, as RocketMQ's proxy refuses it; otherwise unused (the
    broker's --transaction-immunity-s times the first check, docs/PROXY.md "Producer features") —
    tests/unit/proxy/test_producer_features.py::test_a_transactions_recovery_duration_over_an_hour_is_a_bad_request."""
    seconds(duration, what="orphaned_transaction_recovery_duration")
    if duration.seconds > MAX_TRANSACTION_RECOVERY_S:
        raise errors.BadRequest(
            f"orphaned_transaction_recovery_duration {duration.seconds} s is longer than the"
            f" {MAX_TRANSACTION_RECOVERY_S} s allowed"
        )


def _set_ms(target: object, ms: int) -> None:
    target.seconds, target.nanos = divmod(ms, 1000)  # type: ignore[attr-defined]
    target.nanos *= 1_000_000  # type: ignore[attr-defined]


def body_digest(body: bytes) -> str:
    """The body's MD5 as upper-case hex: what RocketMQ's proxy sends and every official client checks alike
    (their CRC32 texts differ: Java unpadded hex, Node.js decimal, Python padded hex). A checksum, not security:
    `usedforsecurity=False` keeps it working where OpenSSL refuses MD5 otherwise (FIPS mode)."""
    return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()


def to_client(popped: bpb.PoppedMessage, *, namespace: str = "", out: v2.Message | None = None) -> v2.Message:
    """A popped broker message as the official clients read it (IDENTITY encoding, MD5 digest).

    ``out``: an empty message to fill in place (a response frame's field: no copy of the message after)."""
    stored = popped.stored
    source = stored.message
    if out is None:
        out = v2.Message()
    body = source.body  # each read of a bytes field is a copy
    out.body = body
    out.topic.name = validate.outside(namespace, source.topic)
    out.topic.resource_namespace = namespace
    if source.properties:
        out.user_properties.update(source.properties)
    props = out.system_properties
    props.message_id = source.message_id
    props.body_digest.type = v2.MD5
    props.body_digest.checksum = body_digest(body)
    props.body_encoding = v2.IDENTITY
    props.keys.extend(source.keys)
    if source.HasField("tag"):
        props.tag = source.tag
    if source.priority:
        props.priority = source.priority
        props.message_type = v2.PRIORITY
    elif source.transactional:
        props.message_type = v2.TRANSACTION
    elif source.message_group:
        props.message_group = source.message_group
        props.message_type = v2.FIFO
    elif source.deliver_at_ms:
        props.message_type = v2.DELAY
        _set_ms(props.delivery_timestamp, source.deliver_at_ms)
    else:
        props.message_type = v2.NORMAL
    _set_ms(props.born_timestamp, source.born_ms)
    props.born_host = source.born_host
    if source.trace_context:
        props.trace_context = source.trace_context
    _set_ms(props.store_timestamp, stored.store_ms)
    props.receipt_handle = popped.receipt_handle
    props.queue_id = stored.queue_id
    props.queue_offset = stored.offset
    props.delivery_attempt = max(1, popped.delivery_attempt)
    return out


# -- the byte path: a delivery spliced into the v2 encoding its broker stored (Message.v2_system) -------------
# The Message is topic, user_properties, system_properties, body, each once: system_properties is the stored
# bytes followed by what is per store and per delivery (store_timestamp, queue_offset, queue_id, receipt_handle,
# delivery_attempt) under one tag and length — a single occurrence of the field, which every protobuf parser
# reads alike (google-protobuf for JavaScript replaces a repeated embedded message where others merge it).
# tests/unit/proxy/test_splice.py checks the bytes parse to `to_client`'s message.


_TABLED = 1 << 12  # sizes below this have their varint in _VARINTS
_VARINTS = [varint(n) for n in range(_TABLED)]
_ATTEMPTS = [DELIVERY_ATTEMPT + SMALL[max(1, n)] for n in range(0x80)]  # delivery_attempt fields (0 or less: 1)


def client_bytes(popped: bpb.PoppedMessage, namespace: str = "") -> bytes:
    """One delivery's v2 Message encoding, by the byte path."""
    return b"".join(client_items([popped], range(1), namespace)[0])


def client_items(
    messages: Sequence[bpb.PoppedMessage],
    indexes: range,
    namespace: str,
    tag: bytes | None = None,
    firsts: list[int] | None = None,
) -> tuple[list[bytes], int]:
    """`messages[indexes]` as byte parts to join, and their total size: each delivery's v2 Message (what `to_client`
    makes of it; its stored system properties computed here for a message stored without them), inside a field
    `tag` unless None. What deliveries of one answer share (their topic, most
    often their store time) is encoded once for them all —
    tests/unit/proxy/test_splice.py::test_an_answers_messages_read_as_each_spliced_alone. Each first delivery's
    `first_since_ms` is added to `firsts`, if given, from the values read here (the proxy's delivery metrics)."""
    parts: list[bytes] = []
    total = 0
    topic = store_ms = None
    topic_head = stamp = b""
    sizes = _VARINTS  # the varints of the sizes most answers have, looked up instead of encoded
    for i in indexes:
        popped = messages[i]
        stored = popped.stored
        source = stored.message
        body = source.body
        system = source.v2_system or static_system(source)
        name = source.topic
        if name != topic:
            topic = name
            topic_head = topic_field(outside(namespace, name) if namespace else name, namespace)
        properties = source.properties
        head = topic_head + user_properties(properties) if properties else topic_head
        ms = stored.store_ms
        if ms != store_ms:
            store_ms = ms
            stamp = timestamp(STORED, ms) + QUEUE_OFFSET
        handle = popped.receipt_handle.encode()
        length = len(handle)
        attempt = popped.delivery_attempt
        if firsts is not None and attempt <= 1:
            due = source.deliver_at_ms
            firsts.append(due if due > ms else ms)
        offset = stored.offset
        queue_id = stored.queue_id
        tail = b"".join(
            (
                stamp,
                sizes[offset] if 0 <= offset < _TABLED else varint(offset),
                QUEUE_ID + varint(queue_id) if queue_id else b"",
                RECEIPT_HANDLE,
                sizes[length] if length < _TABLED else varint(length),
                handle,
                _ATTEMPTS[attempt] if 0 <= attempt < 0x80 else DELIVERY_ATTEMPT + varint(max(1, attempt)),
            )
        )
        inner = len(system) + len(tail)
        system_head = SYSTEM + (sizes[inner] if inner < _TABLED else varint(inner))
        size = len(body)
        body_head = BODY + (sizes[size] if size < _TABLED else varint(size))
        size += len(head) + len(system_head) + inner + len(body_head)
        if tag is not None:
            item_head = tag + (sizes[size] if size < _TABLED else varint(size))
            parts.append(item_head)
            total += len(item_head)
        parts += (head, system_head, system, tail, body_head, body)
        total += size
    return parts, total
