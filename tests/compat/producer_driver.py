"""The official client's producer features beyond plain sends: priority, recall, transactions. Scenarios for
driver.py (same rules: its own process, exit 0 = the scenario held, one JSON line of observations)."""

from __future__ import annotations

import random
import time

from driver import config, message, receive_until, started_consumer, started_producer
from rocketmq import Message


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


SCENARIOS = {f.__name__: f for f in (priority, recall)}
_ = config
