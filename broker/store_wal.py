"""The SQLite store's write-ahead log stays bounded while the writer commits without a pause: connections run in
WAL mode with the file cut back when the WAL starts over (`connect`), a checkpointer thread copies the WAL into
the database beside the writer (`run_checkpointer`), and between two commits the writer starts it over once it
is past WAL_RESTART_BYTES (`bound_wal`), waiting RESTART_BUSY_MS at most for readers: one holding a snapshot
longer (an online backup) postpones the restart to the checkpointer's next tick (`WalRestart`), never a commit.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S = 0.5
# The WAL file past which the writer itself checkpoints, between two commits, and starts the WAL over.
WAL_RESTART_BYTES = 64 * 1024 * 1024
WAL_HEADER_BYTES, WAL_FRAME_HEADER_BYTES = 32, 24  # SQLite's WAL file format
BUSY_TIMEOUT_MS = 5000
# How long the writer's WAL restart waits for a checkpoint under way: about what one tick's writes take to copy; one
# copying the WAL a long reader held back takes longer, and the restart is postponed to its end instead.
CHECKPOINT_WAIT_S = 1.0
# How long the WAL restart waits for readers: a Pop's read ends well within it, a snapshot held longer (an online
# backup) still makes it fail quickly and postpones it —
# tests/unit/broker/test_store_wal.py::test_the_wal_stays_bounded_while_short_reads_go_on_without_a_pause.
RESTART_BUSY_MS = 50


class WalRestart:
    """When the writer starts the WAL over: once it is past WAL_RESTART_BYTES, and after an attempt a reader kept
    from it, not before the checkpointer's next checkpoint ended — so a reader holding a snapshot costs the writer
    one attempt a tick that fails within RESTART_BUSY_MS, its commits go on, and once the reader let go the
    checkpointer copies the WAL beside the writer before it tries again —
    tests/unit/broker/test_store_wal.py::test_commits_go_on_while_a_reader_holds_a_snapshot_and_the_wal_restarts_after.
    """

    def __init__(self, wal_path: Path) -> None:
        self.wal_path = wal_path
        self.checkpointing = threading.Lock()  # held by a checkpoint: the restart waits for it, not for readers
        self.postponed = False  # set by the writer, cleared by the checkpointer's tick
        self.ticking = True  # whether a checkpointer runs: with none, nothing is postponed

    def due(self) -> bool:
        return not (self.postponed and self.ticking) and wal_full(self.wal_path)

    def tick(self) -> None:
        self.postponed = False


def connect(path: Path, sync: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # When the WAL starts over its file is cut back to a quarter of the restart size, not to the restart size
    # itself: a WAL kept at the restart size would be past it again at once, and every commit would checkpoint.
    conn.execute(f"PRAGMA journal_size_limit={WAL_RESTART_BYTES // 4}")
    return conn


def begin_now(conn: sqlite3.Connection) -> bool:
    """Begin a write transaction if the store's write lock is free now (asked without waiting), for a commit on the
    event loop's thread: the lock is then held until that commit ends, so no other connection takes it meanwhile.
    False when another connection holds it — an operator's `sqlite3` shell, say: the writer thread then commits,
    waiting for the lock, not the loop —
    tests/unit/broker/test_sqlite_store.py::test_a_write_lock_held_elsewhere_never_holds_the_event_loop,
    ::test_no_other_connection_takes_the_write_lock_between_its_ask_and_an_inline_commit."""
    conn.execute("PRAGMA busy_timeout=0")
    try:
        conn.execute("BEGIN IMMEDIATE")
        return True
    except sqlite3.Error:  # busy, or worse: the writer's commit answers it as a failed one
        return False
    finally:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


def roll_back(conn: sqlite3.Connection) -> None:
    """End a failed commit's transaction, if one is open. A ROLLBACK that fails as well (the disk gone) is logged,
    not raised: the writer thread serves on, and the next commit's failure rolls back again —
    tests/unit/broker/test_sqlite_store.py::test_a_rollback_that_fails_leaves_the_writer_serving."""
    if not conn.in_transaction:
        return
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        log.warning("store rollback failed: %s", exc)


def run_checkpointer(
    connect: Callable[[], sqlite3.Connection], stop: threading.Event, failed: Callable[..., None], restart: WalRestart
) -> None:
    """Until `stop` is set: a PASSIVE checkpoint every CHECKPOINT_INTERVAL_S, on a connection of its own (none
    when the store cannot be opened any more: its data directory deleted under it, which the sweep reports), each
    followed by a tick of `restart`: a postponed restart is tried again once this one copied what it could."""
    try:
        conn = connect()
    except sqlite3.Error as exc:
        restart.ticking = False
        failed("checkpointer cannot open the store, no checkpoints: %s", exc)
        return
    try:
        while not stop.wait(CHECKPOINT_INTERVAL_S):
            try:
                with restart.checkpointing:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:
                failed("checkpoint failed: %s", exc)
            restart.tick()
    finally:
        restart.ticking = False
        conn.close()


def report_recovery(conn: sqlite3.Connection, wal_path: Path, found_bytes: int) -> None:
    """At start, with the WAL file `found_bytes` long before `conn` opened the store: log how many frames SQLite
    took from it, and warn when a WAL that can hold a frame gave none — SQLite ignores a damaged, truncated or
    foreign WAL without a word, and with it what was committed since the last checkpoint —
    tests/unit/broker/test_sqlite_store.py::test_a_wal_that_gives_no_frame_is_reported_at_start."""
    if not found_bytes:
        return
    try:  # the first checkpoint, a moment early; on a full disk it fails and the checkpointer tries again
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    except sqlite3.Error as exc:
        log.info("%s: %d bytes found at start (frames not counted: %s)", wal_path, found_bytes, exc)
        return
    if frames <= 0 and found_bytes >= WAL_HEADER_BYTES + WAL_FRAME_HEADER_BYTES + page_size:
        if not committed_frames(wal_path, page_size):
            log.info(
                "%s: %d bytes found at start, no committed frame (a write cut short): nothing lost",
                wal_path,
                found_bytes,
            )
            return
        log.warning(
            "%s: %d bytes found at start and no frame taken from them: the write-ahead log was damaged, truncated"
            ' or another store\'s, and what it held is not in the store (docs/RUNBOOK.md, "Store damaged")',
            wal_path,
            found_bytes,
        )
    else:
        log.info("%s: %d bytes found at start, %d frames recovered", wal_path, found_bytes, max(frames, 0))


def committed_frames(wal_path: Path, page_size: int) -> bool:
    """Whether the WAL file holds a frame of its own log (its header valid, the frame's salts the header's) that
    ends a transaction: unless one does, SQLite taking no frame from it lost nothing (a write cut short after the
    log started over) — tests/unit/broker/test_sqlite_store.py::
    test_a_wal_of_an_uncommitted_write_only_is_not_reported_damaged."""
    try:
        with open(wal_path, "rb") as wal:
            header = wal.read(WAL_HEADER_BYTES)
            if len(header) < WAL_HEADER_BYTES or header[:4] not in (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83"):
                return True  # not a log SQLite would read: what it held is unknown
            salts = header[16:24]
            while len(frame := wal.read(WAL_FRAME_HEADER_BYTES)) == WAL_FRAME_HEADER_BYTES and frame[8:16] == salts:
                if int.from_bytes(frame[4:8], "big"):  # the database size after a commit: a commit frame
                    return True
                wal.seek(page_size, os.SEEK_CUR)
    except OSError:
        return True
    return False


def wal_bytes(wal_path: Path) -> int:
    try:
        return os.path.getsize(wal_path)
    except OSError:
        return 0


def wal_full(wal_path: Path) -> bool:
    return wal_bytes(wal_path) >= WAL_RESTART_BYTES


def bound_wal(conn: sqlite3.Connection, writing: threading.Lock, restart: WalRestart) -> None:
    """Between two commits, when the WAL file is past WAL_RESTART_BYTES: checkpoint it here and start it
    over. The checkpointer's PASSIVE checkpoints copy the WAL into the database beside the writer, but
    SQLite starts the WAL over only when a write begins after a checkpoint copied all of it, which never
    happens while the writer commits without a pause: without this the WAL would grow with everything
    written until a clean stop. Most of it is copied already, so this stalls the writer for the rest only —
    tests/unit/broker/test_sqlite_store.py::test_the_wal_stays_bounded_while_the_writer_never_pauses. It waits
    at most CHECKPOINT_WAIT_S for a checkpoint under way and RESTART_BUSY_MS for readers: a reader holding an older
    snapshot longer, or a checkpoint copying what one held back, postpones it (`WalRestart`)."""
    if not restart.due():
        return
    try:
        with writing:
            busy = not restart.checkpointing.acquire(timeout=CHECKPOINT_WAIT_S) or _restart(conn, restart)
    except (OSError, sqlite3.Error) as exc:  # no WAL file yet, or a full disk: the next commit says so
        log.debug("WAL restart skipped: %s", exc)
        busy = True
    if busy:
        restart.postponed = True
        log.debug("WAL restart postponed to the next checkpoint: a reader or a long checkpoint is under way")


def _restart(conn: sqlite3.Connection, restart: WalRestart) -> bool:
    """A RESTART checkpoint that waits RESTART_BUSY_MS at most for readers (whether one kept it from starting the
    WAL over), with `restart.checkpointing` held, which it releases."""
    try:
        conn.execute(f"PRAGMA busy_timeout={RESTART_BUSY_MS}")
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
        finally:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    finally:
        restart.checkpointing.release()
    return bool(busy)
