"""Sans-IO v2 protocol, the sending side: a message to send from a body and options, checked, and the SendMessage
requests a batch of them goes in. Reading the answer is `_wire.send_receipts`.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract.wire import field

from ._durations import _deliver_at, _set_seconds, duration
from ._ids import HOST, MessageIds
from .message import Message

MAX_SEND_BATCH = 1024  # the proxy's SendMessage and AckMessage limit
MAX_SEND_BYTES = 8 * 1024 * 1024  # body bytes per SendMessage request
PRIORITY_MAX = 2**31 - 1  # v2's priority is an int32


# The host every message says it was born on: this machine's name, as RocketMQ's Java and Node.js clients send it
# (tests/unit/sdk/test_wire.py::test_each_message_of_a_send_request_has_the_shared_fields_and_only_its_own).
BORN_HOST = HOST


def _as_bytes(body: bytes | str) -> bytes:
    if type(body) is bytes:  # the common case, as is (bytes(body) would be body)
        return body
    if isinstance(body, str):
        return body.encode()
    if not isinstance(body, bytes | bytearray | memoryview):  # bytes(5) would be five zero bytes
        raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")
    return bytes(body)


def _as_keys(keys: Sequence[str] | str) -> tuple[str, ...]:
    """A str is one key (tuple("order-1") would be seven one-letter keys)."""
    return (keys,) if isinstance(keys, str) else tuple(keys)


def outgoing(
    body: bytes | str | Message,
    *,
    tag: str | None = None,
    keys: Sequence[str] = (),
    properties: Mapping[str, str] | None = None,
    delay: float | None = None,
    deliver_at: float | None = None,
    message_group: str | None = None,
    priority: int | None = None,
    now: float | None = None,
) -> Message:
    """A `Message` to send from a body or message plus options (options fill fields the message leaves unset)."""
    if delay is not None and deliver_at is not None:
        raise ValueError("give delay or deliver_at, not both")
    if delay is not None:
        now = time.time() if now is None else now
        deliver_at = now + duration("delay", delay)
    if isinstance(body, Message):
        m = body
        out = Message(
            _as_bytes(m.body),
            tag=m.tag if m.tag is not None else tag,
            keys=_as_keys(m.keys or keys),
            properties=_as_properties(m.properties or properties),
            message_group=m.message_group if m.message_group is not None else message_group,
            deliver_at=m.deliver_at if m.deliver_at is not None else deliver_at,
            priority=m.priority if m.priority is not None else priority,
        )
    else:
        # Positionally, in its fields' order — test_wire.py::test_an_outgoing_body_takes_the_call_options_as_its_fields.
        out = Message(
            _as_bytes(body),
            "",
            tag,
            _as_keys(keys),
            _as_properties(properties),
            message_group,
            deliver_at,
            priority,
        )
    _check_fields(out)
    if out.priority is not None and (out.message_group is not None or out.deliver_at is not None):
        raise ValueError("a message with a priority cannot have a message_group or a delay")
    if out.message_group is not None and out.deliver_at is not None:
        # A v2 message is FIFO or DELAY, not both (RocketMQ's clients refuse it the same way).
        raise ValueError("a message with a message_group cannot also have a delay or deliver_at")
    if out.deliver_at is not None:
        _deliver_at(out.deliver_at, time.time() if now is None else now)
    return out


def _as_properties(properties: object) -> dict[str, str]:
    """A message's or a call's properties as a dict: a mapping, or pairs, as `dict` takes them (`send` and `Message`
    alike) — tests/unit/sdk/test_refused.py::test_properties_as_pairs_are_taken_by_a_message_as_by_send."""
    if not properties:
        return {}
    try:
        out: dict[str, str] = dict(properties)  # type: ignore[call-overload]
        return out
    except (TypeError, ValueError):
        raise TypeError(f"properties map str to str, got {properties!r}") from None


def an_int(name: str, value: object) -> int:
    """`value` as an int when it is an integer (numpy's too; a bool is not one), else a TypeError naming the
    argument `name` — tests/unit/sdk/test_refused.py::test_an_argument_of_the_wrong_type_is_refused_naming_it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def a_text(name: str, value: object) -> str:
    """`value` when it is a str of valid UTF-8 text, else a TypeError (not a str) or ValueError (a lone surrogate,
    as from undecodable bytes) naming the argument `name`, where protobuf would raise naming nothing —
    tests/unit/sdk/test_refused.py::test_names_and_texts_of_the_wrong_type_or_not_utf8_are_refused_naming_them."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{name} must be valid UTF-8 text, got {value!r}") from None
    return value


def _check_fields(message: Message) -> None:
    """Refuse, naming the argument, what protobuf would refuse with no name —
    tests/unit/sdk/test_refused.py::test_a_bad_property_or_priority_is_refused_naming_the_argument."""
    if message.tag is not None:
        a_text("tag", message.tag)
    if message.message_group is not None:
        a_text("message_group", message.message_group)
    for key in message.keys:
        a_text("keys", key)
    for key, value in message.properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"properties map str to str, got {key!r}: {value!r}")
        a_text("properties", key)
        a_text("properties", value)
    priority = message.priority
    if priority is None:
        return
    if not 0 <= an_int("priority", priority) <= PRIORITY_MAX:
        raise ValueError(f"priority must be >= 0 and <= {PRIORITY_MAX}, got {priority}")


def send_template(topic: str, *, namespace: str = "", now: float) -> v2.Message:
    """What every message of one SendMessage request carries alike (topic, born time and host, encoding, the
    NORMAL type the others replace), copied into each before `_fill` sets its own fields —
    tests/unit/sdk/test_wire.py::test_each_message_of_a_send_request_has_the_shared_fields_and_only_its_own."""
    out = v2.Message()
    out.topic.name = topic
    if namespace:
        out.topic.resource_namespace = namespace
    props = out.system_properties
    props.body_encoding = v2.IDENTITY
    props.born_host = BORN_HOST
    _set_seconds(props.born_timestamp, now)
    props.message_type = v2.NORMAL
    return out


def _fill(out: v2.Message, message: Message, message_id: str, *, transactional: bool) -> v2.Message:
    """`out`, a copy of `send_template`'s message, given the fields `message` has of its own."""
    out.body = message.body
    if message.properties:
        out.user_properties.update(message.properties)
    props = out.system_properties
    props.message_id = message_id
    if message.tag is not None:
        props.tag = message.tag
    if message.keys:
        props.keys.extend(message.keys)
    if transactional:
        if message.message_group is not None or message.deliver_at is not None or message.priority is not None:
            raise ValueError("a transaction's message cannot have a message_group, a delay or a priority")
        props.message_type = v2.TRANSACTION
    elif message.priority is not None:
        props.priority = message.priority
        props.message_type = v2.PRIORITY
    elif message.message_group is not None:
        props.message_group = message.message_group
        props.message_type = v2.FIFO
    elif message.deliver_at is not None:
        _set_seconds(props.delivery_timestamp, message.deliver_at)
        props.message_type = v2.DELAY
    return out


def send_requests(
    topic: str, messages: Sequence[Message], ids: MessageIds, *, namespace: str = "", transactional: bool = False
) -> list[pb.SendMessageRequest]:
    """SendMessage requests for a batch, split at MAX_SEND_BATCH messages or MAX_SEND_BYTES body bytes."""
    template = send_template(topic, namespace=namespace, now=time.time())

    def fill(out: v2.Message, index: int, message_id: str) -> None:
        _fill(out, messages[index], message_id, transactional=transactional)

    return _batched(template, [m.body for m in messages], ids.many(len(messages)), fill)


def shared_requests(
    topic: str,
    bodies: Sequence[bytes],
    shared: Message,
    ids: MessageIds,
    *,
    namespace: str = "",
    transactional: bool = False,
) -> list[pb.SendMessageRequest]:
    """`send_requests` for plain bodies that all have the options of `shared` (`outgoing` of an empty body): the
    options are set once, in the template each message copies — the requests `send_requests` makes of each body's
    own `outgoing` message —
    tests/unit/sdk/test_wire.py::test_bodies_sharing_their_options_are_sent_as_their_messages_would_be."""
    template = send_template(topic, namespace=namespace, now=time.time())
    _fill(template, shared, "", transactional=transactional)
    return _batched(template, bodies, ids.many(len(bodies)), _body_and_id(bodies))


def _body_and_id(bodies: Sequence[bytes]) -> Callable[[v2.Message, int, str], None]:
    def fill(out: v2.Message, index: int, message_id: str) -> None:
        out.body = bodies[index]
        out.system_properties.message_id = message_id

    return fill


@dataclass(slots=True)
class SharedSend:
    """Messages alike but for their bodies and ids: popgate's SendShared of one run (proto/ext/messaging.proto), or
    `as_v2` the v2 SendMessage of the same messages, for a proxy without SendShared."""

    shared: v2.Message  # what every message carries: no body, no message id
    bodies: list[bytes]
    message_ids: list[str]

    def SerializeToString(self) -> bytes:  # noqa: N802 (as the protobuf messages the Session serializes)
        """The SendShared of these messages: one run."""
        run = ext.SharedMessages(bodies=self.bodies, message_ids=self.message_ids)
        return field(b"\x0a", field(b"\x0a", self.shared.SerializeToString()) + run.SerializeToString())

    def as_v2(self) -> pb.SendMessageRequest:
        return _batched(self.shared, self.bodies, self.message_ids, _body_and_id(self.bodies))[0]


SendPlan = pb.SendMessageRequest | SharedSend  # what one send call carries


def sent_count(request: SendPlan) -> int:
    return len(request.message_ids) if isinstance(request, SharedSend) else len(request.messages)


def sent_id(request: SendPlan, index: int) -> str:
    """The message id the producer gave message `index` of `request`."""
    if isinstance(request, SharedSend):
        return request.message_ids[index]
    return str(request.messages[index].system_properties.message_id)


def in_a_group(request: SendPlan) -> bool:
    """Whether a message of `request` has a message group (FIFO)."""
    if isinstance(request, SharedSend):
        return bool(request.shared.system_properties.message_group)
    return any(m.system_properties.message_group for m in request.messages)


def shared_sends(
    topic: str, bodies: Sequence[bytes], shared: Message, ids: MessageIds, *, namespace: str = ""
) -> list[SharedSend]:
    """The SharedSends of plain bodies that all have the options of `shared` (`outgoing` of an empty body), split
    where `send_requests` splits — tests/unit/sdk/test_wire.py::test_a_shared_send_is_the_send_of_its_messages."""
    template = send_template(topic, namespace=namespace, now=time.time())
    _fill(template, shared, "", transactional=False)
    message_ids = ids.many(len(bodies))
    out: list[SharedSend] = []
    start = size = 0
    for index, body in enumerate(bodies):
        if index > start and (index - start >= MAX_SEND_BATCH or size + len(body) > MAX_SEND_BYTES):
            out.append(SharedSend(template, list(bodies[start:index]), message_ids[start:index]))
            start, size = index, 0
        size += len(body)
    if start < len(bodies):
        out.append(SharedSend(template, list(bodies[start:]), message_ids[start:]))
    return out


def _batched(
    template: v2.Message, bodies: Sequence[bytes], ids: Sequence[str], fill: Callable[[v2.Message, int, str], None]
) -> list[pb.SendMessageRequest]:
    requests: list[pb.SendMessageRequest] = []
    current = pb.SendMessageRequest()
    add = current.messages.add
    count = size = 0
    for index, message_id in enumerate(ids):
        length = len(bodies[index])
        if count and (count >= MAX_SEND_BATCH or size + length > MAX_SEND_BYTES):
            requests.append(current)
            current, count, size = pb.SendMessageRequest(), 0, 0
            add = current.messages.add
        out = add()  # built in place: no message copied into the request
        out.CopyFrom(template)
        fill(out, index, message_id)
        count += 1
        size += length
    if count:
        requests.append(current)
    return requests
