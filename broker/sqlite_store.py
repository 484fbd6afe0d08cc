"""SQLite (WAL) implementation of the Store, with one writer thread and group commit.

Every commit request goes onto a queue; the writer thread takes all that are
waiting (up to a batch limit), writes them in one transaction — new messages as
one row per queue (a batch, commit-log style), consumer-state ops as one
statement per kind — commits once, and hands the results back to the event loop
in one callback. ``flush=sync`` sets ``synchronous=FULL`` (fsync before a commit is
acknowledged); ``async`` sets ``NORMAL`` (WAL without fsync: survives kill -9,
not power loss). Reads use a second connection on a reader thread (`broker.store_reader`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from broker import store_files, store_layout, store_reads, store_wal, store_writes
from broker.purges import PurgeCounts
from broker.store import (
    PURGES,
    ArrivalListener,
    NewMessage,
    Op,
    PurgeTopic,
    PutHalf,
    PutScheduled,
    Record,
    Snapshot,
)
from broker.store_pacing import INLINE_MAX_LOOP_BUSY, STATE_DELAY_S, LoopLoad, small_enough
from broker.store_reader import StoreReader
from broker.store_writes import Cut, Deletion, Request, TopicPurge
from popgate_contract.errors import StoreUnavailable
from popgate_process.throttled import Throttled as _Throttled

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_GROUP = 512

CommitObserver = Callable[[float], None]


def _settle(future: asyncio.Future[T], result: T | BaseException) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


class SqliteStore:
    def __init__(
        self,
        data_dir: Path,
        *,
        flush: str = "async",
        on_commit: CommitObserver | None = None,
        state_delay_s: float = STATE_DELAY_S,
    ) -> None:
        """state_delay_s: with ``flush="async"``, how long consumer-state writes (no appends) wait before
        they go to the writer thread (see `submit`); 0 sends them at once. Ignored with ``sync``."""
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = store_layout.lock(data_dir)
        try:
            self._open(data_dir, flush, on_commit, state_delay_s)
        except BaseException:
            os.close(self._lock)
            raise

    def _open(self, data_dir: Path, flush: str, on_commit: CommitObserver | None, state_delay_s: float) -> None:
        self._path = data_dir / "broker.sqlite3"
        self._wal_path = data_dir / "broker.sqlite3-wal"
        self._wal_restart = store_wal.WalRestart(self._wal_path)
        self._sync = "FULL" if flush == "sync" else "NORMAL"
        self._state_delay_s = state_delay_s if flush == "async" else 0.0
        self._deferred: list[Request] = []
        self._purges = PurgeCounts()  # under `_writing`
        self._commit_inline = flush == "async"
        self._outstanding = 0  # requests handed to the writer or committed here whose callers are not answered yet
        self._writing = threading.Lock()  # held by whoever uses the writing connection
        self._loop_load = LoopLoad()  # made again in `start`: it measures the thread that builds it (the loop's)
        self._deferred_timer: asyncio.TimerHandle | None = None
        self._on_commit = on_commit
        self._listener: ArrivalListener | None = None
        self._requests: queue.SimpleQueue[Request | Deletion | TopicPurge | None] = queue.SimpleQueue()
        self._next_offset: dict[tuple[str, int], int] = {}
        self._writer: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()
        self._reads = StoreReader(self._path, self._connect)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._commit_failed = _Throttled(log.error)  # the writer's
        self._checkpoint_failed = _Throttled(log.warning)  # the checkpointer's
        found = store_wal.wal_bytes(self._wal_path)
        self._conn = self._connect()
        self._moved: str | None = None  # what happened to the data directory's files, once `files_moved` saw it
        self._opened = {
            data_dir / "LOCK": store_files.identity(os.fstat(self._lock)),
            self._path: store_files.identity(os.stat(self._path)),
        }
        version = store_layout.layout(self._conn, self._path)
        store_wal.report_recovery(self._conn, self._wal_path, found)
        self._conn.executescript(store_layout.SCHEMA)
        if version == 1:
            store_layout.migrate_from_rows(self._conn, self._path)
        # A write only when it changes: a full disk must not stop a restart.
        if version not in (store_layout.SCHEMA_VERSION, store_layout.PURGING_VERSION):
            self._conn.execute(f"PRAGMA user_version = {store_layout.SCHEMA_VERSION}")

    def _connect(self) -> sqlite3.Connection:
        return store_wal.connect(self._path, self._sync)

    def set_listener(self, listener: ArrivalListener) -> None:
        self._listener = listener

    # -- start ---------------------------------------------------------------

    def load(self) -> Snapshot:
        """Read the hot state (`store_reads.load`); each queue's offsets go on from its last."""
        snap = store_reads.load(self._conn, self._path)
        for key, index in snap.queues.items():
            self._next_offset[key] = index.min_offset + len(index.store_ms)
        return snap

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called on `loop`'s thread; the constructor and `load` may run on another (the broker runs them off it)."""
        self._loop = loop
        self._loop_load = LoopLoad()
        self._reads.open()
        # Checkpoints move the WAL into the database file. Run by the writer (SQLite's default,
        # every 1000 pages) they stall the commit that triggers them; a checkpointer thread on its own
        # connection does them PASSIVE, beside the writer.
        self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._writer = threading.Thread(target=self._run_writer, name="store-writer", daemon=True)
        self._writer.start()
        self._checkpointer = threading.Thread(
            target=store_wal.run_checkpointer,
            args=(self._connect, self._stop_checkpoints, self._checkpoint_failed, self._wal_restart),
            name="store-checkpoint",
            daemon=True,
        )
        self._checkpointer.start()

    # -- writes --------------------------------------------------------------

    def submit(
        self,
        appends: Sequence[NewMessage],
        ops: Sequence[Op],
        *,
        within_s: float | None = None,
        awaited: bool = False,
    ) -> asyncio.Future[list[Record]]:
        if self._loop is None:
            raise StoreUnavailable("store is not started")
        future: asyncio.Future[list[Record]] = self._loop.create_future()
        if self._closed:
            future.set_exception(StoreUnavailable("store is closed"))
        elif self._moved is not None:
            future.set_exception(StoreUnavailable(f"store refuses writes: {self._moved}"))
        elif appends or within_s is not None or awaited or not self._state_delay_s:  # a caller waits: never deferred
            request = Request(appends, ops, future, 0.0 if within_s is None else time.monotonic() + within_s)
            if not self._commit_here(request):
                if self._deferred:
                    self._flush_deferred()  # requests reach the writer in the order they were submitted
                self._to_writer(request)
        else:
            # Consumer state under --flush async (nobody waits for it): hand it to the writer a moment
            # later, in order, so the writer thread does not take the GIL for its Python part of the
            # commit while this loop is still writing the Pop's or Ack's reply.
            self._deferred.append(Request(appends, ops, future))
            if self._deferred_timer is None:
                self._deferred_timer = self._loop.call_later(self._state_delay_s, self._flush_deferred)
        return future

    def _commit_here(self, request: Request) -> bool:
        """Commit `request` on the event loop's thread now, with the consumer state deferred before it, when the
        store is idle: nothing else being committed or waiting for it, and the loop busy less than
        INLINE_MAX_LOOP_BUSY of the time (an idle broker's Send: no hand-off to the writer thread and back, each a
        thread wake-up). False leaves it to the writer: a saturated broker's commits run beside its loop there and
        take every request that came meanwhile along (group commit). Only under --flush async (a commit is a WAL
        write, no fsync) and for small commits, so the loop is held for a short write only —
        tests/unit/broker/test_sqlite_store.py::test_an_idle_store_commits_a_send_at_once_and_a_busy_one_in_groups.
        Every request of the batch counts in `_outstanding` until answered, so no later commit here overtakes one
        handed to the writer — ::test_an_ack_taken_into_an_inline_commit_is_never_written_before_its_pop.
        """
        if not self._commit_inline or self._outstanding or self._loop_load.busy() >= INLINE_MAX_LOOP_BUSY:
            return False
        if not small_enough(request, self._deferred):
            return False
        if not self._writing.acquire(blocking=False):  # the writer is bounding the WAL
            return False
        try:
            if not store_wal.begin_now(self._conn):  # another connection holds it: the writer waits, not the loop
                return False
            if self._deferred_timer is not None:
                self._deferred_timer.cancel()
                self._deferred_timer = None
            batch, self._deferred = [*self._deferred, request], []
            self._apply(batch, begun=True)
            restart_due = self._wal_restart.due()
        finally:
            self._writing.release()
        assert self._loop is not None
        self._outstanding += len(batch)  # `_delivered` answers them all: none may be overtaken meanwhile
        self._loop.call_soon(self._delivered, batch)
        if restart_due:  # the writer thread bounds it, off the loop, after an empty commit
            self._to_writer(Request([], [], self._loop.create_future()))
        return True

    def _to_writer(self, request: Request | Deletion | TopicPurge) -> None:
        self._outstanding += 1
        self._requests.put(request)

    def _flush_deferred(self) -> None:
        if self._deferred_timer is not None:
            self._deferred_timer.cancel()
            self._deferred_timer = None
        deferred, self._deferred = self._deferred, []
        for request in deferred:
            self._to_writer(request)

    def _run_writer(self) -> None:
        taken: Request | Deletion | TopicPurge | None = None  # a deletion met while gathering a batch: it goes next
        while True:
            first = taken or self._requests.get()
            taken = None
            if first is None:
                return
            assert self._loop is not None
            if isinstance(first, Deletion | TopicPurge):
                with self._writing:
                    self._delete_rows(first) if isinstance(first, Deletion) else self._purge_step(first)
                self._loop.call_soon_threadsafe(self._settled, first)
                store_wal.bound_wal(self._conn, self._writing, self._wal_restart)
                continue
            batch = [first]
            stop = False
            while len(batch) < MAX_GROUP:
                try:
                    nxt = self._requests.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                if isinstance(nxt, Deletion | TopicPurge):  # a transaction of its own, in its turn
                    taken = nxt
                    break
                batch.append(nxt)
            with self._writing:
                self._apply(batch)
            self._loop.call_soon_threadsafe(self._delivered, batch)
            if stop:
                return
            store_wal.bound_wal(self._conn, self._writing, self._wal_restart)

    def _delivered(self, batch: list[Request]) -> None:
        self._outstanding -= len(batch)
        self._deliver(batch)

    def _settled(self, deletion: Deletion | TopicPurge) -> None:
        self._outstanding -= 1
        _settle(deletion.future, deletion.result)  # type: ignore[misc]  # each kind's future takes its own result

    def _apply(self, batch: list[Request], *, begun: bool = False) -> None:
        """One transaction for the whole batch (`begun`: already begun). Statements cannot conflict (offsets are
        assigned here, state writes are upserts), so a failure is the database's (disk full, read-only): it fails
        every request of the batch and rolls the offsets back.

        A request with a purge (PurgeGroup, PurgeTopic: broker.admin) splits the batch: the requests before it are
        written, then its purges run, then it and the rest are written — a purge never deletes what a later request
        wrote, nor leaves what an earlier one did (tests/unit/broker/test_admin.py::
        test_a_purge_splits_its_group_commit_so_it_never_deletes_a_later_write). Within each part ops run grouped
        by kind, each kind in request order, the kinds in KIND_ORDER. Two ops of different kinds on one row can
        share a batch (a Pop is answered before its commit under --flush async, so its ack may follow at once): a
        schedule entry is written before it is delivered, and a delivery's puts and deletes leave it as the last of
        them in request order does (`store_writes.coalesce`: an offset reset deletes a delivery that a Pop may make
        again before either is committed)."""
        started = time.perf_counter()
        batch = store_writes.in_time(batch, time.monotonic())  # the others are answered as they are
        conn = self._conn
        saved = dict(self._next_offset)
        try:
            if not begun:
                conn.execute("BEGIN")
            segment: list[Request] = []
            for request in batch:
                purges = [op for op in request.ops if isinstance(op, PURGES)]
                if purges:  # what came before it is written first, then the purge, then the rest
                    store_writes.write(conn, self._next_offset, segment)
                    store_writes.purge(conn, self._next_offset, purges)
                    segment = []
                    for op in purges:
                        if isinstance(op, PurgeTopic):  # counted also should the commit fail: cuts are only dropped
                            self._purges.purged(op.topic)
                segment.append(request)
            store_writes.write(conn, self._next_offset, segment)
            conn.execute("COMMIT")
        except Exception as exc:  # also a bug's: the writer thread must not die, nor the transaction stay open
            if isinstance(exc, sqlite3.Error):
                self._commit_failed("store commit failed: %s", exc)
            else:
                log.exception("store commit failed")
            store_wal.roll_back(conn)
            self._next_offset = saved
            for request in batch:
                request.result = StoreUnavailable(f"store write failed (data directory full or read-only?): {exc}")
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - started)

    def _delete_rows(self, deletion: Deletion) -> None:
        """Delete the rows wholly below each cut, at most DELETE_ROWS rows and about DELETE_BYTES of payloads, in
        one transaction (a failure deletes nothing: the pass tries again next time)."""
        started = time.perf_counter()
        conn = self._conn
        cuts = self._purges.cuts_holding(deletion.purged, deletion.cuts)
        try:
            deletion.result = store_writes.delete_rows(conn, cuts) if cuts else ([], 0)
        except sqlite3.Error as exc:
            self._commit_failed("store deletion failed: %s", exc)
            store_wal.roll_back(conn)
            deletion.result = StoreUnavailable(f"store write failed (data directory full or read-only?): {exc}")
        # done, or failed (`delete_before` raises: no further step), unless cuts are left
        self._purges.step_done(deletion.purged, more=isinstance(deletion.result, tuple) and bool(deletion.result[0]))
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - started)

    def _purge_step(self, step: TopicPurge) -> None:
        """One step of a purged topic's rows (a failure deletes nothing: the step is tried again)."""
        started = time.perf_counter()
        try:
            step.result = store_writes.delete_topic_rows(self._conn, step.topic)
        except sqlite3.Error as exc:
            self._commit_failed("store deletion failed: %s", exc)
            store_wal.roll_back(self._conn)
            step.result = StoreUnavailable(f"store write failed (data directory full or read-only?): {exc}")
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - started)

    async def purge_step(self, topic: str) -> tuple[bool, int]:
        """Delete the next rows of a topic whose purge committed, in a transaction as `delete_before`'s: whether
        they were its last (then the topic is no longer `purging` in the store), and how many went."""
        if self._loop is None or self._closed or self._moved is not None:
            raise StoreUnavailable("store is not started" if self._loop is None else "store is closed or moved")
        future: asyncio.Future[tuple[bool, int]] = self._loop.create_future()
        self._to_writer(TopicPurge(topic, future))
        return await future

    def files_moved(self) -> str | None:
        """What happened to the data directory's files when they are no longer those this store opened (deleted,
        replaced): from then on it refuses writes (the caller, the sweep, reports NOT_SERVING). Logged once —
        tests/unit/broker/test_store_files.py::test_a_store_whose_directory_was_deleted_refuses_writes."""
        if self._moved is None and (moved := store_files.moved(self._opened)) is not None:
            self._moved = moved
            log.error("%s; refusing writes: stop this broker and restore its data directory (docs/RUNBOOK.md)", moved)
        return self._moved

    async def delete_before(self, cuts: Sequence[Cut]) -> int:
        """Delete, for each (topic, queue, offset), the batch rows wholly below the offset (retention); how many
        rows went. In transactions of at most DELETE_ROWS rows and about DELETE_BYTES, each followed by a pause
        as long, so a big deletion never holds sends back for long and most do not wait for it at all —
        tests/unit/broker/test_retention.py::test_big_deletions_go_in_short_transactions_and_steps. Submitted
        after the consumer state deferred so far (pull offsets moved up past what it deletes are stored first)."""
        if self._loop is None or self._closed or self._moved is not None:
            raise StoreUnavailable("store is not started" if self._loop is None else "store is closed or moved")
        left, rows = list(cuts), 0
        purged: dict[str, int] = {}  # each topic's purge count at the first step (`Deletion`)
        while left:
            future: asyncio.Future[tuple[list[Cut], int]] = self._loop.create_future()
            self._flush_deferred()
            started = time.perf_counter()
            self._to_writer(Deletion(left, future, purged))
            left, deleted = await future
            rows += deleted
            if left:  # the writer as long idle as it was deleting: most commits then find it free
                await asyncio.sleep(time.perf_counter() - started)
        return rows

    async def retained_from(self, targets: Sequence[Cut]) -> dict[tuple[str, int], int]:
        """For each (topic, queue, offset): where the queue would start once the rows wholly below the offset
        are deleted (`store_reads.retained_from`). Queues with no row are left out."""
        return await self._reads.retained_from(targets)

    def _deliver(self, batch: list[Request]) -> None:
        for request in batch:
            result = request.result
            if isinstance(result, BaseException):
                if not request.future.done():
                    request.future.set_exception(result)
                continue
            # Committed data is announced even when its caller has gone away.
            if result and self._listener is not None:
                try:
                    self._listener.arrived(result)
                except Exception:  # a listener bug must not leave this batch's callers unanswered
                    log.exception("announcing %d committed messages failed", len(result))
            if not request.future.done():
                request.future.set_result(result)

    # -- reads (`broker.store_reader`) ----------------------------------------

    async def read_payloads(self, topic: str, wanted: Mapping[int, Sequence[int]]) -> dict[tuple[int, int], bytes]:
        return await self._reads.read_payloads(topic, wanted)

    async def read_range(
        self, topic: str, queue_id: int, from_offset: int, limit: int, *, max_bytes: int | None = None
    ) -> list[Record]:
        return await self._reads.read_range(topic, queue_id, from_offset, limit, max_bytes)

    async def read_scheduled(self, schedule_ids: Sequence[int]) -> list[PutScheduled]:
        return await self._reads.read_scheduled(schedule_ids)

    async def read_halves(self, half_ids: Sequence[int]) -> list[PutHalf]:
        return await self._reads.read_halves(half_ids)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush_deferred()
        self._requests.put(None)
        self._stop_checkpoints.set()
        if self._writer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._writer.join)
        if self._checkpointer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._checkpointer.join)
        self._reads.close()
        self._conn.close()
        os.close(self._lock)  # the data directory is free for the next broker
