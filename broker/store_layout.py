"""The SQLite store's data directory and file layout: one broker at a time holds the directory (`lock`), the
tables are created if missing, and a file of an older layout is carried forward (`layout`,
`migrate_from_rows`) — a layout newer than this broker reads is refused, never written over.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
from pathlib import Path

from broker.batches import batch_rows
from popgate_contract.errors import StoreUnavailable

log = logging.getLogger(__name__)

# Version of the file layout below, kept in PRAGMA user_version.
SCHEMA_VERSION = 2
# Layout 2 while a deleted topic's rows are being deleted (a row in `purging`, store_writes.delete_topic_rows): a
# broker older than those deletions refuses the directory at start instead of loading the rows as the topic again
# (then deleting what it stored in it at the next start of a newer one). Set by the purge, back to SCHEMA_VERSION by
# the last step — tests/unit/broker/test_topic_purges.py::test_a_deletion_under_way_marks_the_layout_for_older_brokers.
PURGING_VERSION = 3

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


def lock(data_dir: Path) -> int:
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


def layout(conn: sqlite3.Connection, path: Path) -> int:
    """The layout version of the file behind `conn` (closed if this broker cannot read it)."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version == 0 and "messages" in tables:
        version = 1  # one row per message, written before the layout had a version
    if version not in (0, 1, SCHEMA_VERSION, PURGING_VERSION):
        conn.close()
        raise StoreUnavailable(
            f"{path} has store layout {version}, this broker reads layouts up to {PURGING_VERSION}:"
            " start it with the popgate that wrote it, or on a new data directory"
        )
    return int(version)


def migrate_from_rows(conn: sqlite3.Connection, path: Path) -> None:
    """Layout 1 (table `messages`, a row per message) into batch rows, in one transaction."""
    log.info("migrating %s: messages into batch rows (store layout 1 -> %d)", path, SCHEMA_VERSION)
    conn.execute("BEGIN")
    rows = conn.execute(
        "SELECT topic, queue, offset, store_ms, tag, payload FROM messages ORDER BY topic, queue, offset"
    )
    for chunk in batch_rows(rows):
        conn.executemany(INSERT_BATCH, chunk)
    conn.execute("DROP TABLE messages")
    conn.execute("COMMIT")
