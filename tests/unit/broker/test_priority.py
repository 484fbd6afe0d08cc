"""Priority messages in the broker (broker.priority): a higher priority is delivered first among the messages a
group may read now, over the topic's queues, the earliest first among equals in a queue; what a group took ahead
of its pull offset stays bounded and survives a restart; bad priorities are refused with nothing stored."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin
from broker.core import BrokerCore
from broker.filters import MATCH_ALL
from broker.inflight import GroupQueue
from broker.log import QueueLog
from broker.priority import WINDOW, take_prioritized
from broker.store import Record
from popgate_contract.errors import BadRequest
from tests.unit.broker.cores import broker

INVISIBLE_MS = 30_000


def queue_of(priorities: list[int]) -> QueueLog:
    queue = QueueLog("t", 0)
    for offset, p in enumerate(priorities):
        queue.append(Record("t", 0, offset, 1000 + offset, None, b"", priority=p))
    return queue


def test_the_highest_priority_comes_first_and_the_pull_offset_skips_what_was_taken() -> None:
    queue = queue_of([0, 5, 0, 9, 5])
    gq = GroupQueue(0, 0)
    assert take_prioritized(queue, gq, MATCH_ALL, 2, queue.max_offset) == [3, 1]
    assert gq.pull_offset == 0 and gq.ahead == {1, 3}
    assert take_prioritized(queue, gq, MATCH_ALL, 1, queue.max_offset) == [4]
    assert take_prioritized(queue, gq, MATCH_ALL, 5, queue.max_offset) == [0, 2]
    assert gq.pull_offset == queue.max_offset and gq.ahead is None


def test_what_a_group_took_ahead_stays_below_the_window() -> None:
    queue = queue_of([0] + [1] * (3 * WINDOW))  # a low-priority message at the front, never the best choice
    gq = GroupQueue(0, 0)
    taken: list[int] = []
    while gq.pull_offset < queue.max_offset:
        taken += take_prioritized(queue, gq, MATCH_ALL, 100, queue.max_offset)
        assert gq.ahead is None or len(gq.ahead) < WINDOW
    assert sorted(taken) == list(range(queue.max_offset))  # each once
    assert taken.index(0) == WINDOW - 1  # the low one waits only while its window holds a better one


async def send(core: BrokerCore, priorities: list[int]) -> None:
    await core.send(
        [pb.Message(topic="t", body=f"p{p}-{i}".encode(), queue_id=0, priority=p) for i, p in enumerate(priorities)]
    )


def bodies(result: object) -> list[str]:
    return [pb.Message.FromString(m.payload).body.decode() for m in result.messages]  # type: ignore[attr-defined]


async def test_a_pop_takes_higher_priorities_first_also_after_a_restart(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        await send(core, [0, 3, 1, 3, 7])
        first = await core.pop("t", "g", "*", 2, INVISIBLE_MS, 0)
        assert bodies(first) == ["p7-4", "p3-1"]
    async with broker(tmp_path) as (core, _):  # in flight ahead of the pull offset: not delivered twice
        rest = await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)
        assert bodies(rest) == ["p3-3", "p1-2", "p0-0"]
        other = await core.pop("t", "g2", "*", 32, INVISIBLE_MS, 0)  # each group has its own order
        assert bodies(other) == ["p7-4", "p3-1", "p3-3", "p1-2", "p0-0"]


async def test_a_pop_takes_the_highest_priorities_of_every_queue_first(tmp_path: Path) -> None:
    """A topic's messages spread over its queues: a Pop compares the priorities of all of them, as RocketMQ orders
    a topic's priorities within a broker, and answers them highest first; equals come from the queues in turn."""
    async with broker(tmp_path, queues_per_topic=4) as (core, _):
        await core.send([pb.Message(topic="t", body=b"low%d" % i, priority=1) for i in range(5)])
        await core.send([pb.Message(topic="t", body=b"HIGH", priority=9)])
        one = await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)
        assert bodies(one) == ["HIGH"]
        rest = await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)
        assert sorted(bodies(rest)) == [f"low{i}" for i in range(5)]
        all_at_once = await core.pop("t", "g2", "*", 32, INVISIBLE_MS, 0)
        assert bodies(all_at_once)[0] == "HIGH" and len(bodies(all_at_once)) == 6


@pytest.mark.parametrize(
    "message",
    [
        pb.Message(topic="t", body=b"x", priority=-1),
        pb.Message(topic="t", body=b"x", priority=2, message_group="g"),
        pb.Message(topic="t", body=b"x", priority=2, delay_level=1),
    ],
)
async def test_a_bad_priority_is_refused_and_nothing_is_stored(tmp_path: Path, message: pb.Message) -> None:
    async with broker(tmp_path) as (core, _):
        with pytest.raises(BadRequest):
            await core.send([pb.Message(topic="t", body=b"ok"), message])
        assert "t" not in core.topics or all(q.max_offset == 0 for q in core.topics["t"].queues)


def stored_inflight(data: Path) -> list[tuple[int, int, int]]:
    """(queue, offset, attempt) of every stored in-flight row, the broker closed."""
    with contextlib.closing(sqlite3.connect(data / "broker.sqlite3")) as conn:
        return sorted(conn.execute("SELECT queue, offset, attempt FROM inflight"))


async def test_an_ack_of_a_message_taken_ahead_holds_across_a_restart(tmp_path: Path) -> None:
    async with broker(tmp_path, flush="sync") as (core, _):
        await send(core, [0, 7])
        first = await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)
        assert bodies(first) == ["p7-1"]
        assert await core.ack("t", "g", [m.handle for m in first.messages]) == [None]
    async with broker(tmp_path, flush="sync") as (core, _):
        rest = await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)
        assert bodies(rest) == ["p0-0"]  # the acked p7 is not delivered again
        assert await core.ack("t", "g", [m.handle for m in rest.messages]) == [None]
    assert stored_inflight(tmp_path) == []  # the pull offset passed it: nothing of it is kept


async def test_a_dead_letter_of_a_message_taken_ahead_holds_across_a_restart(tmp_path: Path) -> None:
    async with broker(tmp_path, flush="sync") as (core, _):
        await send(core, [0, 7])
        first = await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)
        await core.dead_letter("t", "g", first.messages[0].handle)
    async with broker(tmp_path, flush="sync") as (core, _):
        assert bodies(await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)) == ["p0-0"]


async def test_a_reset_forgets_what_was_taken_ahead_also_after_a_restart(tmp_path: Path) -> None:
    async with broker(tmp_path, flush="sync") as (core, _):
        await send(core, [0, 7])
        first = await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)
        await core.ack("t", "g", [m.handle for m in first.messages])
        request = pb.ResetOffsetRequest(topic="t", group="g", to=pb.ResetOffsetRequest.To.EARLIEST)
        await admin.reset_offset(core, request, pb.ResetOffsetResponse())
    assert stored_inflight(tmp_path) == []
    async with broker(tmp_path, flush="sync") as (core, _):
        assert bodies(await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)) == ["p7-1", "p0-0"]


async def test_lag_counts_a_message_taken_ahead_once_and_an_acked_one_not_at_all(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        await send(core, [0, 7, 7, 7])
        taken = await core.pop("t", "g", "*", 3, INVISIBLE_MS, 0)
        assert bodies(taken) == ["p7-1", "p7-2", "p7-3"]
        [row] = [r.lag for r in core.lags("t", "g") if r.queue_id == 0]
        assert (row.ready, row.inflight, row.lag) == (1, 3, 4)
        await core.ack("t", "g", [m.handle for m in taken.messages])
        [row] = [r.lag for r in core.lags("t", "g") if r.queue_id == 0]
        assert (row.ready, row.inflight, row.lag) == (1, 0, 1)


async def test_a_message_taken_ahead_in_flight_leaves_the_lag_and_offset_of_the_older_one_waiting(
    tmp_path: Path,
) -> None:
    """A priority Pop takes a newer message ahead of an older one it leaves waiting: the lag in time is the older
    one's, and the consumer offset (all below acked) stays at the pull offset, not past the unsent message, so it
    does not go back when the newer ones are acked."""
    from tests.unit.broker.cores import ManualClock

    t0, hour = 1_800_000_000_000, 3_600_000
    clock = ManualClock(t0)
    async with broker(tmp_path, clock=clock, queues_per_topic=1, flush="sync") as (core, _):
        await core.send([pb.Message(topic="t", body=b"old-p0")])
        clock.now = t0 + hour
        await core.send([pb.Message(topic="t", body=b"new-p9-%d" % i, priority=9) for i in range(3)])
        clock.now = t0 + 2 * hour
        popped = await core.pop("t", "g", "*", 3, 30_000, 0)
        assert bodies(popped) == ["new-p9-0", "new-p9-1", "new-p9-2"]
        [row] = [x.lag for x in core.lags("t", "g")]
        assert row.lag_seconds(clock.now) == 2 * 3600 and row.consumer_offset == 0
        await core.ack("t", "g", [m.handle for m in popped.messages])
        [row] = [x.lag for x in core.lags("t", "g")]
        assert row.consumer_offset == 0 and row.lag == 1
