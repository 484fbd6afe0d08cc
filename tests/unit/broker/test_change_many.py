"""ChangeInvisibleTimes at a real BrokerCore (no sockets): many handles made invisible to one time in one request,
each with its own result in order, as a ChangeInvisibleTime of each alone would answer it; the new handles act,
the old ones are stale, and the messages come again once their time passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from popgate_contract.errors import DomainError, IllegalBatchSize, IllegalInvisibleTime, InvalidReceiptHandle
from popgate_contract.validation import MAX_HANDLES
from tests.unit.broker.cores import broker


async def test_each_handle_gets_its_own_result_in_order_and_a_stale_one_changes_nothing(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=f"m{i}".encode()) for i in range(3)])
        popped = (await core.pop("t", "g", "*", 3, 30_000, 0)).messages
        assert await core.ack("t", "g", [popped[1].handle]) == [None]
        handles = [m.handle for m in popped]
        outcome, deadline = await core.change_invisible_many("t", "g", handles, 0)
        assert [type(r) for r in outcome] == [tuple, InvalidReceiptHandle, tuple]
        changed = [r for r in outcome if isinstance(r, tuple)]
        assert all(until == deadline for _, until in changed)
        stale = await core.change_invisible_many("t", "g", [handles[0]], 0)  # the old handle no longer acts
        assert isinstance(stale[0][0], InvalidReceiptHandle)
        again = (await core.pop("t", "g", "*", 3, 30_000, 0)).messages
        assert sorted((m.offset, m.attempt) for m in again) == [(0, 2), (2, 2)]
        assert await core.ack("t", "g", [m.handle for m in again]) == [None, None]


async def test_a_new_handle_acts_until_the_message_comes_again(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        [m] = (await core.pop("t", "g", "*", 1, 30_000, 0)).messages
        [(new, _)], _ = await core.change_invisible_many("t", "g", [m.handle], 60_000)
        assert await core.ack("t", "g", [new]) == [None]
        assert (await core.pop("t", "g", "*", 1, 30_000, 0)).messages == []


@pytest.mark.parametrize(
    ("count", "invisible_ms", "error", "match"),
    [
        (0, 0, DomainError, "carries no receipt handle"),
        (MAX_HANDLES + 1, 0, IllegalBatchSize, "handles, at most"),
        (1, -1, IllegalInvisibleTime, "outside"),
    ],
)
async def test_a_request_out_of_bounds_is_refused_whole(
    tmp_path: Path, count: int, invisible_ms: int, error: type[DomainError], match: str
) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        [m] = (await core.pop("t", "g", "*", 1, 30_000, 0)).messages
        with pytest.raises(error, match=match):
            await core.change_invisible_many("t", "g", [m.handle] * count, invisible_ms)
        assert await core.ack("t", "g", [m.handle]) == [None]  # nothing changed: the handle still acts


async def test_messages_given_back_undelivered_keep_their_attempt(tmp_path: Path) -> None:
    """A give-back of messages the application never saw (a receive cancelled as they came): ready at once with the
    attempt they had, taken first, as a Pop its cancel frame released; a nack (not `undelivered`) counts as before.
    A time other than 0 is refused with it."""
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=f"m{i}".encode()) for i in range(3)])
        popped = (await core.pop("t", "g", "*", 2, 30_000, 0)).messages
        with pytest.raises(IllegalInvisibleTime):
            await core.change_invisible_many("t", "g", [popped[0].handle], 1000, undelivered=True)
        outcome, _ = await core.change_invisible_many("t", "g", [m.handle for m in popped], 0, undelivered=True)
        assert all(isinstance(r, tuple) for r in outcome)
        again = (await core.pop("t", "g", "*", 3, 30_000, 0)).messages
        assert [(m.offset, m.attempt) for m in again] == [(0, 1), (1, 1), (2, 1)]
        await core.change_invisible_many("t", "g", [again[0].handle], 0)  # a nack: counted
        [nacked] = (await core.pop("t", "g", "*", 1, 30_000, 0)).messages
        assert (nacked.offset, nacked.attempt) == (0, 2)


async def test_only_a_pops_delivery_is_uncounted_by_an_undelivered_give_back(tmp_path: Path) -> None:
    """A handle a change made (a nack's, or an earlier give-back's) given back undelivered counts its delivery: a
    client cannot walk a message's attempt down by giving back the handles it is answered, and one seen and nacked
    still heads for the DLQ."""
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        [m] = (await core.pop("t", "g", "*", 1, 30_000, 0)).messages
        [(nacked, _)], _ = await core.change_invisible_many("t", "g", [m.handle], 60_000)  # seen, nacked for later
        await core.change_invisible_many("t", "g", [nacked], 0, undelivered=True)
        [again] = (await core.pop("t", "g", "*", 1, 30_000, 0)).messages
        assert again.attempt == 2
        [(back, _)], _ = await core.change_invisible_many("t", "g", [again.handle], 0, undelivered=True)
        await core.change_invisible_many("t", "g", [back], 0, undelivered=True)  # its answer's handle, again
        [third] = (await core.pop("t", "g", "*", 1, 30_000, 0)).messages
        assert third.attempt == 2  # uncounted once (the Pop's), not twice
