"""popgate.ext.v1 SendShared (proxy/v2/send.py `send_shared`): the SendMessage of its runs' messages, as that
SendMessage would be stored, answered and refused."""

from __future__ import annotations

import gzip
import time
from types import SimpleNamespace

import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from proxy.auth import Account
from proxy.v2 import access, send
from proxy.v2.session import StreamAccount
from tests.unit.proxy.fakes import FakeBroker
from tests.unit.proxy.test_session import service_over

CALL = SimpleNamespace(invocation_metadata=lambda: (), time_remaining=lambda: 3.0)  # a unary call's context


def shared(topic: str, **properties: object) -> v2.Message:
    out = v2.Message()
    out.topic.name = topic
    props = out.system_properties
    props.born_host, props.message_type = "10.0.0.1", v2.NORMAL
    props.born_timestamp.FromSeconds(int(time.time()))
    for name, value in properties.items():
        if name == "user":
            out.user_properties.update(value)  # type: ignore[call-overload]
        elif name == "keys":
            props.keys.extend(value)  # type: ignore[call-overload]
        elif name == "deliver_in_s":
            props.delivery_timestamp.FromSeconds(int(time.time()) + int(value))  # type: ignore[call-overload]
        else:
            setattr(props, name, value)
    return out


def run(message: v2.Message, bodies: list[bytes], ids: list[str]) -> ext.SharedMessages:
    return ext.SharedMessages(shared=message, bodies=bodies, message_ids=ids)


def as_send(request: ext.SendShared) -> pb.SendMessageRequest:
    """The SendMessage a SendShared stands for."""
    out = pb.SendMessageRequest()
    for r in request.runs:
        for body, message_id in zip(r.bodies, r.message_ids, strict=True):
            m = out.messages.add()
            m.CopyFrom(r.shared)
            m.body, m.system_properties.message_id = body, message_id
    return out


RUNS = [
    run(
        shared("orders", tag="paid", keys=["k1", "k2"], user={"a": "1"}), [b"one", b"two", b"three"], ["I1", "I2", "I3"]
    ),
    run(shared("orders"), [b"x" * 300], ["I4"]),
    run(shared("audit", message_group="g-7", message_type=v2.FIFO), [b"f1", b"f2"], ["I5", "I6"]),
    run(shared("later", deliver_in_s=600, message_type=v2.DELAY), [b"d"], ["I7"]),
    run(shared("zipped", body_encoding=v2.GZIP), [gzip.compress(b"z" * 5000), gzip.compress(b"q")], ["I8", "I9"]),
]


async def test_a_shared_send_stores_and_answers_as_the_send_of_its_messages() -> None:
    """Each run's messages are stored as their SendMessage stores them (tag, keys, properties, group, delivery time,
    inflated bodies, born time and host), in order, and the answer is that SendMessage's answer."""
    request = ext.SendShared(runs=RUNS)
    shared_broker, send_broker = FakeBroker("b1"), FakeBroker("b1")
    shared_answer = await service_over(shared_broker)[0].SendShared(request, CALL)
    send_answer = await service_over(send_broker)[0].SendMessage(as_send(request), CALL)
    assert shared_answer.status.code == v2.OK
    assert shared_answer == send_answer
    assert [e.message_id for e in shared_answer.entries] == [f"I{i}" for i in range(1, 10)]
    assert shared_broker.sent == send_broker.sent
    assert {b"z" * 5000, b"q"} <= {m.body for m in shared_broker.sent}  # inflated


@pytest.mark.parametrize(
    ("runs", "code", "text"),
    [
        ([], v2.BAD_REQUEST, "SendShared carries 0 messages: must be 1..1024"),
        ([run(shared("t"), [b"a", b"b"], ["I1"])], v2.BAD_REQUEST, "2 bodies and 1 message ids"),
        ([RUNS[1], run(shared("t"), [], [])], v2.BAD_REQUEST, "0 bodies and 0 message ids"),
        ([run(v2.Message(topic=v2.Resource(name="t"), body=b"mine"), [b"a"], ["I1"])], v2.BAD_REQUEST, "of its own"),
        ([run(shared("t", message_id="mine"), [b"a"], ["I1"])], v2.BAD_REQUEST, "of its own"),
        ([RUNS[1], run(shared("t", tag=""), [b"a"], ["I1"])], v2.ILLEGAL_MESSAGE_TAG, ""),
        ([RUNS[1], run(shared("t"), [b"a", b"b"], ["I1", "bad\n"])], v2.ILLEGAL_MESSAGE_ID, ""),
        ([run(shared("t"), [b"a"] * 1025, [f"I{i}" for i in range(1025)])], v2.BAD_REQUEST, "1025 messages"),
        ([RUNS[1], run(shared("t"), [b"a", b""], ["I1", "I2"])], v2.MESSAGE_BODY_EMPTY, "empty"),
        ([run(shared("t", body_encoding=v2.GZIP), [b"a", b"not gzip"], ["I1", "I2"])], v2.BAD_REQUEST, "GZIP"),
    ],
)
async def test_a_shared_send_refused_stores_nothing_and_says_why(
    runs: list[ext.SharedMessages], code: int, text: str
) -> None:
    broker = FakeBroker("b1")
    answer = await service_over(broker)[0].SendShared(ext.SendShared(runs=runs), CALL)
    assert (v2.Code.Name(answer.status.code), text in answer.status.message) == (v2.Code.Name(code), True)
    assert broker.sent == []


@pytest.mark.parametrize(
    "account", [None, StreamAccount(Account("ak", "sk", publish=("*",)))], ids=["open", "accounts"]
)
async def test_a_shared_send_of_too_many_runs_is_refused_before_they_are_read(
    monkeypatch: pytest.MonkeyPatch, account: StreamAccount | None
) -> None:
    """Runs of one tiny message each: refused by their count, as a SendMessage of as many messages is, before any
    run is read (a request the size of max_message_bytes would otherwise hold the event loop and memory per run);
    with accounts, before any run's topic is read for permissions."""

    def read(_: object) -> None:
        raise AssertionError("a run was read")

    monkeypatch.setattr(send, "_run", read)
    monkeypatch.setattr(access, "_topic", read)
    broker = FakeBroker("b1")
    request = ext.SendShared()
    request.runs.extend([run(v2.Message(), [b"a"], ["I"])] * 200_000)
    answer = await service_over(broker)[0].SendShared(request, CALL, account)
    assert answer.status.code == v2.BAD_REQUEST
    assert answer.status.message == "SendShared carries 200000 runs: at most 1024, as many as messages"
    assert broker.sent == []


def test_a_shared_send_needs_publishing_to_every_runs_topic() -> None:
    may = StreamAccount(Account("ak", "sk", publish=("orders", "audit")))
    may_not = StreamAccount(Account("ak", "sk", publish=("orders",)))
    request = ext.SendShared(runs=[RUNS[0], RUNS[2]])  # orders, then audit
    access.check(may, (), request)
    with pytest.raises(errors.Forbidden, match="audit"):
        access.check(may_not, (), request)
