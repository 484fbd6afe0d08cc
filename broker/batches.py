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
from collections.abc import Container, Iterable, Iterator
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


def batch_rows(messages: Iterable[tuple[str, int, int, int, str | None, bytes]]) -> Iterator[list[Row]]:
    """Messages, one (topic, queue, offset, store_ms, tag, payload) each in queue and offset order (the
    first store layout's rows), as batch rows: a few dozen at a time, so memory stays bounded."""
    batches = Batches()
    for topic, queue_id, offset, store_ms, tag, payload in messages:
        batch = batches.open.get((topic, queue_id))
        if batch is not None and batch.first_offset + len(batch.sizes) != offset:  # not consecutive
            batches.rows.append(batch.row(topic, queue_id))
            del batches.open[(topic, queue_id)]
        batches.add(NewMessage(topic, queue_id, store_ms, tag, payload), offset)
        if len(batches.rows) >= 64:
            yield batches.rows
            batches.rows = []
    yield batches.all_rows()
