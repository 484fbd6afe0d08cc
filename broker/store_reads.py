"""Reads of the SQLite store, each a plain function of a connection: the hot state at start (`load`), and what
the reader thread serves — payloads, ranges of records, schedule entries, half messages, and where retention
would leave each queue to start. None of them writes.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from broker.batches import BATCH_MESSAGES, PayloadEnds, fifo_offsets, priority_marks, unpack
from broker.store import (
    RECORD_OVERHEAD_BYTES,
    PutHalf,
    PutInflight,
    PutScheduled,
    QueueIndex,
    Record,
    SetGroupFilter,
    SetPullOffset,
    Snapshot,
)
from popgate_contract.errors import StoreUnavailable

log = logging.getLogger(__name__)

# What a Pop gets for a message whose batch row SQLite reports damaged: bytes that never parse as a message, so it
# goes to the DLQ as it is, marked UNREADABLE_PAYLOAD, like a payload damaged where SQLite does not check
# (broker.redelivery `_dead_letter_of`) — tests/integration/broker/test_damaged_payload.py::
# test_a_damaged_page_dead_letters_its_row_and_the_other_rows_are_delivered.
UNREADABLE = b"\xff\xffpopgate: the stored row holding this message cannot be read (damaged data file)"

# The batches holding offsets lo..hi: from the one that starts at or before lo.
SELECT_BATCHES = (
    "SELECT first_offset, meta, payloads FROM batches WHERE topic = ?1 AND queue = ?2 AND first_offset BETWEEN"
    " coalesce((SELECT max(first_offset) FROM batches WHERE topic = ?1 AND queue = ?2 AND first_offset <= ?3), ?3)"
    " AND ?4 ORDER BY first_offset"
)
SELECT_ROW_STARTS = (
    "SELECT first_offset FROM batches WHERE topic = ?1 AND queue = ?2 AND first_offset BETWEEN"
    " coalesce((SELECT max(first_offset) FROM batches WHERE topic = ?1 AND queue = ?2 AND first_offset <= ?3), ?3)"
    " AND ?4 ORDER BY first_offset"
)  # the index alone: readable when a row's pages are not
SELECT_ROW = "SELECT first_offset, meta, payloads FROM batches WHERE topic = ? AND queue = ? AND first_offset = ?"
SELECT_BATCH_AT = (
    "SELECT first_offset, meta, payloads FROM batches"
    " WHERE topic = ? AND queue = ? AND first_offset <= ? ORDER BY first_offset DESC LIMIT 1"
)

# Retention: where a queue starts once the rows wholly below an offset are gone (the row holding it, or the
# queue's last row).
SELECT_ROW_START = "SELECT max(first_offset) FROM batches WHERE topic = ? AND queue = ? AND first_offset <= ?"


def _interned(tag: str | None) -> str | None:
    return None if tag is None else sys.intern(tag)


def load(conn: sqlite3.Connection, path: Path) -> Snapshot:
    """Read the hot state. Each batch's index is decoded on its own and copied into compact arrays, so the
    peak is about what the core keeps (~16 bytes a message), not several times it."""
    snap = Snapshot()
    for topic, queue_id in conn.execute("SELECT topic, queue FROM queues"):
        snap.queues[(topic, queue_id)] = QueueIndex()
    select = "SELECT topic, queue, first_offset, meta FROM batches"
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'purging'").fetchone():
        snap.purging = {topic for (topic,) in conn.execute("SELECT topic FROM purging")}
        # What their purges have not deleted yet (store_writes.delete_topic_rows): not read.
        select += " WHERE topic NOT IN (SELECT topic FROM purging)"
    rows = conn.execute(select + " ORDER BY topic, queue, first_offset")
    for topic, queue_id, first_offset, meta in rows:
        try:
            lists = json.loads(meta)
            store_ms, tags = lists[0], lists[1]
        except (ValueError, LookupError, TypeError) as exc:  # damaged where SQLite does not check
            raise StoreUnavailable(
                f"{path}: the index of {topic} queue {queue_id} from offset {first_offset} is damaged"
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
    snap.pull_offsets = [SetPullOffset(*row) for row in conn.execute("SELECT * FROM pull_offsets")]
    snap.inflight = [PutInflight(*row) for row in conn.execute("SELECT * FROM inflight")]
    snap.filters = [SetGroupFilter(*row) for row in conn.execute("SELECT * FROM group_filters")]
    snap.scheduled = [(due, sid) for sid, due in conn.execute("SELECT id, due_ms FROM scheduled")]
    halves = conn.execute(
        "SELECT id, token, topic, queue, tag, x'', store_ms, checks, next_check_ms FROM half_messages"
    )
    snap.halves = [PutHalf(*row) for row in halves]
    return snap


def read_queue(
    conn: sqlite3.Connection,
    ends: PayloadEnds,
    topic: str,
    queue_id: int,
    offsets: Sequence[int],
    out: dict[tuple[int, int], bytes],
) -> None:
    """The stored payloads of these offsets of one queue, into `out` by (queue, offset); absent ones are left out.
    When SQLite reports a row damaged, the rows are read one by one: the readable ones are served, and each
    message of a damaged one gets UNREADABLE."""
    wanted = set(offsets)
    lo, hi = min(offsets), max(offsets)
    try:
        if hi - lo < 4 * len(offsets) + BATCH_MESSAGES:
            rows = conn.execute(SELECT_BATCHES, (topic, queue_id, lo, hi)).fetchall()
        else:  # a few offsets far apart: the batch holding each
            found = {conn.execute(SELECT_BATCH_AT, (topic, queue_id, o)).fetchone() for o in sorted(wanted)}
            rows = [row for row in found if row is not None]
    except sqlite3.DatabaseError as exc:
        if not damaged(exc):
            raise
        rows = _rows_one_by_one(conn, topic, queue_id, lo, hi, wanted, out)
    for first_offset, meta, payloads in rows:
        ends.pick(first_offset, meta, payloads, wanted, queue_id, out)


def damaged(exc: sqlite3.Error) -> bool:
    """Whether SQLite found the data file damaged (not: unable to open it, a full disk, an I/O error)."""
    return _primary_code(exc) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _primary_code(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", 0)) & 0xFF


def _rows_one_by_one(
    conn: sqlite3.Connection,
    topic: str,
    queue_id: int,
    lo: int,
    hi: int,
    wanted: set[int],
    out: dict[tuple[int, int], bytes],
) -> list[tuple[int, str, bytes]]:
    """The readable rows holding lo..hi; the wanted offsets of a damaged one go into `out` as UNREADABLE."""
    starts = [start for (start,) in conn.execute(SELECT_ROW_STARTS, (topic, queue_id, lo, hi))]
    rows = []
    for i, start in enumerate(starts):
        try:
            row = conn.execute(SELECT_ROW, (topic, queue_id, start)).fetchone()
        except sqlite3.DatabaseError as exc:
            if not damaged(exc):
                raise
            end = starts[i + 1] if i + 1 < len(starts) else hi + 1
            log.error("%s queue %s: the row from offset %s cannot be read (%s)", topic, queue_id, start, exc)
            out.update(((queue_id, o), UNREADABLE) for o in wanted if start <= o < end)
            continue
        if row is not None:
            rows.append(row)
    return rows


def read_payloads(
    conn: sqlite3.Connection, ends: PayloadEnds, topic: str, wanted: Mapping[int, Sequence[int]]
) -> dict[tuple[int, int], bytes]:
    """The stored payloads of these offsets, by (queue, offset). A queue whose read fails with an I/O error is read
    an offset at a time: each that cannot be read gets UNREADABLE (a bad sector under its row, dead-lettered as a
    damaged one) unless none could be read and neither can the store's other tables: then the error is raised (the
    store cannot be read: the Pop is undone, no attempt charged) — tests/unit/broker/test_damaged_reads.py."""
    out: dict[tuple[int, int], bytes] = {}
    failed: list[tuple[int, int]] = []
    error: sqlite3.Error | None = None
    for queue_id, offsets in wanted.items():
        if not offsets:
            continue
        try:
            read_queue(conn, ends, topic, queue_id, offsets, out)
        except sqlite3.OperationalError as exc:
            if not _io_error(exc):
                raise
            error = exc
            failed += _offsets_one_by_one(conn, ends, topic, queue_id, offsets, out)
    if failed:
        assert error is not None
        if len(failed) == sum(len(offsets) for offsets in wanted.values()) and not _readable(conn):
            raise error
        log.error("%s: %d message(s) cannot be read (%s): dead-lettered as unreadable", topic, len(failed), error)
        out.update((key, UNREADABLE) for key in failed)
    return out


def _readable(conn: sqlite3.Connection) -> bool:
    """Whether the store reads at all: another table's pages than the messages' (an I/O error there too: the
    store, not one row)."""
    try:
        conn.execute("SELECT count(*) FROM queues").fetchone()
    except sqlite3.OperationalError as exc:
        if _io_error(exc):
            return False
        raise
    return True


def _io_error(exc: sqlite3.Error) -> bool:
    return _primary_code(exc) == sqlite3.SQLITE_IOERR


def _offsets_one_by_one(
    conn: sqlite3.Connection,
    ends: PayloadEnds,
    topic: str,
    queue_id: int,
    offsets: Sequence[int],
    out: dict[tuple[int, int], bytes],
) -> list[tuple[int, int]]:
    """Read each offset alone into `out`; those failing with an I/O error, as (queue, offset)."""
    failed = []
    for offset in offsets:
        try:
            read_queue(conn, ends, topic, queue_id, [offset], out)
        except sqlite3.OperationalError as exc:
            if not _io_error(exc):
                raise
            failed.append((queue_id, offset))
    return failed


def read_range(
    conn: sqlite3.Connection, topic: str, queue_id: int, from_offset: int, limit: int, max_bytes: int | None
) -> list[Record]:
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


def read_scheduled(conn: sqlite3.Connection, schedule_ids: Sequence[int]) -> list[PutScheduled]:
    out: list[PutScheduled] = []
    for i in range(0, len(schedule_ids), 500):
        chunk = list(schedule_ids[i : i + 500])
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(f"SELECT * FROM scheduled WHERE id IN ({marks})", chunk)
        out.extend(PutScheduled(*row) for row in rows)
    return out


def read_halves(conn: sqlite3.Connection, half_ids: Sequence[int]) -> list[PutHalf]:
    marks = ",".join("?" * len(half_ids))
    return [PutHalf(*row) for row in conn.execute(f"SELECT * FROM half_messages WHERE id IN ({marks})", half_ids)]


def retained_from(conn: sqlite3.Connection, targets: Sequence[tuple[str, int, int]]) -> dict[tuple[str, int], int]:
    """For each (topic, queue, offset): where the queue would start once the rows wholly below the offset
    are deleted — the first offset of the row holding it, or of the queue's last row (never deleted: a
    start derives a queue's offsets from its rows). Queues with no row are left out."""
    out: dict[tuple[str, int], int] = {}
    for topic, queue_id, offset in targets:
        (start,) = conn.execute(SELECT_ROW_START, (topic, queue_id, offset)).fetchone()
        if start is not None:
            out[(topic, queue_id)] = start
    return out
