"""The official client's producer features beyond plain sends: priority, recall, transactions. Scenarios for
driver.py (same rules: its own process, exit 0 = the scenario held, one JSON line of observations)."""

from __future__ import annotations

import json
import random
import sys
import threading
import time

from driver import config, message, receive_until, started_consumer, started_producer
from rocketmq import Message, Producer, SimpleConsumer, TransactionChecker, TransactionResolution


def _queue_of(m: Message) -> tuple[str, str]:
    """(broker, queue) from the receipt handle `1~broker~topic~queue~...` (the client reads no queue id)."""
    parts = m.receipt_handle.split("~")
    return parts[1], parts[3]


def priority(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """Messages sent with priorities before anyone consumes: within each queue they come highest first."""
    producer = started_producer(endpoint, topic)
    try:
        sent: dict[str, int] = {}
        for i in range(48):
            msg = message(topic, f"m{i}".encode())
            msg.priority = random.Random(i).randrange(10)
            sent[producer.send(msg).message_id] = msg.priority
    finally:
        producer.shutdown()
    consumer = started_consumer(endpoint, topic, group)
    try:
        got = receive_until(consumer, lambda g: len(g) >= len(sent), batch=4)
        for m in got:
            consumer.ack(m)
    finally:
        consumer.shutdown()
    assert sorted(m.message_id for m in got) == sorted(sent), "received ids differ from sent ids"
    by_queue: dict[tuple[str, str], list[int]] = {}
    for m in got:
        assert m.priority == sent[m.message_id], (m.priority, sent[m.message_id])
        by_queue.setdefault(_queue_of(m), []).append(m.priority)
    for queue, order in by_queue.items():
        assert order == sorted(order, reverse=True), f"{queue}: {order}"
    return {"received": len(got), "queues": len(by_queue)}


def _code(call: object) -> object:
    try:
        call()  # type: ignore[operator]
    except Exception as exc:
        return getattr(exc, "code", type(exc).__name__)
    return "no error"


def recall(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """A delay message recalled before its time is never delivered; its neighbour is. Recalling it again, or with a
    garbage handle, is an error with a clear code."""
    producer = started_producer(endpoint, topic)
    consumer = started_consumer(endpoint, topic, group)
    try:
        due = int(time.time()) + 3  # the client sends whole seconds
        receipts = {}
        for name in ("recalled", "kept"):
            msg = message(topic, name.encode())
            msg.delivery_timestamp = due
            receipts[name] = producer.send(msg)
        assert receipts["recalled"].recall_handle, "a delay message's receipt has a recall handle"
        recalled_id = producer.recall_message(topic, receipts["recalled"].recall_handle)
        assert recalled_id == receipts["recalled"].message_id
        again = _code(lambda: producer.recall_message(topic, receipts["recalled"].recall_handle))
        garbage = _code(lambda: producer.recall_message(topic, "garbage-handle"))
        got = receive_until(consumer, lambda g: any(m.body == b"kept" for m in g), limit_s=20)
        until = time.monotonic() + 2  # past the due time: the recalled one would have come by now
        while time.monotonic() < until:
            got += consumer.receive(32, 20)
        for m in got:
            consumer.ack(m)
        assert [m.body for m in got] == [b"kept"], [m.body for m in got]
        late = _code(lambda: producer.recall_message(topic, receipts["kept"].recall_handle))
        return {"recall_again": again, "garbage": garbage, "delivered": late}
    finally:
        consumer.shutdown()
        producer.shutdown()


class Checker(TransactionChecker):
    """Answers every check with `answer` and records what it was asked about."""

    def __init__(self, answer: int = TransactionResolution.COMMIT) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self.event = threading.Event()

    def check(self, message: Message) -> int:
        self.asked.append(message.message_id)
        self.event.set()
        return self.answer


def transactional_producer(endpoint: str, topic: str, checker: TransactionChecker) -> Producer:
    producer = Producer(config(endpoint), (topic,), checker)
    producer.startup()
    return producer


def half(producer: Producer, topic: str, body: bytes) -> tuple[object, str]:
    transaction = producer.begin_transaction()
    receipt = producer.send(message(topic, body), transaction)
    assert receipt.transaction_id, "a half message's receipt has a transaction id"
    return transaction, receipt.message_id


def first_and_any_more(consumer: SimpleConsumer) -> list[Message]:
    """What comes until the first message and 2 s more (long enough for a second copy to show), acked."""
    got = receive_until(consumer, lambda g: len(g) >= 1, limit_s=20)
    until = time.monotonic() + 2
    while time.monotonic() < until:
        got += consumer.receive(32, 20)
    for m in got:
        consumer.ack(m)
    return got


def transactions(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """A committed half message is delivered once, a rolled-back one never; neither before its resolution. The same
    resolution sent again is OK; the other one, or a forged transaction id, is INVALID_TRANSACTION_ID and changes
    nothing."""
    checker = Checker(TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)  # "unknown": checks change nothing
    producer = transactional_producer(endpoint, topic, checker)
    consumer = started_consumer(endpoint, topic, group)
    try:
        committed, committed_id = half(producer, topic, b"commit-me")
        rolled_back, _ = half(producer, topic, b"roll-me-back")
        early = consumer.receive(32, 20)  # a long poll of AWAIT_S: half messages are invisible
        assert early == [], [m.body for m in early]
        committed.commit()  # type: ignore[attr-defined]
        rolled_back.rollback()  # type: ignore[attr-defined]
        resent = _code(committed.commit)  # type: ignore[attr-defined]
        stale = _code(committed.rollback)  # type: ignore[attr-defined]
        endpoints = producer.client_configuration.rpc_endpoints
        forged_msg = message(topic, b"x")
        forged_msg.message_id = committed_id
        response = producer.end_transaction(endpoints, forged_msg, "forged-id", TransactionResolution.COMMIT, 1)
        forged = response.status.code  # this low-level call returns the answer unchecked
        got = first_and_any_more(consumer)
        assert [m.body for m in got] == [b"commit-me"], [m.body for m in got]
        return {"resent": resent, "stale": stale, "forged": forged, "checked": len(checker.asked)}
    finally:
        consumer.shutdown()
        producer.shutdown()


def orphan_half(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """Send a half message and exit without resolving it (the next scenario's producer is checked for it)."""
    producer = transactional_producer(endpoint, topic, Checker())
    try:
        _, message_id = half(producer, topic, b"orphan")
        return {"message_id": message_id}
    finally:
        producer.shutdown()


def orphan_check(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """Another producer of the topic, on `endpoint` (another proxy), is asked about the orphan and commits it: the
    consumer gets it once. The orphan's id comes as the fifth argument."""
    orphan_id = sys.argv[5]
    checker = Checker(TransactionResolution.COMMIT)
    producer = transactional_producer(endpoint, topic, checker)
    consumer = started_consumer(endpoint, topic, group)
    try:
        assert checker.event.wait(30), "no check came"
        got = first_and_any_more(consumer)
        assert [m.message_id for m in got] == [orphan_id], [m.message_id for m in got]
        return {"asked": checker.asked[:1] == [orphan_id]}
    finally:
        consumer.shutdown()
        producer.shutdown()


SCENARIOS = {f.__name__: f for f in (priority, recall, transactions, orphan_half, orphan_check)}
_ = json
