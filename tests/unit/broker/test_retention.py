"""Retention (`broker/retention.py`): messages older than --retention-s are deleted as whole batch rows, never a
queue's last row nor a message in flight; groups that had not read them lose them (pull offsets moved up,
stored); the index, lag and a restart agree with what the store keeps. Real SQLite, no sockets; the time of a
pass is given; the broker's clock (store times of sends, deadlines) is a `ManualClock` the test sets."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb
from prometheus_client import generate_latest

from broker import admin, retention, store_writes
from broker.core import BrokerCore
from broker.log import PayloadCache, QueueLog
from broker.metrics import BrokerMetrics
from broker.sqlite_store import SqliteStore
from broker.store import CreateQueue, NewMessage, PurgeTopic, Record
from tests.unit.broker.cores import ManualClock, broker

HOUR_MS = 3600 * 1000
T0 = 1_800_000_000_000


@pytest.fixture
def clock() -> ManualClock:
    """The broker's clock: the store time of what is sent, the core's deadlines."""
    return ManualClock(T0)


def rows(data: Path, topic: str = "t") -> list[int]:
    """The first offsets of the topic's stored batch rows."""
    with closing(sqlite3.connect(data / "broker.sqlite3")) as conn, conn:
        return [o for (o,) in conn.execute("SELECT first_offset FROM batches WHERE topic = ? ORDER BY 1", (topic,))]


def stored_pull(data: Path, group: str) -> int:
    with closing(sqlite3.connect(data / "broker.sqlite3")) as conn, conn:
        [(offset,)] = conn.execute("SELECT pull_offset FROM pull_offsets WHERE grp = ?", (group,)).fetchall()
        return int(offset)


async def send(core: BrokerCore, n: int, *, tag: str | None = None, group: str | None = None) -> None:
    """n messages in one Send: one batch row of queue 0 (the tests' topics have one queue)."""
    messages = [pb.Message(topic="t", body=b"x%d" % i) for i in range(n)]
    for m in messages:
        if tag is not None:
            m.tag = tag
        if group is not None:
            m.message_group = group
    await core.send(messages)


def settings(**extra: Any) -> dict[str, Any]:
    return {"queues_per_topic": 1, "retention_s": 3600.0, "flush": "sync", **extra}


async def test_rows_older_than_the_retention_are_deleted_and_newer_ones_kept(
    tmp_path: Path, clock: ManualClock
) -> None:
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        for _ in range(3):
            await send(core, 2)  # offsets 0..5, three rows stored at T0
        clock.now = T0 + 2 * HOUR_MS
        await send(core, 2)  # 6, 7
        assert await core.retention.run(T0 + HOUR_MS + 1) == 6  # the cut: T0 + 1 ms
        queue = core.topics["t"].queues[0]
        assert (queue.min_offset, queue.max_offset) == (6, 8)
        assert rows(tmp_path) == [6]
        assert core.retention.deleted == {"t": 6}
        metrics = BrokerMetrics()
        metrics.watch(core)
        text = generate_latest(metrics.registry).decode()
        assert 'popgate_broker_retention_deleted_messages_total{topic="t"} 6.0' in text
        assert 'popgate_broker_min_offset{queue="0",topic="t"} 6.0' in text
        listed = await core.list_messages("t", 0, 0, 100)  # from the first message kept
        assert [r.offset for r in listed] == [6, 7]
        assert await core.retention.run(T0 + HOUR_MS + 1) == 0  # nothing more


async def test_a_queue_keeps_its_last_row_and_its_offsets_go_on(tmp_path: Path, clock: ManualClock) -> None:
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        await send(core, 3)
        await send(core, 2)  # 3, 4: the last row
        assert await core.retention.run(T0 + 10 * HOUR_MS) == 3
        assert rows(tmp_path) == [3]
        await send(core, 1)
        assert core.topics["t"].queues[0].max_offset == 6
    async with broker(tmp_path, clock=clock, **settings()) as (
        core,
        _,
    ):  # a start derives the offsets from the rows
        queue = core.topics["t"].queues[0]
        assert (queue.min_offset, queue.max_offset) == (3, 6)
        [sent] = await core.send([pb.Message(topic="t", body=b"next")])
        assert sent.offset == 6


async def test_a_message_in_flight_holds_back_its_row_and_the_rows_after_it(tmp_path: Path, clock: ManualClock) -> None:
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        for _ in range(4):
            await send(core, 2)  # rows 0, 2, 4, 6
        first = await core.pop("t", "g", "*", 3, 30_000, 0)  # 0, 1, 2 in flight
        await core.ack("t", "g", [p.handle for p in first.messages[:2]])  # 2 stays in flight
        late = T0 + 10 * HOUR_MS
        assert await core.retention.run(late) == 2  # row 0 only: row 2 holds offset 2
        assert rows(tmp_path) == [2, 4, 6]
        other = await core.pop("t", "other", "*", 1, 30_000, 0)  # another group's: it starts at 2
        assert [p.offset for p in other.messages] == [2]
        await core.ack("t", "g", [first.messages[2].handle])
        assert await core.retention.run(late) == 0  # `other` holds 2 now
        await core.ack("t", "other", [other.messages[0].handle])
        assert await core.retention.run(late) == 4  # rows 2 and 4; 6 is the last
        assert rows(tmp_path) == [6]


async def test_groups_lose_what_they_never_received_and_their_pull_offsets_are_stored(
    tmp_path: Path, clock: ManualClock
) -> None:
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        await core.notification("t", "idle", "*", 0)  # looks before the topic exists
        await send(core, 4, tag="a")
        await send(core, 4, tag="b")
        clock.now = T0 + 2 * HOUR_MS
        await send(core, 2, tag="a")  # 8, 9: recent
        [before] = core.lags("t", "idle")
        assert before.lag.lag == 10
        await core.retention.run(T0 + HOUR_MS + 1)
        [after] = core.lags("t", "idle")
        assert (after.lag.pull_offset, after.lag.ready, after.lag.lag) == (8, 2, 2)
        assert stored_pull(tmp_path, "idle") == 8
        popped = await core.pop("t", "idle", "a", 32, 30_000, 0)
        assert [p.offset for p in popped.messages] == [8, 9]


async def test_a_filtered_groups_lag_counts_only_what_stays(tmp_path: Path, clock: ManualClock) -> None:
    """A filtered group's lag reuses its last count (broker.lag); one made before retention counted deleted
    messages."""
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        await send(core, 5, tag="a")
        await send(core, 5, tag="b")
        clock.now = T0 + 2 * HOUR_MS
        await send(core, 3, tag="a")
        await core.notification("t", "ga", "a", 0)
        assert [x.lag.lag for x in core.lags("t", "ga")] == [8]
        await core.retention.run(T0 + HOUR_MS + 1)
        assert [x.lag.lag for x in core.lags("t", "ga")] == [3]


async def test_a_restart_after_retention_gives_the_same_offsets_lag_and_index(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many rows over several tag blocks, tags and FIFO messages, a filtered group, messages in flight; a pass of
    several steps and deletion transactions (made small here)."""
    monkeypatch.setattr(store_writes, "DELETE_ROWS", 4)
    monkeypatch.setattr(retention, "STEP_MESSAGES", 500)

    def snapshot(core: BrokerCore) -> Any:
        queue = core.topics["t"].queues[0]
        index = (queue.min_offset, queue.max_offset, list(queue.store_ms), queue.tags, queue.fifo, queue._blocks)  # noqa: SLF001
        return index, sorted((x.group, x.lag) for x in core.lags("t"))

    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        for i in range(30):  # 30 rows of 100 (offsets 0..2999) stored a minute apart
            clock.now = T0 + i * 60_000
            await send(core, 100, tag="abc"[i % 3], group="o1" if i % 7 == 3 else None)
        await core.notification("t", "some", "b || c", 0)
        assert [x.lag.lag for x in core.lags("t", "some")] == [2000]
        # The first 17 rows (stored up to T0 + 16 min) are older than the cut at T0 + 16.5 min.
        assert await core.retention.run(T0 + HOUR_MS + 16 * 60_000 + 30_000) == 1700
        assert rows(tmp_path)[0] == 1700
        assert [x.lag.lag for x in core.lags("t", "some")] == [900]  # rows 17..29: 4 of b, 5 of c
        popped = await core.pop("t", "all", "*", 3, 30_000, 0)
        assert [p.offset for p in popped.messages] == [1700, 1701, 1702]
        await core.ack("t", "all", [popped.messages[0].handle])
        assert await core.retention.run(T0 + HOUR_MS + 25 * 60_000) == 0  # 1701 in flight holds row 1700
        before = snapshot(core)
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        assert snapshot(core) == before
        [sent] = await core.send([pb.Message(topic="t", body=b"next")])
        assert sent.offset == 3000


async def test_big_deletions_go_in_short_transactions_and_steps(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_writes, "DELETE_ROWS", 3)
    monkeypatch.setattr(retention, "STEP_MESSAGES", 7)
    commits: list[float] = []

    async with broker(tmp_path, clock=clock, **settings()) as (core, store):
        for _ in range(20):
            await send(core, 2)
        store._on_commit = commits.append  # noqa: SLF001 - count the transactions
        assert await core.retention.run(T0 + 10 * HOUR_MS) == 38
        assert rows(tmp_path) == [38]
        assert len(commits) >= 19 // 3  # 19 rows, at most 3 a transaction


async def test_retention_0_keeps_everything(tmp_path: Path, clock: ManualClock) -> None:
    async with broker(tmp_path, clock=clock, **settings(retention_s=0.0)) as (core, _):
        await send(core, 2)
        await send(core, 2)
        assert await core.retention.run(T0 + 1000 * HOUR_MS) == 0
        assert rows(tmp_path) == [0, 2]


async def test_a_start_corrects_state_below_a_queues_first_message(tmp_path: Path, clock: ManualClock) -> None:
    """A crash between the deletion and the commit of what it changed (pull offsets, an ack): the start moves the
    pull offset up and drops the delivery of a deleted message, and stores that."""
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        await send(core, 2)
        await send(core, 2)
        await core.pop("t", "g", "*", 1, 30_000, 0)
    with closing(sqlite3.connect(tmp_path / "broker.sqlite3")) as conn, conn:  # as a crash may leave it
        conn.execute("DELETE FROM batches WHERE first_offset = 0")
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        [row] = core.lags("t", "g")
        assert (row.lag.pull_offset, row.lag.inflight, row.lag.lag) == (2, 0, 2)
        await core.store.submit([], [])  # what the start stored is committed
    with closing(sqlite3.connect(tmp_path / "broker.sqlite3")) as conn, conn:
        assert conn.execute("SELECT count(*) FROM inflight").fetchone() == (0,)
    assert stored_pull(tmp_path, "g") == 2


async def test_the_cache_forgets_deleted_payloads(tmp_path: Path, clock: ManualClock) -> None:
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        await send(core, 3)
        await send(core, 1)
        cached = core.cache.bytes
        await core.retention.run(T0 + 10 * HOUR_MS)
        queue = core.topics["t"].queues[0]
        assert sorted(queue.payloads) == [3]
        assert core.cache.bytes == cached // 4


def test_settings_of_retention(tmp_path: Path) -> None:
    from broker.settings import BrokerSettings, parse

    assert BrokerSettings().retention_s == 72 * 3600
    assert parse(["--retention-s", "0", "--retention-check-s", "5"], {}).retention_s == 0
    assert parse([], {"POPGATE_RETENTION_S": "60"}).retention_s == 60
    with pytest.raises(ValueError, match="retention_s"):
        BrokerSettings(retention_s=-1)
    for busy_loop in (0, 0.001):  # a pass looks at every queue: passes back to back would busy the broker
        with pytest.raises(ValueError, match=r"retention_check_s must be in \[1, 86400\]"):
            BrokerSettings(retention_check_s=busy_loop)


async def test_store_deletes_nothing_it_was_not_asked_to(tmp_path: Path) -> None:
    """`retained_from` names row starts; `delete_before` deletes whole rows below, never the row holding it."""
    async with broker(tmp_path, **settings()) as (core, store):
        assert isinstance(store, SqliteStore)
        for n in (3, 3, 3):
            await send(core, n)
        starts = await store.retained_from([("t", 0, 4), ("t", 0, 6), ("t", 0, 100), ("nope", 0, 5)])
        assert starts == {("t", 0): 6}  # the last one asked for the queue wins in the dict
        assert await store.retained_from([("t", 0, 4)]) == {("t", 0): 3}
        assert await store.retained_from([("t", 0, 100)]) == {("t", 0): 6}  # the last row stays
        assert await store.delete_before([("t", 0, 3)]) == 1
        assert rows(tmp_path) == [3, 6]


async def test_a_group_that_popped_and_left_does_not_hold_the_queue_back(tmp_path: Path, clock: ManualClock) -> None:
    """A delivery whose invisibility passed and that nobody popped again held back its row, and every row after
    it, for good (a consumer gone, a group deleted: the disk grew without bound, a review's probe)."""
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        for _ in range(3):
            await send(core, 2)  # rows 0, 2, 4
        await core.pop("t", "gone", "*", 1, 1_000, 0)  # offset 0, invisible 1 s, never acked
        clock.now = T0 + 10 * HOUR_MS
        core.redelivery.expire(core.groups[("gone", "t")], clock.now)  # its invisibility passed
        assert await core.retention.run(clock.now) == 4  # rows 0 and 2; 4 is the last
        state = core.groups[("gone", "t")]
        assert state.inflight_count == 0 and state.queues[0].pull_offset == 4
        [lag] = core.lags("t", "gone")
        assert (lag.lag.ready, lag.lag.inflight) == (2, 0)


async def test_a_row_the_writer_committed_but_not_announced_is_not_taken_for_the_queues_start(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's reader can see a row before the index does: with every message expired it named that new
    row's start (the index's end) as the queue's start; the trim raised, and the retention task died unsaid,
    leaving other queues trimmed in memory only (a review's probe, 5 runs of 6)."""
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        for _ in range(3):
            await send(core, 2)
        queue = core.topics["t"].queues[0]

        async def sees_an_unannounced_row(targets: Any) -> dict[tuple[str, int], int]:
            return {(topic, queue_id): queue.max_offset for topic, queue_id, _ in targets}

        monkeypatch.setattr(core.store, "retained_from", sees_an_unannounced_row)
        assert await core.retention.run(T0 + 10 * HOUR_MS) == 0  # skipped: the next pass sees it right
        assert (queue.min_offset, queue.max_offset) == (0, 6) and rows(tmp_path) == [0, 2, 4]


def test_the_caches_eviction_order_does_not_keep_what_retention_dropped() -> None:
    """Below --cache-bytes nothing is evicted, so the order kept an entry per message sent for good (~100 B a
    message, 1.75 M messages: +150 MiB with 232 kept, a review's probe)."""
    cache = PayloadCache(max_bytes=1 << 30)
    queue = QueueLog("t", 0)
    for offset in range(100_000):
        queue.append(Record("t", 0, offset, T0, None, b"x"))
        cache.add(queue, offset, b"x")
        if offset % 10_000 == 9_999:
            queue.trim(offset - 10)
            cache.drop(queue, offset - 10)
    assert cache.cached == 11 and len(cache._order) <= 2 * cache.cached + 1024


async def test_a_pass_ends_while_sends_go_on(tmp_path: Path, clock: ManualClock) -> None:
    """A pass takes another step only when the step bound cut it, not when it reached the queue's end: a queue's
    end moves with every Send, and a pass that chased it never ended (bench/retention_bench.py hung)."""
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        for _ in range(3):
            await send(core, 2)
        sending = True

        async def sender() -> None:
            while sending:
                await send(core, 2)

        task = asyncio.create_task(sender())
        try:
            deleted = await asyncio.wait_for(core.retention.run(T0 + 10 * HOUR_MS), 10)
        finally:
            sending = False
            await task
        assert deleted >= 4  # everything is older than the cut: all but the last row, as far as it saw


async def test_a_topic_deleted_during_a_deletion_keeps_its_new_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletion goes in steps with pauses between them. A topic deleted (admin) and sent to again meanwhile starts
    its offsets anew: the later steps' cut, taken from the old topic, must not delete the new topic's messages."""
    monkeypatch.setattr(store_writes, "DELETE_ROWS", 3)
    store = SqliteStore(tmp_path, state_delay_s=0)  # the purge is committed at once, before the next step
    store.load()
    store.start(asyncio.get_running_loop())
    await store.submit([], [CreateQueue("t", 0)])
    for i in range(20):  # a row each, as an idle broker commits its sends
        await store.submit([NewMessage("t", 0, i, None, b"old")], [])
    recreated: list[Record] = []
    settled = store._settled  # noqa: SLF001 - between a deletion's steps
    begun: list[asyncio.Task[None]] = []

    def after_a_step(deletion: Any) -> None:
        settled(deletion)
        if not begun:
            begun.append(asyncio.get_running_loop().create_task(recreate()))

    async def recreate() -> None:
        await store.submit([], [PurgeTopic("t")])
        while not (await store.purge_step("t"))[0]:  # its rows, as broker.topic_purges deletes them
            pass
        recreated.extend(await store.submit([NewMessage("t", 0, 99, None, b"new")] * 3, [CreateQueue("t", 0)]))

    store._settled = after_a_step  # type: ignore[method-assign]  # noqa: SLF001
    await store.delete_before([("t", 0, 19)])  # retention's cut of the old topic
    assert not store._purges.counts  # noqa: SLF001 - kept only while a deletion is in progress
    await begun[0]
    await store.close()
    assert [r.offset for r in recreated] == [0, 1, 2]
    assert rows(tmp_path) == [0]  # the new topic's one row, its three messages


async def test_a_cut_chosen_before_its_topic_was_deleted_and_made_again_is_not_applied(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A pass chooses its cuts, then asks the store where each may start (a read that can wait behind others). A
    topic deleted and sent to again meanwhile is a new topic: the old one's cut is not applied to it, and its
    messages stay, also after a restart."""
    async with broker(tmp_path, clock=clock, **settings()) as (core, store):
        for _ in range(3):
            await send(core, 200)
        clock.now = T0 + 2 * HOUR_MS
        real = store.retained_from

        async def retained_from(targets: Any) -> Any:
            starts = await real(targets)
            await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
            for _ in range(5):
                await send(core, 200)
            return starts

        store.retained_from = retained_from  # type: ignore[method-assign]
        assert await core.retention.run() == 0
        queue = core.topics["t"].queues[0]
        assert (queue.min_offset, queue.max_offset) == (0, 1000)
    async with broker(tmp_path, clock=clock, **settings(retention_s=0.0)) as (core, _):
        queue = core.topics["t"].queues[0]
        assert (queue.min_offset, queue.max_offset) == (0, 1000)


async def test_a_deleted_topic_leaves_no_series_behind(tmp_path: Path, clock: ManualClock) -> None:
    """A topic deleted takes its series with it, its retention count too (a topic made again counts from 0, as
    every other family of it does)."""
    async with broker(tmp_path, clock=clock, **settings()) as (core, _):
        for _ in range(3):
            await send(core, 2)
        clock.now = T0 + 2 * HOUR_MS
        await send(core, 2)
        assert await core.retention.run(T0 + HOUR_MS + 1) == 6
        metrics = BrokerMetrics()
        metrics.watch(core)
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        left = [line for line in generate_latest(metrics.registry).decode().splitlines() if 'topic="t"' in line]
    assert left == []
