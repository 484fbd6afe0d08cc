"""A real broker process on a free port, driven over gRPC (issue: foundation and the durable pop broker)."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

from tests.conftest import BrokerHandle
from tests.procs import wait_until


def send(stub: pb_grpc.BrokerStub, topic: str, bodies: list[bytes], **fields: object) -> pb.SendResponse:
    return stub.Send(pb.SendRequest(messages=[pb.Message(topic=topic, body=b, **fields) for b in bodies]), timeout=10)


def pop(
    stub: pb_grpc.BrokerStub,
    topic: str,
    group: str,
    *,
    n: int = 32,
    invisible_ms: int = 30000,
    poll_ms: int = 0,
    filter: str = "*",
) -> list[pb.PoppedMessage]:
    request = pb.PopRequest(
        topic=topic, group=group, filter=filter, max_messages=n, invisible_ms=invisible_ms, poll_ms=poll_ms
    )
    return list(stub.Pop(request, timeout=poll_ms / 1000 + 10).messages)


def lag_rows(stub: pb_grpc.BrokerStub, topic: str, group: str) -> list[pb.GroupQueueStats]:
    return list(stub.Stats(pb.StatsRequest(topic=topic, group=group), timeout=10).groups)


def error_name(exc: grpc.RpcError) -> str:
    return dict(exc.trailing_metadata() or ()).get("popgate-error", "")  # type: ignore[attr-defined]


async def test_ten_thousand_messages_four_poppers_exactly_once(broker: BrokerHandle) -> None:
    total = 10_000
    for start in range(0, total, 500):
        send(broker.stub, "orders", [f"m{i}".encode() for i in range(start, start + 500)])

    async def popper(stub: pb_grpc.BrokerStub, seen: list[bytes]) -> None:
        while len(seen) < total:
            response = await stub.Pop(
                pb.PopRequest(topic="orders", group="g", max_messages=32, invisible_ms=60000, poll_ms=200), timeout=10
            )
            if not response.messages:
                continue
            seen.extend(m.stored.message.body for m in response.messages)
            assert all(m.delivery_attempt == 1 for m in response.messages)
            acked = await stub.Ack(
                pb.AckRequest(topic="orders", group="g", receipt_handles=[m.receipt_handle for m in response.messages])
            )
            assert all(r.ok for r in acked.results)

    seen: list[bytes] = []
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        await asyncio.wait_for(asyncio.gather(*(popper(stub, seen) for _ in range(4))), timeout=90)
    assert len(seen) == total
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(total))
    rows = lag_rows(broker.stub, "orders", "g")
    assert len(rows) == 4
    assert sum(r.lag for r in rows) == 0
    assert all(r.consumer_offset == r.max_offset for r in rows)


def test_unacked_message_returns_with_attempt_two_and_change_invisible(broker: BrokerHandle) -> None:
    send(broker.stub, "t", [b"x"])
    [first] = pop(broker.stub, "t", "g", invisible_ms=300)
    assert first.delivery_attempt == 1
    [again] = pop(broker.stub, "t", "g", invisible_ms=5000, poll_ms=5000)
    assert again.delivery_attempt == 2
    assert again.stored.message.body == b"x"
    # The first delivery's handle is stale now.
    result = broker.stub.Ack(pb.AckRequest(topic="t", group="g", receipt_handles=[first.receipt_handle]))
    assert not result.results[0].ok and result.results[0].error == "InvalidReceiptHandle"
    changed = broker.stub.ChangeInvisibleTime(
        pb.ChangeInvisibleTimeRequest(topic="t", group="g", receipt_handle=again.receipt_handle, invisible_ms=60000)
    )
    assert changed.receipt_handle != again.receipt_handle
    result = broker.stub.Ack(pb.AckRequest(topic="t", group="g", receipt_handles=[again.receipt_handle]))
    assert result.results[0].error == "InvalidReceiptHandle"
    with pytest.raises(grpc.RpcError) as info:
        broker.stub.ChangeInvisibleTime(
            pb.ChangeInvisibleTimeRequest(topic="t", group="g", receipt_handle=again.receipt_handle, invisible_ms=1000)
        )
    assert error_name(info.value) == "InvalidReceiptHandle"
    result = broker.stub.Ack(pb.AckRequest(topic="t", group="g", receipt_handles=[changed.receipt_handle]))
    assert result.results[0].ok
    assert pop(broker.stub, "t", "g", poll_ms=300) == []


def test_change_invisible_to_zero_redelivers_at_once(broker: BrokerHandle) -> None:
    send(broker.stub, "t", [b"y"])
    [first] = pop(broker.stub, "t", "g")
    broker.stub.ChangeInvisibleTime(
        pb.ChangeInvisibleTimeRequest(topic="t", group="g", receipt_handle=first.receipt_handle, invisible_ms=0)
    )
    [again] = pop(broker.stub, "t", "g", poll_ms=2000)
    assert again.delivery_attempt == 2


def test_dead_letter_after_max_attempts_keeps_origin(broker: BrokerHandle) -> None:
    [sent] = send(broker.stub, "pay", [b"poison"], tag="t1", properties={"k": "v"}).results
    attempts = []
    deadline = time.monotonic() + 60
    while len(attempts) < 17 and time.monotonic() < deadline:
        got = pop(broker.stub, "pay", "workers", invisible_ms=100, poll_ms=2000)
        attempts.extend(m.delivery_attempt for m in got)
    assert attempts == list(range(1, 18))
    assert pop(broker.stub, "pay", "workers", poll_ms=600) == []
    [dead] = pop(broker.stub, "%DLQ%workers", "inspect", poll_ms=5000)
    props = dead.stored.message.properties
    assert dead.stored.message.body == b"poison"
    assert dead.stored.message.message_id == sent.message_id
    assert props["ORIGIN_TOPIC"] == "pay"
    assert props["ORIGIN_MESSAGE_ID"] == sent.message_id
    assert props["DELIVERY_ATTEMPTS"] == "17"
    assert props["k"] == "v" and dead.stored.message.tag == "t1"
    assert sum(r.lag for r in lag_rows(broker.stub, "pay", "workers")) == 0


def test_forward_to_dead_letter_at_once(broker: BrokerHandle) -> None:
    send(broker.stub, "t", [b"bad"])
    [m] = pop(broker.stub, "t", "g")
    out = broker.stub.DeadLetter(pb.DeadLetterRequest(topic="t", group="g", receipt_handle=m.receipt_handle))
    assert out.dlq_topic == "%DLQ%g"
    [dead] = pop(broker.stub, "%DLQ%g", "inspect", poll_ms=2000)
    assert dead.stored.message.properties["DELIVERY_ATTEMPTS"] == "1"


def _later(delay: float, fn: object) -> threading.Timer:
    timer = threading.Timer(delay, fn)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_held_pop_and_notification_are_answered_by_a_send(broker_without_sweep: BrokerHandle) -> None:
    broker = broker_without_sweep  # no safety sweep: only the Send wakes the held requests within 1.5 s
    pop(broker.stub, "live", "g", poll_ms=0)  # the topic exists (auto-created on first send below anyway)
    other = grpc.insecure_channel(broker.address)
    try:
        other_stub = pb_grpc.BrokerStub(other)
        timer = _later(0.3, lambda: send(other_stub, "live", [b"wake"]))
        started = time.monotonic()
        got = pop(broker.stub, "live", "g", poll_ms=10000)
        assert [m.stored.message.body for m in got] == [b"wake"]
        assert time.monotonic() - started < 1.5
        timer.join()

        timer = _later(0.3, lambda: send(other_stub, "live", [b"note"]))
        started = time.monotonic()
        note = broker.stub.Notification(pb.NotificationRequest(topic="live", group="g", poll_ms=10000), timeout=15)
        assert note.has_message and time.monotonic() - started < 1.5
        assert 0.2 < time.monotonic() - started
        timer.join()
    finally:
        other.close()


def test_held_requests_answer_empty_at_their_deadline(broker: BrokerHandle) -> None:
    started = time.monotonic()
    assert pop(broker.stub, "quiet", "g", poll_ms=800) == []
    assert 0.7 < time.monotonic() - started < 5
    started = time.monotonic()
    note = broker.stub.Notification(pb.NotificationRequest(topic="quiet", group="g", poll_ms=800), timeout=10)
    assert not note.has_message
    assert 0.7 < time.monotonic() - started < 5


def test_notification_honours_the_tag_filter(broker_without_sweep: BrokerHandle) -> None:
    broker = broker_without_sweep  # no safety sweep: only the blue Send wakes the held Notification
    send(broker.stub, "tags", [b"a"], tag="red")
    quick = broker.stub.Notification(pb.NotificationRequest(topic="tags", group="g", filter="blue", poll_ms=300))
    assert not quick.has_message
    _later(0.3, lambda: send(broker.stub, "tags", [b"b"], tag="blue"))
    note = broker.stub.Notification(
        pb.NotificationRequest(topic="tags", group="g", filter="blue || green", poll_ms=10000), timeout=15
    )
    assert note.has_message
    got = pop(broker.stub, "tags", "g", filter="blue || green")
    assert [m.stored.message.body for m in got] == [b"b"]
    rows = lag_rows(broker.stub, "tags", "g")
    assert sum(r.inflight for r in rows) == 1 and sum(r.ready for r in rows) == 0


def test_cancelled_held_pop_leaves_at_once(broker: BrokerHandle) -> None:
    future = broker.stub.Pop.future(
        pb.PopRequest(topic="idle", group="g", max_messages=1, invisible_ms=1000, poll_ms=20000), timeout=30
    )

    def held() -> int:
        return broker.stub.Stats(pb.StatsRequest()).held_pops  # type: ignore[no-any-return]

    assert wait_until(lambda: held() == 1, timeout=5)
    future.cancel()
    assert wait_until(lambda: held() == 0, timeout=2)


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_kill_9_during_sends_loses_nothing_acknowledged(make_broker: object, flush: str) -> None:
    b: BrokerHandle = make_broker("b1", "--flush", flush)  # type: ignore[operator]
    send(b.stub, "dur", [b"inflight-1", b"inflight-2"])
    inflight = pop(b.stub, "dur", "g", invisible_ms=1000)
    assert len(inflight) == 2
    acked: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        i = 0
        while not stop.is_set():
            try:
                response = send(b.stub, "dur", [f"k{i}-{j}".encode() for j in range(10)])
            except grpc.RpcError:
                return
            acked.extend(r.message_id for r in response.results)
            i += 1

    worker = threading.Thread(target=loop)
    worker.start()
    assert wait_until(lambda: len(acked) >= 500, timeout=20)
    b.proc.kill()
    stop.set()
    worker.join(10)
    b.restart()
    stored: set[str] = set()
    attempts: dict[bytes, int] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = pop(b.stub, "dur", "g", poll_ms=1500)
        if not got:
            break
        for m in got:
            stored.add(m.stored.message.message_id)
            attempts[m.stored.message.body] = m.delivery_attempt
        b.stub.Ack(pb.AckRequest(topic="dur", group="g", receipt_handles=[m.receipt_handle for m in got]))
    assert set(acked) <= stored
    assert attempts[b"inflight-1"] == 2 and attempts[b"inflight-2"] == 2


BAD = [
    ("Send", pb.SendRequest(messages=[pb.Message(topic="bad topic!", body=b"x")]), "IllegalTopic"),
    ("Send", pb.SendRequest(messages=[pb.Message(topic="t" * 128, body=b"x")]), "IllegalTopic"),
    ("Send", pb.SendRequest(messages=[pb.Message(topic="t", body=b"")]), "MessageBodyEmpty"),
    (
        "Send",
        pb.SendRequest(messages=[pb.Message(topic="t", body=b"x" * (4 * 1024 * 1024 + 1))]),
        "MessageBodyTooLarge",
    ),
    ("Send", pb.SendRequest(messages=[pb.Message(topic="t", body=b"x", tag="a|b")]), "IllegalMessage"),
    ("Send", pb.SendRequest(), "BadRequest"),
    ("Pop", pb.PopRequest(topic="t", group="g", max_messages=0, invisible_ms=1000), "IllegalBatchSize"),
    ("Pop", pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=0), "IllegalInvisibleTime"),
    ("Pop", pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=10**12), "IllegalInvisibleTime"),
    ("Pop", pb.PopRequest(topic="t", group="g g", max_messages=1, invisible_ms=1000), "IllegalGroup"),
    ("Pop", pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=1000, filter=" || "), "IllegalFilter"),
    (
        "Pop",
        pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=1000, poll_ms=-1),
        "IllegalPollingTime",
    ),
    (
        "ChangeInvisibleTime",
        pb.ChangeInvisibleTimeRequest(topic="t", group="g", receipt_handle="garbage", invisible_ms=1000),
        "InvalidReceiptHandle",
    ),
    (
        "ChangeInvisibleTime",
        pb.ChangeInvisibleTimeRequest(topic="t", group="g", receipt_handle="1~b1~t~0~0~1~ff~1", invisible_ms=1000),
        "InvalidReceiptHandle",
    ),
    ("DeadLetter", pb.DeadLetterRequest(topic="t", group="g", receipt_handle="~" * 2000), "InvalidReceiptHandle"),
    ("Notification", pb.NotificationRequest(topic="", group="g"), "IllegalTopic"),
]


@pytest.mark.parametrize(
    ("method", "request_", "expected"), BAD, ids=[f"{m}-{e}-{i}" for i, (m, _, e) in enumerate(BAD)]
)
def test_bad_input_gets_a_clear_error_and_nothing_is_stored(
    broker: BrokerHandle, method: str, request_: object, expected: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        getattr(broker.stub, method)(request_, timeout=10)
    assert error_name(info.value) == expected
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert info.value.details()  # type: ignore[attr-defined]
    stats = broker.stub.Stats(pb.StatsRequest())
    assert all(q.max_offset == 0 for q in stats.queues)
    assert send(broker.stub, "ok", [b"still serving"]).results[0].offset == 0


def test_garbage_ack_handles_are_rejected_per_entry(broker: BrokerHandle) -> None:
    send(broker.stub, "t", [b"x"])
    [m] = pop(broker.stub, "t", "g")
    result = broker.stub.Ack(
        pb.AckRequest(topic="t", group="g", receipt_handles=["junk", m.receipt_handle, m.receipt_handle + "0"])
    )
    assert [r.ok for r in result.results] == [False, True, False]
    assert {r.error for r in result.results if not r.ok} == {"InvalidReceiptHandle"}


def test_unknown_topic_with_auto_create_off(make_broker: object) -> None:
    b: BrokerHandle = make_broker("b1", "--no-auto-create")  # type: ignore[operator]
    for call in (lambda: send(b.stub, "nope", [b"x"]), lambda: pop(b.stub, "nope", "g")):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
        assert error_name(info.value) == "TopicNotFound"


def test_health_metrics_and_clean_sigterm(make_broker: object) -> None:
    b: BrokerHandle = make_broker("b1", "--metrics-listen", "127.0.0.1:0")  # type: ignore[operator]
    health = health_pb2_grpc.HealthStub(b.channel)
    assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    send(b.stub, "m", [b"x"], tag="a")
    pop(b.stub, "m", "g")
    line = next(line for line in b.proc.lines if "metrics on" in line)
    url = line.split("metrics on ")[1].strip()
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for name in (
        "popgate_broker_max_offset",
        "popgate_broker_inflight_messages",
        "popgate_broker_held_requests",
        "popgate_broker_rpc_duration_seconds_bucket",
        "popgate_broker_store_commit_duration_seconds",
        "popgate_broker_oldest_unacked_age_seconds",
        "popgate_broker_consumer_lag_messages",
    ):
        assert name in text
    assert "_created" not in text  # no creation-time series beside every counter and histogram
    held = b.stub.Pop.future(pb.PopRequest(topic="m", group="g", max_messages=1, invisible_ms=1000, poll_ms=20000))
    assert wait_until(lambda: b.stub.Stats(pb.StatsRequest()).held_pops == 1, timeout=5)
    started = time.monotonic()
    assert b.proc.stop() == 0
    assert held.result(timeout=10).messages == []  # answered, not dropped
    assert time.monotonic() - started < 10


def test_pop_answer_stays_under_the_size_limit(broker: BrokerHandle) -> None:
    big = b"z" * (3 * 1024 * 1024)
    for _ in range(4):
        send(broker.stub, "big", [big])
    seen = []
    while len(seen) < 4:
        got = pop(broker.stub, "big", "g", n=32, poll_ms=2000)
        assert got and sum(len(m.stored.message.body) for m in got) <= 8 * 1024 * 1024
        assert all(m.delivery_attempt == 1 for m in got)
        seen.extend(got)
    assert pop(broker.stub, "big", "g") == []
