"""Scheduled delivery: due times, the index, and the deliverer's retry, blocking and flow control.

The deliverer runs inside a real core over a real SQLite store; failures are injected through the
Store interface (a wrapper that fails or stalls the commits that deliver scheduled messages).
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from popgate_pb import broker_pb2 as pb

from broker import admin
from broker.core import BrokerCore
from broker.schedule import DELAY_LEVELS_S, ScheduledDelivery, ScheduleIndex, due_time_ms
from broker.settings import BrokerSettings
from broker.sqlite_store import SqliteStore
from broker.store import DeleteScheduled, NewMessage, Op, Record
from popgate_contract.errors import IllegalDeliveryTime, StoreUnavailable
from tests.unit.broker.cores import ManualClock, broker

DAY = 24 * 3600 * 1000
NOW = 1_800_000_000_000
HOUR = 3600 * 1000


def test_due_time_from_level_timestamp_or_now() -> None:
    assert due_time_ms(1000, deliver_at_ms=0, delay_level=0, max_delay_ms=DAY) is None
    assert due_time_ms(1000, deliver_at_ms=999, delay_level=0, max_delay_ms=DAY) is None  # past: at once
    assert due_time_ms(1000, deliver_at_ms=5000, delay_level=0, max_delay_ms=DAY) == 5000
    assert due_time_ms(1000, deliver_at_ms=0, delay_level=1, max_delay_ms=DAY) == 2000
    assert due_time_ms(0, deliver_at_ms=0, delay_level=18, max_delay_ms=DAY) == 7200 * 1000
    # RocketMQ's messageDelayLevel "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    # (docs/ARCHITECTURE.md §8)
    minutes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30]
    assert list(DELAY_LEVELS_S) == [1, 5, 10, 30] + [60 * m for m in minutes] + [3600, 7200]


@pytest.mark.parametrize(("at", "level"), [(0, 19), (0, -1), (4 * DAY, 0)])
def test_bad_delivery_times(at: int, level: int) -> None:
    with pytest.raises(IllegalDeliveryTime):
        due_time_ms(0, deliver_at_ms=at, delay_level=level, max_delay_ms=3 * DAY)


def test_index_gives_due_entries_earliest_first() -> None:
    index = ScheduleIndex()
    for due, sid in [(30, 1), (10, 2), (20, 3), (40, 4)]:
        index.add(due, sid)
    assert index.next_due() == 10
    assert index.take_due(25, limit=10) == [(10, 2), (20, 3)]
    assert index.take_due(100, limit=1) == [(30, 1)]
    assert len(index) == 1 and index.count_due(39) == 0


# An operation on the index: ("add", due), ("take", now, limit) or ("remove", which of the waiting entries).
index_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 200)),
        st.tuples(st.just("take"), st.integers(-5, 205), st.integers(1, 20)),
        st.tuples(st.just("remove"), st.integers(0, 10_000)),
    ),
    max_size=300,
)


@given(ops=index_ops, nows=st.lists(st.integers(-5, 205), min_size=1, max_size=10))
def test_count_due_equals_a_scan_of_every_entry(
    ops: list[tuple[str, int] | tuple[str, int, int]], nows: list[int]
) -> None:
    index = ScheduleIndex()
    model: dict[int, int] = {}  # schedule id -> due time of the entries still waiting in the index
    for n, op in enumerate(ops):
        if op[0] == "add":
            index.add(op[1], n)
            model[n] = op[1]
        elif op[0] == "take":
            for due, sid in index.take_due(op[1], op[2]):
                assert model.pop(sid) == due
        elif model:  # a recall
            sid = sorted(model)[op[1] % len(model)]
            index.remove(sid)
            del model[sid]
        dues = model.values()
        for now in [*nows, min(dues, default=0), max(dues, default=0)]:
            assert index.count_due(now) == sum(1 for due in dues if due <= now)
        assert index.next_due() == min(dues, default=None)
    assert len(index) == len(model)


def test_recalled_entries_do_not_stay_in_memory_until_their_due_time() -> None:
    """The timeout pattern: each message scheduled an hour ahead and recalled when its work is done."""
    index = ScheduleIndex()
    index.add(HOUR - 1000, 0)  # one not recalled, due first
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for sid in range(1, 20_001):
            index.add(HOUR + sid, sid)
            index.remove(sid)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 100_000, f"{grown / 20_000:.0f} B kept per recalled message"
    assert index.count_due(HOUR + 30_000) == 1 and len(index) == 1
    assert index.take_due(HOUR + 30_000, 10) == [(HOUR - 1000, 0)]


class FlakyStore:
    """Delegates to a real store; commits that deliver scheduled messages fail or stall on demand."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.failures_left = 0
        self.gate: asyncio.Event | None = None
        self.delivery_attempts = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def submit(self, appends: Sequence[NewMessage], ops: Sequence[Op], **how: Any) -> asyncio.Future[list[Record]]:
        if not any(isinstance(op, DeleteScheduled) for op in ops):
            return self.inner.submit(appends, ops, **how)
        self.delivery_attempts += 1
        loop = asyncio.get_running_loop()
        if self.failures_left > 0:
            self.failures_left -= 1
            failed: asyncio.Future[list[Record]] = loop.create_future()
            failed.set_exception(StoreUnavailable("injected failure"))
            return failed
        if self.gate is not None:
            gate = self.gate
            return asyncio.ensure_future(self._after(gate, appends, ops))
        return self.inner.submit(appends, ops, **how)

    async def _after(self, gate: asyncio.Event, appends: Sequence[NewMessage], ops: Sequence[Op]) -> list[Record]:
        await gate.wait()
        return await self.inner.submit(appends, ops)


@asynccontextmanager
async def flaky_core(tmp_path: Path, **settings: object) -> AsyncIterator[tuple[BrokerCore, FlakyStore]]:
    """A started core over a FlakyStore (short back-off), closed on the way out. Its clock stands at NOW until
    `come_due` moves it, so a message sent due later is scheduled however slowly the send runs."""
    inner = SqliteStore(tmp_path / "data")
    store = FlakyStore(inner)
    core = BrokerCore(
        BrokerSettings(name="b1", data_dir=tmp_path / "data", **{"auto_create": True, **settings}),
        store,
        clock=ManualClock(NOW),
    )  # type: ignore[arg-type]
    inner.set_listener(core)
    inner.start(asyncio.get_running_loop())
    core.restore(inner.load())
    core.start()
    core.scheduler.backoff_s = (0.01, 0.02, 0.05)
    try:
        yield core, store
    finally:
        await core.close()
        await inner.close()


def come_due(core: BrokerCore, ms: int) -> None:
    """`ms` pass on the core's ManualClock, and its scheduled delivery hears of it."""
    clock = core.clock
    assert isinstance(clock, ManualClock)
    clock.now += ms
    core.scheduler.added(clock.now)


def delayed(topic: str, body: bytes, due_ms: int) -> pb.Message:
    return pb.Message(topic=topic, body=body, deliver_at_ms=due_ms)


def visible(core: BrokerCore, topic: str) -> int:
    log = core.topics.get(topic)
    return sum(q.max_offset for q in log.queues) if log else 0


async def until(predicate: Callable[[], bool], within_s: float = 20.0) -> None:
    async with asyncio.timeout(within_s):
        while not predicate():  # noqa: ASYNC110 - in-process state with no event to wait on; bounded
            await asyncio.sleep(0.005)


async def test_failed_delivery_is_retried_with_back_off(tmp_path: Path) -> None:
    async with flaky_core(tmp_path) as (core, store):
        store.failures_left = 2
        await core.send([delayed("t", b"x", NOW + 50)])
        assert visible(core, "t") == 0
        come_due(core, 50)
        await until(lambda: visible(core, "t") == 1)
        assert store.delivery_attempts == 3
        assert core.scheduler.stats.retries == 2 and not core.scheduler.blocked


async def test_after_three_failed_retries_delivery_blocks_until_it_succeeds(tmp_path: Path) -> None:
    async with flaky_core(tmp_path) as (core, store):
        store.failures_left = 10**6
        await core.send([delayed("t", b"first", NOW + 20)])
        come_due(core, 20)
        await until(lambda: core.scheduler.blocked)
        assert store.delivery_attempts == 4  # the first try and three retries
        await core.send([delayed("t", b"second", NOW + 30)])
        come_due(core, 10)
        await asyncio.sleep(0.2)
        assert visible(core, "t") == 0 and len(core.schedule) == 1  # blocked: the second waits, nothing skipped
        store.failures_left = 0
        await until(lambda: visible(core, "t") == 2)
        assert not core.scheduler.blocked and core.scheduler.stats.blocked_s > 0


async def test_flow_control_bounds_messages_in_flight(tmp_path: Path) -> None:
    async with flaky_core(tmp_path, schedule_max_in_flight=10) as (core, store):
        store.gate = asyncio.Event()
        await core.send([delayed("t", b"%d" % i, NOW + 10) for i in range(50)])
        come_due(core, 10)
        await until(lambda: core.scheduler.in_flight == 10)
        await asyncio.sleep(0.1)
        assert core.scheduler.in_flight == 10 and len(core.schedule) == 40
        store.gate.set()
        # The messages are visible from the commit's callback; the delivery task leaves flight when it resumes.
        await until(lambda: visible(core, "t") == 50 and core.scheduler.in_flight == 0)


async def test_delivery_stays_blocked_while_any_batch_is_past_its_retries() -> None:
    """Batches 1 and 2 both fail past their retries, 1 first (it blocks delivery); then 1 succeeds while 2
    still fails: nothing due later may go out before 2 (docs/ARCHITECTURE.md §2: after repeated failure the
    level blocks, not skips)."""
    clock = ManualClock(0)
    failing = {1, 2}  # schedule ids whose delivery fails
    attempts: dict[int, int] = {}
    delivered: list[int] = []
    first_blocked = asyncio.Event()

    async def deliver(entries: list[tuple[int, int]]) -> None:
        [(_, sid)] = entries
        attempts[sid] = attempts.get(sid, 0) + 1
        if sid == 2 and attempts[sid] == 1:
            await first_blocked.wait()  # 2's retries start once 1 has blocked delivery
        if sid in failing:
            raise StoreUnavailable("injected")
        delivered.append(sid)

    index = ScheduleIndex()
    sched = ScheduledDelivery(index, deliver, batch=1, backoff_s=(0.001, 0.001, 0.01), clock=clock)
    sched.start()
    index.add(10, 1)
    index.add(20, 2)
    clock.now = 30
    sched.added(10)
    await until(lambda: sched.blocked and sched.in_flight == 2)  # both taken, 1 past its retries
    first_blocked.set()
    await until(lambda: attempts[2] > 4)  # 2 past its retries too
    index.add(40, 3)
    clock.now = 50
    sched.added(40)
    failing.discard(1)  # 1 recovers, 2 does not
    await until(lambda: delivered == [1])
    await asyncio.sleep(0.1)
    assert sched.blocked and 3 not in delivered, delivered
    failing.discard(2)
    await until(lambda: delivered == [1, 2, 3])
    await sched.close()
    assert not sched.blocked and sched.stats.blocked_s > 0
    assert delivered == [1, 2, 3]


async def test_a_message_due_in_a_topic_made_again_with_fewer_queues_goes_to_a_queue_it_has(tmp_path: Path) -> None:
    """Scheduled into queue 7 of 8; the topic deleted before it is due and made again by the delivery with
    --queues-per-topic (4) queues: it and the rest of its batch are consumable at once, and so are later Sends."""
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, queues_per_topic=4) as (core, _):
        await admin.create_topic(core, pb.CreateTopicRequest(topic="t", queues=8), pb.CreateTopicResponse())
        await core.send([pb.Message(topic="t", body=b"late", deliver_at_ms=NOW + 1000, queue_id=7)])
        await core.send([pb.Message(topic="t", body=b"later", deliver_at_ms=NOW + 2000)])
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        clock.now = NOW + 5000
        core.scheduler.added(NOW + 1000)
        await until(lambda: len(core.schedule) == 0 and core.scheduler.in_flight == 0)
        assert len(core.topics["t"].queues) == 4
        assert sorted(await popped(core)) == [b"late", b"later"]
        await core.send([pb.Message(topic="t", body=b"plain%d" % i) for i in range(4)])
        assert sorted(await popped(core)) == [b"plain0", b"plain1", b"plain2", b"plain3"]
    async with broker(tmp_path, clock=clock, queues_per_topic=4) as (core, _):
        assert len(core.topics["t"].queues) == 4


async def popped(core: BrokerCore, topic: str = "t") -> list[bytes]:
    result = await core.pop(topic, "g", "*", 32, 30_000, 0)
    return [pb.Message.FromString(m.payload).body for m in result.messages]
