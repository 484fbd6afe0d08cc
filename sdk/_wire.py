"""Sans-IO v2 protocol: request building, response reading. No sockets, no grpc.

The headers every call carries are in `_metadata`, client and message ids in `_ids`, duration checks in
`_durations`, the building of sends in `_wire_send`.

The sync and asyncio clients both do their I/O around these functions, so everything
that decides *what* goes on the wire is tested once, without a server.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from . import errors
from ._body import digest_mismatch, inflated
from ._durations import _set_seconds, duration
from ._wire_send import MAX_SEND_BATCH as MAX_SEND_BATCH
from ._wire_send import SendPlan as SendPlan
from ._wire_send import SharedSend as SharedSend
from ._wire_send import an_int, sent_count, sent_id
from ._wire_send import outgoing as outgoing
from ._wire_send import send_requests as send_requests
from ._wire_send import shared_requests as shared_requests
from ._wire_send import shared_sends as shared_sends
from .message import Message, SendReceipt

SUCCESS = frozenset({v2.OK, v2.MULTIPLE_RESULTS})


def check(status: v2.Status) -> None:
    """Raise the typed error for a non-success status."""
    if status.code not in SUCCESS:
        raise errors.error_for(status.code, status.message)


# A frozen dataclass's __init__ sets each field through object.__setattr__; `_receipt` sets the slots directly, each
# by its name: a field renamed fails here, at import, and a field added too, until `_receipt` sets it.
_RECEIPT_SETTERS = {f.name: getattr(SendReceipt, f.name).__set__ for f in fields(SendReceipt)}
_SET_ID, _SET_TOPIC, _SET_OFFSET, _SET_RECALL, _SET_TRANSACTION = (
    _RECEIPT_SETTERS.pop(name) for name in ("message_id", "topic", "offset", "recall_handle", "transaction_id")
)
if _RECEIPT_SETTERS:
    raise ImportError(f"popgate._wire._receipt does not set SendReceipt's {sorted(_RECEIPT_SETTERS)}")


def _receipt(message_id: str, topic: str, offset: int, recall_handle: str, transaction_id: str) -> SendReceipt:
    """``SendReceipt(message_id, topic, offset, recall_handle, transaction_id)``, built faster —
    tests/unit/sdk/test_wire.py::test_send_receipts_and_errors."""
    out = object.__new__(SendReceipt)
    _SET_ID(out, message_id)
    _SET_TOPIC(out, topic)
    _SET_OFFSET(out, offset)
    _SET_RECALL(out, recall_handle)
    _SET_TRANSACTION(out, transaction_id)
    return out


class SendAnswer(Protocol):
    """What `send_receipts` reads of a SendMessage answer: the answer itself, or one caller's part of a joined
    one (`_joining.PartAnswer`)."""

    @property
    def status(self) -> v2.Status: ...

    @property
    def entries(self) -> Sequence[pb.SendResultEntry]: ...


def send_receipts(topic: str, request: SendPlan, response: SendAnswer) -> list[SendReceipt]:
    """The receipts of a SendMessage answer; its error otherwise. An error whose entries say some messages
    were stored (a popgate proxy whose brokers stored some of the request's message groups) carries their
    ``receipts`` and is not retriable: sent again whole, those would be stored twice."""
    count = sent_count(request)
    if response.status.code not in SUCCESS and len(response.entries) == count:
        stored: list[SendReceipt | None] = [  # each whole, as a stored message's receipt is (recall, transaction)
            _receipt(entry.message_id or sent_id(request, i), topic, entry.offset, entry.recall_handle,
                     entry.transaction_id)
            if entry.HasField("status") and entry.status.code == v2.OK
            else None
            for i, entry in enumerate(response.entries)
        ]  # fmt: skip
        if any(stored):
            error = errors.error_for(response.status.code, response.status.message)
            error.receipts, error.retriable = stored, False
            raise error
    check(response.status)
    if len(response.entries) != count:
        raise errors.ServerError(f"SendMessage answered {len(response.entries)} entries for {count}")
    out = []
    for i, entry in enumerate(response.entries):
        if entry.HasField("status"):
            status = entry.status
            if status.code not in SUCCESS:
                raise errors.error_for(status.code, status.message)  # check(status)
        message_id = entry.message_id or sent_id(request, i)  # an entry's id, when it echoes none
        out.append(_receipt(message_id, topic, entry.offset, entry.recall_handle, entry.transaction_id))
    return out


def _seconds(ts: object) -> float:
    return ts.seconds + ts.nanos / 1e9  # type: ignore[attr-defined, no-any-return]


_has = v2.SystemProperties.HasField  # unbound: no bound method made per message
_GZIP = v2.GZIP


def _optional(props: v2.SystemProperties, name: str) -> Any:
    """An optional system property's value; None when unset."""
    return getattr(props, name) if _has(props, name) else None


def _present(props: v2.SystemProperties, name: str, absent: int) -> int:
    """An optional scalar's value; `absent` when unset (nonzero, it is set: HasField only tells an unset one from
    one set to 0)."""
    value: int = getattr(props, name)
    return value if value or _has(props, name) else absent


# Each field of a received message read from its system properties when first asked (`ReceivedMessage`).
_LATER: dict[str, Callable[[v2.SystemProperties], Any]] = {
    "tag": lambda p: _optional(p, "tag"),
    "keys": lambda p: tuple(p.keys),
    "message_group": lambda p: _optional(p, "message_group"),
    "deliver_at": lambda p: _seconds(p.delivery_timestamp) if _has(p, "delivery_timestamp") else None,
    "priority": lambda p: _optional(p, "priority"),
    "born_at": lambda p: _seconds(p.born_timestamp),
    "stored_at": lambda p: _seconds(p.store_timestamp),
    "queue_id": lambda p: p.queue_id,
    "offset": lambda p: _present(p, "queue_offset", -1),
    "born_host": lambda p: p.born_host,
}
_AT_ONCE = frozenset({"body", "topic", "properties", "message_id", "receipt_handle", "attempt"})  # by `from_v2`
# A field added to Message and read neither at once nor later would be missing from every received message: fails
# here, at import.
if _unread := {f.name for f in fields(Message)} ^ (_AT_ONCE | _LATER.keys()):
    raise ImportError(f"popgate._wire reads no received message's {sorted(_unread)}")
_FIELDS = tuple(f.name for f in fields(Message))


class ReceivedMessage(Message):
    """A received `Message`. What consuming and acking read (body, topic, properties, message_id, receipt_handle,
    attempt) is read at once; each other field from its system properties, kept serialized (nothing of the answer
    it came in), the first time it is asked (most consumers never read them). Set, a field keeps what was set. It
    compares equal to a `Message` with the same fields, and copies and pickles as one.

    Each field has its value and type whatever the v2 fields set —
    tests/unit/sdk/test_wire.py::test_a_received_message_carries_each_v2_field_with_its_value_and_type, and
    tests/unit/sdk/test_wire.py::test_a_received_message_reads_as_a_message_whatever_its_fields_were_read_or_set."""

    __slots__ = ("_system",)
    _system: bytes | v2.SystemProperties  # serialized, then parsed once a field is read from it

    def __getattr__(self, name: str) -> Any:  # only for a field not set (its slot empty)
        read = _LATER.get(name)
        if read is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            system = self._system
        except AttributeError:  # made whole (as by dataclasses.replace), then the field deleted
            raise AttributeError(f"{name!r} of this received message was deleted") from None
        if isinstance(system, bytes):
            system = self._system = v2.SystemProperties.FromString(system)
        value = read(system)
        setattr(self, name, value)
        return value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _FIELDS)

    __hash__ = None  # type: ignore[assignment]  # as Message's: mutable

    def __reduce__(self) -> tuple[type[Message], tuple[Any, ...]]:
        return Message, tuple(getattr(self, name) for name in _FIELDS)


_new = object.__new__
_md5 = hashlib.md5
_MD5 = v2.MD5


class _Corrupt(Exception):
    def __init__(self, message: ReceivedMessage, why: str) -> None:
        self.message, self.why = message, why


def from_v2(message: v2.Message) -> ReceivedMessage:
    """A received v2 message as the SDK's `Message`; one whose body is corrupt too, its body as it came (to be given
    back: `received` tells them apart)."""
    try:
        return _decoded(message)
    except _Corrupt as exc:
        return exc.message


def _decoded(message: v2.Message) -> ReceivedMessage:
    """`from_v2` (a consumer's main cost per message: see `ReceivedMessage`); `_Corrupt` for a body that does not
    match its digest or does not inflate, checked as RocketMQ's clients check it: the digest of the body as it came —
    tests/unit/sdk/test_corrupt.py::test_a_body_that_does_not_inflate_or_match_its_digest_is_marked_corrupted."""
    props = message.system_properties
    out: ReceivedMessage = _new(ReceivedMessage)
    body = message.body
    why = None
    digest = props.body_digest
    kind = digest.type  # MD5, what RocketMQ's proxy and popgate's send, checked here at its cheapest
    if kind and not (kind == _MD5 and _md5(body, usedforsecurity=False).hexdigest().upper() == digest.checksum):
        why = digest_mismatch(kind, digest.checksum, body)
    if props.body_encoding == _GZIP and why is None:
        body, why = inflated(body)
    out.body = body
    out.topic = message.topic.name
    user = message.user_properties
    out.properties = {key: user[key] for key in user} if user else {}  # dict(map) goes the slow Mapping way
    out.message_id = props.message_id
    out.receipt_handle = props.receipt_handle
    attempt = props.delivery_attempt
    out.attempt = attempt if attempt or _has(props, "delivery_attempt") else 1
    out._system = props.SerializeToString()
    if why is not None:
        raise _Corrupt(out, why)
    return out


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str = "*"


def receive_request(
    group: str, sub: Subscription, *, max: int, invisible: float, wait: float, namespace: str = ""
) -> pb.ReceiveMessageRequest:
    max = an_int("max", max)
    if not 1 <= max <= 32:
        raise ValueError(f"max must be 1..32, got {max}")
    request = pb.ReceiveMessageRequest(batch_size=max)  # its parts set in place: no Resource built and copied in
    request.group.name = group
    topic = request.message_queue.topic
    topic.name = sub.topic
    if namespace:
        request.group.resource_namespace = topic.resource_namespace = namespace
    filter_expression = request.filter_expression
    filter_expression.type = v2.TAG
    filter_expression.expression = sub.expression
    _set_seconds(request.invisible_duration, duration("invisible", invisible, positive=True))
    _set_seconds(request.long_polling_timeout, duration("wait", wait))
    return request


def received(
    frames: Iterable[pb.ReceiveMessageResponse | ext.ReceiveMessagesResponse],
    corrupt: list[tuple[Message, str]] | None = None,
) -> list[Message]:
    """The messages of a ReceiveMessage stream (a frame per message) or a ReceiveMessages one (many per frame);
    raises for an error status (MESSAGE_NOT_FOUND is empty), and a retriable Unavailable for messages whose answer
    ended without its status (v2: discarded, the proxy gives them back; the caller gives them back too) —
    tests/unit/sdk/test_no_status.py. With `corrupt`, a message whose body does not match its
    digest or does not inflate goes there, with why, instead (to be given back); without, it is returned too."""
    messages: list[Message] = []
    status: v2.Status | None = None
    for frame in frames:
        kind = frame.WhichOneof("content")
        if kind == "messages":
            some = frame.messages.messages  # type: ignore[union-attr]
            before = len(messages)
            try:
                messages += map(_decoded, some)
            except _Corrupt:  # rare: the frame read again one message at a time
                del messages[before:]
                for one in some:
                    try:
                        messages.append(_decoded(one))
                    except _Corrupt as exc:
                        _set_aside(exc, messages, corrupt)
        elif kind == "message":
            try:
                messages.append(_decoded(frame.message))  # type: ignore[union-attr]
            except _Corrupt as exc:
                _set_aside(exc, messages, corrupt)
        elif kind == "status":
            status = frame.status
    if status is None and (messages or corrupt):
        raise errors.Unavailable("the receive's answer ended without its status", retriable=True)
    if status is not None and status.code != v2.MESSAGE_NOT_FOUND:
        check(status)
    return messages


def all_messages(frames: Iterable[pb.ReceiveMessageResponse | ext.ReceiveMessagesResponse]) -> list[Message]:
    """Every message of a receive's frames, whatever its body or the answer's status: what is given back of an answer
    nobody gets."""
    out: list[Message] = []
    for frame in frames:
        kind = frame.WhichOneof("content")
        if kind == "messages":
            out += map(from_v2, frame.messages.messages)  # type: ignore[union-attr]
        elif kind == "message":
            out.append(from_v2(frame.message))  # type: ignore[union-attr]
    return out


def _set_aside(exc: _Corrupt, messages: list[Message], corrupt: list[tuple[Message, str]] | None) -> None:
    if corrupt is None:
        messages.append(exc.message)
    else:
        corrupt.append((exc.message, exc.why))


def ack_request(group: str, topic: str, messages: Sequence[Message], *, namespace: str = "") -> pb.AckMessageRequest:
    """An AckMessage of `messages`, each entry its message's id and receipt handle, in order —
    tests/unit/sdk/test_wire.py::test_an_ack_plan_has_a_request_per_topic_and_batch_with_each_message_in_order."""
    request = pb.AckMessageRequest()  # its parts set in place: no Resource or entry built and copied in
    request.group.name = group
    request.topic.name = topic
    if namespace:
        request.group.resource_namespace = request.topic.resource_namespace = namespace
    add = request.entries.add
    for m in messages:
        entry = add()  # fields set one by one: cheaper than add(**fields)
        entry.message_id = m.message_id
        entry.receipt_handle = m.receipt_handle
    return request


def ack_failures(response: pb.AckMessageResponse) -> list[tuple[str, errors.PopgateError]]:
    """Per-entry failures of an AckMessage; raises when the whole call failed without entries."""
    if response.status.code == v2.OK:
        return []
    failed = [
        (e.message_id, errors.error_for(e.status.code, e.status.message))
        for e in response.entries
        if e.HasField("status") and e.status.code != v2.OK
    ]
    if not failed:
        check(response.status)
    return failed


def change_invisible_request(
    group: str, message: Message, invisible: float, *, namespace: str = ""
) -> pb.ChangeInvisibleDurationRequest:
    if not isinstance(message, Message):
        raise TypeError(f"only a received Message can be nacked, got {type(message).__name__}: {message!r}")
    request = pb.ChangeInvisibleDurationRequest(
        group=v2.Resource(name=group, resource_namespace=namespace),
        topic=v2.Resource(name=message.topic, resource_namespace=namespace),
        receipt_handle=message.receipt_handle,
        message_id=message.message_id,
    )
    _set_seconds(request.invisible_duration, duration("delay", invisible))  # nack(message, delay)
    return request


def dlq_request(
    group: str, message: Message, *, max_attempts: int = 17, namespace: str = ""
) -> pb.ForwardMessageToDeadLetterQueueRequest:
    return pb.ForwardMessageToDeadLetterQueueRequest(
        group=v2.Resource(name=group, resource_namespace=namespace),
        topic=v2.Resource(name=message.topic, resource_namespace=namespace),
        receipt_handle=message.receipt_handle,
        message_id=message.message_id,
        delivery_attempt=message.attempt,
        max_delivery_attempts=max_attempts,
    )


def received_chunks(messages: Iterable[Message], verb: str) -> Iterator[tuple[str, list[Message]]]:
    """`messages` by topic (in the order topics first come) in chunks of MAX_SEND_BATCH, each in the order given; a
    message without topic or receipt handle (no receive returned it) is a ValueError before anything is yielded —
    tests/unit/sdk/test_ack_nowait.py::test_a_message_never_received_is_refused_at_the_call_waiting_or_not."""
    try:
        by_topic = group_by_topic(messages)
    except AttributeError:  # not a Message (no per-message check on the ack path: its cost only when one fails)
        raise TypeError(f"only a received Message can be {verb}") from None
    for topic, listed in by_topic.items():
        if not topic or not all(m.receipt_handle for m in listed):
            raise ValueError(f"only a received message can be {verb}: it has no topic or no receipt handle")
    for topic, listed in by_topic.items():
        for i in range(0, len(listed), MAX_SEND_BATCH):
            yield topic, listed[i : i + MAX_SEND_BATCH]


def group_by_topic(messages: Iterable[Message]) -> dict[str, list[Message]]:
    """The messages of each topic, in the order given, topics in the order they first come —
    tests/unit/sdk/test_wire.py::test_an_ack_plan_has_a_request_per_topic_and_batch_with_each_message_in_order."""
    listed = list(messages)
    if len({m.topic for m in listed}) == 1:  # a receive's messages: one topic, one set built instead of a dict
        return {listed[0].topic: listed}
    out: dict[str, list[Message]] = {}
    for m in listed:
        out.setdefault(m.topic, []).append(m)
    return out


def recall_request(topic: str, recall_handle: str, *, namespace: str = "") -> pb.RecallMessageRequest:
    if not recall_handle:
        raise ValueError("recall_handle must not be empty (a scheduled message's SendReceipt.recall_handle)")
    return pb.RecallMessageRequest(
        topic=v2.Resource(name=topic, resource_namespace=namespace), recall_handle=recall_handle
    )


def end_transaction_request(
    topic: str, message_id: str, transaction_id: str, commit: bool | None, *, from_check: bool, namespace: str = ""
) -> pb.EndTransactionRequest:
    """``commit``: True commits, False rolls back, None says "unknown yet" (a checker's answer: checked again)."""
    resolution = v2.TRANSACTION_RESOLUTION_UNSPECIFIED if commit is None else v2.COMMIT if commit else v2.ROLLBACK
    return pb.EndTransactionRequest(
        topic=v2.Resource(name=topic, resource_namespace=namespace),
        message_id=message_id,
        transaction_id=transaction_id,
        resolution=resolution,
        source=v2.SOURCE_SERVER_CHECK if from_check else v2.SOURCE_CLIENT,
    )


def producer_settings(topics: Sequence[str], *, namespace: str = "") -> pb.TelemetryCommand:
    """A producer's Telemetry settings: the topics it publishes to, so the proxy sends it their checks."""
    command = pb.TelemetryCommand()
    settings = command.settings
    settings.client_type = v2.PRODUCER
    settings.publishing.topics.extend(v2.Resource(name=t, resource_namespace=namespace) for t in topics)
    return command
