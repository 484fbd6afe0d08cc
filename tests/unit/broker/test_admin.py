"""The broker's admin operations (broker.admin) over a real store without sockets: an offset reset puts a group
where it was asked, drops its deliveries and wakes its held polls, and lasts across a restart; deleting a group or a
topic forgets it durably and answers the requests it held; a message query finds ids and keys newest first within
its bound; reported consumers expire with their proxy's report."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin, handlers
from broker.consumers import ConsumerRegistry, Seen
from broker.core import BrokerCore
from broker.sqlite_store import SqliteStore
from broker.store import (
    CreateQueue,
    NewMessage,
    Op,
    PurgeGroup,
    PurgeQueueInflight,
    PurgeTopic,
    Record,
    SetGroupFilter,
    SetPullOffset,
)
from popgate_contract.errors import BadRequest, InvalidReceiptHandle, StoreUnavailable, TooManyRequests, TopicNotFound
from tests.unit.broker.cores import ManualClock, broker

To = pb.ResetOffsetRequest.To


async def send_at(core: BrokerCore, clock: ManualClock, ms: int, *bodies: bytes, topic: str = "t") -> None:
    clock.now = ms
    for body in bodies:
        await core.send([pb.Message(topic=topic, body=body, keys=[body.decode()])])


def bodies(popped: Sequence[object]) -> list[bytes]:
    return sorted(pb.Message.FromString(p.payload).body for p in popped)  # type: ignore[attr-defined]


async def reset(core: BrokerCore, to: int, timestamp_ms: int = 0, *, group: str = "g") -> pb.ResetOffsetResponse:
    out = pb.ResetOffsetResponse()
    await admin.reset_offset(core, pb.ResetOffsetRequest(topic="t", group=group, to=to, timestamp_ms=timestamp_ms), out)
    return out


async def test_a_topic_creation_is_not_deferred_as_consumer_state(tmp_path: Path) -> None:
    """Its caller waits for the commit (the answer says the topic is stored): it goes to the store's writer at once,
    never after the delay consumer state waits under --flush async (here 30 s); likewise a broker's `--topic`."""
    async with broker(tmp_path, state_delay_s=30.0) as (core, _):
        out = pb.CreateTopicResponse()
        await asyncio.wait_for(admin.create_topic(core, pb.CreateTopicRequest(topic="fresh"), out), 10)
        assert out.created
        assert await asyncio.wait_for(core.create_topics(["other"]), 10) == ["other"]


async def test_a_reset_to_a_time_delivers_exactly_what_was_stored_from_then_and_lasts_a_restart(tmp_path: Path) -> None:
    clock = ManualClock(1_000)
    async with broker(tmp_path, clock=clock, queues_per_topic=2) as (core, _):
        await send_at(core, clock, 1_000, b"old1", b"old2")
        await send_at(core, clock, 2_000, b"new1", b"new2", b"new3")
        popped = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert len(popped.messages) == 5  # all in flight
        out = await reset(core, To.TIMESTAMP, 2_000)
        assert sum(q.dropped_inflight for q in out.queues) == 5 and out.broker == "b1"
        with pytest.raises(InvalidReceiptHandle):  # a dropped delivery's handle is stale
            await core.change_invisible("t", "g", popped.messages[0].handle, 0)
        assert (await core.ack("t", "g", [popped.messages[0].handle]))[0] is not None
    async with broker(tmp_path, clock=clock, queues_per_topic=2) as (core, _):  # kill -9 keeps it: committed
        again = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert bodies(again.messages) == [b"new1", b"new2", b"new3"]
        await reset(core, To.LATEST)
        assert (await core.pop("t", "g", "*", 32, 30_000, 0)).messages == []
        await reset(core, To.EARLIEST)
        assert len((await core.pop("t", "g", "*", 32, 30_000, 0)).messages) == 5


async def test_a_reset_wakes_the_groups_held_pop(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"a")])
        assert len((await core.pop("t", "g", "*", 32, 30_000, 0)).messages) == 1
        held = asyncio.create_task(core.pop("t", "g", "*", 32, 30_000, 20_000))
        async with asyncio.timeout(5):
            while core.hold.total_held < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        await reset(core, To.EARLIEST)
        got = await asyncio.wait_for(held, 2)  # not after its 20 s: the reset woke it
        assert bodies(got.messages) == [b"a"]


async def test_bad_resets_change_nothing(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"a")])
        with pytest.raises(BadRequest):
            await reset(core, To.TO_UNSPECIFIED)
        with pytest.raises(BadRequest):
            await reset(core, To.TIMESTAMP, -1)
        assert not core.groups
        out = pb.ResetOffsetResponse()
        await admin.reset_offset(core, pb.ResetOffsetRequest(topic="other", group="g", to=To.LATEST), out)
        assert not out.queues and not core.groups  # a topic this broker lacks: nothing to reset here


async def test_deleting_a_group_forgets_it_durably_and_keeps_its_dlq_unless_asked(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"a"), pb.Message(topic="u", body=b"b")])
        for topic in ("t", "u"):
            assert (await core.pop(topic, "g", "*", 32, 30_000, 0)).messages
        await core.send([pb.Message(topic="%DLQ%g", body=b"letter")])
        held = asyncio.create_task(core.pop("t", "g", "*", 32, 30_000, 20_000))
        async with asyncio.timeout(5):
            while core.hold.total_held < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        out = pb.DeleteGroupResponse()
        await admin.delete_group(core, pb.DeleteGroupRequest(group="g"), out)
        assert list(out.topics) == ["t", "u"] and not out.dlq_deleted
        assert (await asyncio.wait_for(held, 2)).messages == []  # answered empty at once
        assert not [k for k in core.groups if k[0] == "g"] and "%DLQ%g" in core.topics
    async with broker(tmp_path) as (core, _):
        assert not [k for k in core.groups if k[0] == "g"]
        again = await core.pop("t", "g", "*", 32, 30_000, 0)  # a new group: from the first message
        assert bodies(again.messages) == [b"a"]
        await core.pop("u", "g", "*", 32, 30_000, 0)
        out = pb.DeleteGroupResponse()
        await admin.delete_group(core, pb.DeleteGroupRequest(group="g", topic="t", delete_dlq=True), out)
        assert list(out.topics) == ["t"] and out.dlq_deleted and "%DLQ%g" not in core.topics
        assert ("g", "u") in core.groups


async def test_deleting_a_topic_ends_its_held_polls_and_its_data_for_good(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=2) as (core, _):
        await core.send([pb.Message(topic="t", body=b"a"), pb.Message(topic="t", body=b"b")])
        await core.pop("t", "g1", "*", 32, 30_000, 0)
        answer = pb.NotificationResponse()
        asked = pb.NotificationRequest(topic="t", group="g1", filter="*", poll_ms=20_000)
        held = asyncio.create_task(handlers.notification(core, asked, answer))
        async with asyncio.timeout(5):
            while core.hold.total_held < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        out = pb.DeleteTopicResponse()
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), out)
        assert out.existed and out.messages == 2 and list(out.groups) == ["g1"] and out.held_ended == 1
        await asyncio.wait_for(held, 2)
        assert not answer.has_message and not answer.closing  # not stopping: a proxy asks again, TOPIC_NOT_FOUND
        assert "t" not in core.topics and not core.groups
        again = pb.DeleteTopicResponse()
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), again)  # a repeat is harmless
        assert not again.existed
    async with broker(tmp_path, queues_per_topic=2) as (core, _):
        assert "t" not in core.topics and not core.groups
        sent = await core.send([pb.Message(topic="t", body=b"new")])  # auto-create: a new topic from offset 0
        assert sent[0].offset == 0
    async with broker(tmp_path, auto_create=False) as (core, _):
        created = pb.CreateTopicResponse()
        await admin.create_topic(core, pb.CreateTopicRequest(topic="fresh", queues=3), created)
        assert created.created and created.queues == 3
        existing = pb.CreateTopicResponse()
        await admin.create_topic(core, pb.CreateTopicRequest(topic="fresh", queues=5), existing)
        assert not existing.created and existing.queues == 3  # an existing topic keeps its queues
        with pytest.raises(TopicNotFound):
            await core.send([pb.Message(topic="other", body=b"x")])


async def test_deleted_topics_leave_nothing_behind_however_many(tmp_path: Path) -> None:
    """Scratch topics made and deleted one after another (a test run's, a tenant's): what the broker keeps per topic
    stays at the live topics'."""
    async with broker(tmp_path) as (core, store):
        await core.send([pb.Message(topic="live", body=b"a")])
        for i in range(50):
            await core.send([pb.Message(topic=f"scratch-{i}", body=b"x")])
            await admin.delete_topic(core, pb.DeleteTopicRequest(topic=f"scratch-{i}"), pb.DeleteTopicResponse())
        assert set(core.topics) == {"live"}
        assert core.sends._valid_topics == {"live"}  # noqa: SLF001
        assert not store._purges.counts  # noqa: SLF001


async def test_a_query_finds_ids_and_keys_newest_first_within_its_bound(tmp_path: Path) -> None:
    clock = ManualClock(1_000)
    async with broker(tmp_path, clock=clock, queues_per_topic=2) as (core, _):
        for i in range(10):
            clock.now = 1_000 + i
            await core.send([pb.Message(topic="t", body=f"b{i}".encode(), keys=["k", f"k{i}"], message_id=f"id{i}")])

        async def query(**fields: object) -> pb.QueryMessagesResponse:
            out = pb.QueryMessagesResponse()
            await admin.query_messages(core, pb.QueryMessagesRequest(topic="t", **fields), out)  # type: ignore[arg-type]
            return out

        found = await query(key="k", max_messages=3)
        assert [m.stored.message.message_id for m in found.messages] == ["id9", "id8", "id7"]
        assert all(m.stored.message.body == b"" and m.body_size == 2 for m in found.messages)
        (one,) = (await query(message_id="id4", max_messages=5, with_body=True)).messages
        assert one.stored.message.body == b"b4" and one.stored.store_ms == 1_004 and one.broker == "b1"
        assert not (await query(key="k4x", max_messages=5)).messages
        bounded = await query(key="k0", max_messages=5, max_scan=2)
        assert not bounded.messages and bounded.scan_cut  # the bound stopped it before the oldest messages
        with pytest.raises(BadRequest):
            await query(key="k", message_id="id1", max_messages=1)


def test_reported_consumers_expire_with_their_proxys_report() -> None:
    registry = ConsumerRegistry()
    registry.report("p1", [Seen("g", "c1", "", 900), Seen("h", "c2", "", 950)], 10_000, 1_000)
    registry.report("p2", [Seen("g", "c3", "", 990)], 2_000, 1_000)
    assert [(s.client_id, s.proxy) for s in registry.of_group("g", 2_000)] == [("c1", "p1"), ("c3", "p2")]
    registry.report("p1", [Seen("g", "c1", "", 2_500)], 10_000, 2_500)  # a new report replaces the last
    assert [s.client_id for s in registry.every_group(3_500)[0]] == ["c1"]  # p2's report is past its time
    with pytest.raises(BadRequest):
        registry.report("p3", [], 10, 4_000)


async def test_a_purge_splits_its_group_commit_so_it_never_deletes_a_later_write(tmp_path: Path) -> None:
    # Three consumer-state requests deferred together into one commit (--flush async): the purge deletes what the
    # request before it wrote, not what the one after it did.
    async with broker(tmp_path) as (_, store):
        before = store.submit([], [SetPullOffset("g", "t", 0, 5), SetGroupFilter("g", "t", "a")])
        purge = store.submit([], [PurgeGroup("g", "t")])
        after = store.submit([], [SetPullOffset("g", "t", 1, 7)])
        await asyncio.gather(before, purge, after)
    async with broker(tmp_path) as (_, store):
        snap = store.load()
        assert snap.pull_offsets == [SetPullOffset("g", "t", 1, 7)] and not snap.filters


def fail_next_commit_with(store: SqliteStore, kind: type) -> None:
    """The store's next commit carrying an op of `kind` is refused (StoreUnavailable, as on a full disk)."""
    real = store.submit
    armed = [True]

    def submit(appends: Sequence[NewMessage], ops: Sequence[Op], **how: Any) -> asyncio.Future[list[Record]]:
        if armed[0] and any(isinstance(op, kind) for op in ops):
            armed[0] = False
            refused: asyncio.Future[list[Record]] = asyncio.get_running_loop().create_future()
            refused.set_exception(StoreUnavailable("disk full"))
            return refused
        return real(appends, ops, **how)

    store.submit = submit  # type: ignore[method-assign]


async def test_a_topic_whose_deletion_failed_is_not_made_again_before_its_purge_commits(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, store):
        await core.send([pb.Message(topic="t", body=b"old%d" % i) for i in range(3)])
        await core.send([pb.Message(topic="t", body=b"later", deliver_at_ms=int(time.time() * 1000) + 1500)])
        fail_next_commit_with(store, PurgeTopic)
        with pytest.raises(StoreUnavailable):
            await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        with pytest.raises(TopicNotFound, match="being deleted"):
            await core.send([pb.Message(topic="t", body=b"new")])
        by = asyncio.get_running_loop().time() + 0.05  # waits for the deletion until the caller's deadline
        with pytest.raises(TooManyRequests, match="being deleted"):
            await admin.create_topic(core, pb.CreateTopicRequest(topic="t"), pb.CreateTopicResponse(), rows_by=by)
        due = core.sends.schedule.next_due()
        async with asyncio.timeout(5):
            while core.sends.schedule.next_due() == due:  # noqa: ASYNC110 (came due: it waits, not delivered)
                await asyncio.sleep(0.01)
        assert "t" not in core.topics
        core.sweep()  # its once-a-second retry: the purge is written
        async with asyncio.timeout(5):
            while "t" not in core.topics:  # noqa: ASYNC110 (the scheduled message, refused meanwhile, delivered)
                await asyncio.sleep(0.01)
        sent = await core.send([pb.Message(topic="t", body=b"new")])
        assert sent[0].offset == 1
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        after = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert bodies(after.messages) == [b"later", b"new"]


async def test_a_failed_topic_deletion_may_be_repeated_and_then_holds(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, store):
        await core.send([pb.Message(topic="t", body=b"old")])
        fail_next_commit_with(store, PurgeTopic)
        with pytest.raises(StoreUnavailable):
            await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())  # the operator's
        sent = await core.send([pb.Message(topic="t", body=b"new")])
        assert sent[0].offset == 0
        await core.pop("u", "g", "*", 1, 30_000, 0)  # a later consumer-state commit: nothing left to write again
        await asyncio.sleep(0.1)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        after = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert bodies(after.messages) == [b"new"]


async def test_a_group_deletion_written_again_after_the_group_came_back_keeps_its_new_state(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, store):
        await core.send([pb.Message(topic="t", body=b"m%d" % i) for i in range(4)])
        await core.pop("t", "g", "*", 1, 30_000, 0)
        fail_next_commit_with(store, PurgeGroup)
        with pytest.raises(StoreUnavailable):
            await admin.delete_group(core, pb.DeleteGroupRequest(group="g"), pb.DeleteGroupResponse())
        unacked = await core.pop("t", "g", "*", 2, 1_000, 0)  # a consumer goes on: the group is made again
        assert bodies(unacked.messages) == [b"m0", b"m1"]
        await core.commits.commit([])  # the Pop's commit has landed, and behind it the purge written again
        await core.commits.commit([])
        acked = await core.pop("t", "g", "*", 1, 1_000, 0)
        await core.ack("t", "g", [p.handle for p in acked.messages])
        await core.commits.commit([])
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await asyncio.sleep(1.1)  # the unacked ones' invisibility passes
        again = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert bodies(again.messages) == [b"m0", b"m1", b"m3"]


async def test_a_reset_written_again_after_new_deliveries_keeps_them(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, store):
        await core.send([pb.Message(topic="t", body=b"m%d" % i) for i in range(4)])
        await core.pop("t", "g", "*", 4, 30_000, 0)
        fail_next_commit_with(store, PurgeQueueInflight)
        with pytest.raises(StoreUnavailable):
            await reset(core, To.EARLIEST)
        unacked = await core.pop("t", "g", "*", 2, 1_000, 0)  # delivered again from the new offset
        assert bodies(unacked.messages) == [b"m0", b"m1"]
        await core.commits.commit([])  # the Pop's commit has landed, and behind it the reset written again
        await core.commits.commit([])
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await asyncio.sleep(1.1)  # the unacked ones' invisibility passes
        again = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert bodies(again.messages) == [b"m0", b"m1", b"m2", b"m3"]


async def test_a_group_deletion_repeated_after_a_refused_commit_is_stored_before_it_answers(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, store):
        await core.send([pb.Message(topic="t", body=b"m%d" % i) for i in range(4)])
        popped = await core.pop("t", "g", "*", 4, 30_000, 0)
        await core.ack("t", "g", [m.handle for m in popped.messages])
        fail_next_commit_with(store, PurgeGroup)
        with pytest.raises(StoreUnavailable):
            await admin.delete_group(core, pb.DeleteGroupRequest(group="g"), pb.DeleteGroupResponse())
        out = pb.DeleteGroupResponse()
        await admin.delete_group(core, pb.DeleteGroupRequest(group="g"), out)  # the operator's repeat, every topic
        assert list(out.topics) == []  # memory had forgotten it already
    async with broker(tmp_path, queues_per_topic=1) as (core, _):  # a kill -9 before the sweep's retry
        again = await core.pop("t", "g", "*", 32, 30_000, 0)
        assert bodies(again.messages) == [b"m0", b"m1", b"m2", b"m3"]  # a new group


async def test_a_topic_creation_repeated_after_a_refused_commit_is_stored_before_it_answers(tmp_path: Path) -> None:
    async with broker(tmp_path, auto_create=False) as (core, store):
        fail_next_commit_with(store, CreateQueue)
        with pytest.raises(StoreUnavailable):
            await admin.create_topic(core, pb.CreateTopicRequest(topic="orders", queues=2), pb.CreateTopicResponse())
        out = pb.CreateTopicResponse()
        await admin.create_topic(core, pb.CreateTopicRequest(topic="orders", queues=2), out)  # the operator's repeat
        assert out.queues == 2
    async with broker(tmp_path, auto_create=False) as (core, _):  # a kill -9 right after the answer
        assert len(core.topics["orders"].queues) == 2
        assert (await core.send([pb.Message(topic="orders", body=b"x")]))[0].offset == 0


async def test_a_topic_creation_racing_the_first_answers_once_the_topic_is_stored(tmp_path: Path) -> None:
    async with broker(tmp_path, auto_create=False) as (core, _):
        request = pb.CreateTopicRequest(topic="orders")
        first = asyncio.create_task(admin.create_topic(core, request, pb.CreateTopicResponse()))
        await asyncio.sleep(0)  # the first one's commit is under way
        out = pb.CreateTopicResponse()
        await admin.create_topic(core, request, out)
        assert first.done() and not out.created
        await first
