"""The sans-IO protocol layer: what goes on the wire and how answers are read, without a server."""

from __future__ import annotations

import copy
import dataclasses
import gc
import gzip
import hashlib
import hmac
import itertools
import pickle
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message as ProtoMessage
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import _ids, _metadata, _wire, _wire_send, errors
from popgate._base import ConsumerBase
from popgate.message import Message, SendReceipt


def test_authorization_header_is_the_official_mqv2_hmac_sha1() -> None:
    meta = dict(
        _metadata.CallMetadata(client_id="c", credentials=_metadata.Credentials("AK", "SK"))(now=1_700_000_000.5)
    )
    assert meta["x-mq-date-time"] == "20231114T221320Z"
    expected = hmac.new(b"SK", b"20231114T221320Z", hashlib.sha1).hexdigest()
    assert meta["authorization"] == (
        f"MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time, Signature={expected}"
    )
    assert meta["x-mq-protocol"] == "GRPC_V2" and meta["x-mq-language"] == "PYTHON"
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["x-mq-request-id"])


def test_no_credentials_no_authorization_header_and_request_ids_differ() -> None:
    metadata = _metadata.CallMetadata(client_id="c")
    first, second = dict(metadata()), dict(metadata())
    assert "authorization" not in first
    assert first["x-mq-request-id"] != second["x-mq-request-id"]
    assert "SK" not in repr(_metadata.Credentials("AK", "SK"))


def test_message_ids_have_the_official_format_and_are_unique() -> None:
    ids = _ids.MessageIds()
    made = [ids() for _ in range(1000)]
    assert len(set(made)) == 1000
    assert all(re.fullmatch(r"01[0-9A-F]{32}", i) for i in made)


# A pre-forking server (gunicorn, multiprocessing "fork"): the generator made at import is shared by the workers.
FORKED_WORKERS = """
import os
from popgate._base import ProducerBase

ProducerBase._ids()  # the parent sends before forking (or not: the children must differ either way)
read, write = os.pipe()
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        os.write(write, f"{os.getpid()} {ProducerBase._ids()} {ProducerBase._ids()}\\n".encode())
        os._exit(0)
    os.waitpid(pid, 0)
os.close(write)
print(os.read(read, 4096).decode(), end="")
print(os.getpid(), ProducerBase._ids())
"""


def test_forked_workers_do_not_repeat_each_others_message_ids() -> None:
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", FORKED_WORKERS], cwd=root, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    rows = [line.split() for line in out.splitlines()]
    made = [i for row in rows for i in row[1:]]
    assert len(rows) == 3 and len(made) == 5
    assert len(set(made)) == len(made), out
    for pid, *ids in rows:  # each process's ids carry its own pid, as the official format has it
        assert all(i[14:18] == f"{int(pid) & 0xFFFF:04X}" for i in ids)


def test_generators_whose_pids_share_the_low_16_bits_start_apart() -> None:
    # Two processes whose pids differ by a multiple of 65536 (pid_max is 4194304 on current Linux) have
    # the same id prefix; the counter's random start keeps their ids apart. Two generators in one
    # process stand for them.
    first, second = _ids.MessageIds(), _ids.MessageIds()
    assert first()[:18] == second()[:18]
    assert {first() for _ in range(100)}.isdisjoint(second() for _ in range(100))


class OneId:
    """Ids for a test's send request: each one `message_id`."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id

    def many(self, count: int) -> list[str]:
        return [self.message_id] * count


def sent_alone(topic: str, message: Message, message_id: str) -> v2.Message:
    """`message` as `send_requests` puts it in a SendMessage request of its own."""
    [request] = _wire.send_requests(topic, [message], OneId(message_id))
    return request.messages[0]


def test_outgoing_message_fields() -> None:
    m = _wire.outgoing("héllo", tag="t", keys=["k1"], properties={"a": "b"}, delay=10, now=1000.0)
    sent = sent_alone("orders", m, "ID")
    props = sent.system_properties
    assert sent.body == "héllo".encode() and sent.topic.name == "orders"
    assert props.tag == "t" and list(props.keys) == ["k1"] and dict(sent.user_properties) == {"a": "b"}
    assert props.message_type == v2.DELAY and props.delivery_timestamp.seconds == 1010
    assert props.body_encoding == v2.IDENTITY and props.message_id == "ID"
    fifo = sent_alone("orders", _wire.outgoing(b"x", message_group="g"), "ID2")
    assert fifo.system_properties.message_type == v2.FIFO and fifo.system_properties.message_group == "g"
    with pytest.raises(ValueError):
        _wire.outgoing(b"x", delay=1, deliver_at=2)


def test_an_outgoing_body_takes_the_call_options_as_its_fields() -> None:
    props = {"a": "b"}
    m = _wire.outgoing(bytearray(b"ab"), tag="t", keys="order-1", properties=props, priority=2)
    assert m == Message(b"ab", tag="t", keys=("order-1",), properties={"a": "b"}, priority=2)
    assert type(m.body) is bytes and m.properties is not props  # a copy: the caller's dict stays the caller's
    later = _wire.outgoing(memoryview(b"cd"), keys=["k1", "k2"], message_group=None, deliver_at=1000.5, now=1000.0)
    assert later == Message(b"cd", keys=("k1", "k2"), deliver_at=1000.5)
    assert _wire.outgoing("é", message_group="g") == Message("é".encode(), message_group="g")
    with pytest.raises(TypeError, match="bytes or str, not int"):
        _wire.outgoing(5)


def test_a_message_object_keeps_its_own_fields_over_the_call_options() -> None:
    m = _wire.outgoing(Message(b"x", tag="own"), tag="default", keys=["k"])
    assert m.tag == "own" and list(m.keys) == ["k"]


def test_send_batches_split_by_count_and_bytes() -> None:
    ids = _ids.MessageIds()
    small = [_wire.outgoing(b"x") for _ in range(2500)]
    assert [len(r.messages) for r in _wire.send_requests("t", small, ids)] == [1024, 1024, 452]
    big = [_wire.outgoing(b"x" * (3 * 1024 * 1024)) for _ in range(5)]
    assert [len(r.messages) for r in _wire.send_requests("t", big, ids)] == [2, 2, 1]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"tag": "t", "keys": ["k1", "k2"], "properties": {"p": "q"}},
        {"message_group": "g"},
        {"deliver_at": 1000.5, "now": 1000.0},
        {"priority": 3},
    ],
)
@pytest.mark.parametrize("transactional", [False, True])
def test_bodies_sharing_their_options_are_sent_as_their_messages_would_be(
    options: dict[str, Any], transactional: bool
) -> None:
    bodies = [b"a", b"", b"x" * 300]
    try:
        expected = _wire.send_requests(
            "orders",
            [_wire.outgoing(b, **options) for b in bodies],
            _ids.MessageIds(),
            namespace="ns",
            transactional=transactional,
        )
    except ValueError as refused:  # a transaction's message with a group, delay or priority
        with pytest.raises(ValueError, match=re.escape(str(refused))):
            _wire.shared_requests(
                "orders", bodies, _wire.outgoing(b"", **options), _ids.MessageIds(), transactional=True
            )
        return
    shared = _wire.shared_requests(
        "orders", bodies, _wire.outgoing(b"", **options), _ids.MessageIds(), namespace="ns", transactional=transactional
    )
    for requests in (expected, shared):  # each call stamps its own born time and ids
        for m in requests[0].messages:
            m.system_properties.ClearField("born_timestamp")
            m.system_properties.ClearField("message_id")
    assert shared == expected


@pytest.mark.parametrize(
    "options", [{}, {"tag": "t", "keys": ["k1"], "properties": {"p": "q"}}, {"message_group": "g"}, {"priority": 3}]
)
def test_a_shared_send_is_the_send_of_its_messages(options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A SharedSend serialized is a SendShared of one run whose messages are those `shared_requests` sends (its
    `as_v2`), split where they are split."""
    monkeypatch.setattr(_wire_send, "MAX_SEND_BATCH", 2)
    bodies = [b"a", b"b", b"x" * 300]
    sends = _wire.shared_sends("orders", bodies, _wire.outgoing(b"", **options), _ids.MessageIds(), namespace="ns")
    assert [s.bodies for s in sends] == [[b"a", b"b"], [b"x" * 300]]
    for send in sends:
        (run,) = ext.SendShared.FromString(send.SerializeToString()).runs
        assert (run.shared, run.bodies, run.message_ids) == (send.shared, send.bodies, send.message_ids)
        assert not run.shared.body and not run.shared.system_properties.message_id
        expected = pb.SendMessageRequest()
        for body, message_id in zip(run.bodies, run.message_ids, strict=True):
            m = expected.messages.add()
            m.CopyFrom(run.shared)
            m.body, m.system_properties.message_id = body, message_id
        assert send.as_v2() == expected
        assert [_wire_send.sent_id(send, i) for i in range(len(send.bodies))] == send.message_ids
        assert _wire_send.in_a_group(send) == ("message_group" in options)
    alone = _wire.shared_requests("orders", bodies, _wire.outgoing(b"", **options), _ids.MessageIds(), namespace="ns")
    converted = [s.as_v2() for s in sends]
    for request in [*alone, *converted]:
        for m in request.messages:
            m.system_properties.ClearField("born_timestamp")
            m.system_properties.ClearField("message_id")
    assert [m for r in converted for m in r.messages] == [m for r in alone for m in r.messages]


def test_each_message_of_a_send_request_has_the_shared_fields_and_only_its_own() -> None:
    messages = [
        _wire.outgoing(b"plain"),
        _wire.outgoing(b"own", tag="t", keys=["k"], properties={"p": "q"}, message_group="g"),
        _wire.outgoing(b"later", deliver_at=1000.5, now=1000.0),
        _wire.outgoing(b"high", priority=3),
        _wire.outgoing(b"plain again"),
    ]
    ids = _ids.MessageIds()
    [request] = _wire.send_requests("orders", messages, ids, namespace="ns")
    sent = list(request.messages)
    for m in sent:
        assert (m.topic.name, m.topic.resource_namespace, m.system_properties.born_host) == (
            "orders",
            "ns",
            _ids.HOST,
        )
        assert m.system_properties.body_encoding == v2.IDENTITY
        assert m.system_properties.born_timestamp == sent[0].system_properties.born_timestamp
    types = [m.system_properties.message_type for m in sent]
    assert types == [v2.NORMAL, v2.FIFO, v2.DELAY, v2.PRIORITY, v2.NORMAL]
    own = sent[1]
    assert (own.system_properties.tag, list(own.system_properties.keys), dict(own.user_properties)) == (
        "t",
        ["k"],
        {"p": "q"},
    )
    assert sent[2].system_properties.delivery_timestamp.nanos == 500_000_000 and sent[3].system_properties.priority == 3
    last = sent[4].system_properties
    assert not any(last.HasField(f) for f in ("tag", "message_group", "delivery_timestamp", "priority"))
    assert not last.keys and not sent[4].user_properties
    # Ids made for a request continue the generator's sequence, as made one by one.
    counters = [int(m.system_properties.message_id[-8:], 16) for m in sent] + [int(ids()[-8:], 16)]
    assert [(b - a) % 2**32 for a, b in itertools.pairwise(counters)] == [1] * 5
    assert len({m.system_properties.message_id for m in sent}) == 5


def test_send_receipts_and_errors() -> None:
    request = _wire.send_requests("t", [_wire.outgoing(b"x")], _ids.MessageIds())[0]
    ok = v2.Status(code=v2.OK)
    response = pb.SendMessageResponse(status=ok, entries=[pb.SendResultEntry(status=ok, message_id="M", offset=7)])
    [receipt] = _wire.send_receipts("t", request, response)
    assert (receipt.message_id, receipt.topic, receipt.offset) == ("M", "t", 7)
    scheduled = pb.SendResultEntry(status=ok, offset=-1, recall_handle="R", transaction_id="X")
    [later] = _wire.send_receipts("t", request, pb.SendMessageResponse(status=ok, entries=[scheduled]))
    own_id = request.messages[0].system_properties.message_id  # the entry echoed none
    assert later == SendReceipt(own_id, "t", -1, "R", "X") and hash(later) == hash(
        SendReceipt(own_id, "t", -1, "R", "X")
    )
    assert repr(later) == repr(SendReceipt(own_id, "t", -1, "R", "X"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        later.offset = 0  # type: ignore[misc]
    refused = pb.SendMessageResponse(status=v2.Status(code=v2.MESSAGE_BODY_TOO_LARGE, message="4 MiB max"))
    with pytest.raises(errors.MessageBodyTooLarge, match="4 MiB max"):
        _wire.send_receipts("t", request, refused)


def test_a_partly_stored_answer_gives_each_stored_message_its_whole_receipt() -> None:
    """A request whose message groups went to brokers apart, one of which failed: the error's receipts are those
    of the stored messages, each whole — a scheduled one's recall handle too, or it could not be recalled."""
    request = _wire.send_requests("t", [_wire.outgoing(b"a"), _wire.outgoing(b"b")], _ids.MessageIds())[0]
    ok, failed = v2.Status(code=v2.OK), v2.Status(code=v2.HA_NOT_AVAILABLE, message="b2 down")
    response = pb.SendMessageResponse(
        status=failed,
        entries=[
            pb.SendResultEntry(status=failed),
            pb.SendResultEntry(status=ok, message_id="M2", offset=-1, recall_handle="RH", transaction_id="TX"),
        ],
    )
    with pytest.raises(errors.PopgateError) as partly:
        _wire.send_receipts("t", request, response)
    assert partly.value.receipts == [None, SendReceipt("M2", "t", -1, "RH", "TX")]
    assert not partly.value.retriable


def _frame_message(handle: str, attempt: int = 1) -> pb.ReceiveMessageResponse:
    m = v2.Message(topic=v2.Resource(name="t"), body=b"b", user_properties={"p": "q"})
    s = m.system_properties
    s.message_id, s.receipt_handle, s.delivery_attempt, s.tag = "M", handle, attempt, "tg"
    s.keys.append("k")
    s.store_timestamp.seconds, s.born_timestamp.seconds = 20, 10
    return pb.ReceiveMessageResponse(message=m)


def test_receive_stream_is_read_whatever_the_frame_order() -> None:
    stamp = pb.ReceiveMessageResponse()
    stamp.delivery_timestamp.seconds = 5
    status = pb.ReceiveMessageResponse(status=v2.Status(code=v2.OK))
    [m] = _wire.received([status, _frame_message("h", 2), stamp])
    assert (m.body, m.topic, m.tag, tuple(m.keys), dict(m.properties)) == (b"b", "t", "tg", ("k",), {"p": "q"})
    assert (m.message_id, m.receipt_handle, m.attempt, m.born_at, m.stored_at) == ("M", "h", 2, 10.0, 20.0)


def _fields(m: Message) -> dict[str, tuple[type, object]]:
    return {name: (type(getattr(m, name)), getattr(m, name)) for name in Message.__dataclass_fields__}


def test_a_received_message_carries_each_v2_field_with_its_value_and_type() -> None:
    full = v2.Message(topic=v2.Resource(name="t"), body=b"b", user_properties={"p": "q", "r": "s"})
    s = full.system_properties
    s.tag, s.message_group, s.priority, s.message_id, s.receipt_handle = "tg", "g", 3, "M", "h"
    s.keys.extend(["k1", "k2"])
    s.delivery_timestamp.seconds, s.delivery_timestamp.nanos = 30, 500_000_000
    s.born_timestamp.seconds, s.born_timestamp.nanos = 10, 250_000_000
    s.store_timestamp.seconds = 20
    s.queue_id, s.queue_offset, s.delivery_attempt, s.born_host = 4, 9, 2, "producer-7"
    assert _fields(_wire.from_v2(full)) == {
        "body": (bytes, b"b"),
        "topic": (str, "t"),
        "tag": (str, "tg"),
        "keys": (tuple, ("k1", "k2")),
        "properties": (dict, {"p": "q", "r": "s"}),
        "message_group": (str, "g"),
        "deliver_at": (float, 30.5),
        "priority": (int, 3),
        "message_id": (str, "M"),
        "attempt": (int, 2),
        "born_at": (float, 10.25),
        "stored_at": (float, 20.0),
        "receipt_handle": (str, "h"),
        "queue_id": (int, 4),
        "offset": (int, 9),
        "born_host": (str, "producer-7"),
    }
    # Set to their zero values, the optional fields are present: empty or 0, not None, 1 or -1.
    zeros = v2.Message()
    z = zeros.system_properties
    z.tag, z.message_group, z.priority, z.delivery_attempt, z.queue_offset = "", "", 0, 0, 0
    z.delivery_timestamp.seconds = 0
    got = _fields(_wire.from_v2(zeros))
    assert {k: got[k] for k in ("tag", "message_group", "deliver_at", "priority", "attempt", "offset")} == {
        "tag": (str, ""),
        "message_group": (str, ""),
        "deliver_at": (float, 0.0),
        "priority": (int, 0),
        "attempt": (int, 0),
        "offset": (int, 0),
    }
    assert _fields(_wire.from_v2(v2.Message())) == {
        "body": (bytes, b""),
        "topic": (str, ""),
        "tag": (type(None), None),
        "keys": (tuple, ()),
        "properties": (dict, {}),
        "message_group": (type(None), None),
        "deliver_at": (type(None), None),
        "priority": (type(None), None),
        "message_id": (str, ""),
        "attempt": (int, 1),
        "born_at": (float, 0.0),
        "stored_at": (float, 0.0),
        "receipt_handle": (str, ""),
        "queue_id": (int, 0),
        "offset": (int, -1),
        "born_host": (str, ""),
    }


def test_a_received_message_reads_as_a_message_whatever_its_fields_were_read_or_set() -> None:
    source = v2.Message(topic=v2.Resource(name="t"), body=b"b", user_properties={"p": "q"})
    s = source.system_properties
    s.tag, s.message_id, s.receipt_handle, s.queue_offset, s.delivery_attempt = "tg", "M", "h", 5, 3
    m = _wire.from_v2(source)
    assert isinstance(m, Message)
    # It keeps nothing of the answer it came in (a held message would keep the whole answer alive).
    assert not any(isinstance(r, ProtoMessage) for r in gc.get_referents(m))
    m.tag = "set"  # a field set keeps what was set, read or not
    assert (m.tag, m.attempt, m.offset) == ("set", 3, 5)
    plain = Message(**{f.name: getattr(m, f.name) for f in dataclasses.fields(Message)})
    assert m == plain and plain == m and m != dataclasses.replace(plain, offset=6)
    again = pickle.loads(pickle.dumps(_wire.from_v2(source)))
    assert type(again) is Message and again == _wire.from_v2(source)
    assert type(copy.copy(m)) is Message and copy.copy(m) == m
    assert dataclasses.replace(_wire.from_v2(source), body=b"z").properties == {"p": "q"}
    assert dataclasses.asdict(m)["tag"] == "set"
    with pytest.raises(AttributeError):
        _ = m.no_such_field  # type: ignore[attr-defined]


def test_a_gzip_body_is_received_inflated() -> None:
    m = v2.Message(body=gzip.compress(b"hello"))
    m.system_properties.body_encoding = v2.GZIP
    assert _wire.from_v2(m).body == b"hello"


def test_empty_receive_is_not_an_error_but_other_statuses_are() -> None:
    empty = pb.ReceiveMessageResponse(status=v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message"))
    assert _wire.received([empty]) == []
    busy = pb.ReceiveMessageResponse(status=v2.Status(code=v2.TOO_MANY_REQUESTS, message="busy"))
    with pytest.raises(errors.TooManyRequests):
        _wire.received([busy])


def test_receive_request_durations_are_float_seconds() -> None:
    r = _wire.receive_request("g", _wire.Subscription("t", "a || b"), max=5, invisible=12.5, wait=0.25)
    assert (r.invisible_duration.seconds, r.invisible_duration.nanos) == (12, 500_000_000)
    assert (r.long_polling_timeout.seconds, r.long_polling_timeout.nanos) == (0, 250_000_000)
    assert r.filter_expression.expression == "a || b" and r.batch_size == 5
    assert (r.group.name, r.message_queue.topic.name, r.filter_expression.type) == ("g", "t", v2.TAG)
    spaced = _wire.receive_request("g", _wire.Subscription("t"), max=1, invisible=1, wait=0, namespace="ns")
    assert (spaced.group.resource_namespace, spaced.message_queue.topic.resource_namespace) == ("ns", "ns")
    with pytest.raises(ValueError):
        _wire.receive_request("g", _wire.Subscription("t"), max=33, invisible=1, wait=0)


def test_receive_plans_with_the_same_arguments_share_one_request() -> None:
    consumer = ConsumerBase("127.0.0.1:1", "g", {"a": "*", "b": "x || y"}, batch=8, invisible=15.0, wait=2.0)
    first, timeout = consumer._receive_plan(None, None, None)
    other, _ = consumer._receive_plan(None, None, None)  # the next topic
    assert (first.message_queue.topic.name, other.message_queue.topic.name, timeout) == ("a", "b", 5.0)
    assert other.filter_expression.expression == "x || y"
    again, _ = consumer._receive_plan(None, None, None)
    assert again is first
    assert again == _wire.receive_request("g", _wire.Subscription("a"), max=8, invisible=15.0, wait=2.0)
    changed, timeout = consumer._receive_plan(32, 12.5, 0)
    assert (changed.batch_size, changed.invisible_duration.nanos, changed.long_polling_timeout.seconds) == (32, 5e8, 0)
    assert timeout == 3.0
    for _ in range(2):  # a bad argument fails every time, also after an equal valid one was planned
        consumer._receive_plan(1, None, None)
        with pytest.raises(TypeError):
            consumer._receive_plan(1.0, None, None)
        with pytest.raises(ValueError):
            consumer._receive_plan(33, None, None)


def test_ack_failures_per_entry() -> None:
    ok = v2.Status(code=v2.OK)
    stale = v2.Status(code=v2.INVALID_RECEIPT_HANDLE, message="stale")
    response = pb.AckMessageResponse(
        status=v2.Status(code=v2.MULTIPLE_RESULTS),
        entries=[
            pb.AckMessageResultEntry(message_id="a", status=ok),
            pb.AckMessageResultEntry(message_id="b", status=stale),
        ],
    )
    [(message_id, error)] = _wire.ack_failures(response)
    assert message_id == "b" and isinstance(error, errors.InvalidReceiptHandle)
    assert _wire.ack_failures(pb.AckMessageResponse(status=ok)) == []
    with pytest.raises(errors.BadRequest):
        _wire.ack_failures(pb.AckMessageResponse(status=v2.Status(code=v2.ILLEGAL_CONSUMER_GROUP, message="bad")))


def test_an_ack_plan_has_a_request_per_topic_and_batch_with_each_message_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_wire, "MAX_SEND_BATCH", 2)
    consumer = ConsumerBase("127.0.0.1:1", "g", "a", namespace="ns")

    def received(topic: str, n: int) -> Message:
        return Message(b"", topic, message_id=f"{topic}{n}", receipt_handle=f"handle-{topic}{n}")

    def entries(plan: list[pb.AckMessageRequest]) -> list[list[tuple[str, str]]]:
        return [[(e.message_id, e.receipt_handle) for e in request.entries] for request in plan]

    mixed = [received("a", 1), received("b", 1), received("a", 2), received("a", 3), received("b", 2)]
    plan = consumer._ack_plan(iter(mixed))  # any iterable
    assert [(r.group.name, r.group.resource_namespace, r.topic.name, r.topic.resource_namespace) for r in plan] == [
        ("g", "ns", "a", "ns"),
        ("g", "ns", "a", "ns"),
        ("g", "ns", "b", "ns"),
    ]
    assert entries(plan) == [
        [("a1", "handle-a1"), ("a2", "handle-a2")],
        [("a3", "handle-a3")],
        [("b1", "handle-b1"), ("b2", "handle-b2")],
    ]
    one_topic = [received("b", n) for n in range(3)]  # a receive's messages
    plan = consumer._ack_plan(one_topic)
    assert [r.topic.name for r in plan] == ["b", "b"]
    assert entries(plan) == [[("b0", "handle-b0"), ("b1", "handle-b1")], [("b2", "handle-b2")]]
    assert consumer._ack_plan([]) == []
    plain = _wire.ack_request("g", "t", one_topic[:1])
    assert plain == pb.AckMessageRequest(
        group=v2.Resource(name="g"),
        topic=v2.Resource(name="t"),
        entries=[pb.AckMessageEntry(message_id="b0", receipt_handle="handle-b0")],
    )


def test_a_host_name_that_is_not_ascii_is_sent_as_printable_ascii(monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC metadata (the client id) and every message's born_host carry the host name: one that is not printable
    ASCII (a Windows computer name "hôte") would fail every call with "Invalid metadata"."""
    monkeypatch.setattr(socket, "gethostname", lambda: "hôte\x01x")
    assert _ids.host_name() == "h?te?x"
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert _ids.host_name() == "localhost"
