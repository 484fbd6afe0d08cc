"""Admin requests that meet a deletion of their topic under way: a second DeleteTopic waits for the first and
answers as it; a CreateTopic waits until the topic's rows are gone, then creates it; either is refused
TOO_MANY_REQUESTS, naming the deletion, when it is still under way at the caller's deadline. A real store, no
sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin
from popgate_contract.errors import TooManyRequests
from tests.unit.broker.cores import broker
from tests.unit.broker.test_topic_purges import fill, stall_after_the_first_step


async def test_a_second_deletion_waits_for_the_first_and_answers_as_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_step, go = stall_after_the_first_step(monkeypatch)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await fill(core, "t", 10)
        request = pb.DeleteTopicRequest(topic="t")
        first, second = pb.DeleteTopicResponse(), pb.DeleteTopicResponse()
        deleting = asyncio.create_task(admin.delete_topic(core, request, first))
        await asyncio.wait_for(first_step.wait(), 10)
        again = asyncio.create_task(admin.delete_topic(core, request, second))
        await asyncio.sleep(0.05)
        assert not again.done()  # the rows are still going
        go.set()
        await asyncio.wait_for(asyncio.gather(deleting, again), 10)
        assert first.existed and first.messages == 10
        assert second == first


async def test_a_topic_created_while_it_is_deleted_is_made_once_its_rows_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_step, go = stall_after_the_first_step(monkeypatch)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await fill(core, "t", 10)
        deleting = asyncio.create_task(
            admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        )
        await asyncio.wait_for(first_step.wait(), 10)
        out = pb.CreateTopicResponse()
        creating = asyncio.create_task(admin.create_topic(core, pb.CreateTopicRequest(topic="t", queues=3), out))
        await asyncio.sleep(0.05)
        assert not creating.done() and "t" not in core.topics
        go.set()
        await asyncio.wait_for(asyncio.gather(deleting, creating), 10)
        assert out.created and out.queues == 3
        assert (await core.send([pb.Message(topic="t", body=b"new")]))[0].offset == 0


async def test_a_request_meeting_a_deletion_still_under_way_at_its_deadline_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_step, go = stall_after_the_first_step(monkeypatch)
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await fill(core, "t", 10)
        deleting = asyncio.create_task(
            admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        )
        await asyncio.wait_for(first_step.wait(), 10)
        by = asyncio.get_running_loop().time() + 0.05
        with pytest.raises(TooManyRequests, match="topic t is being deleted on broker b1"):
            await admin.create_topic(core, pb.CreateTopicRequest(topic="t"), pb.CreateTopicResponse(), rows_by=by)
        assert "t" not in core.topics
        go.set()
        await asyncio.wait_for(deleting, 10)
