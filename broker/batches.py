"""Messages as batch rows, commit-log style: one row holds up to BATCH_MESSAGES consecutive messages
of one queue (those one group commit appends), their store times, tags and sizes as JSON (`meta`,
with a fourth list, the positions of FIFO messages, when the batch has any, and a fifth, [position,
priority] of its priority messages, when it has any) and their payloads
concatenated. A row per message would cost the store's writer a B-tree insert and a parameter
binding per message, the GIL given up and retaken per row; a batch row is one insert for all of
them. Pure encoding, no I/O: the SQLite store writes and reads the rows.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any

from broker.store import NewMessage

BATCH_MESSAGES = 256

Row = tuple[str, int, int, str, bytes]  # topic, queue, first offset, meta, payloads


class Batch:
    """Consecutive new messages of one queue, becoming one `batches` row."""

    __slots__ = ("first_offset", "store_ms", "tags", "sizes", "payloads", "fifo", "priority")

    def __init__(self, first_offset: int) -> None:
        self.first_offset = first_offset
        self.store_ms: list[int] = []
        self.tags: list[str | None] = []
        self.sizes: list[int] = []
        self.payloads: list[bytes] = []
        self.fifo: list[int] = []  # positions in the batch of the messages sent with a message group
        self.priority: list[list[int]] = []  # [position, priority] of its priority messages

    def row(self, topic: str, queue_id: int) -> Row:
        lists = [self.store_ms, self.tags, self.sizes]
        if self.fifo or self.priority:
            lists.append(self.fifo)
        if self.priority:
            lists.append(self.priority)
        return topic, queue_id, self.first_offset, json.dumps(lists), b"".join(self.payloads)


class Batches:
    """The new messages of one group commit, gathered per queue."""

    __slots__ = ("open", "rows")

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], Batch] = {}
        self.rows: list[Row] = []

    def add(self, m: NewMessage, offset: int) -> None:
        key = (m.topic, m.queue_id)
        batch = self.open.get(key)
        if batch is None or len(batch.sizes) >= BATCH_MESSAGES:
            if batch is not None:
                self.rows.append(batch.row(*key))
            batch = self.open[key] = Batch(offset)
        if m.fifo:
            batch.fifo.append(len(batch.sizes))
        if m.priority:
            batch.priority.append([len(batch.sizes), m.priority])
        batch.store_ms.append(m.store_ms)
        batch.tags.append(m.tag)
        batch.sizes.append(len(m.payload))
        batch.payloads.append(m.payload)

    def all_rows(self) -> list[Row]:
        return self.rows + [batch.row(*key) for key, batch in self.open.items()]


def fifo_offsets(first_offset: int, meta: list[list[Any]]) -> list[int]:
    """The offsets of a row's FIFO messages, from its decoded `meta` (rows written before FIFO order have none)."""
    return [first_offset + i for i in meta[3]] if len(meta) > 3 else []


def priority_marks(first_offset: int, meta: list[list[Any]]) -> list[tuple[int, int]]:
    """(offset, priority) of a row's priority messages, from its decoded `meta` (older rows have none)."""
    return [(first_offset + i, p) for i, p in meta[4]] if len(meta) > 4 else []


def unpack(
    first_offset: int, meta: str, payloads: bytes, wanted: Container[int] | None = None
) -> list[tuple[int, int, str | None, bytes]]:
    """A `batches` row back into (offset, store_ms, tag, payload) per message (only ``wanted`` offsets)."""
    store_ms, tags, sizes = json.loads(meta)[:3]
    out = []
    end = 0
    for i, size in enumerate(sizes):
        start, end = end, end + size
        if wanted is None or first_offset + i in wanted:
            out.append((first_offset + i, store_ms[i], tags[i], payloads[start:end]))
    return out


class PayloadEnds:
    """Where each payload of a batch row ends in its concatenated payloads, by the row's `meta`, for the last
    `max_rows` metas seen: a row's meta names every size, so the same meta text means the same ends, whatever row
    it came from (a deleted and re-created topic's rows included) — tests/unit/broker/test_batches.py::
    test_payloads_picked_from_a_row_are_those_unpack_gives. Not thread-safe: one reading thread uses it."""

    def __init__(self, max_rows: int = 64) -> None:
        self.max_rows = max_rows
        self._ends: dict[str, list[int]] = {}

    def pick(
        self,
        first_offset: int,
        meta: str,
        payloads: bytes,
        offsets: Iterable[int],
        queue_id: int,
        out: dict[Any, bytes],
    ) -> None:
        """The payloads of those `offsets` the row holds, into `out` by (queue_id, offset)."""
        ends = self._ends.get(meta)
        if ends is None:
            ends = self._remember(meta)
        n = len(ends)
        for offset in offsets:
            i = offset - first_offset
            if 0 <= i < n:
                out[(queue_id, offset)] = payloads[ends[i - 1] if i else 0 : ends[i]]

    def _remember(self, meta: str) -> list[int]:
        sizes: Sequence[int] = json.loads(meta)[2]
        ends = self._ends[meta] = list(accumulate(sizes))
        if len(self._ends) > self.max_rows:
            del self._ends[next(iter(self._ends))]  # the oldest seen
        return ends


def batch_rows(messages: Iterable[tuple[str, int, int, int, str | None, bytes]]) -> Iterator[list[Row]]:
    """Messages, one (topic, queue, offset, store_ms, tag, payload) each in queue and offset order (the
    first store layout's rows), as batch rows: a few dozen at a time, so memory stays bounded — one batch is open at
    a time, closed by a gap or the next queue's first message (tests/unit/broker/test_batches.py::
    test_migrating_rows_of_many_queues_holds_a_few_dozen_batches_at_a_time)."""
    batches = Batches()
    for topic, queue_id, offset, store_ms, tag, payload in messages:
        batch = batches.open.get((topic, queue_id))
        if batch is None or batch.first_offset + len(batch.sizes) != offset:  # another queue, or not consecutive
            batches.rows += [open_batch.row(*key) for key, open_batch in batches.open.items()]
            batches.open.clear()
        batches.add(NewMessage(topic, queue_id, store_ms, tag, payload), offset)
        if len(batches.rows) >= 64:
            yield batches.rows
            batches.rows = []
    yield batches.all_rows()
