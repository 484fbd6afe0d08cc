"""The `popgate dlq` commands' pieces that need no server: what a dead letter is re-sent as, where a listing
starts, and what a stopped resend acks."""

from __future__ import annotations

import argparse
from collections import defaultdict

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate import BadRequest, Message, NotFound, SendReceipt, Unauthorized, Unavailable
from popgate.cli.dlq import DeadLetters, _count_dead_letters, _dlq_ranges
from popgate.cli.dlq_resend import LeftLetters, _resend, resent
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
    letters = [Message(f"m{i}".encode(), properties={"ORIGIN_TOPIC": f"t{i}"}) for i in range(3)]
    for i, letter in enumerate(letters):
        letter.message_id = f"id{i}"

    class Consumer:
        acked: list[str] = []

        def receive(self, *, max: int, wait: float) -> list[Message]:
            return letters

        def ack_many(self, messages: list[Message]) -> None:
            self.acked += [m.message_id for m in messages]

        def _give_back(self, messages: list[Message]) -> bool:
            return True

    class Stopping:
        sent = 0

        def send_many(self, topic: str, messages: list[Message]) -> None:
            self.sent += 1
            if self.sent == 3:
                raise KeyboardInterrupt

    consumer = Consumer()
    args = argparse.Namespace(wait=0.0, count=0)
    with pytest.raises(KeyboardInterrupt):
        _resend(consumer, Stopping(), args, "%DLQ%g", defaultdict(int), LeftLetters(), lambda n: None)  # type: ignore[arg-type]
    assert consumer.acked == ["id0", "id1"]


def test_a_dead_letter_stored_before_the_property_checks_is_resent_without_what_they_refuse() -> None:
    """Dead letters stored before brokers refused RocketMQ's system property names and control characters may carry
    them: resent without them, not refused again on every run."""
    dead = Message(b"x", properties={"ORIGIN_TOPIC": "orders", "KEYS": "k1", "TTL": "60", "note": "a\x01b", "ok": "v"})
    topic, copy = resent(dead) or ("", None)
    assert topic == "orders" and copy is not None and copy.properties == {"ok": "v"}


class Batch:
    """A consumer fake: one batch of dead letters, then none; what it was told to ack and to give back."""

    def __init__(self, letters: list[Message]) -> None:
        self.letters, self.acked, self.given_back = letters, list[str](), list[tuple[str, float]]()

    def receive(self, *, max: int, wait: float) -> list[Message]:
        batch, self.letters = self.letters, []
        return batch

    def ack_many(self, messages: list[Message]) -> None:
        self.acked += [m.message_id for m in messages]

    def _give_back(self, messages: list[Message]) -> bool:
        """One attempt per message, as the SDK's give-back; whether the proxy answered them (it always does)."""
        self.given_back += [(m.message_id, 0.0) for m in messages]
        return True


def letters(*origins: str) -> list[Message]:
    return [
        Message(b"m", message_id=f"id{i}", properties={"ORIGIN_TOPIC": t} if t else {}) for i, t in enumerate(origins)
    ]


def test_dlq_resend_gives_back_what_it_did_not_resend_when_a_send_stops_it() -> None:
    """A send that fails for the run (the proxy gone) stops it: the letters received and not re-sent are made
    visible again at once, so the next run re-sends them rather than saying "nothing to resend" for 30 s."""

    class Failing:
        def send_many(self, topic: str, messages: list[Message]) -> None:
            if topic == "down":
                raise Unavailable("proxy gone")

    consumer = Batch(letters("t", "", "down", "u"))
    args = argparse.Namespace(wait=0.0, count=0)
    with pytest.raises(Unavailable):
        _resend(consumer, Failing(), args, "%DLQ%g", {"t": 0}, LeftLetters(), lambda n: None)  # type: ignore[arg-type]
    assert consumer.acked == ["id0"]
    assert sorted(consumer.given_back) == [("id1", 0), ("id2", 0), ("id3", 0)]


def test_dlq_resend_leaves_a_letter_refused_for_good_and_resends_the_others() -> None:
    """A letter whose topic is gone, or whose send is forbidden or refused, is left in the DLQ as one without
    ORIGIN_TOPIC is: named, given back at the end of the run, and the letters after it are re-sent."""

    class Refusing:
        def send_many(self, topic: str, messages: list[Message]) -> None:
            if topic != "t":
                raise {"gone": NotFound, "no": Unauthorized, "bad": BadRequest}[topic](f"refused {topic}")

    consumer = Batch(letters("gone", "t", "no", "", "bad", "t"))
    counts: dict[str, int] = {"t": 0}
    left = LeftLetters()
    _resend(consumer, Refusing(), argparse.Namespace(wait=0.0, count=0), "%DLQ%g", counts, left, lambda n: None)  # type: ignore[arg-type]
    assert consumer.acked == ["id1", "id5"] and counts == {"t": 2}
    assert sorted(consumer.given_back) == [("id0", 0), ("id2", 0), ("id3", 0), ("id4", 0)]
    assert left.lines("%DLQ%g") == [
        "1 dead letter(s) left in %DLQ%g, to gone: refused gone: id0",
        "1 dead letter(s) left in %DLQ%g, to no: refused no: id2",
        "1 dead letter(s) left in %DLQ%g, without ORIGIN_TOPIC: id3",
        "1 dead letter(s) left in %DLQ%g, to bad: refused bad: id4",
    ]


def test_dlq_resend_stops_giving_back_at_the_first_call_the_proxy_does_not_answer() -> None:
    """The proxy gone mid-run: the letters to give back are given back with one attempt each (at most 1 s), and the
    run stops giving back at the first call that does not reach the proxy (they come back after their invisible
    time anyway), not each letter retried in full (~4 s each, minutes for a batch) before the error is reported."""

    class Gone(Batch):
        calls = 0

        def _give_back(self, messages: list[Message]) -> bool:
            self.calls += 1
            return False

    class Failing:
        def send_many(self, topic: str, messages: list[Message]) -> None:
            raise Unavailable("proxy gone")

    consumer = Gone(letters(*["t"] * 40))
    left = LeftLetters()
    left.leave(Message(b"x", message_id="old"), "to t: refused")
    with pytest.raises(Unavailable):
        _resend(consumer, Failing(), argparse.Namespace(wait=0.0, count=0), "%DLQ%g", {}, left, lambda n: None)  # type: ignore[arg-type]
    assert consumer.calls == 2  # the rest of the batch (one call), then the letters left (one call)


def test_a_left_letter_is_kept_without_its_body_until_given_back() -> None:
    left = LeftLetters()
    letter = Message(
        b"x" * 1000, topic="%DLQ%g", message_id="id0", properties={"ORIGIN_TOPIC": "t"}, receipt_handle="h1"
    )
    left.leave(letter, "to t: refused")
    letter.receipt_handle = "h2"  # delivered again within the run
    left.leave(letter, "to t: refused again")
    kept = left.held["id0"]
    assert (kept.body, dict(kept.properties), kept.topic, kept.receipt_handle) == (b"", {}, "%DLQ%g", "h2")
    assert left.reasons == {"id0": "to t: refused"}


class Sending:
    """A producer fake: the calls it was given, (method, topic, bodies); `send_many` refuses a call carrying a body
    in `refused` (BadRequest, storing the messages before it, as a proxy whose brokers stored some runs of a
    request tells in the error's receipts) and `send` refuses such a body alone."""

    def __init__(self, *refused: bytes) -> None:
        self.refused, self.calls = refused, list[tuple[str, str, list[bytes]]]()

    def send_many(self, topic: str, messages: list[Message]) -> list[SendReceipt]:
        bodies = [m.body for m in messages]
        self.calls.append(("send_many", topic, bodies))
        receipts: list[SendReceipt | None] = [SendReceipt(f"r{i}", topic, i) for i in range(len(bodies))]
        bad = [i for i, body in enumerate(bodies) if body in self.refused]
        if bad:
            error = BadRequest("refused")
            error.receipts = [r if i < bad[0] else None for i, r in enumerate(receipts)]
            raise error
        return [r for r in receipts if r is not None]

    def send(self, topic: str, message: Message) -> SendReceipt:
        self.calls.append(("send", topic, [message.body]))
        if message.body in self.refused:
            raise BadRequest("refused")
        return SendReceipt("r", topic, 0)


def bodied(*origins: str) -> list[Message]:
    """Dead letters to `origins`, letter i with body b"m<i>"."""
    out = letters(*origins)
    for i, letter in enumerate(out):
        letter.body = f"m{i}".encode()
    return out


def test_dlq_resend_sends_the_letters_of_one_origin_topic_in_one_send_many() -> None:
    """The letters of a batch go to their topic with one send_many per origin topic, in the batch's order (a
    message group's letters stay in order), and are acked in the batch's order once all are stored."""
    consumer, producer = Batch(bodied("a", "b", "a", "", "a", "b")), Sending()
    counts: dict[str, int] = defaultdict(int)
    _resend(consumer, producer, argparse.Namespace(wait=0.0, count=0), "%DLQ%g", counts, LeftLetters(), lambda n: None)  # type: ignore[arg-type]
    assert producer.calls == [("send_many", "a", [b"m0", b"m2", b"m4"]), ("send_many", "b", [b"m1", b"m5"])]
    assert consumer.acked == ["id0", "id1", "id2", "id4", "id5"] and counts == {"a": 3, "b": 2}
    assert consumer.given_back == [("id3", 0)]  # without ORIGIN_TOPIC: left, given back at the end


def test_dlq_resend_sends_one_by_one_the_letters_of_a_send_many_refused_for_good() -> None:
    """A send_many refused for good (one letter refused) is sent again one letter at a time, the letters it stored
    not again: the refused letter is left and named, the others re-sent and acked."""
    consumer, producer = Batch(bodied("t", "t", "t", "u")), Sending(b"m1")
    counts: dict[str, int] = defaultdict(int)
    left = LeftLetters()
    _resend(consumer, producer, argparse.Namespace(wait=0.0, count=0), "%DLQ%g", counts, left, lambda n: None)  # type: ignore[arg-type]
    assert producer.calls == [
        ("send_many", "t", [b"m0", b"m1", b"m2"]),  # m0 stored: not sent again
        ("send", "t", [b"m1"]),
        ("send", "t", [b"m2"]),
        ("send_many", "u", [b"m3"]),
    ]
    assert consumer.acked == ["id0", "id2", "id3"] and counts == {"t": 2, "u": 1}
    assert left.lines("%DLQ%g") == ["1 dead letter(s) left in %DLQ%g, to t: refused: id1"]
    assert consumer.given_back == [("id1", 0)]
