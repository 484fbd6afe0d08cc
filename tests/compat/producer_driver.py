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


SCENARIOS = {f.__name__: f for f in (priority,)}
_ = (config, time)
