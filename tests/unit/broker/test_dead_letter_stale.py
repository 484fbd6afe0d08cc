"""DeadLetter under a handle that is no longer its message's current delivery (a retried forward whose first answer
was lost, a forward after the message was redelivered), at a real BrokerCore (no sockets): the message is moved by
the topic, queue and offset the handle names, as RocketMQ's proxy forwards by offset, or, no longer the group's to
move, answered without writing anything — never refused, for the official clients retry a refused forward forever."""

from __future__ import annotations

from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin
from broker.core import BrokerCore
from popgate_contract.errors import InvalidReceiptHandle
from tests.unit.broker.cores import broker

INVISIBLE_MS = 30_000


async def letters(core: BrokerCore, group: str = "g") -> list[pb.Message]:
    records = await core.list_messages(f"%DLQ%{group}", 0, 0, 100)
    return [pb.Message.FromString(r.payload) for r in records]


async def forwarded(core: BrokerCore, handle: str, group: str = "g", message_id: str = "") -> pb.Message:
    """The dead letter a DeadLetter of `handle` wrote (it must write one)."""
    stored = await core.dead_letter("t", group, handle, message_id=message_id)
    assert stored is not None, "the forward wrote no dead letter"
    return stored.message


async def test_a_forward_sent_twice_is_ok_twice_and_the_dlq_holds_the_message_once(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"poison")])
        [m] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        assert (await forwarded(core, m.handle)).body == b"poison"
        assert await core.dead_letter("t", "g", m.handle) is None  # already dead-lettered: nothing written
        assert [x.body for x in await letters(core)] == [b"poison"]


async def test_a_forward_of_an_acked_message_is_ok_and_writes_nothing(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"done")])
        [m] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        assert await core.ack("t", "g", [m.handle]) == [None]
        assert await core.dead_letter("t", "g", m.handle) is None
        assert "%DLQ%g" not in core.topics


async def test_a_forward_of_a_message_redelivered_since_dead_letters_it_and_ends_the_newer_delivery(
    tmp_path: Path,
) -> None:
    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):
        await core.send([pb.Message(topic="t", body=b"poison")])
        [first] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        await core.change_invisible("t", "g", first.handle, 0)
        [again] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        assert again.attempt == 2
        assert (await forwarded(core, first.handle)).properties["DELIVERY_ATTEMPTS"] == "2"
        [refused] = await core.ack("t", "g", [again.handle])  # the newer delivery ended with the dead letter
        assert isinstance(refused, InvalidReceiptHandle)
    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):  # its dead letter is durable
        assert (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages == []
        assert [x.body for x in await letters(core)] == [b"poison"]


async def test_a_forward_of_a_message_visible_again_dead_letters_it(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"poison")])
        [m] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        await core.change_invisible("t", "g", m.handle, 0)  # visible again, awaiting its redelivery
        assert (await forwarded(core, m.handle)).body == b"poison"
        assert (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages == []
        assert [x.body for x in await letters(core)] == [b"poison"]


async def test_a_stale_forward_of_a_fifo_message_releases_its_message_group(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b, message_group="o1") for b in (b"m1", b"m2")])
        [first] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        await core.change_invisible("t", "g", first.handle, 0)
        [again] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages  # m1 again, m2 still held back
        assert pb.Message.FromString(again.payload).body == b"m1"
        await forwarded(core, first.handle)
        [m2] = (await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)).messages
        assert pb.Message.FromString(m2.payload).body == b"m2"


async def test_a_forward_of_a_message_the_group_was_never_given_is_refused(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b, message_group="o1") for b in (b"m1", b"m2")])
        [m1] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        past_end = m1.handle.replace("~t~0~0~", "~t~0~7~")
        held_back = m1.handle.replace("~t~0~0~", "~t~0~1~")  # m2: sent, not given to g yet
        for group, handle in (("g", past_end), ("g", held_back), ("never-read", m1.handle)):
            with pytest.raises(InvalidReceiptHandle):
                await core.dead_letter("t", group, handle)
        assert "%DLQ%g" not in core.topics


async def test_a_stale_forward_of_a_deleted_topics_message_leaves_the_new_message_at_its_offset(
    tmp_path: Path,
) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"old")])
        [old] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        assert await core.ack("t", "g", [old.handle]) == [None]
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        await core.send([pb.Message(topic="t", body=b"new")])  # the topic made again: offset 0 once more
        [new] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        old_id = pb.Message.FromString(old.payload).message_id
        assert await core.dead_letter("t", "g", old.handle, message_id=old_id) is None  # the old forward retried
        assert await core.ack("t", "g", [new.handle]) == [None]
        assert "%DLQ%g" not in core.topics


async def test_a_stale_forward_naming_its_message_dead_letters_it(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"poison")])
        [m] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        await core.change_invisible("t", "g", m.handle, 0)
        message_id = pb.Message.FromString(m.payload).message_id
        assert (await forwarded(core, m.handle, message_id=message_id)).body == b"poison"


async def test_a_letter_forwarded_on_from_a_dlq_keeps_its_first_origin(tmp_path: Path) -> None:
    """A group reading `%DLQ%g` (an official consumer past its own attempts) forwards a letter on: its letter in its
    own DLQ still names the message's first topic, queue and offset, which `popgate dlq resend` sends it back to."""
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"poison")])
        [m] = (await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)).messages
        first = await forwarded(core, m.handle)
        [letter] = (await core.pop("%DLQ%g", "reader", "*", 1, INVISIBLE_MS, 0)).messages
        await core.change_invisible("%DLQ%g", "reader", letter.handle, 0)  # the reader fails it once: attempt 2
        [letter] = (await core.pop("%DLQ%g", "reader", "*", 1, INVISIBLE_MS, 0)).messages
        assert letter.attempt == 2
        again = (await core.dead_letter("%DLQ%g", "reader", letter.handle)).message  # type: ignore[union-attr]
        assert again.topic == "%DLQ%reader" and again.body == b"poison"
        origin = ("ORIGIN_TOPIC", "ORIGIN_MESSAGE_ID", "ORIGIN_QUEUE_ID", "ORIGIN_OFFSET")
        assert {k: again.properties[k] for k in origin} == {k: first.properties[k] for k in origin}
        assert again.properties["ORIGIN_TOPIC"] == "t"
        assert again.properties["DELIVERY_ATTEMPTS"] == "2"  # the reader's attempts, not the first group's
        assert first.properties["DELIVERY_ATTEMPTS"] == "1"
