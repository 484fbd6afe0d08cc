"""The `popgate dlq` commands' pieces that need no server: what a dead letter is re-sent as, where a listing
starts, and what a stopped resend acks."""

from __future__ import annotations

import argparse

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate import Message
from popgate.cli.dlq import DeadLetters, _count_dead_letters, _dlq_ranges, _resend, resent
from popgate.cli.main import main


def test_a_dead_letter_without_its_origin_is_not_resent() -> None:
    assert resent(Message(b"x", message_id="m1", properties={"note": "hand-made"})) is None
    topic, copy = resent(Message(b"x", message_id="m2", properties={"ORIGIN_TOPIC": "orders", "k": "v"})) or ("", None)
    assert topic == "orders" and copy is not None and copy.properties == {"k": "v"}


def test_a_resent_dead_letter_keeps_its_message_group_tag_and_keys() -> None:
    dead = Message(
        b"paid",
        tag="paid",
        keys=("order-42",),
        properties={"ORIGIN_TOPIC": "orders", "ORIGIN_MESSAGE_ID": "ID1", "DELIVERY_ATTEMPTS": "17", "region": "eu"},
        message_group="order-42",
    )
    topic, copy = resent(dead) or ("", None)
    assert topic == "orders" and copy is not None
    assert (copy.message_group, copy.tag, tuple(copy.keys), copy.properties) == (
        "order-42",
        "paid",
        ("order-42",),
        {"region": "eu"},
    )


def test_a_resent_dead_letter_keeps_its_priority() -> None:
    dead = Message(b"urgent", properties={"ORIGIN_TOPIC": "orders"}, priority=9)
    topic, copy = resent(dead) or ("", None)
    assert topic == "orders" and copy is not None and copy.priority == 9


def test_dlq_list_starts_where_the_resend_group_has_not_acked_and_counts_what_it_has() -> None:
    topic = "%DLQ%g"
    stats = bpb.StatsResponse(queues=[bpb.QueueStats(topic=topic, queue_id=0, min_offset=0, max_offset=10)])
    assert _dlq_ranges(stats, topic, "popgate-dlq-resend", everything=False) == [(0, 0, 10)]  # never read: all
    # the resend group left offset 4 in flight and acked 0..3 and 5..7; 8 and 9 not popped yet
    stats.groups.add(topic=topic, group="popgate-dlq-resend", queue_id=0, consumer_offset=4, pull_offset=8, inflight=1)
    stats.groups[0].lag = 3
    stats.groups.add(topic=topic, group="other", queue_id=0, consumer_offset=10, pull_offset=10)  # not a resend
    assert _dlq_ranges(stats, topic, "popgate-dlq-resend", everything=False) == [(0, 4, 10)]
    assert _dlq_ranges(stats, topic, "popgate-dlq-resend", everything=True) == [(0, 0, 10)]
    found = DeadLetters()
    _count_dead_letters(found, stats, topic, "popgate-dlq-resend")
    assert (found.stored, found.pending, found.resent_listed) == (10, 3, 3)  # 4..9 listed, 5..7 re-sent


def test_listing_more_dead_letters_than_a_broker_lists_at_once_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse's own exit for a bad option value
        main(["dlq", "list", "g", "--broker", "b1=127.0.0.1:1", "--limit", "1001"])
    assert exited.value.code == 2 and "1..1000" in capsys.readouterr().err


def test_dlq_resend_acks_what_it_resent_when_ctrl_c_stops_a_batch() -> None:
    """Ctrl-C (or a send that fails) in the middle of a batch of dead letters: the letters already re-sent are
    acked on the way out, so a later `dlq resend` does not send them to their topic a second time."""
    letters = [Message(f"m{i}".encode(), properties={"ORIGIN_TOPIC": "t"}) for i in range(3)]
    for i, letter in enumerate(letters):
        letter.message_id = f"id{i}"

    class Consumer:
        acked: list[str] = []

        def receive(self, *, max: int, wait: float) -> list[Message]:
            return letters

        def ack_many(self, messages: list[Message]) -> None:
            self.acked += [m.message_id for m in messages]

    class Stopping:
        sent = 0

        def send(self, topic: str, message: Message) -> None:
            self.sent += 1
            if self.sent == 3:
                raise KeyboardInterrupt

    consumer = Consumer()
    args = argparse.Namespace(wait=0.0, count=0)
    with pytest.raises(KeyboardInterrupt):
        _resend(consumer, Stopping(), args, "%DLQ%g", {"t": 0}, {}, lambda n: None)  # type: ignore[arg-type]
    assert consumer.acked == ["id0", "id1"]


def test_a_dead_letter_stored_before_the_property_checks_is_resent_without_what_they_refuse() -> None:
    """Dead letters stored before brokers refused RocketMQ's system property names and control characters may carry
    them: resent without them, not refused again on every run."""
    dead = Message(b"x", properties={"ORIGIN_TOPIC": "orders", "KEYS": "k1", "TTL": "60", "note": "a\x01b", "ok": "v"})
    topic, copy = resent(dead) or ("", None)
    assert topic == "orders" and copy is not None and copy.properties == {"ok": "v"}
