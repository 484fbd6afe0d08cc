"""Many deliveries due at once, without sockets: expiry moves them a bounded slice per loop turn, each once and in
deadline order, and the ready queue's counts stay true without walking it, also when late acks leave entries stale."""

from __future__ import annotations

import asyncio

from broker.filters import MATCH_ALL
from broker.inflight import Delivery, GroupTopic
from broker.longpoll import Kind, Outcome
from broker.redelivery import EXPIRE_SLICE as SLICE
from broker.redelivery import Redelivery
from broker.reset import reset_queue
from tests.unit.broker.test_longpoll import holding
from tests.unit.broker.test_redelivery import CommitLog, make


def walked(redelivery: Redelivery, state: GroupTopic) -> int:
    """How many ready entries `take` could take, by walking the whole ready queue."""
    fifo_ready = {(q, o) for q in state.queues for o in redelivery.fifo_ready(state, q)}
    return sum(
        1
        for q, o, t in state.ready
        if state.current(q, o, t) is not None and (o not in state.queues[q].fifo or (q, o) in fifo_ready)
    )


def due(state: GroupTopic, count: int, deadline: int) -> None:
    state.queue(0, 0).pull_offset = count
    for offset in range(count):
        state.deliver(0, offset, Delivery(1, offset + 1, deadline))


async def test_a_deadline_shared_by_many_is_expired_a_slice_a_loop_turn_each_once_in_order() -> None:
    """2.5 slices' worth of deliveries share one passed deadline: one `expire` moves a slice, and the timer moves
    the rest a slice per loop turn (other callers are served in between), waking held Pops after each slice; every
    delivery comes back once, in deadline order, with its attempt counted once, and the counts stay true."""
    redelivery, state, hold = make(CommitLog())
    count = 2 * SLICE + SLICE // 2
    due(state, count, redelivery.clock.now_ms() - 1)
    redelivery.expire(state, redelivery.clock.now_ms())
    assert len(state.ready) == redelivery.ready_count(state) == SLICE
    held = [asyncio.ensure_future(holding(hold, ("t", "g"), Kind.POP, MATCH_ALL, 5.0)) for _ in range(3)]
    await asyncio.sleep(0)
    redelivery.schedule(state)
    steps: list[int] = []
    while len(state.ready) < count and len(steps) < 10:
        before = len(state.ready)
        await asyncio.sleep(0)
        steps.append(len(state.ready) - before)
    assert len(state.ready) == count and max(steps) <= SLICE
    assert await asyncio.gather(*held) == [Outcome.SERVED] * 3
    for offset in range(0, count, 3):  # acked late, with their still-valid handles
        state.remove(0, offset)
    assert redelivery.ready_count(state) == walked(redelivery, state) == count - len(range(0, count, 3))
    picks = redelivery.take(state, redelivery.clock.now_ms(), count, [])
    assert picks == [(0, offset, 2) for offset in range(count) if offset % 3]
    assert not redelivery.has_ready(state) and redelivery.ready_count(state) == 0
    await redelivery.close()


async def test_late_acks_of_expired_deliveries_leave_no_stale_entries_behind() -> None:
    """Deliveries expire and most are then acked (or given a new invisibility) before any Pop: once stale entries
    are the majority the ready queue is rebuilt without them; what stays is exactly what a Pop takes, in order."""
    redelivery, state, _ = make(CommitLog())
    count = 5_000
    due(state, count, 100)
    redelivery.expire(state, 200)
    for offset in range(count):
        if offset % 5:
            state.remove(0, offset)  # acked late
    assert len(state.ready) < count // 2
    assert redelivery.ready_count(state) == walked(redelivery, state) == count // 5
    state.start_delivery(0, 5, 1, redelivery.clock.now_ms() + 60_000, [])  # ChangeInvisibleTime of a ready one
    assert redelivery.ready_count(state) == walked(redelivery, state) == count // 5 - 1
    picks = redelivery.take(state, 300, 10, [])
    assert picks == [(0, offset, 2) for offset in (0, 10, 15, 20, 25, 30, 35, 40, 45, 50)]
    assert redelivery.ready_count(state) == walked(redelivery, state) == count // 5 - 11
    reset_queue(state, redelivery.topics["t"].queues[0], count, [])  # every delivery dropped
    assert (len(state.ready), redelivery.ready_count(state), redelivery.has_ready(state)) == (0, 0, False)
    await redelivery.close()
