"""Recall of scheduled messages in the broker core (broker.recall): before its time a recalled message is never
delivered, also after a restart; a due, delivered, recalled or unknown one, and a garbage or foreign handle, are
clear errors that change nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker.core import BrokerCore
from popgate_contract.errors import InvalidRecallHandle, NotScheduled
from popgate_contract.handles import RecallHandle
from tests.unit.broker.cores import ManualClock, broker, submitted_event

NOW = 1_800_000_000_000
INVISIBLE_MS = 30_000


async def schedule(core: BrokerCore, body: bytes, due_ms: int) -> str:
    (sent,) = await core.send([pb.Message(topic="t", body=body, deliver_at_ms=due_ms)])
    assert sent.recall_handle and sent.offset == -1
    return sent.recall_handle


async def deliver_due(core: BrokerCore, clock: ManualClock, now: int) -> list[bytes]:
    clock.now = now
    entries = core.schedule.take_due(now, 100)
    if entries:
        await core.sends.deliver_scheduled(entries)
    result = await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)
    return [pb.Message.FromString(m.payload).body for m in result.messages]


async def test_a_recalled_message_is_never_delivered_also_after_a_restart(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock) as (core, _):
        handle = await schedule(core, b"recalled", NOW + 60_000)
        await schedule(core, b"kept", NOW + 60_000)
        assert await core.recall("t", handle) == RecallHandle.decode(handle).message_id
        with pytest.raises(NotScheduled):  # twice: the second is refused
            await core.recall("t", handle)
    async with broker(tmp_path, clock=clock) as (core, _):
        assert len(core.schedule) == 1
        assert await deliver_due(core, clock, NOW + 61_000) == [b"kept"]


async def test_a_delivered_message_cannot_be_recalled(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock) as (core, _):
        handle = await schedule(core, b"due", NOW + 1_000)
        assert await deliver_due(core, clock, NOW + 2_000) == [b"due"]
        with pytest.raises(NotScheduled, match="not waiting"):
            await core.recall("t", handle)


@pytest.mark.parametrize(
    "handle",
    [
        "",
        "garbage",
        "x" * 5000,
        RecallHandle("b2", "t", 1, "id").encode(),  # another broker's
        RecallHandle("b1", "other", 1, "id").encode(),  # another topic's
        RecallHandle("b1", "t", 1, "forged-id").encode(),  # the row exists, the message is another
    ],
)
async def test_a_garbage_or_forged_handle_is_refused_and_nothing_changes(tmp_path: Path, handle: str) -> None:
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock) as (core, _):
        await schedule(core, b"kept", NOW + 1_000)
        with pytest.raises(InvalidRecallHandle):
            await core.recall("t", handle)
        assert len(core.schedule) == 1
        assert await deliver_due(core, clock, NOW + 2_000) == [b"kept"]


async def test_an_unknown_schedule_row_is_not_scheduled(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        with pytest.raises(NotScheduled):
            await core.recall("t", RecallHandle("b1", "t", 99, "id").encode())


async def test_a_recall_cancelled_during_its_commit_still_takes_effect(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock) as (core, _):
        handle = await schedule(core, b"recalled", NOW + 60_000)
        submitted = submitted_event(core)
        recalling = asyncio.create_task(core.recall("t", handle))
        await submitted.wait()
        recalling.cancel()  # the caller went away while the commit was under way
        with pytest.raises(asyncio.CancelledError):
            await recalling
        with pytest.raises(NotScheduled):
            await core.recall("t", handle)
        assert await deliver_due(core, clock, NOW + 61_000) == []


async def test_a_recall_is_not_deferred_as_consumer_state(tmp_path: Path) -> None:
    """Its caller waits for the commit: it goes to the store's writer at once, never after the delay consumer state
    waits under --flush async (here 30 s)."""
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, state_delay_s=30.0) as (core, _):
        handle = await asyncio.wait_for(schedule(core, b"recalled", NOW + 60_000), 10)
        await asyncio.wait_for(core.recall("t", handle), 10)
        assert await deliver_due(core, clock, NOW + 61_000) == []
