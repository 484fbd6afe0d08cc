"""How a group commit's requests become SQL on the writing connection, inside the transaction the store opens:
offsets assigned in submission order, ops coalesced and run grouped by kind in KIND_ORDER, purges, and
retention's deletions of whole batch rows in bounded transactions. Nothing here commits on its own account
but `delete_rows`; the caller owns the transaction and its failure.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Sequence

from broker.batches import Batches
from broker.store import (
    PURGES,
    CreateQueue,
    DeleteHalf,
    DeleteInflight,
    DeleteScheduled,
    NewMessage,
    Op,
    PurgeGroup,
    PurgeQueueInflight,
    PurgeTopic,
    PutHalf,
    PutInflight,
    PutScheduled,
    Record,
    SetGroupFilter,
    SetHalfCheck,
    SetPullOffset,
)
from broker.store_layout import INSERT_BATCH, PURGING_VERSION, SCHEMA_VERSION
from popgate_contract.errors import TooManyRequests

# Retention: the first offsets of the rows a deletion takes (on the unique index: no row is read).
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

# What a purge deletes (broker.admin): a group's state on a topic; a group's deliveries on a queue (an offset reset);
# a topic with every group's state on it.
PURGE_GROUP = [
    f"DELETE FROM {table} WHERE grp = ? AND topic = ?" for table in ("pull_offsets", "inflight", "group_filters")
]
PURGE_QUEUE_INFLIGHT = "DELETE FROM inflight WHERE grp = ? AND topic = ? AND queue = ?"
PURGE_TOPIC = [
    f"DELETE FROM {table} WHERE topic = ?" for table in ("queues", "pull_offsets", "inflight", "group_filters")
]
# A purged topic's messages go after its purge, in steps (`delete_topic_rows`), its name in `purging` until the
# last: the load leaves its rows out meanwhile (store_reads.load). Made by the first purge, not at a start: a
# start on a full disk must not fail for it.
MAKE_PURGING = "CREATE TABLE IF NOT EXISTS purging (topic TEXT PRIMARY KEY) WITHOUT ROWID"
MARK_PURGING = "INSERT OR IGNORE INTO purging VALUES (?)"
SELECT_TOPIC_ROWS = "SELECT id, length(payloads) FROM batches WHERE topic = ? ORDER BY queue, first_offset LIMIT ?"
DELETE_TOPIC_ROWS = "DELETE FROM batches WHERE id IN (SELECT value FROM json_each(?))"


class Request:
    """`deadline`: the time (time.monotonic) past which its commit may no longer start (0: none; see `in_time`)."""

    __slots__ = ("appends", "ops", "future", "result", "deadline")

    def __init__(
        self,
        appends: Sequence[NewMessage],
        ops: Sequence[Op],
        future: asyncio.Future[list[Record]],
        deadline: float = 0.0,
    ) -> None:
        self.appends = appends
        self.ops = ops
        self.future = future
        self.result: list[Record] | BaseException = []
        self.deadline = deadline


def in_time(batch: list[Request], now: float) -> list[Request]:
    """The requests of `batch` a commit starting at `now` writes. One past its deadline (a Send whose caller gave up
    while it waited for the store) writes nothing and is answered TooManyRequests, so its caller may send it again
    without a duplicate — tests/unit/broker/test_send_deadline.py::
    test_a_send_queued_past_its_deadline_is_refused_and_not_stored."""
    written = [r for r in batch if not r.deadline or r.deadline > now]
    if len(written) < len(batch):
        for request in batch:
            if request.deadline and request.deadline <= now:
                request.result = TooManyRequests(
                    "the store is behind: the Send's time ran out before its commit started; not stored, retry"
                )
    return written


Cut = tuple[str, int, int]  # (topic, queue, offset): the rows of the queue wholly below the offset


class Deletion:
    """Rows of whole batches to delete (retention), in a transaction of their own of at most DELETE_ROWS rows;
    the result is the cuts not finished and how many rows went. `purged`: each cut topic's purge count when the
    deletion's first step ran (shared by its steps: a topic deleted since, then sent to again, starts its offsets
    anew, and the cut is not its)."""

    __slots__ = ("cuts", "future", "result", "purged")

    def __init__(
        self, cuts: list[Cut], future: asyncio.Future[tuple[list[Cut], int]], purged: dict[str, int] | None = None
    ) -> None:
        self.cuts = cuts
        self.future = future
        self.result: tuple[list[Cut], int] | BaseException = ([], 0)
        self.purged = {} if purged is None else purged


class TopicPurge:
    """One step of a purged topic's rows (`delete_topic_rows`), a transaction of its own; the result: whether it
    was the last, and how many rows went."""

    __slots__ = ("topic", "future", "result")

    def __init__(self, topic: str, future: asyncio.Future[tuple[bool, int]]) -> None:
        self.topic = topic
        self.future = future
        self.result: tuple[bool, int] | BaseException = (False, 0)


def coalesce(by_kind: dict[type, list[Op]], inflight: Sequence[Op]) -> None:
    """Of the ops one commit runs on a row, only those that decide what it holds: the last pull offset of a
    queue, and of a delivery's puts and deletes (`inflight`, in the order they were submitted) the last — a put
    (written whole) or a delete (run: an earlier commit may have stored the row). A Pop acked before its state was
    committed, the usual case under --flush async, writes nothing; a delivery deleted then made again (an offset
    reset, then a Pop of the same message) is written —
    tests/unit/broker/test_sqlite_store.py::test_a_commit_writes_each_row_once_as_its_last_op_leaves_it."""
    pulls = by_kind[SetPullOffset]
    if len(pulls) > 1:
        by_kind[SetPullOffset] = list({op[:3]: op for op in pulls}.values())
    last = {op[:4]: op for op in inflight}
    by_kind[PutInflight] = [op for op in last.values() if type(op) is PutInflight]
    by_kind[DeleteInflight] = [op for op in last.values() if type(op) is DeleteInflight]


def write(conn: sqlite3.Connection, next_offset: dict[tuple[str, int], int], batch: list[Request]) -> None:
    """The appends and ops of `batch`, ops grouped by kind in KIND_ORDER (see `SqliteStore._apply`)."""
    batches = Batches()
    by_kind: dict[type, list[Op]] = {kind: [] for kind in KIND_ORDER}
    inflight: list[Op] = []  # puts and deletes of deliveries, in the order submitted
    for request in batch:
        request.result = assign(next_offset, request.appends, batches)
        for op in request.ops:
            kind = type(op)
            if kind is PutInflight or kind is DeleteInflight:
                inflight.append(op)
            elif not isinstance(op, PURGES):  # applied before (`SqliteStore._apply`)
                by_kind[kind].append(op)
    if batches.open:
        conn.executemany(INSERT_BATCH, batches.all_rows())
    coalesce(by_kind, inflight)
    for kind, ops in by_kind.items():
        if not ops:
            continue
        if kind is PutInflight:
            conn.execute(PUT_INFLIGHT, (json.dumps(ops),))
        elif kind is DeleteInflight:
            delete_inflight(conn, ops)
        else:
            conn.executemany(_SQL[kind], ops)


def purge(conn: sqlite3.Connection, next_offset: dict[tuple[str, int], int], purges: Sequence[Op]) -> None:
    for op in purges:
        if isinstance(op, PurgeGroup):
            for sql in PURGE_GROUP:
                conn.execute(sql, (op.group, op.topic))
        elif isinstance(op, PurgeQueueInflight):
            conn.execute(PURGE_QUEUE_INFLIGHT, op)
        elif isinstance(op, PurgeTopic):
            conn.execute(MAKE_PURGING)
            conn.execute(MARK_PURGING, (op.topic,))
            conn.execute(f"PRAGMA user_version = {PURGING_VERSION}")
            for sql in PURGE_TOPIC:
                conn.execute(sql, (op.topic,))
            for key in [k for k in next_offset if k[0] == op.topic]:
                del next_offset[key]


def delete_rows(conn: sqlite3.Connection, cuts: list[Cut]) -> tuple[list[Cut], int]:
    """Delete the rows wholly below each cut, at most DELETE_ROWS rows and about DELETE_BYTES of payloads, in
    one transaction: the cuts not finished, and how many rows went."""
    budget = DELETE_ROWS
    size = 0  # payload bytes taken
    left: list[Cut] = []
    conn.execute("BEGIN")
    for i, (topic, queue_id, below) in enumerate(cuts):
        if budget <= 0 or size >= DELETE_BYTES:
            left = cuts[i:]
            break
        starts = conn.execute(SELECT_ROWS_BELOW, (topic, queue_id, below, budget + 1)).fetchall()
        take = 0  # rows of this queue taken: up to the budget of rows and bytes, at least one
        while take < min(len(starts), budget) and (not take or size < DELETE_BYTES):
            size += starts[take][1]
            take += 1
        upto = below
        if take < len(starts):  # more than this transaction takes: the rest next time
            upto = starts[take][0]
            left = [(topic, queue_id, below), *cuts[i + 1 :]]
        budget -= conn.execute(DELETE_ROWS_BELOW, (topic, queue_id, upto)).rowcount
        if left:
            break
    conn.execute("COMMIT")
    return left, DELETE_ROWS - budget


def delete_topic_rows(conn: sqlite3.Connection, topic: str) -> tuple[bool, int]:
    """One step of a purged topic's rows, as `delete_rows` bounds one: whether it was the last (then the topic
    leaves `purging` in the same transaction), and how many rows went."""
    conn.execute("BEGIN")
    rows = conn.execute(SELECT_TOPIC_ROWS, (topic, DELETE_ROWS + 1)).fetchall()
    take, size = 0, 0
    while take < min(len(rows), DELETE_ROWS) and (not take or size < DELETE_BYTES):
        size += rows[take][1]
        take += 1
    conn.execute(DELETE_TOPIC_ROWS, (json.dumps([row[0] for row in rows[:take]]),))
    last = take == len(rows)
    if last:
        conn.execute("DELETE FROM purging WHERE topic = ?", (topic,))
        if conn.execute("SELECT 1 FROM purging LIMIT 1").fetchone() is None:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.execute("COMMIT")
    return last, take


def assign(next_offset: dict[tuple[str, int], int], appends: Sequence[NewMessage], batches: Batches) -> list[Record]:
    records: list[Record] = []
    for m in appends:
        key = (m.topic, m.queue_id)
        offset = next_offset.get(key, 0)
        next_offset[key] = offset + 1
        records.append(Record(m.topic, m.queue_id, offset, m.store_ms, m.tag, m.payload, m.fifo, m.priority))
        batches.add(m, offset)
    return records


def delete_inflight(conn: sqlite3.Connection, ops: list[Op]) -> None:
    offsets: dict[tuple[str, str, int], list[int]] = {}
    for op in ops:
        assert isinstance(op, DeleteInflight)
        offsets.setdefault((op.group, op.topic, op.queue_id), []).append(op.offset)
    for (group, topic, queue_id), chunk in offsets.items():
        conn.execute(DELETE_INFLIGHT, (group, topic, queue_id, json.dumps(chunk)))
