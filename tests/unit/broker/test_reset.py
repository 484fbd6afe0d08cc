"""An offset reset's own work (broker.reset), pure: however many deliveries a group has in flight on a queue, the
reset stores a fixed number of ops for it and leaves the group's deadline heap with nothing stale to walk; the store
op drops exactly that queue's rows of that group, and nothing written after it in the same commit."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.inflight import ACKED_AHEAD, GroupTopic
from broker.log import QueueLog
from broker.reset import reset_queue
from broker.sqlite_store import SqliteStore
from broker.store import Op, PurgeQueueInflight, PutInflight, SetPullOffset

IN_FLIGHT = 5_000  # per queue


def group_with_many_in_flight() -> tuple[GroupTopic, list[QueueLog]]:
    state = GroupTopic("g", "t")
    queues = [QueueLog("t", 0), QueueLog("t", 1)]
    for queue in queues:
        gq = state.queue(queue.queue_id, 0)
        gq.pull_offset = IN_FLIGHT + 10
        gq.ahead = {IN_FLIGHT + 20, IN_FLIGHT + 21}
        for offset in range(IN_FLIGHT):
            state.start_delivery(queue.queue_id, offset, 1, 60_000 + offset, None)
    return state, queues


def test_a_reset_of_many_deliveries_makes_a_bounded_number_of_store_ops() -> None:
    state, queues = group_with_many_in_flight()
    ops: list[Op] = []
    dropped = [reset_queue(state, queue, 0, ops) for queue in queues]
    assert dropped == [IN_FLIGHT, IN_FLIGHT]
    assert ops == [
        PurgeQueueInflight("g", "t", 0),
        SetPullOffset("g", "t", 0, 0),
        PurgeQueueInflight("g", "t", 1),
        SetPullOffset("g", "t", 1, 0),
    ]
    assert state.inflight_count == 0 and state.current(0, 7, 0) is None


def test_a_reset_of_many_deliveries_leaves_no_stale_deadlines_to_drain() -> None:
    state, queues = group_with_many_in_flight()
    ops: list[Op] = []
    for queue in queues:
        reset_queue(state, queue, 0, ops)
    checked = 0
    valid = state._valid

    def counting(entry: tuple[int, int, int, int]) -> bool:
        nonlocal checked
        checked += 1
        return valid(entry)

    state._valid = counting  # type: ignore[method-assign]
    assert state.next_deadline() is None  # the redelivery timer's question after the reset
    assert checked < 100  # not one look per dropped delivery
    state.start_delivery(0, 3, 1, 5_000, None)  # delivered again from the new offset
    assert state.next_deadline() == 5_000


async def test_the_queue_purge_drops_that_queues_rows_only_and_not_a_later_write(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path, state_delay_s=30.0)  # the three requests below go in one group commit
    store.start(asyncio.get_running_loop())
    try:
        rows = [PutInflight(g, "t", q, o, 1, 9, 100) for g in ("g", "h") for q in (0, 1) for o in range(3)]
        await store.submit([], rows, awaited=True)
        before = store.submit([], [PutInflight("g", "t", 0, 7, ACKED_AHEAD, 0, 0)])
        purge = store.submit([], [PurgeQueueInflight("g", "t", 0)])
        after = store.submit([], [PutInflight("g", "t", 0, 1, 1, 10, 200)])  # popped again from the new offset
        await asyncio.gather(before, purge, after, store.submit([], [], awaited=True))
        kept = {(i.group, i.queue_id, i.offset) for i in store.load().inflight}
    finally:
        await store.close()
    assert kept == {("g", 0, 1)} | {(g, 1, o) for g in ("g", "h") for o in range(3)} | {("h", 0, o) for o in range(3)}
