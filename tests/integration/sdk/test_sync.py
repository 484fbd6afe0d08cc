"""The blocking Producer and SimpleConsumer against a real 2-broker cluster."""

from __future__ import annotations

import time
import uuid

import pytest

from popgate import (
    AckError,
    BadRequest,
    InvalidReceiptHandle,
    Message,
    MessageBodyTooLarge,
    Producer,
    RetryPolicy,
    SimpleConsumer,
    Unavailable,
    _durations,
)
from tests.integration.sdk.conftest import (
    LONG_INVISIBLE,
    WAIT,
    Collector,
    drain,
    given_back_attempts,
    record_batches,
)


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_send_receive_ack_keeps_every_field(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, {topic: "*"}) as consumer:
        before = time.time()
        receipt = producer.send(topic, b"hello", tag="new", keys=["order-1"], properties={"region": "eu"})
        [message] = drain(consumer, 1)
    assert message.message_id == receipt.message_id and receipt.topic == topic
    assert (message.body, message.topic, message.tag) == (b"hello", topic, "new")
    assert (tuple(message.keys), dict(message.properties)) == (("order-1",), {"region": "eu"})
    assert message.attempt == 1 and message.receipt_handle
    assert before - 1 <= message.born_at <= message.stored_at <= time.time() + 1


def test_send_many_batches_and_ack_many(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    bodies = [f"m{i}".encode() for i in range(1100)]  # two SendMessage calls (<= 1024 each)
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        receipts = producer.send_many(topic, bodies, tag="bulk")
        assert len({r.message_id for r in receipts}) == 1100
        got = drain(consumer, 1100, timeout=60)
    assert sorted(m.body for m in got) == sorted(bodies)
    assert {m.message_id for m in got} == {r.message_id for r in receipts}
    assert {m.tag for m in got} == {"bulk"}


def test_ack_many_reports_a_refused_call_per_message_and_still_acks_the_other_topics(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        producer.send(topic, b"good")
        [good] = drain(consumer, 1, ack=False)
        bad = Message(b"x", topic="no such topic!", message_id="m-bad", receipt_handle=good.receipt_handle)
        with pytest.raises(AckError) as caught:
            consumer.ack_many([bad, good])  # the bad topic's call is refused as a whole; the good one is acked
        assert [(m, type(e)) for m, e in caught.value.failures] == [("m-bad", BadRequest)]
        with pytest.raises(InvalidReceiptHandle):
            consumer.ack(good)  # acked already by ack_many


def test_a_str_is_one_key_and_a_body_must_be_bytes_or_str(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        producer.send(topic, b"x", keys="order-1")
        with pytest.raises(TypeError, match="bytes or str"):
            producer.send(topic, 5)  # type: ignore[arg-type]
        [message] = drain(consumer, 1)
    assert tuple(message.keys) == ("order-1",)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_durations_must_be_finite(endpoint: str, bad: float) -> None:
    with Producer(endpoint) as producer, pytest.raises(ValueError, match="finite"):
        producer.send(name("t"), b"x", delay=bad)
    with pytest.raises(ValueError, match="finite"):
        SimpleConsumer(endpoint, "g", "t", wait=bad)
    with pytest.raises(ValueError, match="finite"):
        Producer(endpoint, request_timeout=bad)


def test_the_longest_durations_reach_the_proxy_which_answers_its_own_limits(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    longest = _durations.MAX_DURATION_S  # a gRPC timeout of 7 days (+ wait): far from grpc's deadline overflow
    with (
        Producer(endpoint, request_timeout=longest) as producer,
        SimpleConsumer(endpoint, group, topic, request_timeout=longest) as consumer,
    ):
        producer.send(topic, b"x")
        [message] = drain(consumer, 1, ack=False)
        with pytest.raises(BadRequest, match="ILLEGAL_DELIVERY_TIME"):  # 1 day at most on this proxy
            producer.send(topic, b"later", delay=longest)
        with pytest.raises(BadRequest, match="ILLEGAL_INVISIBLE_TIME"):  # 12 h at most on this proxy
            consumer.nack(message, longest)
        consumer.ack(message)


def test_a_body_over_the_grpc_message_limit_is_too_large(endpoint: str) -> None:
    with Producer(endpoint) as producer, pytest.raises(MessageBodyTooLarge) as caught:
        producer.send(
            name("t"), b"x" * (64 * 1024 * 1024 + 1)
        )  # refused by gRPC itself, before the proxy's 4 MiB check
    assert caught.value.code_name == "RESOURCE_EXHAUSTED" and not caught.value.retriable


def test_nack_redelivers_after_the_delay_with_the_next_attempt(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        producer.send(topic, b"retry me")
        [first] = drain(consumer, 1, ack=False)
        old_handle = first.receipt_handle
        nacked_at = time.monotonic()
        consumer.nack(first, 0.5)
        assert first.receipt_handle != old_handle
        [again] = drain(consumer, 1, ack=False)
        assert time.monotonic() - nacked_at >= 0.4
        assert (again.message_id, again.attempt) == (first.message_id, 2)
        with pytest.raises(InvalidReceiptHandle) as stale:
            consumer.ack(first)  # the handle of the first delivery no longer acks
        assert stale.value.code == 40013 and not stale.value.retriable
        consumer.ack(again)
        with pytest.raises(AckError) as failed:
            consumer.ack_many([again])
        assert [mid for mid, _ in failed.value.failures] == [again.message_id]


def test_forward_to_dlq_keeps_the_origin(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        receipt = producer.send(topic, b"poison")
        [message] = drain(consumer, 1, ack=False)
        consumer.forward_to_dlq(message)
    with SimpleConsumer(endpoint, name("dlq-reader"), f"%DLQ%{group}") as dlq:
        [dead] = drain(dlq, 1)
    assert dead.body == b"poison"
    assert dead.properties["ORIGIN_TOPIC"] == topic
    assert dead.properties["ORIGIN_MESSAGE_ID"] == receipt.message_id
    assert dead.properties["DELIVERY_ATTEMPTS"] == "1"


def test_tag_filter(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, {topic: "wanted || also"}) as consumer:
        for _ in range(4):  # sent one by one, round robin: every broker holds some, ahead of the wanted ones,
            producer.send_many(topic, [b"skip"], tag="other")  # so a Pop that ignored the filter would return them
        producer.send(topic, b"first", tag="wanted")
        producer.send(topic, Message(b"second", tag="also"))
        got = drain(consumer, 2)
    assert sorted(m.body for m in got) == [b"first", b"second"]


def test_a_consumer_never_gets_a_message_its_filter_does_not_take_given_back_by_another(endpoint: str) -> None:
    """A deploy changing a group's filter from `a` to `b`: the `a` messages the old consumer gave back are acked
    for the group by the brokers (as RocketMQ's proxy drops them), never handed to the new consumer."""
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer:
        with SimpleConsumer(endpoint, group, {topic: "a"}) as old:
            for i in range(4):  # one by one, round robin: on every broker
                producer.send(topic, f"a-{i}".encode(), tag="a")
            for message in drain(old, 4, ack=False):
                old.nack(message)  # ready again at once
        with SimpleConsumer(endpoint, group, {topic: "b"}) as new:
            producer.send(topic, b"b-1", tag="b")
            got = drain(new, 1)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:  # Pops on every broker meanwhile, each over the given-back ones
                got += new.receive(max=32, wait=WAIT)
    assert [(m.body, m.tag) for m in got] == [(b"b-1", "b")]


def test_delay(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        sent_at = time.time()
        producer.send(topic, b"later", delay=1.0)
        [message] = drain(consumer, 1)
    assert message.body == b"later" and time.time() - sent_at >= 0.9


def test_iteration_long_polls_until_closed(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    consumer = SimpleConsumer(endpoint, group, topic, wait=2.0)
    collector = Collector(consumer)
    try:
        with Producer(endpoint) as producer:
            for i in range(3):
                producer.send(topic, f"n{i}".encode())
                assert collector.next_body(10) == f"n{i}".encode()
    finally:
        collector.stop()
    assert collector.error is None


def test_iteration_with_wait_zero_long_polls_instead_of_spinning(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    consumer = SimpleConsumer(endpoint, group, topic, wait=0)
    calls = []
    receive_once = consumer._receive_once
    consumer._receive_once = lambda *a, **k: calls.append(1) or receive_once(*a, **k)  # type: ignore[method-assign]
    collector = Collector(consumer)
    try:
        time.sleep(2.0)  # a measuring window, not synchronisation: an idle consumer's calls in 2 s
        idle_calls = len(calls)
        with Producer(endpoint) as producer:
            producer.send(topic, b"after the window")
            assert collector.next_body(10) == b"after the window"
    finally:
        collector.stop()
    # 1 s long polls (a busy loop made ~1,600 calls in 2 s); that a held receive is answered as the message
    # comes is test_realtime.py::test_a_long_poll_gets_a_message_from_any_broker_promptly's.
    assert idle_calls <= 3


def test_breaking_out_of_iteration_gives_the_rest_of_the_batch_back_at_once(endpoint: str) -> None:
    """Before, the messages of the batch not yet yielded stayed invisible for `invisible` (60 s here)."""
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer:
        sent = producer.send_many(topic, [b"m%d" % i for i in range(10)])
    with SimpleConsumer(endpoint, group, topic, invisible=LONG_INVISIBLE, wait=2.0) as consumer:
        batches = record_batches(consumer)
        for message in consumer:  # batches of up to 16: the first one holds several
            consumer.ack(message)
            break
        [batch] = batches
        assert len(batch) > 1 and message is batch[0]
        rest = drain(consumer, len(sent) - 1)  # 15 s at most
    assert {m.message_id: m.attempt for m in rest} == given_back_attempts(sent, [message], batch[1:])


def test_closing_the_consumer_mid_batch_ends_its_iteration_and_gives_the_rest_back(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer:
        sent = producer.send_many(topic, [b"m%d" % i for i in range(10)])
    consumer = SimpleConsumer(endpoint, group, topic, invisible=LONG_INVISIBLE, wait=2.0)
    batches = record_batches(consumer)
    yielded = []
    for message in consumer:
        yielded.append(message)
        consumer.close()
    assert len(yielded) == 1  # nothing more once closed
    [batch] = batches
    with SimpleConsumer(endpoint, group, topic) as other:
        rest = drain(other, len(sent) - 1)  # before: the rest of the batch came back after `invisible`
    assert {m.message_id: m.attempt for m in rest} == given_back_attempts(sent, yielded, batch[1:])


def test_bad_input_is_a_typed_non_retriable_error_with_the_servers_message(endpoint: str) -> None:
    with Producer(endpoint) as producer:
        with pytest.raises(BadRequest) as bad:
            producer.send("no spaces allowed", b"x")
    assert bad.value.code_name == "ILLEGAL_TOPIC" and not bad.value.retriable
    assert "topic" in bad.value.message


def test_unreachable_proxy_is_retried_then_unavailable() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02)
    started = time.monotonic()
    with Producer("127.0.0.1:1", retry=policy, request_timeout=1.0) as producer:
        with pytest.raises(Unavailable) as down:
            producer.send("t", b"x")
    assert down.value.retriable and time.monotonic() - started < 5


def test_several_topics_are_polled_in_turn(endpoint: str) -> None:
    orders, refunds, group = name("orders"), name("refunds"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, {orders: "*", refunds: "r"}) as consumer:
        for _ in range(4):  # on every broker, ahead of r1 (see test_tag_filter)
            producer.send(refunds, b"skipped", tag="x")
        producer.send(orders, b"o1")
        producer.send(refunds, b"r1", tag="r")
        got = drain(consumer, 2)
    assert sorted((m.topic, m.body) for m in got) == sorted([(orders, b"o1"), (refunds, b"r1")])


def test_send_many_on_a_producer_closed_meanwhile_is_unavailable_not_a_value_error(endpoint: str) -> None:
    producer = Producer(endpoint)
    producer.close()
    with pytest.raises(Unavailable, match="closed") as caught:
        producer.send_many(name("t"), [b"x"] * 2000)  # several calls: the windowed path
    assert not caught.value.retriable


MIB = 1024 * 1024


def test_a_failed_send_many_says_which_messages_are_stored(endpoint: str) -> None:
    """Two calls (the third body does not fit the first call's 8 MiB): the first is stored, the second refused.
    The error's receipts name the stored ones, so only the rest need sending again."""
    topic, group = name("t"), name("g")
    bodies = [b"a" * 3 * MIB, b"b" * 3 * MIB, b"z" * (4 * MIB + 1)]  # the last is over the 4 MiB body limit
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        with pytest.raises(MessageBodyTooLarge) as caught:
            producer.send_many(topic, bodies)
        receipts = caught.value.receipts
        assert receipts is not None and len(receipts) == 3
        first, second, refused = receipts
        assert first is not None and second is not None and refused is None
        got = drain(consumer, 2)
    assert {m.message_id for m in got} == {first.message_id, second.message_id}
    assert sorted(m.body[:1] for m in got) == [b"a", b"b"]


def test_deliver_at_holds_the_message_back_until_that_time(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        deliver_at = time.time() + 1.5
        producer.send(topic, b"at a time", deliver_at=deliver_at)
        early = consumer.receive(max=1, wait=0.5)
        # Nothing before its time (on a machine so slow that this receive ended after it, anything may come).
        assert early == [] or time.time() >= deliver_at, [m.body for m in early]
        [message] = drain(consumer, 1, timeout=20)  # polls past the due time
    assert message.body == b"at a time" and time.time() >= deliver_at - 0.05
