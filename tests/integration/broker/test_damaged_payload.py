"""A stored payload damaged on disk where SQLite does not notice (inside a batch row's bytes): a Pop answers the
healthy messages and the damaged one goes to `%DLQ%<group>` as it is, marked UNREADABLE_PAYLOAD. Before, every
Pop it was in failed INTERNAL (its healthy batch-mates reached the DLQ with it), and dead-lettering it failed in
a way that left a FIFO queue blocked for good."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import grpc
from popgate_pb import broker_pb2 as pb

from tests.conftest import BrokerHandle
from tests.procs import wait_until


def damage_first_message(broker: BrokerHandle, topic: str) -> None:
    """Overwrite the first two bytes of the topic's first stored message (SQLite's own pages stay valid)."""
    with closing(sqlite3.connect(broker.data_dir / "broker.sqlite3")) as db, db:
        row, payloads = db.execute(
            "SELECT rowid, payloads FROM batches WHERE topic = ? AND first_offset = 0", (topic,)
        ).fetchone()
        db.execute("UPDATE batches SET payloads = ? WHERE rowid = ?", (b"\xff\xff" + payloads[2:], row))


def pop_ids(broker: BrokerHandle, topic: str, want: int) -> list[str]:
    request = pb.PopRequest(topic=topic, group="g", max_messages=want, invisible_ms=30_000, poll_ms=0)
    return [m.stored.message.message_id for m in broker.stub.Pop(request, timeout=10).messages]


def dead_letters(broker: BrokerHandle) -> list[pb.StoredMessage]:
    try:
        request = pb.ListMessagesRequest(topic="%DLQ%g", queue_id=0, limit=10)
        return list(broker.stub.ListMessages(request, timeout=10).messages)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND
        return []


def send(broker: BrokerHandle, topic: str, *, message_group: str = "") -> None:
    messages = [
        pb.Message(topic=topic, message_id=f"m-{i}", body=b"body %d" % i, message_group=message_group) for i in range(3)
    ]
    broker.stub.Send(pb.SendRequest(messages=messages), timeout=10)


def test_a_damaged_payload_goes_to_the_dlq_and_its_batch_mates_are_delivered(make_broker: object) -> None:
    broker: BrokerHandle = make_broker("b1", "--queues-per-topic", "1")  # type: ignore[operator]
    send(broker, "t")
    broker.restart(while_stopped=lambda: damage_first_message(broker, "t"))  # no payload cached in memory
    assert pop_ids(broker, "t", 32) == ["m-1", "m-2"]
    assert wait_until(lambda: len(dead_letters(broker)) == 1)
    [letter] = dead_letters(broker)
    assert letter.message.properties["UNREADABLE_PAYLOAD"] == "true"
    assert letter.message.properties["ORIGIN_TOPIC"] == "t"
    assert letter.message.properties["ORIGIN_OFFSET"] == "0"
    assert letter.message.message_id  # given one: the original's is in the damaged bytes
    assert letter.message.body.startswith(b"\xff\xff")  # kept as it was stored


def test_a_damaged_fifo_message_does_not_block_its_queue(make_broker: object) -> None:
    broker: BrokerHandle = make_broker("b1", "--queues-per-topic", "1")  # type: ignore[operator]
    send(broker, "f", message_group="m")
    broker.restart(while_stopped=lambda: damage_first_message(broker, "f"))
    assert pop_ids(broker, "f", 1) == []  # m-0 is the one taken: not answered, dead-lettered
    assert wait_until(lambda: len(dead_letters(broker)) == 1)
    assert pop_ids(broker, "f", 1) == ["m-1"]  # its group's next message, once m-0 left the queue


def send_big(broker: BrokerHandle, topic: str, ids: list[str], *, message_group: str = "") -> None:
    """Messages big enough that their batch row spans overflow pages of its own."""
    messages = [
        pb.Message(topic=topic, message_id=i, body=(i.encode() + b"|") * 1000, message_group=message_group) for i in ids
    ]
    broker.stub.Send(pb.SendRequest(messages=messages), timeout=10)


def zero_page_of(broker: BrokerHandle, marker: bytes) -> None:
    """Zero the database page holding `marker`: SQLite then reports that row "database disk image is malformed"."""
    path = broker.data_dir / "broker.sqlite3"
    data = bytearray(path.read_bytes())
    page = data.find(marker) // 4096
    data[page * 4096 : (page + 1) * 4096] = bytes(4096)
    path.write_bytes(data)


def test_a_damaged_page_dead_letters_its_row_and_the_other_rows_are_delivered(make_broker: object) -> None:
    broker: BrokerHandle = make_broker(  # type: ignore[operator]
        "b1", "--queues-per-topic", "1", "--max-delivery-attempts", "3"
    )
    for prefix in ("a", "m", "z"):  # one batch row each
        send_big(broker, "t", [f"{prefix}-{i}" for i in range(3)])
    broker.restart(while_stopped=lambda: zero_page_of(broker, b"m-1|m-1|m-1|"))
    got = pop_ids(broker, "t", 32)
    assert {"a-0", "a-1", "a-2", "z-0", "z-1", "z-2"} <= set(got)
    assert not {"m-0", "m-1", "m-2"} & set(got)
    assert wait_until(lambda: len(dead_letters(broker)) == 3)
    letters = dead_letters(broker)
    assert all(letter.message.properties["UNREADABLE_PAYLOAD"] == "true" for letter in letters)
    assert sorted(letter.message.properties["ORIGIN_OFFSET"] for letter in letters) == ["3", "4", "5"]
    assert all(letter.message.properties["DELIVERY_ATTEMPTS"] == "1" for letter in letters)


def test_a_damaged_page_does_not_block_a_fifo_group(make_broker: object) -> None:
    broker: BrokerHandle = make_broker("b1", "--queues-per-topic", "1")  # type: ignore[operator]
    send_big(broker, "f", ["m-0", "m-1"], message_group="g1")
    send_big(broker, "f", ["n-0"], message_group="g1")
    broker.restart(while_stopped=lambda: zero_page_of(broker, b"m-1|m-1|m-1|"))
    assert pop_ids(broker, "f", 1) == []  # m-0, unreadable: dead-lettered, not answered
    assert wait_until(lambda: pop_ids(broker, "f", 1) == ["n-0"], timeout=15)  # m-1 after it, then n-0
    assert len(dead_letters(broker)) == 2
