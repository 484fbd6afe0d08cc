"""The broker keeps consumer-group state for a bounded number of (group, topic) pairs (`--max-groups`) and a
bounded number of topics (`--max-topics`): what any client can make up by naming it is limited. Answers that list
stored messages are bounded in bytes (`--max-pop-bytes`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from popgate_contract.errors import IllegalBatchSize, IllegalPollingTime, TooManyRequests
from tests.unit.broker.cores import broker


async def test_a_new_group_beyond_the_limit_is_too_many_requests_and_the_known_ones_go_on(tmp_path: Path) -> None:
    async with broker(tmp_path / "data", max_groups=2) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        assert len((await core.pop("t", "g1", "*", 1, 30_000, 0)).messages) == 1
        assert await core.notification("t", "g2", "*", 0) == (True, False)
        with pytest.raises(TooManyRequests, match="--max-groups"):
            await core.pop("t", "g3", "*", 1, 30_000, 0)
        with pytest.raises(TooManyRequests, match="--max-groups"):
            await core.notification("t", "g3", "*", 0)
        assert len((await core.pop("t", "g2", "*", 1, 30_000, 0)).messages) == 1
        assert sorted({row.group for row in core.lags()}) == ["g1", "g2"]


async def test_a_send_that_would_create_topics_beyond_the_limit_is_refused_whole(tmp_path: Path) -> None:
    """Before, any Send created every topic it named (one Send of 1,024 messages: 1,024 topics)."""
    async with broker(tmp_path / "data", max_topics=3) as (core, _):
        await core.send([pb.Message(topic="t1", body=b"x")])
        batch = [pb.Message(topic=name, body=b"y") for name in ("t1", "t2", "t3", "t4", "t2")]
        with pytest.raises(TooManyRequests, match=r"--max-topics 3\): a Send creating 3 more is refused"):
            await core.send(batch)
        # nothing half-way: no topic created, not even the ones that would have fitted, and t1 unchanged
        assert sorted(core.topics) == ["t1"]
        assert sum(q.max_offset for q in core.topics["t1"].queues) == 1
        await core.send([pb.Message(topic=name, body=b"z") for name in ("t2", "t3", "t1")])
        with pytest.raises(TooManyRequests, match="--max-topics"):
            await core.send(
                [pb.Message(topic="t4", body=b"z", deliver_at_ms=core.clock.now_ms() + 60_000)]
            )  # delayed too
        await core.send([pb.Message(topic="t3", body=b"z")])  # existing topics take messages as before
        # a dead-letter topic is the broker's own: created at the limit, and counted
        [m] = (await core.pop("t2", "g", "*", 1, 30_000, 0)).messages
        await core.dead_letter("t2", "g", m.handle)
        assert sorted(core.topics) == ["%DLQ%g", "t1", "t2", "t3"]


async def test_past_the_topic_limit_by_the_brokers_own_topics_sends_to_existing_topics_go_on(tmp_path: Path) -> None:
    async with broker(tmp_path / "data", max_topics=2) as (core, _):
        await core.send([pb.Message(topic=name, body=b"x") for name in ("a", "b")])
        [m] = (await core.pop("a", "g", "*", 1, 30_000, 0)).messages
        await core.dead_letter("a", "g", m.handle)  # the broker's own topic takes it past the limit
        assert sorted(core.topics) == ["%DLQ%g", "a", "b"]
        await core.send([pb.Message(topic=name, body=b"y") for name in ("a", "b", "a")])
        assert sum(q.max_offset for q in core.topics["b"].queues) == 2
        with pytest.raises(
            TooManyRequests, match=r"has 3 topics, its limit \(--max-topics 2\): a Send creating 1 more"
        ):
            await core.send([pb.Message(topic="a", body=b"z"), pb.Message(topic="c", body=b"z")])


async def test_listing_stored_messages_is_cut_at_the_byte_budget_and_goes_on_from_the_next_offset(
    tmp_path: Path,
) -> None:
    """Before, ListMessages returned `limit` whole messages: six of 4 MiB were past the gRPC message limit and
    the admin's `dlq list` failed outright."""
    bodies = [bytes([65 + i]) * 3000 for i in range(5)]

    async with broker(tmp_path / "data", queues_per_topic=1, max_pop_bytes=7000) as (core, _):
        await core.send([pb.Message(topic="t", body=body) for body in bodies])
        await core.send([pb.Message(topic="t", body=b"z" * 9000)])  # alone larger than the budget
        pages, offset = [], 0
        while page := await core.list_messages("t", 0, offset, 1000):
            assert sum(len(r.payload) for r in page) <= 7000 or len(page) == 1
            pages.append([r.offset for r in page])
            offset = page[-1].offset + 1
        assert [pb.Message.FromString(r.payload).body for r in await core.list_messages("t", 0, 1, 1)] == [bodies[1]]
    assert pages == [[0, 1], [2, 3], [4], [5]]


async def test_a_pop_larger_or_longer_than_the_brokers_limits_is_served_within_them(tmp_path: Path) -> None:
    """A proxy's batch and long-polling ranges are its own settings: a broker with smaller ones serves what it can
    (fewer messages, a shorter hold) instead of refusing every such receive. Nothing below 1 message or 0 ms."""
    async with broker(tmp_path / "data", max_pop_batch=4, max_poll_s=0.2) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x%d" % i) for i in range(6)])
        assert len((await core.pop("t", "g", "*", 32, 30_000, 0)).messages) == 4
        assert len((await core.pop("t", "g", "*", 32, 30_000, 0)).messages) == 2
        # held 0.2 s, not 45 (the bound is generous: it fails only when the 45 s are held)
        nothing = await asyncio.wait_for(core.pop("t", "g", "*", 32, 30_000, 45_000), 20)
        assert nothing.messages == []
        assert await asyncio.wait_for(core.notification("t", "g", "*", 45_000), 20) == (False, False)
        with pytest.raises(IllegalBatchSize):
            await core.pop("t", "g", "*", 0, 30_000, 0)
        with pytest.raises(IllegalPollingTime):
            await core.pop("t", "g", "*", 1, 30_000, -1)


async def test_a_send_of_a_whole_sendmessage_is_taken_and_one_message_more_is_refused_whole(tmp_path: Path) -> None:
    # a proxy forwards one SendMessage (up to 1,024 messages) as one Send: no broker setting may refuse that
    async with broker(tmp_path / "data", queues_per_topic=1) as (core, _):
        assert len(await core.send([pb.Message(topic="t", body=b"x")] * 1024)) == 1024
        with pytest.raises(IllegalBatchSize, match="1025 messages, at most 1024"):
            await core.send([pb.Message(topic="t", body=b"y")] * 1025)
        await core.pop("t", "g", "*", 1, 30_000, 0)  # the group's lag rows exist once it has popped
        assert [row.lag.max_offset for row in core.lags("t", "g")] == [1024]  # none of the 1,025 stored
