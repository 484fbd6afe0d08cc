"""Renew: an in-flight delivery's invisibility moves on, its receipt handle stays the same and valid (the proxy
renews handles its client holds), across a restart too; stale handles are refused one by one. Time is a
ManualClock's: a deadline passes when the test moves it, however slowly the machine runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from popgate_contract.errors import IllegalInvisibleTime, InvalidReceiptHandle
from tests.unit.broker.cores import ManualClock, broker

NOW = 1_800_000_000_000


async def test_renew_keeps_the_handle_and_moves_the_deadline(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        [m] = (await core.pop("t", "g", "*", 1, 300, 0)).messages
        outcome, until = await core.renew("g", [m.handle], 1500)
        assert outcome == [None]
        assert until == NOW + 1500
        clock.now += 600  # past the first deadline
        assert (await core.pop("t", "g", "*", 1, 300, 0)).messages == []  # still invisible
        assert await core.ack("t", "g", [m.handle]) == [None]  # the handle the client holds acks
        clock.now += 1200  # past the renewed deadline: acked, nothing comes back
        assert (await core.pop("t", "g", "*", 1, 300, 0)).messages == []


async def test_a_renewed_deadline_survives_a_restart(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, queues_per_topic=1, flush="sync") as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        [m] = (await core.pop("t", "g", "*", 1, 300, 0)).messages
        assert (await core.renew("g", [m.handle], 30_000))[0] == [None]
    clock.now += 500  # the popped deadline passed while the broker was down
    async with broker(tmp_path, clock=clock, queues_per_topic=1, flush="sync") as (core, _):
        assert (await core.pop("t", "g", "*", 1, 300, 0)).messages == []
        assert await core.ack("t", "g", [m.handle]) == [None]


async def test_stale_expired_and_garbled_handles_are_refused_each_and_deadlines_never_move_earlier(
    tmp_path: Path,
) -> None:
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=str(i).encode()) for i in range(4)])
        acked, redelivered, expired, kept = (await core.pop("t", "g", "*", 4, 200, 0)).messages
        assert (await core.renew("g", [kept.handle], 60_000))[0] == [None]
        await core.ack("t", "g", [acked.handle])
        clock.now += 300  # `redelivered` and `expired` are due again
        [again] = (await core.pop("t", "g", "*", 1, 30_000, 0)).messages  # the earliest due of the two
        assert again.offset == redelivered.offset and again.attempt == 2
        handles = [acked.handle, redelivered.handle, expired.handle, "garbage", kept.handle]
        outcome, _ = await core.renew("g", handles, 1000)
        assert [type(e) for e in outcome] == [InvalidReceiptHandle] * 4 + [type(None)]
        assert "redelivery is due" in str(outcome[2])
        assert await core.ack("t", "g", [expired.handle]) == [None]  # still acks until delivered again
        clock.now += 1200  # a renewal to 1 s did not shorten the 60 s one
        assert (await core.pop("t", "g", "*", 4, 30_000, 0)).messages == []
        with pytest.raises(IllegalInvisibleTime):
            await core.renew("g", [kept.handle], 0)
