"""Messages on their way to a broker, each encoded once as the broker's `Message` (proto/broker.proto): what
`Proxy.send` routes and a broker Send carries, with no protobuf object made per message on the way.

A `Run` holds messages of one topic and one message group; a SendShared run's messages are its shared part,
encoded once, followed by each message's own id and body (protobuf reads fields in any order) —
tests/unit/proxy/test_outgoing.py::test_a_shared_runs_messages_read_as_the_broker_messages_they_stand_for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from popgate_pb import broker_pb2 as bpb

from popgate_contract.wire import varint

_MESSAGE_ID = b"\x1a"  # Message.message_id (3), length-delimited
_BODY = b"\x22"  # Message.body (4)
_MESSAGES = b"\x0a"  # SendRequest.messages (1)
_SEND = b"\x2a"  # SessionRequest.send (5)
FIELD_OVERHEAD = 8  # at most a SendRequest entry's tag and length, counted with its size against a Send's budget


@dataclass(slots=True)
class Run:
    """Messages to store that share a topic and a message group ("": none), in order: each an encoded broker
    `Message`, and its message id (named in the answer when that message is not stored); `body_bytes`: their
    bodies' size, what a send counts against the proxy's bytes in flight."""

    topic: str
    group: str
    encoded: list[bytes]
    ids: list[str]
    body_bytes: int = 0


def runs_of(messages: Iterable[bpb.Message]) -> list[Run]:
    """`messages` as runs, in order: consecutive messages of one topic and message group share one."""
    runs: list[Run] = []
    last: Run | None = None
    for m in messages:
        topic, group = m.topic, m.message_group
        if last is None or last.topic != topic or last.group != group:
            last = Run(topic, group, [], [])
            runs.append(last)
        last.encoded.append(m.SerializeToString())
        last.ids.append(m.message_id)
        last.body_bytes += len(m.body)
    return runs


def shared_run(template: bpb.Message, bodies: Sequence[bytes], ids: Sequence[str]) -> Run:
    """Messages that are `template` but for their bodies and ids (`template`'s own are not used; both checked
    already): its other fields are encoded once and each message adds its id and body."""
    shared = bpb.Message()
    shared.CopyFrom(template)
    shared.ClearField("message_id")
    shared.ClearField("body")
    head = shared.SerializeToString()
    encoded = []
    body_bytes = 0
    for body, message_id in zip(bodies, ids, strict=True):
        body_bytes += len(body)
        data = message_id.encode()
        encoded.append(b"".join((head, _MESSAGE_ID, varint(len(data)), data, _BODY, varint(len(body)), body)))
    return Run(template.topic, template.message_group, encoded, list(ids), body_bytes)


def send_body(encoded: Sequence[bytes]) -> bytes:
    """The SessionRequest field `send` of a SendRequest carrying `encoded` messages (the request's id is added
    by the session)."""
    request = b"".join([b for data in encoded for b in (_MESSAGES, varint(len(data)), data)])
    return _SEND + varint(len(request)) + request
