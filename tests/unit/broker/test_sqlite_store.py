"""The SQLite store's message batches: what goes in one commit comes back, per offset, after a reopen."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import threading
import time
import tracemalloc
from contextlib import closing
from pathlib import Path

import pytest

from broker import store_writes
from broker.batches import BATCH_MESSAGES
from broker.sqlite_store import SqliteStore
from broker.store import DeleteInflight, NewMessage, Op, PurgeGroup, PurgeTopic, PutInflight, Record, SetPullOffset
from broker.store_pacing import INLINE_MAX_LOOP_BUSY, LoopLoad
from broker.store_writes import KIND_ORDER, coalesce
from popgate_contract.errors import StoreUnavailable
from tests.unit.broker.cores import loaded

N = BATCH_MESSAGES * 2 + 7  # more than one batch row per queue in one commit


def message(i: int, queue_id: int = 0) -> NewMessage:
    tag = None if i % 3 == 0 else f'tag "{i % 5}" ✓'
    return NewMessage("t", queue_id, 1_000 + i, tag, b"p%d" % i * (1 + i % 7))


async def payloads(store: SqliteStore, queue_id: int, offsets: list[int]) -> dict[int, bytes]:
    """The stored payloads of one queue's offsets, by offset."""
    found = await store.read_payloads("t", {queue_id: offsets})
    assert {q for q, _ in found} <= {queue_id}
    return {offset: payload for (_, offset), payload in found.items()}


async def write(store: SqliteStore) -> list[Record]:
    store.start(asyncio.get_running_loop())
    first = await store.submit([message(i) for i in range(N)], [])
    # Two commits queued together share one group commit; queue 1 interleaves.
    second, third = await asyncio.gather(
        store.submit([message(i) for i in range(N, N + 40)], [PutInflight("g", "t", 0, 3, 1, 2**47, 9)]),
        store.submit([message(i, queue_id=1) for i in range(5)], []),
    )
    return first + second + third


async def test_messages_come_back_by_offset_range_and_after_reopen(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    records = await write(store)
    assert [r.offset for r in records[: N + 40]] == list(range(N + 40))
    assert [r.offset for r in records[N + 40 :]] == list(range(5))
    expected = {i: message(i).payload for i in range(N + 40)}

    # A contiguous span crossing batch boundaries, and a few offsets far apart.
    span = list(range(BATCH_MESSAGES - 3, BATCH_MESSAGES * 2 + 2))
    assert await payloads(store, 0, span) == {o: expected[o] for o in span}
    sparse = [0, BATCH_MESSAGES, N + 39]
    assert await payloads(store, 0, sparse) == {o: expected[o] for o in sparse}
    assert await payloads(store, 0, [N + 40]) == {}
    assert await payloads(store, 1, [4]) == {4: message(4, 1).payload}
    # Several queues in one read, each as alone.
    both = await store.read_payloads("t", {0: sparse, 1: [0, 4], 2: [1]})
    assert both == {(0, o): expected[o] for o in sparse} | {(1, o): message(o, 1).payload for o in (0, 4)}

    listed = await store.read_range("t", 0, BATCH_MESSAGES - 1, 600)
    assert [(r.offset, r.store_ms, r.tag, r.payload) for r in listed] == [
        (o, 1_000 + o, message(o).tag, expected[o]) for o in range(BATCH_MESSAGES - 1, N + 40)
    ]
    assert [r.offset for r in await store.read_range("t", 0, 10, 3)] == [10, 11, 12]
    assert await store.read_range("t", 0, N + 40, 10) == []
    await store.close()

    reopened = SqliteStore(tmp_path)
    snap = reopened.load()
    index = snap.queues[("t", 0)]
    assert index.min_offset == 0
    assert list(index.store_ms) == [1_000 + i for i in range(N + 40)]
    assert index.tags == [message(i).tag for i in range(N + 40)]
    assert len(snap.queues[("t", 1)].tags) == 5
    assert snap.inflight == [PutInflight("g", "t", 0, 3, 1, 2**47, 9)]
    reopened.start(asyncio.get_running_loop())
    more = await reopened.submit([message(0)], [])
    assert more[0].offset == N + 40  # offsets carry on after the reopen
    await reopened.close()


async def test_consumer_state_written_a_moment_later_keeps_its_order_and_is_flushed_at_close(tmp_path: Path) -> None:
    put = PutInflight("g", "t", 0, 0, 1, 7, 9)
    store = SqliteStore(tmp_path, state_delay_s=60.0)  # the timer never fires in this test
    store.start(asyncio.get_running_loop())
    [record] = await store.submit([message(0)], [])
    delivered = store.submit([], [put])  # deferred: nobody waits for consumer state under async
    assert not delivered.done()
    # A request with appends goes at once, and takes what was deferred before it along, in order:
    # the delivery is written before it is deleted, so no in-flight row is left behind.
    await store.submit([message(1)], [DeleteInflight("g", "t", 0, record.offset)])
    assert delivered.done()
    kept = store.submit([], [PutInflight("g", "t", 0, 1, 1, 8, 9)])
    await store.close()
    assert kept.done()
    assert (await loaded(tmp_path)).inflight == [PutInflight("g", "t", 0, 1, 1, 8, 9)]


def test_a_commit_writes_each_row_once_as_its_last_op_leaves_it() -> None:
    popped_and_acked = PutInflight("g", "t", 0, 1, 1, 9, 9)
    by_kind: dict[type, list[Op]] = {kind: [] for kind in KIND_ORDER}
    by_kind[SetPullOffset] += [
        SetPullOffset("g", "t", 0, 1),
        SetPullOffset("g", "t", 1, 2),
        SetPullOffset("g", "t", 0, 3),
    ]
    inflight: list[Op] = [
        PutInflight("g", "t", 0, 0, 1, 7, 9),
        popped_and_acked,
        PutInflight("g", "t", 0, 0, 2, 8, 10),
        DeleteInflight("g", "t", 0, 1),
        DeleteInflight("g", "t", 0, 5),  # stored by an earlier commit: its delete still runs
        DeleteInflight("g", "t", 0, 6),  # an offset reset's, then the same message popped again: written
        PutInflight("g", "t", 0, 6, 1, 11, 12),
    ]
    coalesce(by_kind, inflight)
    assert by_kind[PutInflight] == [PutInflight("g", "t", 0, 0, 2, 8, 10), PutInflight("g", "t", 0, 6, 1, 11, 12)]
    assert by_kind[SetPullOffset] == [SetPullOffset("g", "t", 0, 3), SetPullOffset("g", "t", 1, 2)]
    assert by_kind[DeleteInflight] == [DeleteInflight("g", "t", 0, 1), DeleteInflight("g", "t", 0, 5)]


async def test_a_delivery_deleted_then_made_again_in_one_commit_is_stored(tmp_path: Path) -> None:
    """An offset reset deletes a message's delivery and a Pop makes it again before either is committed (one group
    commit under --flush async): the delivery is stored, so the message comes back after a restart."""
    store = SqliteStore(tmp_path, state_delay_s=60.0)  # deferred together, written by the close
    store.start(asyncio.get_running_loop())
    await store.submit([message(0)], [PutInflight("g", "t", 0, 0, 1, 1, 9), SetPullOffset("g", "t", 0, 1)])
    store.submit([], [DeleteInflight("g", "t", 0, 0), SetPullOffset("g", "t", 0, 0)])  # reset to the earliest
    store.submit([], [PutInflight("g", "t", 0, 0, 1, 2, 10), SetPullOffset("g", "t", 0, 1)])  # popped again
    await store.close()
    snap = await loaded(tmp_path)
    assert snap.inflight == [PutInflight("g", "t", 0, 0, 1, 2, 10)]


async def test_consumer_state_deferred_together_ends_as_its_last_ops_leave_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path, state_delay_s=60.0)  # the timer never fires in this test
    store.start(asyncio.get_running_loop())
    await store.submit([message(0)], [PutInflight("g", "t", 0, 5, 1, 1, 9), SetPullOffset("g", "t", 0, 6)])
    store.submit([], [PutInflight("g", "t", 0, 6, 1, 7, 9), SetPullOffset("g", "t", 0, 7)])  # popped
    store.submit([], [PutInflight("g", "t", 0, 6, 2, 8, 10), PutInflight("g", "t", 0, 7, 1, 9, 9)])  # redelivered
    store.submit([], [DeleteInflight("g", "t", 0, 7), DeleteInflight("g", "t", 0, 5), SetPullOffset("g", "t", 0, 8)])
    await store.close()
    snap = await loaded(tmp_path)
    assert snap.inflight == [PutInflight("g", "t", 0, 6, 2, 8, 10)]
    assert snap.pull_offsets == [SetPullOffset("g", "t", 0, 8)]


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_an_idle_store_commits_a_send_at_once_and_a_busy_one_in_groups(
    tmp_path: Path, flush: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under --flush async a Send to a store with nothing in flight, on an event loop with time to spare, is
    committed on the loop's thread, with no hand-off to the writer thread and back; Sends that come while one is
    in flight go to the writer and share its commits; offsets and answers keep the order of submission either
    way. --flush sync: always the writer. A loop busy most of the time (a saturated broker) hands even a lone
    Send to the writer, whose SQL then runs beside the loop."""
    loop_busy = 0.0
    monkeypatch.setattr(LoopLoad, "busy", lambda _: loop_busy)
    threads: list[int] = []
    store = SqliteStore(tmp_path, flush=flush, on_commit=lambda _: threads.append(threading.get_ident()))
    store.start(asyncio.get_running_loop())
    here = threading.get_ident()
    [first] = await store.submit([message(0)], [])
    assert threads == [here] if flush == "async" else threads[0] != here
    threads.clear()
    pending = [store.submit([message(i)], []) for i in range(1, 6)]  # one after another, none awaited yet
    answers = await asyncio.gather(*pending)
    assert [r.offset for [r] in answers] == [1, 2, 3, 4, 5]
    if flush == "async":
        assert threads.pop(0) == here  # the first found the store idle
    to_writer = len(pending) - (flush == "async")
    assert threads and here not in threads
    assert len(threads) < to_writer  # they shared commits
    threads.clear()
    loop_busy = INLINE_MAX_LOOP_BUSY
    [last] = await store.submit([message(6)], [])
    assert last.offset == 6 and len(threads) == 1 and here not in threads
    await store.close()


async def test_a_write_lock_held_elsewhere_never_holds_the_event_loop(tmp_path: Path) -> None:
    """Another connection (an operator's `sqlite3` shell) holds the write lock as an idle store takes a Send: the
    Send is not committed on the loop's thread, where waiting for the lock would hold the loop (every health check
    and request) for up to 5 s, but by the writer thread, once the lock is free."""
    store = SqliteStore(tmp_path, flush="async")
    store.start(asyncio.get_running_loop())
    await store.submit([message(0)], [])  # an idle store: committed on the loop's thread
    with closing(sqlite3.connect(tmp_path / "broker.sqlite3", isolation_level=None)) as shell:
        shell.execute("BEGIN IMMEDIATE")
        sent = store.submit([message(1)], [])
        assert not sent.done()  # the loop was not held: the writer waits for the lock
        shell.execute("ROLLBACK")
        [record] = await asyncio.wait_for(sent, 10)
    assert record.offset == 1
    await store.close()


async def test_no_other_connection_takes_the_write_lock_between_its_ask_and_an_inline_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle store's Send is committed on the loop's thread once the write lock was found free: another connection
    asking for the lock between that and the commit is refused at once (the lock is held from the ask), so it
    cannot take it and hold the loop waiting up to the busy timeout (5 s)."""
    monkeypatch.setattr(LoopLoad, "busy", lambda _: 0.0)
    store = SqliteStore(tmp_path, flush="async")
    store.start(asyncio.get_running_loop())
    await store.submit([message(0)], [])
    asked: list[bool] = []  # whether the other connection got the lock
    real = store._apply

    def apply(batch: list[object], **kw: object) -> None:
        if threading.current_thread() is threading.main_thread() and not asked:  # the inline commit
            with closing(sqlite3.connect(tmp_path / "broker.sqlite3", isolation_level=None, timeout=0)) as shell:
                try:
                    shell.execute("BEGIN IMMEDIATE")
                    shell.execute("ROLLBACK")
                    asked.append(True)
                except sqlite3.OperationalError:
                    asked.append(False)
        real(batch, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_apply", apply)
    [record] = await store.submit([message(1)], [])
    assert (asked, record.offset) == ([False], 1)
    await store.close()


class FailingRollbacks:
    """A store connection whose next COMMIT and ROLLBACK fail (a disk gone), then work again."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.failing = {"COMMIT", "ROLLBACK"}

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql in self.failing:
            self.failing.discard(sql)
            raise sqlite3.OperationalError("disk I/O error")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self.conn, name)


async def test_a_rollback_that_fails_leaves_the_writer_serving(tmp_path: Path) -> None:
    """A commit fails, and so does its rollback: that Send fails StoreUnavailable, and the writer thread serves
    on — a later Send is stored, rather than every later one waiting for a thread that died."""
    store = SqliteStore(tmp_path, flush="sync")  # every commit by the writer thread
    store.start(asyncio.get_running_loop())
    await store.submit([message(0)], [])
    store._conn = FailingRollbacks(store._conn)  # type: ignore[assignment]
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(store.submit([message(1)], []), 10)
    for i in (2, 3):  # the first may fail as it ends the transaction the failed rollback left open
        [outcome] = await asyncio.wait_for(asyncio.gather(store.submit([message(i)], []), return_exceptions=True), 10)
    assert isinstance(outcome, list) and len(outcome) == 1
    await store.close()


async def test_an_ack_taken_into_an_inline_commit_is_never_written_before_its_pop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inline commit that takes deferred consumer state along counts all of it as in flight until answered, so
    a later one never runs while a request handed to the writer before it waits: an acked delivery stays acked
    after a restart."""
    monkeypatch.setattr(LoopLoad, "busy", lambda _: 0.0)
    store = SqliteStore(tmp_path, state_delay_s=60.0)
    store.start(asyncio.get_running_loop())
    store.submit([], [SetPullOffset("g", "t", 0, 0)])  # deferred, then taken along by an idle Send
    await store.submit([message(0)], [])
    await asyncio.sleep(0.05)
    store.submit([], [PutInflight("g", "t", 0, 0, 1, 7, 9), SetPullOffset("g", "t", 0, 1)])  # a Pop
    store._flush_deferred()  # its timer fired: the Pop is handed to the writer
    store.submit([], [DeleteInflight("g", "t", 0, 0)])  # its Ack, deferred, then an idle Send in the same turn
    await store.submit([message(1)], [])
    await store.close()
    snap = await loaded(tmp_path)
    assert snap.inflight == []
    assert snap.pull_offsets == [SetPullOffset("g", "t", 0, 1)]


@pytest.mark.parametrize("state_delay_s", [60.0, 0.0])
async def test_a_purge_is_never_committed_on_the_event_loop(
    tmp_path: Path, state_delay_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge deletes as many rows as its topic or group has: a commit holding one, deferred and taken along by an
    idle Send or submitted alone, goes to the writer thread, so it never holds the loop for that long."""
    monkeypatch.setattr(LoopLoad, "busy", lambda _: 0.0)
    threads: list[int] = []
    store = SqliteStore(
        tmp_path, state_delay_s=state_delay_s, on_commit=lambda _: threads.append(threading.get_ident())
    )
    store.start(asyncio.get_running_loop())
    here = threading.get_ident()
    await store.submit([message(0)], [])
    assert threads == [here]  # an idle Send: on the loop
    for purge in (PurgeGroup("g", "t"), PurgeTopic("t")):
        threads.clear()
        purged = store.submit([], [purge])
        await store.submit([NewMessage("u", 0, 1, None, b"u")], [])
        await purged
        assert threads and here not in threads
    await store.close()
    assert set((await loaded(tmp_path)).queues) == {("u", 0)}


def test_loop_load_is_the_share_of_wall_time_its_thread_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("broker.store_pacing.LOAD_WINDOW_S", 0.02)
    load = LoopLoad()
    time.sleep(0.05)
    idle = load.busy()
    end = time.monotonic() + 0.05
    while time.monotonic() < end:  # on a CPU the whole window (as far as the host lets it)
        pass
    assert idle < 0.2 and load.busy() > idle


async def test_a_store_of_the_first_layout_is_migrated_in_place(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "broker.sqlite3")) as conn, conn:
        conn.execute(
            "CREATE TABLE messages (topic TEXT NOT NULL, queue INTEGER NOT NULL, offset INTEGER NOT NULL, store_ms"
            " INTEGER NOT NULL, tag TEXT, payload BLOB NOT NULL, PRIMARY KEY (topic, queue, offset)) WITHOUT ROWID"
        )
        rows = [("t", 0, o, 1_000 + o, message(o).tag, message(o).payload) for o in range(3, N)]
        rows += [("t", 1, 0, 5, None, b"q1")]
        conn.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?)", rows)

    store = SqliteStore(tmp_path)
    snap = store.load()
    index = snap.queues[("t", 0)]
    assert (index.min_offset, len(index.tags)) == (3, N - 3)
    assert index.tags == [message(o).tag for o in range(3, N)]
    store.start(asyncio.get_running_loop())
    assert await payloads(store, 0, [3, N - 1]) == {3: message(3).payload, N - 1: message(N - 1).payload}
    assert await payloads(store, 1, [0]) == {0: b"q1"}
    assert (await store.submit([message(0)], []))[0].offset == N
    await store.close()
    with closing(sqlite3.connect(tmp_path / "broker.sqlite3")) as conn, conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "messages" not in tables and conn.execute("PRAGMA user_version").fetchone() == (2,)


def test_a_data_directory_of_a_newer_layout_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    with closing(sqlite3.connect(tmp_path / "broker.sqlite3")) as conn, conn:
        conn.execute("PRAGMA user_version = 9")
    with pytest.raises(StoreUnavailable, match="layout 9, this broker reads layouts up to 3"):
        SqliteStore(tmp_path)


async def test_a_data_directory_in_use_by_another_broker_is_refused(tmp_path: Path) -> None:
    first = SqliteStore(tmp_path)
    first.start(asyncio.get_running_loop())
    with pytest.raises(StoreUnavailable, match=f"in use by another broker \\(pid {os.getpid()}\\)"):
        SqliteStore(tmp_path)
    await first.close()
    second = SqliteStore(tmp_path)  # free again once the first is closed
    second.start(asyncio.get_running_loop())
    await second.close()


@pytest.mark.parametrize(("flush", "synchronous"), [("sync", 2), ("async", 1)])
async def test_flush_sets_how_sqlite_syncs_its_commits(tmp_path: Path, flush: str, synchronous: int) -> None:
    """--flush sync: every commit is fsynced before it is acknowledged (synchronous=FULL, 2); async: WAL only,
    synced at checkpoints (NORMAL, 1). Asked of the connections the store writes and reads with."""
    store = SqliteStore(tmp_path, flush=flush)
    store.start(asyncio.get_running_loop())
    await store.submit([message(0)], [])
    assert await payloads(store, 0, [0]) == {0: message(0).payload}  # opens the reading connection
    assert store._reads.conn is not None
    writing = store._conn.execute("PRAGMA synchronous").fetchone()[0]
    reading = store._reads.conn.execute("PRAGMA synchronous").fetchone()[0]
    await store.close()
    assert (writing, reading) == (synchronous, synchronous)


async def test_the_wal_stays_bounded_while_the_writer_never_pauses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits back to back, as under a steady stream of sends: SQLite starts the WAL over only when a write
    begins after a checkpoint copied all of it, which the checkpointer beside the writer never managed then,
    so the WAL grew with everything written (705 MiB after 45 s of sends in a review's probe)."""
    monkeypatch.setattr("broker.store_wal.WAL_RESTART_BYTES", 1 << 20)
    wal = tmp_path / "broker.sqlite3-wal"
    body = os.urandom(2048)

    store = SqliteStore(tmp_path)
    store.start(asyncio.get_running_loop())
    largest = 0
    pending: list[asyncio.Future[list[Record]]] = []
    for i in range(3000):  # 12 MiB of bodies, in commits of a few requests each: the writer never idle
        pending.append(store.submit([NewMessage("t", i % 4, 1_000, None, body) for _ in range(2)], []))
        if len(pending) >= 8:
            await pending.pop(0)
        largest = max(largest, wal.stat().st_size if wal.exists() else 0)
    await asyncio.gather(*pending)
    await store.close()
    assert largest < 4 << 20, f"the WAL reached {largest / 2**20:.1f} MiB (restarted past 1 MiB)"


async def test_loading_the_index_at_start_costs_about_what_is_kept(tmp_path: Path) -> None:
    """Every message's store time and tag is loaded at start. Decoded into lists of Python ints and a string per
    message, the peak was ~130 bytes a message (a broker that grew to 65 M messages could no longer start in its
    4 GiB: a review's probe); kept compact, ~16."""
    count = 200_000

    store = SqliteStore(tmp_path)
    store.start(asyncio.get_running_loop())
    for start in range(0, count, 20_000):
        await store.submit(
            [NewMessage("t", 0, 1_700_000_000_000 + i, f"tag{i % 4}", b"") for i in range(start, start + 20_000)],
            [],
        )
    await store.close()
    reopened = SqliteStore(tmp_path)
    tracemalloc.start()
    try:
        snap = reopened.load()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await reopened.close()
    assert len(snap.queues[("t", 0)].tags) == count
    assert peak / count < 40, f"{peak / count:.0f} bytes a message at the peak"


@pytest.mark.parametrize(
    "flush", ["async", "sync"]
)  # async commits an idle store's Send on the loop, sync on the writer
async def test_a_commit_that_fails_unexpectedly_fails_its_requests_and_the_store_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush: str
) -> None:
    """An error that is not SQLite's (a bug) in a commit fails its requests (StoreUnavailable), rolls it back and
    leaves the store taking commits, on the writer thread and on the loop alike: the writer does not die with every
    later request waiting forever, nor does the transaction stay open."""
    real = store_writes.write
    failing = [True]

    def write(*args: object) -> None:
        if failing and failing.pop():
            raise OverflowError("an integer past what SQLite binds")
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(store_writes, "write", write)
    store = SqliteStore(tmp_path, flush=flush)
    store.load()
    store.start(asyncio.get_running_loop())
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(store.submit([message(0)], []), 5)
    [record] = await asyncio.wait_for(store.submit([message(1)], []), 5)
    assert record.offset == 0  # the failed commit's offset rolled back with it
    await store.close()


def _crashed_copy(tmp_path: Path, wal: bytes | None = None) -> Path:
    """A data directory as a kill -9 leaves it: a store with 50 commits in its WAL (`wal` in their place)."""
    tmp_path.mkdir()
    live = sqlite3.connect(tmp_path / "live.sqlite3", isolation_level=None)
    live.execute("PRAGMA journal_mode=WAL")
    live.execute("PRAGMA wal_autocheckpoint=0")
    live.execute("CREATE TABLE x (v BLOB)")
    for i in range(50):
        live.execute("INSERT INTO x VALUES (?)", (b"%d" % i * 100,))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "broker.sqlite3").write_bytes((tmp_path / "live.sqlite3").read_bytes())
    found = (tmp_path / "live.sqlite3-wal").read_bytes()
    (copy / "broker.sqlite3-wal").write_bytes(found if wal is None else wal[: len(found)])
    live.close()
    return copy


async def test_a_wal_that_gives_no_frame_is_reported_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="broker.store_wal")
    await SqliteStore(_crashed_copy(tmp_path / "a")).close()
    assert "frames recovered" in caplog.text and "no frame taken" not in caplog.text
    caplog.clear()
    await SqliteStore(_crashed_copy(tmp_path / "b", wal=random.randbytes(1 << 20))).close()
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "no frame taken from them" in warning.getMessage()


async def test_a_wal_of_an_uncommitted_write_only_is_not_reported_damaged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker killed in a large write just after its WAL started over leaves frames of its own log, none ending a
    transaction: SQLite rightly takes none, and nothing was lost — no warning sending the operator to a restore."""
    caplog.set_level(logging.INFO, logger="broker.store_wal")
    live_dir, copy = tmp_path / "live", tmp_path / "copy"
    live_dir.mkdir()
    copy.mkdir()
    live = sqlite3.connect(live_dir / "broker.sqlite3", isolation_level=None)
    live.execute("PRAGMA journal_mode=WAL")
    live.execute("PRAGMA cache_size=10")  # a small cache: the write's pages spill into the WAL before its commit
    live.execute("CREATE TABLE x (v BLOB)")
    live.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the log starts over
    live.execute("BEGIN")
    for _ in range(200):
        live.execute("INSERT INTO x VALUES (randomblob(4000))")
    for name in ("broker.sqlite3", "broker.sqlite3-wal"):  # as a kill -9 leaves them
        (copy / name).write_bytes((live_dir / name).read_bytes())
    live.close()
    assert (copy / "broker.sqlite3-wal").stat().st_size > 100_000
    await SqliteStore(copy).close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "no committed frame" in caplog.text
