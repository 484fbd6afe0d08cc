"""A deleted topic's messages go in bounded steps after its purge commits (broker.topic_purges), other commits
between them; a stop midway leaves the topic deleted, and the next start finishes the deletion before the topic may
be made again. A real store, no sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin, store_writes
from broker.sqlite_store import SqliteStore
from broker.topic_purges import TopicPurges
from popgate_contract.errors import TopicNotFound
from tests.unit.broker.cores import broker
from tests.unit.broker.test_retention import rows


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
        assert out.existed and out.messages == 40
        assert rows(tmp_path, "big") == [] and rows(tmp_path, "other") == [sent[0].offset]
        again = await core.send([pb.Message(topic="big", body=b"new")])  # answered: made again at once
        assert again[0].offset == 0


async def test_a_deletion_stopped_midway_is_finished_by_the_next_start_before_the_topic_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_writes, "DELETE_ROWS", 2)
    step = SqliteStore.purge_step
    first = asyncio.Event()  # set once the first step is done: each later one waits for `go` (the broker stops)
    go = asyncio.Event()

    async def stalling(self: SqliteStore, topic: str) -> tuple[bool, int]:
        if first.is_set():
            await go.wait()
        done = await step(self, topic)
        first.set()
        return done

    monkeypatch.setattr(SqliteStore, "purge_step", stalling)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await fill(core, "t", 10)
        deleting = asyncio.create_task(
            admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        )
        await asyncio.wait_for(first.wait(), 10)
        assert rows(tmp_path) == [2, 3, 4, 5, 6, 7, 8, 9]
        deleting.cancel()  # the caller gone with the broker's stop
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


async def until(condition: Any) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - the task's next turn
            await asyncio.sleep(0)


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
        await asyncio.wait_for(admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), out, rows_within_s=0.05), 5)
        assert out.existed and out.messages == 10 and "t" not in core.topics
        with pytest.raises(TopicNotFound, match="being deleted"):
            await core.send([pb.Message(topic="t", body=b"too soon")])
        go.set()
        await asyncio.wait_for(core.commits.topic_rows.deleted("t"), 10)
        assert rows(tmp_path) == [] and (await core.send([pb.Message(topic="t", body=b"new")]))[0].offset == 0
