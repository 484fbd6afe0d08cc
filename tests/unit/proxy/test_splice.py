"""The byte path of a receive (issue 28 point 2): the v2 system properties a broker stores with a message
(popgate_contract/v2wire.py, set by its send path) with the proxy's store and delivery fields spliced in
(proxy/v2/convert.py) read, in every protobuf parser, as the message `to_client` builds from the same delivery —
whatever the message holds."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import v2wire
from popgate_contract.wire import varint
from proxy.metrics import first_since_ms
from proxy.server import PassBytes
from proxy.v2.convert import body_digest, client_bytes, client_items, to_client
from proxy.v2.receive import V2, BatchFraming

# A drawn message may carry a 70,000-byte body (a three-byte length): hypothesis then warns that the example's repr is
# large, whenever it prints one (a slow run, a failure), and the suite makes warnings errors.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning")

text = st.text(max_size=40)
names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF, exclude_characters="%~"), min_size=1, max_size=30)


@st.composite
def stored_messages(draw: Any) -> bpb.Message:
    m = bpb.Message(
        topic=draw(names),
        message_id=draw(text),
        body=draw(st.one_of(st.binary(max_size=300), st.just(b""), st.just(b"z" * 70_000))),
        keys=draw(st.lists(text, max_size=3)),
        born_ms=draw(st.integers(0, 253_402_300_799_000)),
        born_host=draw(text),
    )
    if draw(st.booleans()):
        m.tag = draw(text)
    if draw(st.booleans()):
        m.trace_context = draw(text)
    m.properties.update(draw(st.dictionaries(text, text, max_size=4)))
    kind = draw(st.sampled_from(["normal", "fifo", "delay", "priority", "transaction", "mixed"]))
    if kind in ("fifo", "mixed"):
        m.message_group = draw(names)
    if kind in ("delay", "mixed"):
        m.deliver_at_ms = draw(st.integers(1, 253_402_300_799_000))
    if kind in ("priority", "mixed"):
        m.priority = draw(st.integers(1, 2**31 - 1))
    if kind in ("transaction", "mixed"):
        m.transactional = True
    return m


deliveries = st.tuples(
    st.integers(0, 2**31 - 1),  # queue id
    st.integers(0, 2**63 - 1),  # offset
    st.integers(0, 253_402_300_799_999),  # store time
    st.integers(-1, 1000),  # attempt (0 or less: read as 1)
    st.text(max_size=120),  # receipt handle
    st.sampled_from(["", "ns", "名前空間"]),  # the client's namespace
)


def both(m: bpb.Message, delivery: tuple[int, int, int, int, str, str], *, sent: bool = True) -> tuple[Any, Any]:
    """The delivery as the broker answers the proxy (with the v2 system properties its send path stored, or
    without: a message stored before them) and as it answers a direct caller."""
    queue_id, offset, store_ms, attempt, handle, namespace = delivery
    stored = bpb.Message()
    stored.CopyFrom(m)
    if namespace:
        stored.topic = f"{namespace}%{m.topic}"
    plain = bpb.PoppedMessage(
        stored=bpb.StoredMessage(message=stored, queue_id=queue_id, offset=offset, store_ms=store_ms),
        receipt_handle=handle,
        delivery_attempt=attempt,
    )
    popped = bpb.PoppedMessage()
    popped.CopyFrom(plain)
    if sent:
        popped.stored.message.v2_system = v2wire.static_system(stored)
    return popped, plain


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored_messages(), deliveries, st.booleans())
def test_a_spliced_message_reads_as_to_client_builds_it(m: bpb.Message, delivery: Any, sent: bool) -> None:
    popped, plain = both(m, delivery, sent=sent)
    namespace = delivery[5]
    expected = to_client(plain, namespace=namespace)
    spliced = client_bytes(popped, namespace)
    assert v2.Message.FromString(spliced) == expected
    assert v2.Message.FromString(client_bytes(plain, namespace)) == expected  # stored before v2_system
    props = v2.Message.FromString(spliced).system_properties
    assert props.body_digest.checksum == body_digest(m.body) and props.HasField("receipt_handle")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored_messages(), deliveries)
def test_the_system_properties_are_one_field_as_a_merging_parser_or_a_replacing_one_reads_them(
    m: bpb.Message, delivery: Any
) -> None:
    # google-protobuf for JavaScript (the Node.js client) replaces a repeated embedded message instead of merging
    # it: the spliced message carries each field once (user_properties, a map, once per entry).
    popped, _ = both(m, delivery)
    data = client_bytes(popped, delivery[5])
    fields = _top_level_fields(data)
    assert [f for f in fields if f != 2] == [1, 3, 4] and fields.count(2) == len(m.properties)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(stored_messages(), deliveries, st.booleans()), min_size=1, max_size=6),
    st.sampled_from(["", "ns"]),
    st.data(),
)
def test_an_answers_messages_read_as_each_spliced_alone(answer: list[Any], namespace: str, data: Any) -> None:
    # What an answer's deliveries share is encoded once for them all: topics and store times alike or not.
    popped = []
    for m, delivery, sent in answer:
        if data.draw(st.booleans()):  # the previous delivery's topic and store time
            m.topic = answer[0][0].topic
            delivery = (*delivery[:2], answer[0][1][2], *delivery[3:])
        popped.append(both(m, (*delivery[:5], namespace), sent=sent)[0])
    alone = [client_bytes(p, namespace) for p in popped]
    parts, size = client_items(popped, range(len(popped)), namespace, b"\x0a")
    assert b"".join(parts) == b"".join(b"\x0a" + varint(len(one)) + one for one in alone) and size == len(
        b"".join(parts)
    )
    start = len(popped) // 2
    parts, size = client_items(popped, range(start, len(popped)), namespace)
    assert b"".join(parts) == b"".join(alone[start:]) and size == sum(map(len, alone[start:]))


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at `buf[pos:]` and the position after it."""
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _top_level_fields(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        assert key & 7 == 2  # every top-level field of a v2 Message is length-delimited
        size, pos = read_varint(data, pos)
        pos += size
        out.append(key >> 3)
    assert pos == len(data)
    return out


def _popped_pair(n: int) -> tuple[list[bpb.PoppedMessage], list[bpb.PoppedMessage]]:
    pairs = [
        both(
            bpb.Message(topic="t", message_id=f"m{i}", body=bytes([i]) * (10 + i), tag="a", born_ms=1_764_000_000_123),
            (i % 4, 100 + i, 1_764_000_000_456, 1 + i % 2, f"h{i}", "ns"),
        )
        for i in range(n)
    ]
    return [p for p, _ in pairs], [q for _, q in pairs]


def test_the_byte_path_and_the_object_path_gather_the_same_first_deliveries() -> None:
    spliced, plain = _popped_pair(5)  # attempts 1, 2, 1, 2, 1
    for messages in (spliced, plain):
        messages[4].stored.message.deliver_at_ms = messages[4].stored.store_ms + 5_000  # delayed: since it was due
    want = first_since_ms(plain)
    assert want == [1_764_000_000_456, 1_764_000_000_456, 1_764_000_005_456]
    for messages in (spliced, plain):
        firsts: list[int] = []
        for i in range(5):
            V2.frame(messages, range(i, i + 1), False, "ns", firsts)
        assert firsts == want
        firsts = []
        BatchFraming(max_bytes=25).frame(messages, range(0, 3), True, "ns", firsts)
        BatchFraming(max_bytes=25).frame(messages, range(3, 5), False, "ns", firsts)
        assert firsts == want


def test_v2_and_batch_frames_of_the_byte_path_read_as_the_object_frames() -> None:
    spliced, plain = _popped_pair(5)
    for i in range(5):
        frame = V2.frame(spliced, range(i, i + 1), False, "ns")
        assert isinstance(frame, bytes)
        assert pb.ReceiveMessageResponse.FromString(frame) == V2.frame(plain, range(i, i + 1), False, "ns")
    framing = BatchFraming(max_bytes=25)
    # Framed by their body sizes (ReceiveResult.body_sizes): a spliced message's are the plain one's.
    assert [len(m.stored.message.body) for m in spliced] == [len(m.stored.message.body) for m in plain]
    for first in (True, False):
        data = framing.frame(spliced, range(1, 4), first, "ns")
        assert isinstance(data, bytes)
        got = ext.ReceiveMessagesResponse.FromString(data)
        want = framing.frame(plain, range(1, 4), first, "ns")
        assert isinstance(want, ext.ReceiveMessagesResponse)
        assert list(got.messages.messages) == list(want.messages.messages)
        assert got.messages.HasField("delivery_timestamp") is first
    mixed = [spliced[0], plain[1]]  # a message stored before v2_system beside one stored with it
    data = framing.frame(mixed, range(0, 2), False, "ns")
    assert isinstance(data, bytes)
    assert list(ext.ReceiveMessagesResponse.FromString(data).messages.messages) == [
        to_client(plain[0], namespace="ns"),
        to_client(plain[1], namespace="ns"),
    ]


class _Server:
    def __init__(self) -> None:
        self.generic: Any = None
        self.registered: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        (self.generic,) = handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.registered = handlers


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def test_registered_methods_write_bytes_as_they_are_and_serialize_objects() -> None:
    from popgate_pb.ext import messaging_pb2_grpc as ext_grpc

    server = _Server()
    ext_grpc.add_MessagingServicer_to_server(ext_grpc.MessagingServicer(), PassBytes(server))  # type: ignore[arg-type,no-untyped-call]
    status = ext.ReceiveMessagesResponse(status=v2.Status(code=v2.OK))
    generic = server.generic.service(_Details("/popgate.ext.v1.Messaging/ReceiveMessages"))
    for handler in (generic, server.registered["ReceiveMessages"]):
        assert handler.response_serializer(b"\x12\x00") == b"\x12\x00"
        assert handler.response_serializer(status) == status.SerializeToString()
    assert server.generic.service(_Details("/popgate.ext.v1.Messaging/Nope")) is None
