"""Drives the official rocketmq-python-client 5.1.2 against a popgate proxy. Run in its own process.

Usage: python driver.py SCENARIO ENDPOINT TOPIC GROUP
Its generated protobuf classes share full names with popgate's, so it never runs
inside the pytest process. Exit 0 = the scenario held; any failure raises.
Prints one JSON line of observations on stdout.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)

AWAIT_S = 3  # SimpleConsumer long-polling time
ACKED_INVISIBLE_S = 3  # send_receive: so short that an ack which did nothing shows within the test


def config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=5)


def message(topic: str, body: bytes, *, tag: str = "", keys: tuple[str, ...] = (), **props: str) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body
    if tag:
        msg.tag = tag
    for key in keys:
        msg.keys = key  # the client's setter takes one key per assignment
    for key, value in props.items():
        msg.add_property(key, value)
    return msg


def started_producer(endpoint: str, topic: str) -> Producer:
    producer = Producer(config(endpoint), (topic,))
    producer.startup()
    return producer


def started_consumer(endpoint: str, topic: str, group: str, expression: str = "*") -> SimpleConsumer:
    consumer = SimpleConsumer(config(endpoint), group, {topic: FilterExpression(expression)}, await_duration=AWAIT_S)
    consumer.startup()
    return consumer


def receive_until(
    consumer: SimpleConsumer,
    done: Callable[[list[Message]], bool],
    *,
    invisible: int = 20,
    limit_s: float = 40,
    batch: int = 32,
) -> list[Message]:
    got: list[Message] = []
    end = time.monotonic() + limit_s
    while time.monotonic() < end and not done(got):
        got.extend(consumer.receive(batch, invisible))
    assert done(got), f"gave up after {limit_s} s with {len(got)} messages"
    return got


def send_receive(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """Producer with tags/keys/properties; SimpleConsumer receives each exactly once and acks."""
    producer = started_producer(endpoint, topic)
    consumer = started_consumer(endpoint, topic, group)
    try:
        sent = {}
        for i in range(30):
            receipt = producer.send(message(topic, f"body-{i}".encode(), tag=f"tag{i % 3}", keys=(f"k{i}",), n=str(i)))
            sent[receipt.message_id] = i
        got: list[Message] = []
        end = time.monotonic() + 40
        while len(got) < len(sent) and time.monotonic() < end:
            batch = consumer.receive(32, ACKED_INVISIBLE_S)
            last_received = time.monotonic()
            for m in batch:  # acked at once, well within the short invisible time
                consumer.ack(m)
            got += batch
        ids = [m.message_id for m in got]
        assert sorted(ids) == sorted(sent), "received ids differ from sent ids"
        for m in got:
            i = sent[m.message_id]
            assert m.body == f"body-{i}".encode() and m.tag == f"tag{i % 3}", m
            assert list(m.keys) == [f"k{i}"] and m.properties.get("n") == str(i), m
            assert m.delivery_attempt == 1 and not m.corrupted, m
        # Acked: nothing comes back, polled until well past the time an un-acked one would have returned
        extra: list[Message] = []
        while time.monotonic() < last_received + ACKED_INVISIBLE_S + 1.5:
            extra += consumer.receive(32, 20)
        assert extra == [], f"unexpected redelivery: {[m.message_id for m in extra]}"
        return {"sent": len(sent), "received": len(got)}
    finally:
        consumer.shutdown()
        producer.shutdown()


def redelivery(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """change_invisible_duration brings a message back with attempt 2; an un-acked one returns by itself."""
    producer = started_producer(endpoint, topic)
    consumer = started_consumer(endpoint, topic, group)
    try:
        changed_id = producer.send(message(topic, b"change-me")).message_id
        first = receive_until(consumer, lambda g: len(g) >= 1, invisible=20)[0]
        assert first.message_id == changed_id and first.delivery_attempt == 1
        changed_at = time.monotonic()
        consumer.change_invisible_duration(first, 1)
        # Back after about 1 s, not after the 20 s it was received with: given up at 10 s
        again = receive_until(consumer, lambda g: any(m.message_id == changed_id for m in g), limit_s=10)
        changed_back_after = time.monotonic() - changed_at
        back = next(m for m in again if m.message_id == changed_id)
        assert back.delivery_attempt == 2, back.delivery_attempt
        assert changed_back_after < 10, changed_back_after
        consumer.ack(back)

        unacked_id = producer.send(message(topic, b"forget-me")).message_id
        started = time.monotonic()
        first = receive_until(consumer, lambda g: any(m.message_id == unacked_id for m in g), invisible=2)
        returned = receive_until(consumer, lambda g: any(m.message_id == unacked_id for m in g), invisible=20)
        took = time.monotonic() - started
        msg = next(m for m in returned if m.message_id == unacked_id)
        assert msg.delivery_attempt == 2, msg.delivery_attempt
        consumer.ack(msg)
        return {
            "changed_back_after_s": round(changed_back_after, 2),
            "unacked_returned_after_s": round(took, 2),
            "first": len(first),
        }
    finally:
        consumer.shutdown()
        producer.shutdown()


def empty_poll(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """An empty long poll returns [] without error after about the long-polling time."""
    consumer = started_consumer(endpoint, topic, group)
    try:
        started = time.monotonic()
        got = consumer.receive(16, 20)
        took = time.monotonic() - started
        assert got == [], got
        assert AWAIT_S - 1.0 <= took <= AWAIT_S + 2.0, f"empty poll took {took:.2f} s, long-polling time {AWAIT_S} s"
        return {"empty_poll_s": round(took, 2)}
    finally:
        consumer.shutdown()


def errors(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """A garbage receipt handle and an oversized body give errors (server-side codes)."""
    producer = started_producer(endpoint, topic)
    consumer = started_consumer(endpoint, topic, group)
    out: dict[str, object] = {}
    try:
        producer.send(message(topic, b"x"))
        msg = receive_until(consumer, lambda g: len(g) >= 1)[0]
        good_handle = msg.receipt_handle
        msg.receipt_handle = "garbage-handle"
        try:
            consumer.ack(msg)
        except Exception as exc:  # BadRequestException
            out["garbage_ack"] = getattr(exc, "code", None)
        assert out.get("garbage_ack") == 40013, out
        msg.receipt_handle = good_handle
        consumer.ack(msg)

        # The Telemetry reply set the producer's limit to the proxy's 4 MiB ...
        end = time.monotonic() + 10
        while producer._Producer__max_body_size != 4 * 1024 * 1024 and time.monotonic() < end:  # type: ignore[attr-defined]
            time.sleep(0.05)
        assert producer._Producer__max_body_size == 4 * 1024 * 1024  # type: ignore[attr-defined]
        try:
            producer.send(message(topic, b"y" * (4 * 1024 * 1024 + 1)))
        except Exception as exc:  # refused locally, from the server's settings
            out["oversized_client"] = type(exc).__name__
        # ... and the proxy itself refuses when the client does not check.
        producer._Producer__max_body_size = 64 * 1024 * 1024  # type: ignore[attr-defined]
        try:
            producer.send(message(topic, b"z" * (5 * 1024 * 1024)))
        except Exception as exc:
            out["oversized_server"] = getattr(exc, "code", type(exc).__name__)
        assert out.get("oversized_client") and out.get("oversized_server") == 41301, out
        return out
    finally:
        consumer.shutdown()
        producer.shutdown()


class Counter(MessageListener):
    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.deliveries = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.expected = 0

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.ids.add(message.message_id)
            self.deliveries += 1
            if len(self.ids) >= self.expected:
                self.done.set()
        return ConsumeResult.SUCCESS


def push(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """A PushConsumer consumes 100 messages."""
    producer = started_producer(endpoint, topic)
    listener = Counter()
    listener.expected = 100
    consumer = PushConsumer(config(endpoint), group, listener, {topic: FilterExpression("*")})
    try:
        consumer.startup()
        sent = {producer.send(message(topic, f"push-{i}".encode(), tag="p")).message_id for i in range(100)}
        assert listener.done.wait(60), f"push consumer got {len(listener.ids)} of 100"
        assert listener.ids == sent
        return {"consumed": len(listener.ids), "deliveries": listener.deliveries}
    finally:
        consumer.shutdown()
        producer.shutdown()


class SlowCounter(MessageListener):
    """Takes `seconds` per message and records every delivery with its attempt."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deliveries: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        time.sleep(self.seconds)
        with self.lock:
            self.deliveries.append((message.message_id, message.delivery_attempt))
        return ConsumeResult.SUCCESS


BACKLOG = 400
BACKLOG_THREADS = 4
BACKLOG_LISTENER_S = 0.25  # 4 threads: 16 msg/s, the backlog takes ~25 s against the proxy's 10 s invisible time


def push_backlog(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """A PushConsumer started against a backlog it consumes slower than the invisible time: its client caches the
    whole backlog at once (auto_renew, no invisible duration), so without renewal the messages still cached after
    the invisible time come back with attempt 2 and their first handles fail to ack ("invalid receipt handle")."""
    sent = send_backlog(endpoint, topic)
    listener = SlowCounter(BACKLOG_LISTENER_S)
    consumer = backlog_consumer(endpoint, topic, group, listener)
    started = time.monotonic()
    try:
        consumer.startup()
        return backlog_consumed(listener, sent, started)
    finally:
        consumer.shutdown()


def push_backlog_after_proxy_restart(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """push_backlog with the PushConsumer running first: it prints "started" and waits for a line on stdin while
    the caller restarts the proxy under it; then the backlog comes. The new proxy has no Telemetry stream of the
    client (the official client rebuilds it only when a settings write fails, every 300 s)."""
    listener = SlowCounter(BACKLOG_LISTENER_S)
    consumer = backlog_consumer(endpoint, topic, group, listener)
    try:
        consumer.startup()
        print("started", flush=True)
        sys.stdin.readline()
        started = time.monotonic()  # the running consumer takes the first messages while the rest are sent
        sent = send_backlog(endpoint, topic)
        return backlog_consumed(listener, sent, started)
    finally:
        consumer.shutdown()


def send_backlog(endpoint: str, topic: str) -> set[str]:
    producer = started_producer(endpoint, topic)
    try:
        return {producer.send(message(topic, f"backlog-{i}".encode())).message_id for i in range(BACKLOG)}
    finally:
        producer.shutdown()


def backlog_consumer(endpoint: str, topic: str, group: str, listener: SlowCounter) -> PushConsumer:
    return PushConsumer(
        config(endpoint), group, listener, {topic: FilterExpression("*")}, consumption_thread_count=BACKLOG_THREADS
    )


def backlog_consumed(listener: SlowCounter, sent: set[str], started: float) -> dict[str, object]:
    """Waits (up to 120 s) for every message of `sent`; what the listener and the client's log saw."""
    end = started + 120
    while time.monotonic() < end and len({m for m, _ in listener.deliveries}) < len(sent):
        time.sleep(0.2)
    took_s = time.monotonic() - started
    time.sleep(3)  # acks of the last ones, and any redelivery already due, arrive
    log = Path.home() / "logs" / "rocketmq_python" / "rocketmq_client.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    with listener.lock:
        deliveries = list(listener.deliveries)
    return {
        "sent": len(sent),
        "consumed": len({m for m, _ in deliveries} & sent),
        "deliveries": len(deliveries),
        "redelivered": sum(1 for _, attempt in deliveries if attempt > 1),
        "ack_errors": sum(1 for line in lines if "[ERROR]" in line and ("40013" in line or "receipt handle" in line)),
        "consume_s": round(took_s, 1),
    }


def fifo(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """Messages of one message group go to two SimpleConsumers of one group in order: while the first holds m0,
    the second's long poll gets nothing; after each ack the next message goes to whichever asks."""
    producer = started_producer(endpoint, topic)
    first, second = started_consumer(endpoint, topic, group), started_consumer(endpoint, topic, group)
    try:
        bodies = [f"m{i}".encode() for i in range(10)]
        for body in bodies:
            msg = message(topic, body)
            msg.message_group = "customer-7"
            producer.send(msg)
        [head] = receive_until(first, lambda got: len(got) >= 1, batch=1)
        assert head.body == bodies[0] and head.message_group == "customer-7", head
        started = time.monotonic()
        held_back = second.receive(1, 20)  # a whole long poll: m1 waits for m0's ack
        waited_s = time.monotonic() - started
        assert held_back == [], f"m1 went out while m0 was in flight: {[m.body for m in held_back]}"
        first.ack(head)
        order = [head.body]
        for turn in range(1, len(bodies)):  # the two consumers take turns, each acking what it got
            consumer = (first, second)[turn % 2]
            [m] = receive_until(consumer, lambda got: len(got) >= 1, batch=1)
            order.append(m.body)
            consumer.ack(m)
        assert order == bodies, order
        return {"in_order": len(order), "held_back_poll_s": round(waited_s, 1)}
    finally:
        first.shutdown()
        second.shutdown()
        producer.shutdown()


class InOrder(MessageListener):
    """Records each message group's consumption order; the first delivery of each group's message 3 fails."""

    def __init__(self, expected: int) -> None:
        self.order: dict[str, list[int]] = {}
        self.failed: set[str] = set()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.expected = expected

    def consume(self, message: Message) -> ConsumeResult:
        group, index = message.message_group, int(message.body.decode().rpartition("-")[2])
        time.sleep(0.05)  # long enough that messages consumed side by side would finish out of order
        with self.lock:
            if index == 3 and group not in self.failed:
                self.failed.add(group)
                return ConsumeResult.FAILURE
            self.order.setdefault(group, []).append(index)
            if sum(map(len, self.order.values())) >= self.expected:
                self.done.set()
        return ConsumeResult.SUCCESS


def fifo_push(endpoint: str, topic: str, group: str) -> dict[str, object]:
    """A PushConsumer of a --fifo-group group consumes each message group in order, one message at a time, and
    retries a failed message before the group's next one."""
    producer = started_producer(endpoint, topic)
    groups, per_group = ("ga", "gb", "gc", "gd"), 8
    listener = InOrder(len(groups) * per_group)
    for i in range(per_group):
        for g in groups:
            msg = message(topic, f"{g}-{i}".encode())
            msg.message_group = g
            producer.send(msg)
    consumer = PushConsumer(config(endpoint), group, listener, {topic: FilterExpression("*")})
    try:
        consumer.startup()  # after the sends: the first receives get whole batches of several groups
        assert listener.done.wait(60), f"push consumer got {listener.order}"
        assert listener.order == {g: list(range(per_group)) for g in groups}, listener.order
        assert listener.failed == set(groups)
        return {"groups": len(listener.order)}
    finally:
        consumer.shutdown()
        producer.shutdown()


SCENARIOS = {
    f.__name__: f
    for f in (
        send_receive,
        redelivery,
        empty_poll,
        errors,
        push,
        fifo,
        fifo_push,
        push_backlog,
        push_backlog_after_proxy_restart,
    )
}

if __name__ == "__main__":
    from producer_driver import SCENARIOS as PRODUCER_SCENARIOS  # its scenarios import this module's helpers

    SCENARIOS.update(PRODUCER_SCENARIOS)
    scenario, endpoint, topic, group = sys.argv[1:5]  # a scenario may read more
    result = SCENARIOS[scenario](endpoint, topic, group)
    print(json.dumps(result), flush=True)
