"""What a Pop takes first, without sockets (docs/BROKER.md, "Pop"): deliveries whose invisibility passed come
before new messages in one Pop in five (test_redelivery_mix.py has the rest of that rule), and new messages are
spread over the queues, the start queue rotating per Pop. Real SQLite store, no safety sweep."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin, store_reads
from broker.core import BrokerCore
from broker.model import PopResult
from broker.sqlite_store import SqliteStore
from popgate_contract.errors import StoreUnavailable
from tests.unit.broker.cores import broker
from tests.unit.broker.test_fifo import INVISIBLE_MS, QUEUES, bodies
from tests.unit.broker.test_schedule import until


async def send_to_queues(core: BrokerCore, per_queue: int) -> None:
    await core.send(
        [pb.Message(topic="t", body=b"q%d-%d" % (q, i), queue_id=q) for q in range(QUEUES) for i in range(per_queue)]
    )


async def pop(core: BrokerCore, want: int, invisible_ms: int = INVISIBLE_MS) -> PopResult:
    return await core.pop("t", "g", "*", want, invisible_ms, 0)


async def test_a_redelivery_comes_before_new_messages_in_one_pop_in_five(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"old")])
        first = await pop(core, 1, invisible_ms=core.settings.min_invisible_ms)  # the group's Pop 1
        assert bodies(first) == [b"old"]
        deadline = first.messages[0].invisible_until_ms
        await asyncio.wait_for(
            until(lambda: core.clock.now_ms() > deadline), 5
        )  # its invisibility has passed, not acked
        await core.send(
            [pb.Message(topic="t", body=b"new-%d" % i, queue_id=q) for q in range(QUEUES) for i in range(2)]
        )
        # Pops 2-4 take new messages first, Pop 5 the redelivery (RocketMQ's popFromRetryProbability 20).
        singles = [(await pop(core, 1)).messages[0] for _ in range(4)]
        assert [m.attempt for m in singles] == [1, 1, 1, 2], "the redelivery did not come in the fifth Pop"
        assert pb.Message.FromString(singles[3].payload).body == b"old"
        rest = await pop(core, 32)
        assert len(rest.messages) == 2 * QUEUES - 3 and {m.attempt for m in rest.messages} == {1}


async def test_a_batch_takes_a_fair_share_from_every_queue(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send_to_queues(core, 20)
        batch = await pop(core, 8)
        assert Counter(m.queue_id for m in batch.messages) == dict.fromkeys(range(QUEUES), 2)
        # Each queue's share comes in the queue's order, from where the group left it.
        for q in range(QUEUES):
            assert [b for b in bodies(batch) if b.startswith(b"q%d-" % q)] == [b"q%d-0" % q, b"q%d-1" % q]


async def test_what_short_queues_leave_of_the_batch_comes_from_the_others(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"q0-%d" % i, queue_id=0) for i in range(20)])
        await core.send([pb.Message(topic="t", body=b"q%d-0" % q, queue_id=q) for q in range(1, QUEUES)])
        batch = await pop(core, 8)
        # Shares of 2: queues 1-3 have one message each, queue 0 gives its 2 and then the 3 left over.
        assert Counter(m.queue_id for m in batch.messages) == {0: 5, 1: 1, 2: 1, 3: 1}


async def test_small_pops_rotate_the_queue_they_start_from(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send_to_queues(core, 20)
        singles = [(await pop(core, 1)).messages[0].queue_id for _ in range(2 * QUEUES)]
        # One message a Pop, from the next queue each time: every queue in turn, twice over.
        assert Counter(singles) == dict.fromkeys(range(QUEUES), 2)
        assert all((b - a) % QUEUES == 1 for a, b in zip(singles, singles[1:], strict=False)), singles
        # A batch smaller than the queue count takes one from each of as many queues, starting where the last
        # Pop left off: the next batch starts at the queue after.
        three = [m.queue_id for m in (await pop(core, 3)).messages]
        after = [m.queue_id for m in (await pop(core, 3)).messages]
        assert len(set(three)) == len(set(after)) == 3
        assert after[0] == (three[0] + 1) % QUEUES, (three, after)


async def test_a_pop_cut_short_after_a_reset_during_its_read_does_not_bring_its_messages_back(tmp_path: Path) -> None:
    """A Pop took a FIFO run and, while it read their payloads (from the store: a restarted broker), the group was
    reset to the latest offset. The Pop answers one receive's worth and puts the rest back — not any more: the
    reset owns them, and a message below the new offset is not delivered to the group again."""
    data = tmp_path / "d"
    async with broker(data) as (core, _):
        await core.send([pb.Message(topic="t", body=b"a%d" % i, message_group="o") for i in range(1, 5)])
    async with broker(data) as (core, _):  # restarted: the Pop reads its payloads from the store
        popping = asyncio.create_task(core.pop("t", "g", "*", 32, 30_000, 0, max_fifo=1))
        await asyncio.sleep(0)  # it has taken a1..a4 and waits for their payloads
        latest = pb.ResetOffsetRequest(topic="t", group="g", to=pb.ResetOffsetRequest.To.LATEST)
        await admin.reset_offset(core, latest, pb.ResetOffsetResponse())
        await popping
        assert (await core.pop("t", "g", "*", 32, 30_000, 0)).messages == []


def _slow_reads(store: SqliteStore) -> tuple[asyncio.Event, asyncio.Event]:
    """The store's payload reads wait, once entered (the first event), until the test sets the second."""
    entered, release = asyncio.Event(), asyncio.Event()
    real = store.read_payloads

    async def slow(topic: str, wanted: Mapping[int, Sequence[int]]) -> dict[tuple[int, int], bytes]:
        entered.set()
        await release.wait()
        return await real(topic, wanted)

    store.read_payloads = slow  # type: ignore[method-assign]
    return entered, release


async def test_a_pop_whose_read_spans_a_delete_and_recreate_answers_none_of_the_new_topics(tmp_path: Path) -> None:
    """A Pop reading its payloads while its topic is deleted, made again and sent to answers empty: not the new
    topic's messages, which a Pop of the same group on the new topic then receives, once each."""
    async with broker(tmp_path, queues_per_topic=1, cache_bytes=0) as (core, store):
        await core.send([pb.Message(topic="t", body=b"old%d" % i) for i in range(3)])
        entered, release = _slow_reads(store)
        popping = asyncio.create_task(core.pop("t", "g", "*", 3, 60_000, 0))
        await entered.wait()
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        await core.send([pb.Message(topic="t", body=b"new%d" % i) for i in range(3)])
        release.set()
        assert (await popping).messages == []
        fresh = await core.pop("t", "g", "*", 3, 60_000, 0)
        assert [pb.Message.FromString(m.payload).body for m in fresh.messages] == [b"new0", b"new1", b"new2"]


async def test_a_pop_whose_read_spans_a_delete_answers_empty(tmp_path: Path) -> None:
    """A Pop reading its payloads while its topic is deleted answers empty, not an error."""
    async with broker(tmp_path, queues_per_topic=1, cache_bytes=0) as (core, store):
        await core.send([pb.Message(topic="t", body=b"old") for _ in range(3)])
        entered, release = _slow_reads(store)
        popping = asyncio.create_task(core.pop("t", "g", "*", 3, 60_000, 0))
        await entered.wait()
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        release.set()
        assert (await popping).messages == []


async def test_a_pop_the_store_cannot_read_charges_no_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Pop whose payloads the store cannot read (its file gone unreadable: permissions, a damaged page) fails
    UNAVAILABLE and its messages are ready again at once, attempt count unchanged: never charged toward the DLQ."""
    async with broker(tmp_path, queues_per_topic=1, cache_bytes=0, max_delivery_attempts=2) as (core, _):
        await core.send([pb.Message(topic="t", body=b"m%d" % i) for i in range(3)])
        real = store_reads.read_payloads

        def failing(*args: Any) -> Any:
            raise sqlite3.OperationalError("unable to open database file")

        monkeypatch.setattr(store_reads, "read_payloads", failing)
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                await core.pop("t", "g", "*", 3, 60_000, 0)
        monkeypatch.setattr(store_reads, "read_payloads", real)
        popped = await core.pop("t", "g", "*", 3, 60_000, 0)
        assert [(pb.Message.FromString(m.payload).body, m.attempt) for m in popped.messages] == [
            (b"m0", 1),
            (b"m1", 1),
            (b"m2", 1),
        ]
