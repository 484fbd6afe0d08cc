"""A deleted topic's messages go in bounded steps after its purge commits (broker.topic_purges), other commits
between them; a stop midway leaves the topic deleted, and the next start finishes the deletion before the topic may
be made again. A real store, no sockets."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin, store_layout, store_writes
from broker.send import PURGING_RETRY_MS
from broker.sqlite_store import SqliteStore
from broker.topic_purges import TopicPurges
from popgate_contract.errors import TopicNotFound
from tests.unit.broker.cores import ManualClock, broker
from tests.unit.broker.test_retention import rows

NOW = 1_800_000_000_000


async def fill(core: Any, topic: str, count: int) -> None:
    for i in range(count):  # a row each, as an idle broker commits its sends
        await core.send([pb.Message(topic=topic, body=b"%d" % i)])


async def test_a_big_topic_is_deleted_in_steps_that_hold_no_other_topics_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_writes, "DELETE_ROWS", 2)
    steps: list[str] = []
    step = SqliteStore.purge_step

    async def counted(self: SqliteStore, topic: str) -> tuple[bool, int]:
        steps.append(topic)
        return await step(self, topic)

    monkeypatch.setattr(SqliteStore, "purge_step", counted)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await fill(core, "big", 40)
        out = pb.DeleteTopicResponse()
        deleting = asyncio.create_task(admin.delete_topic(core, pb.DeleteTopicRequest(topic="big"), out))
        async with asyncio.timeout(10):
            while not steps:  # noqa: ASYNC110 - the deletion's first step is under way
                await asyncio.sleep(0.001)
        sent = await core.send([pb.Message(topic="other", body=b"x")])
        steps_before_the_send_answered = len(steps)
        await asyncio.wait_for(deleting, 10)
        assert len(steps) == 20 > steps_before_the_send_answered  # 2 rows a step, the last seeing no more
        assert out.existed and out.messages == 40 and not out.rows_deleting
        assert rows(tmp_path, "big") == [] and rows(tmp_path, "other") == [sent[0].offset]
        again = await core.send([pb.Message(topic="big", body=b"new")])  # answered: made again at once
        assert again[0].offset == 0


async def test_a_deletion_stopped_midway_is_finished_by_the_next_start_before_the_topic_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, go = stall_after_the_first_step(monkeypatch)
    await stop_midway(tmp_path, first)
    assert rows(tmp_path) == [2, 3, 4, 5, 6, 7, 8, 9]
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        assert "t" not in core.topics and "t" in core.commits.purging
        with pytest.raises(TopicNotFound, match="being deleted"):
            await core.send([pb.Message(topic="t", body=b"too soon")])
        go.set()
        await asyncio.wait_for(core.commits.topic_rows.deleted("t"), 10)
        assert rows(tmp_path) == [] and "t" not in core.commits.purging
        again = await core.send([pb.Message(topic="t", body=b"new")])
        assert again[0].offset == 0
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        assert not core.commits.purging and core.topics["t"].queues[0].max_offset == 1


class Steps:
    """A store whose steps end when the test says, each answering `last` as scripted."""

    def __init__(self) -> None:
        self.asked: list[asyncio.Future[bool]] = []

    async def purge_step(self, topic: str) -> tuple[bool, int]:
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.asked.append(answer)
        return await answer, 1


async def until(condition: Any, within_s: float = 5.0) -> None:
    async with asyncio.timeout(within_s):
        while not condition():  # noqa: ASYNC110 - polled: the broker says nothing when it happens
            await asyncio.sleep(0.01)


async def test_a_purge_committed_during_the_last_step_gets_a_step_of_its_own() -> None:
    """Its commit marked the topic purging again in the store, after that step began: only a later step unmarks it, and
    the topic is gone (made again may be) only then."""
    store, gone = Steps(), list[str]()
    purges = TopicPurges(store, gone.append)  # type: ignore[arg-type]
    purges.start("t")
    await until(lambda: len(store.asked) == 1)
    purges.start("t")  # a second purge committed while the first step runs
    store.asked[0].set_result(True)
    await until(lambda: len(store.asked) == 2)
    assert "t" in purges and not gone
    waiting = asyncio.create_task(purges.deleted("t"))
    store.asked[1].set_result(True)
    await asyncio.wait_for(waiting, 5)
    assert gone == ["t"] and "t" not in purges
    await purges.deleted("t")  # none runs: at once
    await purges.close()


async def test_a_deletion_past_its_callers_deadline_is_answered_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applied (the topic gone, its purge stored) is answered so before the caller's deadline, not left to a
    DEADLINE_EXCEEDED that says nothing of what happened; the topic is made again only once its rows are gone."""
    monkeypatch.setattr(store_writes, "DELETE_ROWS", 2)
    step = SqliteStore.purge_step
    go = asyncio.Event()

    async def held(self: SqliteStore, topic: str) -> tuple[bool, int]:
        await go.wait()
        return await step(self, topic)

    monkeypatch.setattr(SqliteStore, "purge_step", held)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await fill(core, "t", 10)
        out = pb.DeleteTopicResponse()
        by = asyncio.get_running_loop().time() + 0.05  # the caller's deadline, less the margin
        await asyncio.wait_for(admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), out, rows_by=by), 5)
        assert out.existed and out.messages == 10 and out.rows_deleting and "t" not in core.topics
        with pytest.raises(TopicNotFound, match="being deleted"):
            await core.send([pb.Message(topic="t", body=b"too soon")])
        go.set()
        await asyncio.wait_for(core.commits.topic_rows.deleted("t"), 10)
        assert rows(tmp_path) == [] and (await core.send([pb.Message(topic="t", body=b"new")]))[0].offset == 0


def user_version(data: Path) -> int:
    with closing(sqlite3.connect(data / "broker.sqlite3")) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def stall_after_the_first_step(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """(first, go): `first` set once a deletion's first step is done; every later step waits for `go`."""
    monkeypatch.setattr(store_writes, "DELETE_ROWS", 2)
    step = SqliteStore.purge_step
    first, go = asyncio.Event(), asyncio.Event()

    async def stalling(self: SqliteStore, topic: str) -> tuple[bool, int]:
        if first.is_set():
            await go.wait()
        done = await step(self, topic)
        first.set()
        return done

    monkeypatch.setattr(SqliteStore, "purge_step", stalling)
    return first, go


async def stop_midway(data: Path, first: asyncio.Event, topic: str = "t") -> None:
    async with broker(data, queues_per_topic=1) as (core, _):
        await fill(core, topic, 10)
        request = pb.DeleteTopicRequest(topic=topic)
        deleting = asyncio.create_task(admin.delete_topic(core, request, pb.DeleteTopicResponse()))
        await asyncio.wait_for(first.wait(), 10)
        assert user_version(data) == store_layout.PURGING_VERSION
        deleting.cancel()  # the caller gone with the broker's stop


async def test_a_topic_named_at_start_is_created_once_its_deletion_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker started with `--topic t` (created at every start) after a stop midway through deleting t: the start
    does not wait for the rest of the deletion (nor fail, nor hang on a store refusing its steps); t is created once
    its rows are gone."""
    first, go = stall_after_the_first_step(monkeypatch)
    await stop_midway(tmp_path, first)
    async with broker(tmp_path, queues_per_topic=1, auto_create=False) as (core, _):
        assert await asyncio.wait_for(core.create_topics(["t"]), 5) == []  # the start goes on
        assert "t" not in core.topics
        go.set()
        await until(lambda: "t" in core.topics)
        assert rows(tmp_path) == [] and (await core.send([pb.Message(topic="t", body=b"new")]))[0].offset == 0


async def test_a_deletion_under_way_marks_the_layout_for_older_brokers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layout 3 while rows of a deleted topic are left: a broker older than deletions in steps refuses the directory
    instead of loading them as the topic (and a newer one later deleting what it stored there); layout 2 again
    once they are gone, so a rollback then works."""
    first, go = stall_after_the_first_step(monkeypatch)
    await stop_midway(tmp_path, first)
    assert user_version(tmp_path) == store_layout.PURGING_VERSION
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        assert user_version(tmp_path) == store_layout.PURGING_VERSION  # a start leaves it as it is
        go.set()
        await asyncio.wait_for(core.commits.topic_rows.deleted("t"), 10)
        assert user_version(tmp_path) == store_layout.SCHEMA_VERSION


async def test_a_deleted_topics_scheduled_message_waits_and_holds_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Due while its topic's rows are being deleted, a scheduled message waits (it makes the topic again once they
    are gone); the deliveries of other topics go on, not blocked behind its retries."""
    first, go = stall_after_the_first_step(monkeypatch)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await fill(core, "big", 10)
        now = int(time.time() * 1000)
        await core.send([pb.Message(topic="big", body=b"late", deliver_at_ms=now + 50)])
        await core.send([pb.Message(topic="other", body=b"due", deliver_at_ms=now + 1500)])
        request = pb.DeleteTopicRequest(topic="big")
        deleting = asyncio.create_task(admin.delete_topic(core, request, pb.DeleteTopicResponse()))
        await asyncio.wait_for(first.wait(), 10)
        await until(lambda: "other" in core.topics and core.topics["other"].queues[0].max_offset == 1, 10)
        assert not core.scheduler.blocked and "big" in core.commits.purging and not deleting.done()
        go.set()
        await asyncio.wait_for(deleting, 10)
        await until(lambda: "big" in core.topics and core.topics["big"].queues[0].max_offset == 1, 10)


async def test_topics_deleted_together_take_their_steps_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step at a time whatever the topics, each with its pause: never several queued in the writer ahead of
    other commits."""
    monkeypatch.setattr(store_writes, "DELETE_ROWS", 2)
    step = SqliteStore.purge_step
    running, most = [0], [0]

    async def counted(self: SqliteStore, topic: str) -> tuple[bool, int]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            return await step(self, topic)
        finally:
            running[0] -= 1

    monkeypatch.setattr(SqliteStore, "purge_step", counted)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        topics = [f"t{i}" for i in range(4)]
        for topic in topics:
            await fill(core, topic, 6)
        await asyncio.gather(
            *(admin.delete_topic(core, pb.DeleteTopicRequest(topic=t), pb.DeleteTopicResponse()) for t in topics)
        )
        assert most[0] == 1 and all(rows(tmp_path, t) == [] for t in topics)


async def test_a_scheduled_message_due_as_its_topic_is_deleted_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Due while a DeleteTopic lets the topic's earlier sends commit (before it forgets the topic), it is not put
    into the topic the purge then deletes: it waits, and makes the topic again after the deletion."""
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, queues_per_topic=1) as (core, store):
        await fill(core, "t", 3)
        await core.send([pb.Message(topic="t", body=b"late", deliver_at_ms=NOW + 20)])
        submit = store.submit

        async def delivered_first(appends: Any, ops: Any, **how: Any) -> Any:
            clock.now += 20
            core.scheduler.added(clock.now)
            await until(lambda: core.sends.schedule.next_due() != NOW + 20 and core.scheduler.in_flight == 0, 10)
            return await submit(appends, ops, **how)

        def due_meanwhile(appends: Any, ops: Any, **how: Any) -> Any:
            if not appends and not ops and clock.now == NOW:  # the deletion's wait for the topic's earlier sends
                return asyncio.ensure_future(delivered_first(appends, ops, **how))
            return submit(appends, ops, **how)

        monkeypatch.setattr(store, "submit", due_meanwhile)
        out = pb.DeleteTopicResponse()
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), out)
        assert out.messages == 3
        clock.now += PURGING_RETRY_MS  # it waited that much more
        core.scheduler.added(clock.now)
        await until(lambda: "t" in core.topics and core.topics["t"].queues[0].max_offset == 1, 10)
        [popped] = (await core.pop("t", "g", "*", 32, 30_000, 0)).messages
        assert pb.Message.FromString(popped.payload).body == b"late"


async def test_a_put_back_scheduled_message_is_not_in_its_batchs_retry(tmp_path: Path) -> None:
    """A scheduled message of a topic being deleted goes back to the schedule and out of the batch it came in: a
    retry of that batch (its commit failed) does not deliver it too, and it is not delivered twice."""
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        later = int(time.time() * 1000) + 3_600_000
        for topic in ("p", "q"):
            await core.send([pb.Message(topic=topic, body=topic.encode(), deliver_at_ms=later)])
        entries = core.sends.schedule.take_due(later, 10)
        [p_entry] = [e for e in entries if (await core.sends.scheduled_rows([e[1]]))[0].topic == "p"]
        core.sends.deleting_all.add("p")  # an admin deleting it
        await core.sends.deliver_scheduled(entries)
        assert p_entry not in entries and len(entries) == 1  # the batch a retry would deliver again
        assert core.sends.schedule.next_due() is not None and core.topics["q"].queues[0].max_offset == 1


async def test_a_groups_dlq_deleted_past_the_callers_deadline_is_answered_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`popgate group delete g --dlq`: the DLQ topic's deletion answers as DeleteTopic's, before the deadline."""
    first, go = stall_after_the_first_step(monkeypatch)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        for i in range(4):  # a row each
            await core.send([pb.Message(topic="t", body=b"%d" % i)])
            [m] = (await core.pop("t", "g", "*", 1, 30_000, 0)).messages
            await core.dead_letter("t", "g", m.handle)
        out = pb.DeleteGroupResponse()
        request = pb.DeleteGroupRequest(group="g", delete_dlq=True)
        by = asyncio.get_running_loop().time() + 0.2
        await asyncio.wait_for(admin.delete_group(core, request, out, rows_by=by), 5)
        assert out.dlq_deleted and "%DLQ%g" in core.commits.purging and first.is_set()
        go.set()
        await asyncio.wait_for(core.commits.topic_rows.deleted("%DLQ%g"), 10)
        assert rows(tmp_path, "%DLQ%g") == [] and "%DLQ%g" not in core.commits.purging


async def test_a_topic_named_at_start_and_deleted_meanwhile_is_not_made_when_the_first_deletion_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, go = stall_after_the_first_step(monkeypatch)
    await stop_midway(tmp_path, first)
    async with broker(tmp_path, queues_per_topic=1, auto_create=False) as (core, _):
        assert await core.create_topics(["t"]) == []  # left to make once the deletion ends
        out = pb.DeleteTopicResponse()
        by = asyncio.get_running_loop().time()  # answered at once, applied
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), out, rows_by=by)
        assert not out.existed and not core.create_when_purged
        go.set()
        await asyncio.wait_for(core.commits.topic_rows.deleted("t"), 10)
        assert "t" not in core.commits.purging and "t" not in core.topics and not core._creating


async def test_the_callers_deadline_counts_the_time_the_deletions_commits_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlogged writer that takes the whole time to the deadline to commit the purge: answered then, not that
    long again later."""
    first, _ = stall_after_the_first_step(monkeypatch)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await fill(core, "t", 10)
        purge = core.commits.purge_topic

        def slow(topic: str) -> Any:
            async def committed() -> Any:
                done = await purge(topic)
                await asyncio.sleep(1.5)  # the writer's backlog
                return done

            return asyncio.ensure_future(committed())

        monkeypatch.setattr(core.commits, "purge_topic", slow)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await admin.delete_topic(
            core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse(), rows_by=started + 1.0
        )
        assert loop.time() - started < 2.2  # 1.5 s of commits; not 1.5 + 1.0
        assert first.is_set() and "t" in core.commits.purging


async def test_a_put_back_scheduled_message_is_waiting_not_in_flight(tmp_path: Path) -> None:
    """Counted once in the scheduler's due messages (a metric, and the bound on what is in flight) as soon as it is
    put back, whatever the rest of its batch does."""
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        later = int(time.time() * 1000) + 3_600_000
        for topic in ("p", "q"):
            await core.send([pb.Message(topic=topic, body=topic.encode(), deliver_at_ms=later)])
        scheduler = core.scheduler
        entries = core.sends.schedule.take_due(later, 10)
        scheduler.in_flight += len(entries)  # as its run loop counts a batch it takes
        core.sends.deleting_all.add("p")
        await core.sends.deliver_scheduled(entries)
        assert scheduler.in_flight == 1 == len(entries)  # q's, until its batch ends
