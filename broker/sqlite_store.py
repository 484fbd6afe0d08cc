"""SQLite (WAL) implementation of the Store, with one writer thread and group commit.

Every commit request goes onto a queue; the writer thread takes all that are
waiting (up to a batch limit), writes them in one transaction — new messages as
one row per queue (a batch, commit-log style), consumer-state ops as one
statement per kind — commits once, and hands the results back to the event loop
in one callback. ``flush=sync`` sets ``synchronous=FULL`` (fsync before a commit is
acknowledged); ``async`` sets ``NORMAL`` (WAL without fsync: survives kill -9,
not power loss). Reads use a second connection on a reader thread.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import queue
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from broker.batches import BATCH_MESSAGES, Batches, PayloadEnds, batch_rows, fifo_offsets, priority_marks, unpack
from broker.store import (
    PURGES,
    RECORD_OVERHEAD_BYTES,
    ArrivalListener,
    CreateQueue,
    DeleteHalf,
    DeleteInflight,
    DeleteScheduled,
    NewMessage,
    Op,
    PurgeGroup,
    PurgeTopic,
    PutHalf,
    PutInflight,
    PutScheduled,
    QueueIndex,
    Record,
    SetGroupFilter,
    SetHalfCheck,
    SetPullOffset,
    Snapshot,
)
from popgate_contract.errors import StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_GROUP = 512
CHECKPOINT_INTERVAL_S = 0.5
# The WAL file past which the writer itself checkpoints, between two commits, and starts the WAL over.
WAL_RESTART_BYTES = 64 * 1024 * 1024

# Version of the file layout below, kept in PRAGMA user_version.
SCHEMA_VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY, topic TEXT NOT NULL, queue INTEGER NOT NULL, first_offset INTEGER NOT NULL,
    meta TEXT NOT NULL, payloads BLOB NOT NULL, UNIQUE (topic, queue, first_offset));
CREATE TABLE IF NOT EXISTS queues (
    topic TEXT NOT NULL, queue INTEGER NOT NULL, PRIMARY KEY (topic, queue)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pull_offsets (
    grp TEXT NOT NULL, topic TEXT NOT NULL, queue INTEGER NOT NULL, pull_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, queue)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inflight (
    grp TEXT NOT NULL, topic TEXT NOT NULL, queue INTEGER NOT NULL, offset INTEGER NOT NULL,
    attempt INTEGER NOT NULL, token INTEGER NOT NULL, deadline_ms INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, queue, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS scheduled (
    id INTEGER PRIMARY KEY, due_ms INTEGER NOT NULL, topic TEXT NOT NULL, queue INTEGER NOT NULL,
    tag TEXT, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS half_messages (
    id INTEGER PRIMARY KEY, token INTEGER NOT NULL, topic TEXT NOT NULL, queue INTEGER NOT NULL, tag TEXT,
    payload BLOB NOT NULL, store_ms INTEGER NOT NULL, checks INTEGER NOT NULL, next_check_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS group_filters (
    grp TEXT NOT NULL, topic TEXT NOT NULL, expression TEXT NOT NULL,
    PRIMARY KEY (grp, topic)) WITHOUT ROWID;
"""

INSERT_BATCH = "INSERT INTO batches (topic, queue, first_offset, meta, payloads) VALUES (?, ?, ?, ?, ?)"
# The batches holding offsets lo..hi: from the one that starts at or before lo.
SELECT_BATCHES = (
    "SELECT first_offset, meta, payloads FROM batches WHERE topic = ?1 AND queue = ?2 AND first_offset BETWEEN"
    " coalesce((SELECT max(first_offset) FROM batches WHERE topic = ?1 AND queue = ?2 AND first_offset <= ?3), ?3)"
    " AND ?4 ORDER BY first_offset"
)
SELECT_BATCH_AT = (
    "SELECT first_offset, meta, payloads FROM batches"
    " WHERE topic = ? AND queue = ? AND first_offset <= ? ORDER BY first_offset DESC LIMIT 1"
)

# Retention: where a queue starts once the rows wholly below an offset are gone (the row holding it, or the
# queue's last row), and the first offsets of the rows a deletion takes (on the unique index: no row is read).
SELECT_ROW_START = "SELECT max(first_offset) FROM batches WHERE topic = ? AND queue = ? AND first_offset <= ?"
SELECT_ROWS_BELOW = (
    "SELECT first_offset, length(payloads) FROM batches WHERE topic = ? AND queue = ? AND first_offset < ?"
    " ORDER BY first_offset LIMIT ?"
)
DELETE_ROWS_BELOW = "DELETE FROM batches WHERE topic = ? AND queue = ? AND first_offset < ?"
# What one deletion transaction takes at most: rows, and payload bytes (freeing their pages is most of its time).
# A pass deletes in as many as it needs, other commits between them —
# tests/unit/broker/test_retention.py::test_big_deletions_go_in_short_transactions_and_steps.
DELETE_ROWS = 256
DELETE_BYTES = 4 * 1024 * 1024

# Many small rows go in as one JSON array per statement, unpacked by SQLite's json_each: the writer thread
# takes the GIL once per statement, not once per row as executemany's row-by-row binding does, so a big
# commit does not starve the event loop.
PUT_INFLIGHT = (
    "INSERT OR REPLACE INTO inflight"
    " SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6 FROM json_each(?)"
)
# Grouped by (group, topic, queue) so the delete searches the whole primary key.
DELETE_INFLIGHT = (
    "DELETE FROM inflight WHERE grp = ? AND topic = ? AND queue = ? AND offset IN (SELECT value FROM json_each(?))"
)

# The order op kinds run in within one group commit (see SqliteStore._apply).
KIND_ORDER = (
    CreateQueue,
    SetGroupFilter,
    SetPullOffset,
    PutScheduled,
    PutInflight,
    DeleteInflight,
    DeleteScheduled,
    PutHalf,
    SetHalfCheck,
    DeleteHalf,
)

_SQL = {
    CreateQueue: "INSERT OR IGNORE INTO queues VALUES (?, ?)",
    SetPullOffset: "INSERT OR REPLACE INTO pull_offsets VALUES (?, ?, ?, ?)",
    SetGroupFilter: "INSERT OR REPLACE INTO group_filters VALUES (?, ?, ?)",
    PutScheduled: "INSERT INTO scheduled VALUES (?, ?, ?, ?, ?, ?)",
    DeleteScheduled: "DELETE FROM scheduled WHERE id = ?",
    PutHalf: "INSERT INTO half_messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    SetHalfCheck: "UPDATE half_messages SET checks = ?2, next_check_ms = ?3 WHERE id = ?1",
    DeleteHalf: "DELETE FROM half_messages WHERE id = ?",
}

# What a purge deletes (broker.admin): a group's state on a topic; a topic with every group's state on it.
PURGE_GROUP = [
    f"DELETE FROM {table} WHERE grp = ? AND topic = ?" for table in ("pull_offsets", "inflight", "group_filters")
]
PURGE_TOPIC = [
    f"DELETE FROM {table} WHERE topic = ?"
    for table in ("batches", "queues", "pull_offsets", "inflight", "group_filters")
]

CommitObserver = Callable[[float], None]
FAILURE_LOG_EVERY_S = 10.0


class _Throttled:
    """A failure that repeats is logged once, then at most every `every_s` with how many were left out: the
    log grows with time, not with the clients' retry rate, on what may be the same full disk."""

    def __init__(self, emit: Callable[..., None], every_s: float = FAILURE_LOG_EVERY_S) -> None:
        self._emit = emit
        self._every_s = every_s
        self._next = 0.0
        self._left_out = 0

    def __call__(self, text: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._left_out += 1
            return
        if self._left_out:
            text, args = text + " (and %d more since the last such line)", (*args, self._left_out)
        self._emit(text, *args)
        self._left_out = 0
        self._next = now + self._every_s


class _Request:
    __slots__ = ("appends", "ops", "future", "result")

    def __init__(self, appends: Sequence[NewMessage], ops: Sequence[Op], future: asyncio.Future[list[Record]]) -> None:
        self.appends = appends
        self.ops = ops
        self.future = future
        self.result: list[Record] | BaseException = []


Cut = tuple[str, int, int]  # (topic, queue, offset): the rows of the queue wholly below the offset


class _Deletion:
    """Rows of whole batches to delete (retention), in a transaction of their own of at most DELETE_ROWS rows;
    the result is the cuts not finished and how many rows went."""

    __slots__ = ("cuts", "future", "result")

    def __init__(self, cuts: list[Cut], future: asyncio.Future[tuple[list[Cut], int]]) -> None:
        self.cuts = cuts
        self.future = future
        self.result: tuple[list[Cut], int] | BaseException = ([], 0)


# A commit made on the event loop's thread (`SqliteStore._commit_here`): only while that thread is busy less than
# this share of the time (measured over LOAD_WINDOW_S), and holding at most this much.
INLINE_MAX_LOOP_BUSY = 0.5
LOAD_WINDOW_S = 0.05
INLINE_MAX_MESSAGES = 64
INLINE_MAX_OPS = 256
INLINE_MAX_BYTES = 256 * 1024

# How long consumer-state writes (deliveries, acks, pull offsets) wait under --flush async before they go to the
# writer thread, all of them then in one commit: a broker that is not saturated still commits them in batches, and
# a Pop acked within this time never writes its delivery (`coalesce`). Nobody waits for them (a Send that comes
# meanwhile takes them along at once); a kill -9 loses at most this much of them, whose messages then come back
# (at least once) — tests/unit/broker/test_sqlite_store.py::
# test_consumer_state_written_a_moment_later_keeps_its_order_and_is_flushed_at_close. RocketMQ's pop buffer keeps
# checkpoints up to 10 s.
STATE_DELAY_S = 0.05


class LoopLoad:
    """The share of wall time the calling thread (the event loop's) spent on a CPU, over the last window of at
    least LOAD_WINDOW_S: near 1 when the loop never waits for I/O (a saturated broker)."""

    def __init__(self) -> None:
        self._since = time.monotonic()
        self._cpu = time.thread_time()
        self._busy = 0.0

    def busy(self) -> float:
        now = time.monotonic()
        if now - self._since >= LOAD_WINDOW_S:
            cpu = time.thread_time()
            self._busy = (cpu - self._cpu) / (now - self._since)
            self._since, self._cpu = now, cpu
        return self._busy


def _lock(data_dir: Path) -> int:
    """Hold `data_dir/LOCK` (flock, released by the OS when the process dies): two brokers on one data
    directory would both assign offsets and overwrite each other's batches."""
    fd = os.open(data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreUnavailable(
            f"data directory {data_dir} is in use by another broker (pid {holder}): each broker needs its own"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def coalesce(by_kind: dict[type, list[Op]]) -> None:
    """Of the ops one commit runs on a row, only those that decide what it holds: the last pull offset of a
    queue, the last put of a delivery, and no put of a delivery the commit also deletes (a Pop acked before its
    state was committed, the usual case under --flush async; the delete still runs, as an earlier commit may
    have stored the row). The rows end as running every op in KIND_ORDER leaves them, since nothing puts a row
    after deleting it (see `SqliteStore._apply`) —
    tests/unit/broker/test_sqlite_store.py::test_a_commit_writes_each_row_once_as_its_last_op_leaves_it."""
    pulls = by_kind[SetPullOffset]
    if len(pulls) > 1:
        by_kind[SetPullOffset] = list({op[:3]: op for op in pulls}.values())
    puts = by_kind[PutInflight]
    if puts:
        deleted = set(by_kind[DeleteInflight])
        by_kind[PutInflight] = [op for row, op in {op[:4]: op for op in puts}.items() if row not in deleted]


def _settle(future: asyncio.Future[T], result: T | BaseException) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _interned(tag: str | None) -> str | None:
    return None if tag is None else sys.intern(tag)


def _read_queue(
    conn: sqlite3.Connection,
    ends: PayloadEnds,
    topic: str,
    queue_id: int,
    offsets: Sequence[int],
    out: dict[tuple[int, int], bytes],
) -> None:
    """The stored payloads of these offsets of one queue, into `out` by (queue, offset); absent ones are left out."""
    wanted = set(offsets)
    lo, hi = min(offsets), max(offsets)
    if hi - lo < 4 * len(offsets) + BATCH_MESSAGES:
        rows = conn.execute(SELECT_BATCHES, (topic, queue_id, lo, hi)).fetchall()
    else:  # a few offsets far apart: the batch holding each
        found = {conn.execute(SELECT_BATCH_AT, (topic, queue_id, o)).fetchone() for o in sorted(wanted)}
        rows = [row for row in found if row is not None]
    for first_offset, meta, payloads in rows:
        ends.pick(first_offset, meta, payloads, wanted, queue_id, out)


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
        self._lock = _lock(data_dir)
        try:
            self._open(data_dir, flush, on_commit, state_delay_s)
        except BaseException:
            os.close(self._lock)
            raise

    def _open(self, data_dir: Path, flush: str, on_commit: CommitObserver | None, state_delay_s: float) -> None:
        self._path = data_dir / "broker.sqlite3"
        self._wal_path = data_dir / "broker.sqlite3-wal"
        self._sync = "FULL" if flush == "sync" else "NORMAL"
        self._state_delay_s = state_delay_s if flush == "async" else 0.0
        self._deferred: list[_Request] = []
        self._commit_inline = flush == "async"
        self._outstanding = 0  # requests handed to the writer or committed here whose callers are not answered yet
        self._writing = threading.Lock()  # held by whoever uses the writing connection
        self._loop_load = LoopLoad()
        self._deferred_timer: asyncio.TimerHandle | None = None
        self._on_commit = on_commit
        self._listener: ArrivalListener | None = None
        self._requests: queue.SimpleQueue[_Request | _Deletion | None] = queue.SimpleQueue()
        self._next_offset: dict[tuple[str, int], int] = {}
        self._writer: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-reader")
        self._read_conn: sqlite3.Connection | None = None
        self._payload_ends = PayloadEnds()  # the reading thread's (`read_payloads`)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._commit_failed = _Throttled(log.error)  # the writer's
        self._checkpoint_failed = _Throttled(log.warning)  # the checkpointer's
        self._conn = self._connect()
        version = self._layout()
        self._conn.executescript(SCHEMA)
        if version == 1:
            self._migrate_from_rows()
        if version != SCHEMA_VERSION:  # a write only when it changes: a full disk must not stop a restart
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _layout(self) -> int:
        (version,) = self._conn.execute("PRAGMA user_version").fetchone()
        tables = {name for (name,) in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version == 0 and "messages" in tables:
            version = 1  # one row per message, written before the layout had a version
        if version not in (0, 1, SCHEMA_VERSION):
            self._conn.close()
            raise StoreUnavailable(
                f"{self._path} has store layout {version}, this broker reads layouts up to {SCHEMA_VERSION}:"
                " start it with the popgate that wrote it, or on a new data directory"
            )
        return int(version)

    def _migrate_from_rows(self) -> None:
        """Layout 1 (table `messages`, a row per message) into batch rows, in one transaction."""
        conn = self._conn
        log.info("migrating %s: messages into batch rows (store layout 1 -> %d)", self._path, SCHEMA_VERSION)
        conn.execute("BEGIN")
        rows = conn.execute(
            "SELECT topic, queue, offset, store_ms, tag, payload FROM messages ORDER BY topic, queue, offset"
        )
        for chunk in batch_rows(rows):
            conn.executemany(INSERT_BATCH, chunk)
        conn.execute("DROP TABLE messages")
        conn.execute("COMMIT")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._sync}")
        conn.execute("PRAGMA busy_timeout=5000")
        # When the WAL starts over its file is cut back to a quarter of the restart size, not to the restart size
        # itself: a WAL kept at the restart size would be past it again at once, and every commit would checkpoint.
        conn.execute(f"PRAGMA journal_size_limit={WAL_RESTART_BYTES // 4}")
        return conn

    def set_listener(self, listener: ArrivalListener) -> None:
        self._listener = listener

    # -- start ---------------------------------------------------------------

    def load(self) -> Snapshot:
        """Read the hot state. Each batch's index is decoded on its own and copied into compact arrays, so the
        peak is about what the core keeps (~16 bytes a message), not several times it."""
        snap = Snapshot()
        for topic, queue_id in self._conn.execute("SELECT topic, queue FROM queues"):
            snap.queues[(topic, queue_id)] = QueueIndex()
        rows = self._conn.execute(
            "SELECT topic, queue, first_offset, meta FROM batches ORDER BY topic, queue, first_offset"
        )
        for topic, queue_id, first_offset, meta in rows:
            try:
                lists = json.loads(meta)
                store_ms, tags = lists[0], lists[1]
            except (ValueError, LookupError, TypeError) as exc:  # damaged where SQLite does not check
                raise StoreUnavailable(
                    f"{self._path}: the index of {topic} queue {queue_id} from offset {first_offset} is damaged"
                    f" ({exc}); restore the data directory from a copy"
                ) from None
            index = snap.queues.get((topic, queue_id))
            if index is None:
                index = snap.queues[(topic, queue_id)] = QueueIndex()
            if not index.store_ms:
                index.min_offset = first_offset
            # Offsets are dense (assigned here, never skipped); pad defensively if not.
            while index.min_offset + len(index.store_ms) < first_offset:
                index.store_ms.append(store_ms[0])
                index.tags.append(None)
            index.store_ms.extend(store_ms)
            index.tags.extend(map(_interned, tags))  # one string per tag text, not one per message
            index.fifo.extend(fifo_offsets(first_offset, lists))
            index.priority.extend(priority_marks(first_offset, lists))
        for key, index in snap.queues.items():
            self._next_offset[key] = index.min_offset + len(index.store_ms)
        snap.pull_offsets = [SetPullOffset(*row) for row in self._conn.execute("SELECT * FROM pull_offsets")]
        snap.inflight = [PutInflight(*row) for row in self._conn.execute("SELECT * FROM inflight")]
        snap.filters = [SetGroupFilter(*row) for row in self._conn.execute("SELECT * FROM group_filters")]
        snap.scheduled = [(due, sid) for sid, due in self._conn.execute("SELECT id, due_ms FROM scheduled")]
        halves = self._conn.execute(
            "SELECT id, token, topic, queue, tag, x'', store_ms, checks, next_check_ms FROM half_messages"
        )
        snap.halves = [PutHalf(*row) for row in halves]
        return snap

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Checkpoints move the WAL into the database file. Run by the writer (SQLite's default,
        # every 1000 pages) they stall the commit that triggers them; a checkpointer thread on its own
        # connection does them PASSIVE, beside the writer.
        self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._writer = threading.Thread(target=self._run_writer, name="store-writer", daemon=True)
        self._writer.start()
        self._checkpointer = threading.Thread(target=self._run_checkpointer, name="store-checkpoint", daemon=True)
        self._checkpointer.start()

    def _run_checkpointer(self) -> None:
        conn = self._connect()
        try:
            while not self._stop_checkpoints.wait(CHECKPOINT_INTERVAL_S):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:
                    self._checkpoint_failed("checkpoint failed: %s", exc)
        finally:
            conn.close()

    # -- writes --------------------------------------------------------------

    def submit(self, appends: Sequence[NewMessage], ops: Sequence[Op]) -> asyncio.Future[list[Record]]:
        if self._loop is None:
            raise StoreUnavailable("store is not started")
        future: asyncio.Future[list[Record]] = self._loop.create_future()
        if self._closed:
            future.set_exception(StoreUnavailable("store is closed"))
        elif appends or not self._state_delay_s:
            request = _Request(appends, ops, future)
            if not self._commit_here(request):
                if self._deferred:
                    self._flush_deferred()  # requests reach the writer in the order they were submitted
                self._to_writer(request)
        else:
            # Consumer state under --flush async (nobody waits for it): hand it to the writer a moment
            # later, in order, so the writer thread does not take the GIL for its Python part of the
            # commit while this loop is still writing the Pop's or Ack's reply.
            self._deferred.append(_Request(appends, ops, future))
            if self._deferred_timer is None:
                self._deferred_timer = self._loop.call_later(self._state_delay_s, self._flush_deferred)
        return future

    def _commit_here(self, request: _Request) -> bool:
        """Commit `request` on the event loop's thread now, with the consumer state deferred before it, when the
        store is idle: nothing else being committed or waiting for it, and the loop busy less than
        INLINE_MAX_LOOP_BUSY of the time (an idle broker's Send: no hand-off to the writer thread and back, each a
        thread wake-up). False leaves it to the writer: a saturated broker's commits run beside its loop there and
        take every request that came meanwhile along (group commit). Only under --flush async (a commit is a WAL
        write, no fsync) and for small commits, so the loop is held for a short write only —
        tests/unit/broker/test_sqlite_store.py::test_an_idle_store_commits_a_send_at_once_and_a_busy_one_in_groups.
        """
        if not self._commit_inline or self._outstanding or self._loop_load.busy() >= INLINE_MAX_LOOP_BUSY:
            return False
        if len(request.appends) > INLINE_MAX_MESSAGES:  # deferred requests hold consumer state only
            return False
        if sum(len(m.payload) for m in request.appends) > INLINE_MAX_BYTES:
            return False
        if len(request.ops) + sum(len(r.ops) for r in self._deferred) > INLINE_MAX_OPS:
            return False
        if not self._writing.acquire(blocking=False):  # the writer is bounding the WAL
            return False
        try:
            if self._deferred_timer is not None:
                self._deferred_timer.cancel()
                self._deferred_timer = None
            batch, self._deferred = [*self._deferred, request], []
            self._apply(batch)
            wal_full = self._wal_bytes() >= WAL_RESTART_BYTES
        finally:
            self._writing.release()
        assert self._loop is not None
        self._outstanding += 1
        self._loop.call_soon(self._delivered, batch)
        if wal_full:  # the writer thread bounds it, off the loop, after an empty commit
            self._to_writer(_Request([], [], self._loop.create_future()))
        return True

    def _to_writer(self, request: _Request | _Deletion) -> None:
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
        taken: _Request | _Deletion | None = None  # a deletion met while gathering a batch: it goes next
        while True:
            first = taken or self._requests.get()
            taken = None
            if first is None:
                return
            assert self._loop is not None
            if isinstance(first, _Deletion):
                with self._writing:
                    self._delete_rows(first)
                self._loop.call_soon_threadsafe(self._settled, first)
                self._bound_wal()
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
                if isinstance(nxt, _Deletion):  # a transaction of its own, in its turn
                    taken = nxt
                    break
                batch.append(nxt)
            with self._writing:
                self._apply(batch)
            self._loop.call_soon_threadsafe(self._delivered, batch)
            if stop:
                return
            self._bound_wal()

    def _delivered(self, batch: list[_Request]) -> None:
        self._outstanding -= len(batch)
        self._deliver(batch)

    def _settled(self, deletion: _Deletion) -> None:
        self._outstanding -= 1
        _settle(deletion.future, deletion.result)

    def _wal_bytes(self) -> int:
        try:
            return os.path.getsize(self._wal_path)
        except OSError:
            return 0

    def _bound_wal(self) -> None:
        """Between two commits, when the WAL file is past WAL_RESTART_BYTES: checkpoint it here and start it
        over. The checkpointer's PASSIVE checkpoints copy the WAL into the database beside the writer, but
        SQLite starts the WAL over only when a write begins after a checkpoint copied all of it, which never
        happens while the writer commits without a pause: without this the WAL would grow with everything
        written until a clean stop. Most of it is copied already, so this stalls the writer for the rest only —
        tests/unit/broker/test_sqlite_store.py::test_the_wal_stays_bounded_while_the_writer_never_pauses."""
        if self._wal_bytes() < WAL_RESTART_BYTES:
            return
        try:
            with self._writing:
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
        except (OSError, sqlite3.Error) as exc:  # no WAL file yet, or a full disk: the next commit says so
            log.debug("WAL restart skipped: %s", exc)
            return
        if busy:  # a reader held an old snapshot past busy_timeout: tried again after the next commit
            log.debug("WAL restart postponed: a reader is busy")

    def _apply(self, batch: list[_Request]) -> None:
        """One transaction for the whole batch. Statements cannot conflict (offsets are assigned here,
        state writes are upserts), so a failure is the database's (disk full, read-only): it fails
        every request of the batch and rolls the offsets back.

        A request with a purge (PurgeGroup, PurgeTopic: broker.admin) splits the batch: the requests before it are
        written, then its purges run, then it and the rest are written — a purge never deletes what a later request
        wrote, nor leaves what an earlier one did (tests/unit/broker/test_admin.py::
        test_a_purge_splits_its_group_commit_so_it_never_deletes_a_later_write). Within each part ops run grouped
        by kind, each kind in request order, the kinds in KIND_ORDER. Two ops of different kinds on one row can
        share a batch (a Pop is answered before its commit under --flush async, so its ack may follow at once), and
        then only in that order: a delivery is put before it is deleted, a schedule entry written before it is
        delivered; nothing puts a row again after its delete (an acked message has no delivery left to change)."""
        started = time.perf_counter()
        conn = self._conn
        saved = dict(self._next_offset)
        try:
            conn.execute("BEGIN")
            segment: list[_Request] = []
            for request in batch:
                purges = [op for op in request.ops if isinstance(op, PURGES)]
                if purges:  # what came before it is written first, then the purge, then the rest
                    self._write(segment)
                    self._purge(purges)
                    segment = []
                segment.append(request)
            self._write(segment)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._commit_failed("store commit failed: %s", exc)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._next_offset = saved
            for request in batch:
                request.result = StoreUnavailable(f"store write failed (data directory full or read-only?): {exc}")
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - started)

    def _write(self, batch: list[_Request]) -> None:
        """The appends and ops of `batch`, ops grouped by kind in KIND_ORDER (see `_apply`)."""
        conn = self._conn
        batches = Batches()
        by_kind: dict[type, list[Op]] = {kind: [] for kind in KIND_ORDER}
        for request in batch:
            request.result = self._assign(request.appends, batches)
            for op in request.ops:
                if not isinstance(op, PURGES):  # applied before (`_apply`)
                    by_kind[type(op)].append(op)
        if batches.open:
            conn.executemany(INSERT_BATCH, batches.all_rows())
        coalesce(by_kind)
        for kind, ops in by_kind.items():
            if not ops:
                continue
            if kind is PutInflight:
                conn.execute(PUT_INFLIGHT, (json.dumps(ops),))
            elif kind is DeleteInflight:
                self._delete_inflight(ops)
            else:
                conn.executemany(_SQL[kind], ops)

    def _purge(self, purges: Sequence[Op]) -> None:
        for op in purges:
            if isinstance(op, PurgeGroup):
                for sql in PURGE_GROUP:
                    self._conn.execute(sql, (op.group, op.topic))
            elif isinstance(op, PurgeTopic):
                for sql in PURGE_TOPIC:
                    self._conn.execute(sql, (op.topic,))
                for key in [k for k in self._next_offset if k[0] == op.topic]:
                    del self._next_offset[key]

    def _delete_rows(self, deletion: _Deletion) -> None:
        """Delete the rows wholly below each cut, at most DELETE_ROWS rows and about DELETE_BYTES of payloads, in
        one transaction (a failure deletes nothing: the pass tries again next time)."""
        started = time.perf_counter()
        conn = self._conn
        budget = DELETE_ROWS
        size = 0  # payload bytes taken
        left: list[Cut] = []
        try:
            conn.execute("BEGIN")
            for i, (topic, queue_id, below) in enumerate(deletion.cuts):
                if budget <= 0 or size >= DELETE_BYTES:
                    left = deletion.cuts[i:]
                    break
                starts = conn.execute(SELECT_ROWS_BELOW, (topic, queue_id, below, budget + 1)).fetchall()
                take = 0  # rows of this queue taken: up to the budget of rows and bytes, at least one
                while take < min(len(starts), budget) and (not take or size < DELETE_BYTES):
                    size += starts[take][1]
                    take += 1
                upto = below
                if take < len(starts):  # more than this transaction takes: the rest next time
                    upto = starts[take][0]
                    left = [(topic, queue_id, below), *deletion.cuts[i + 1 :]]
                budget -= conn.execute(DELETE_ROWS_BELOW, (topic, queue_id, upto)).rowcount
                if left:
                    break
            conn.execute("COMMIT")
            deletion.result = (left, DELETE_ROWS - budget)
        except sqlite3.Error as exc:
            self._commit_failed("store deletion failed: %s", exc)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            deletion.result = StoreUnavailable(f"store write failed (data directory full or read-only?): {exc}")
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - started)

    async def delete_before(self, cuts: Sequence[Cut]) -> int:
        """Delete, for each (topic, queue, offset), the batch rows wholly below the offset (retention); how many
        rows went. In transactions of at most DELETE_ROWS rows and about DELETE_BYTES, each followed by a pause
        as long, so a big deletion never holds sends back for long and most do not wait for it at all —
        tests/unit/broker/test_retention.py::test_big_deletions_go_in_short_transactions_and_steps. Submitted
        after the consumer state deferred so far (pull offsets moved up past what it deletes are stored first)."""
        if self._loop is None or self._closed:
            raise StoreUnavailable("store is not started" if self._loop is None else "store is closed")
        left, rows = list(cuts), 0
        while left:
            future: asyncio.Future[tuple[list[Cut], int]] = self._loop.create_future()
            self._flush_deferred()
            started = time.perf_counter()
            self._to_writer(_Deletion(left, future))
            left, deleted = await future
            rows += deleted
            if left:  # the writer as long idle as it was deleting: most commits then find it free
                await asyncio.sleep(time.perf_counter() - started)
        return rows

    async def retained_from(self, targets: Sequence[Cut]) -> dict[tuple[str, int], int]:
        """For each (topic, queue, offset): where the queue would start once the rows wholly below the offset
        are deleted — the first offset of the row holding it, or of the queue's last row (never deleted: a
        start derives a queue's offsets from its rows). Queues with no row are left out."""

        def read() -> dict[tuple[str, int], int]:
            conn = self._reader_conn()
            out: dict[tuple[str, int], int] = {}
            for topic, queue_id, offset in targets:
                (start,) = conn.execute(SELECT_ROW_START, (topic, queue_id, offset)).fetchone()
                if start is not None:
                    out[(topic, queue_id)] = start
            return out

        return await asyncio.get_running_loop().run_in_executor(self._reader, read)

    def _assign(self, appends: Sequence[NewMessage], batches: Batches) -> list[Record]:
        records: list[Record] = []
        next_offset = self._next_offset
        for m in appends:
            key = (m.topic, m.queue_id)
            offset = next_offset.get(key, 0)
            next_offset[key] = offset + 1
            records.append(Record(m.topic, m.queue_id, offset, m.store_ms, m.tag, m.payload, m.fifo, m.priority))
            batches.add(m, offset)
        return records

    def _delete_inflight(self, ops: list[Op]) -> None:
        offsets: dict[tuple[str, str, int], list[int]] = {}
        for op in ops:
            assert isinstance(op, DeleteInflight)
            offsets.setdefault((op.group, op.topic, op.queue_id), []).append(op.offset)
        for (group, topic, queue_id), chunk in offsets.items():
            self._conn.execute(DELETE_INFLIGHT, (group, topic, queue_id, json.dumps(chunk)))

    def _deliver(self, batch: list[_Request]) -> None:
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

    # -- reads ---------------------------------------------------------------

    def _reader_conn(self) -> sqlite3.Connection:
        if self._read_conn is None:
            self._read_conn = self._connect()
        return self._read_conn

    async def read_payloads(self, topic: str, wanted: Mapping[int, Sequence[int]]) -> dict[tuple[int, int], bytes]:
        if not any(wanted.values()):
            return {}

        def read() -> dict[tuple[int, int], bytes]:
            conn = self._reader_conn()
            out: dict[tuple[int, int], bytes] = {}
            for queue_id, offsets in wanted.items():
                if offsets:
                    _read_queue(conn, self._payload_ends, topic, queue_id, offsets, out)
            return out

        return await asyncio.get_running_loop().run_in_executor(self._reader, read)

    async def read_range(
        self, topic: str, queue_id: int, from_offset: int, limit: int, *, max_bytes: int | None = None
    ) -> list[Record]:
        def read() -> list[Record]:
            conn = self._reader_conn()
            out: list[Record] = []
            size = 0
            want = from_offset  # the next offset to return
            while len(out) < limit:
                rows = conn.execute(SELECT_BATCHES, (topic, queue_id, want, want + limit - len(out))).fetchall()
                before = len(out)
                for row in rows:
                    for offset, store_ms, tag, payload in unpack(*row):
                        if offset < want or len(out) >= limit:
                            continue
                        size += len(payload) + RECORD_OVERHEAD_BYTES
                        if max_bytes is not None and out and size > max_bytes:
                            return out  # full: the caller goes on from the offset after the last one
                        out.append(Record(topic, queue_id, offset, store_ms, tag, payload))
                        want = offset + 1
                if len(out) == before:  # nothing at or after `want`
                    break
            return out

        return await asyncio.get_running_loop().run_in_executor(self._reader, read)

    async def read_scheduled(self, schedule_ids: Sequence[int]) -> list[PutScheduled]:
        def read() -> list[PutScheduled]:
            conn = self._reader_conn()
            out: list[PutScheduled] = []
            for i in range(0, len(schedule_ids), 500):
                chunk = list(schedule_ids[i : i + 500])
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(f"SELECT * FROM scheduled WHERE id IN ({marks})", chunk)
                out.extend(PutScheduled(*row) for row in rows)
            return out

        return await asyncio.get_running_loop().run_in_executor(self._reader, read)

    async def read_halves(self, half_ids: Sequence[int]) -> list[PutHalf]:
        def read() -> list[PutHalf]:
            conn = self._reader_conn()
            marks = ",".join("?" * len(half_ids))
            return [
                PutHalf(*row) for row in conn.execute(f"SELECT * FROM half_messages WHERE id IN ({marks})", half_ids)
            ]

        return await asyncio.get_running_loop().run_in_executor(self._reader, read)

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
        self._reader.shutdown(wait=True)
        if self._read_conn is not None:
            self._read_conn.close()
        self._conn.close()
        os.close(self._lock)  # the data directory is free for the next broker
