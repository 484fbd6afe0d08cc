"""In-memory index of every queue's messages plus a bounded cache of recent payloads.

For each queue the broker keeps the store time and tag of every message
(about 16 bytes a message), which makes exact filtered counts, readiness checks
and lag in time cheap and synchronous. Payloads live in the store; the most
recently appended ones are also cached here (FIFO, bounded by bytes) so a
consumer that keeps up never waits for a disk read.
"""

from __future__ import annotations

import sys
from array import array
from collections import deque
from collections.abc import Iterator

from broker.filters import TagFilter
from broker.store import QueueIndex, Record


class PayloadCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._order: deque[tuple[QueueLog, int, int]] = deque()

    def add(self, queue: QueueLog, offset: int, payload: bytes) -> None:
        size = len(payload) + 64
        queue.payloads[offset] = payload
        self._order.append((queue, offset, size))
        self.bytes += size
        while self.bytes > self.max_bytes and self._order:
            old_queue, old_offset, old_size = self._order.popleft()
            old_queue.payloads.pop(old_offset, None)
            self.bytes -= old_size


class QueueLog:
    __slots__ = ("topic", "queue_id", "min_offset", "store_ms", "tags", "payloads")

    def __init__(self, topic: str, queue_id: int, index: QueueIndex | None = None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.min_offset = index.min_offset if index else 0
        self.store_ms = array("q", index.store_ms if index else ())
        self.tags: list[str | None] = [None if t is None else sys.intern(t) for t in index.tags] if index else []
        self.payloads: dict[int, bytes] = {}

    @property
    def max_offset(self) -> int:
        """The offset the next message will get (RocketMQ's MaxOffset)."""
        return self.min_offset + len(self.store_ms)

    def append(self, record: Record) -> None:
        if record.offset != self.max_offset:
            raise AssertionError(f"{self.topic}/{self.queue_id}: offset {record.offset} != {self.max_offset}")
        self.store_ms.append(record.store_ms)
        self.tags.append(None if record.tag is None else sys.intern(record.tag))

    def store_ms_at(self, offset: int) -> int:
        return self.store_ms[offset - self.min_offset]

    def first_match(self, start: int, tag_filter: TagFilter) -> int:
        """The first offset >= start whose tag matches, or max_offset when none."""
        start = max(start, self.min_offset)
        if tag_filter.matches_all:
            return start
        tags = self.tags
        for i in range(start - self.min_offset, len(tags)):
            if tag_filter.matches(tags[i]):
                return self.min_offset + i
        return self.max_offset

    def matching(self, start: int, tag_filter: TagFilter, limit: int) -> Iterator[int]:
        """Up to ``limit`` matching offsets from ``start`` on."""
        offset = self.first_match(start, tag_filter)
        end = self.max_offset
        found = 0
        while offset < end and found < limit:
            if tag_filter.matches(self.tags[offset - self.min_offset]):
                found += 1
                yield offset
            offset += 1

    def count_matching(self, start: int, end: int, tag_filter: TagFilter) -> int:
        start = max(start, self.min_offset)
        end = min(end, self.max_offset)
        if end <= start:
            return 0
        if tag_filter.matches_all:
            return end - start
        wanted = tag_filter.tags or frozenset()
        lo = start - self.min_offset
        return sum(1 for t in self.tags[lo : end - self.min_offset] if t in wanted)


class TopicLog:
    __slots__ = ("name", "queues", "next_queue")

    def __init__(self, name: str, queues: list[QueueLog]) -> None:
        self.name = name
        self.queues = queues
        self.next_queue = 0

    def pick_queue(self) -> int:
        queue_id = self.next_queue % len(self.queues)
        self.next_queue += 1
        return queue_id
