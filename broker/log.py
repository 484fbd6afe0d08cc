"""In-memory index of every queue's messages plus a bounded cache of recent payloads.

For each queue the broker keeps the store time and tag of every message
(about 16 bytes a message), which makes exact filtered counts, readiness checks
and lag in time cheap and synchronous. Payloads live in the store; the most
recently appended ones are also cached here (FIFO, bounded by bytes) so a
consumer that keeps up never waits for a disk read.

Lag is computed on the event loop at every scrape, so filtered counts and
searches must not scan the backlog: the tags are also summarised per block of
``BLOCK`` offsets (tag -> count), and a count or search over a range looks only
at the partial blocks at its ends and at the summaries in between. A block with
more than ``MAX_BLOCK_TAGS`` distinct tags keeps no summary (it would cost more
memory than the tags themselves) and is scanned like before.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterator
from itertools import compress, count, islice, takewhile

from broker.filters import TagFilter
from broker.store import QueueIndex, Record

BLOCK_BITS = 10
BLOCK = 1 << BLOCK_BITS  # offsets per tag summary; blocks are aligned on absolute offsets
MAX_BLOCK_TAGS = 64

# Tag counts of one block, or None when the block has too many distinct tags to summarise.
BlockSummary = dict[str | None, int] | None


# What a cached payload costs beyond its length: the bytes object's header, its offset's int, its slots in its
# queue's dict and in the eviction order with that entry's tuple, averaged over a full cache's evictions —
# tests/unit/broker/test_log.py::test_the_payload_cache_holds_about_its_bound_in_memory.
ENTRY_BYTES = 208


class PayloadCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0  # each payload's length plus ENTRY_BYTES
        self.cached = 0  # payloads held (the eviction order may also hold entries `drop` emptied)
        self._order: deque[tuple[QueueLog, int]] = deque()

    def add(self, queue: QueueLog, offset: int, payload: bytes) -> None:
        queue.payloads[offset] = payload
        self._order.append((queue, offset))
        self.bytes += len(payload) + ENTRY_BYTES
        self.cached += 1
        while self.bytes > self.max_bytes and self._order:
            old_queue, old_offset = self._order.popleft()
            old = old_queue.payloads.pop(old_offset, None)
            if old is not None:  # not dropped by `drop` already
                self.bytes -= len(old) + ENTRY_BYTES
                self.cached -= 1

    def drop(self, queue: QueueLog, below: int) -> None:
        """Forget the queue's cached payloads below offset `below` (deleted by retention). A queue's payloads
        are cached in offset order, so they are the first of its dict; their entries in the eviction order
        stay until they come up (and count nothing then)."""
        payloads = queue.payloads
        # One look along the dict, not its first key popped again and again: each such pop skips every key popped
        # before it, quadratic in the payloads dropped.
        for offset in list(takewhile(below.__gt__, payloads)):
            self.bytes -= len(payloads.pop(offset)) + ENTRY_BYTES
            self.cached -= 1
        # Their entries in the eviction order leave when they come up, which is never while the cache is not
        # full (a retention window smaller than the cache): rebuilt once they are most of it, so the order holds
        # no more than about twice the cached entries — tests/unit/broker/test_retention.py::
        # test_the_caches_eviction_order_does_not_keep_what_retention_dropped.
        if len(self._order) > 2 * self.cached + 1024:
            self._order = deque(entry for entry in self._order if entry[1] in entry[0].payloads)


class QueueLog:
    __slots__ = ("topic", "queue_id", "min_offset", "store_ms", "tags", "payloads", "_blocks", "fifo", "priority")

    def __init__(self, topic: str, queue_id: int, index: QueueIndex | None = None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.min_offset = index.min_offset if index else 0
        self.store_ms: array[int] = array("q")
        self.tags: list[str | None] = []
        if index is not None and isinstance(index.store_ms, array):  # as the store loads it: compact, interned
            self.store_ms, self.tags = index.store_ms, index.tags  # taken, not copied: no second index at start
        elif index is not None:
            self.store_ms = array("q", index.store_ms)
            self.tags = [None if t is None else sys.intern(t) for t in index.tags]
        self.payloads: dict[int, bytes] = {}
        # One byte a message, 1 for a FIFO one (sent with a message group); None while the queue has none.
        self.fifo: bytearray | None = None
        for offset in index.fifo if index else ():
            self._mark_fifo(offset)
        # Offset -> priority of the queue's priority messages (broker.priority); None while it has none. Trimmed
        # with the queue, so it holds no more than the messages retention keeps.
        self.priority: dict[int, int] | None = dict(index.priority) if index and index.priority else None
        # _blocks[i] summarises block (min_offset >> BLOCK_BITS) + i, only the offsets present in it.
        self._blocks: list[BlockSummary] = []
        lo = base = self.min_offset
        while lo < self.max_offset:
            hi = min((lo | (BLOCK - 1)) + 1, self.max_offset)
            counts = dict(Counter(self.tags[lo - base : hi - base]))
            self._blocks.append(counts if len(counts) <= MAX_BLOCK_TAGS else None)
            lo = hi

    @property
    def max_offset(self) -> int:
        """The offset the next message will get (RocketMQ's MaxOffset)."""
        return self.min_offset + len(self.store_ms)

    def append(self, record: Record) -> None:
        offset = self.min_offset + len(self.store_ms)
        if record.offset != offset:
            raise AssertionError(f"{self.topic}/{self.queue_id}: offset {record.offset} != {offset}")
        tag = record.tag
        if tag is not None:
            tag = sys.intern(tag)
        self.store_ms.append(record.store_ms)
        self.tags.append(tag)
        if record.fifo:
            self._mark_fifo(offset)
        if record.priority:
            if self.priority is None:
                self.priority = {}
            self.priority[offset] = record.priority
        blocks = self._blocks
        if not offset & (BLOCK - 1) or not blocks:  # the first offset of a block
            blocks.append({tag: 1})
            return
        counts = blocks[-1]
        if counts is not None:
            counts[tag] = counts.get(tag, 0) + 1
            if len(counts) > MAX_BLOCK_TAGS:
                blocks[-1] = None

    def _mark_fifo(self, offset: int) -> None:
        if self.fifo is None:
            self.fifo = bytearray()
        i = offset - self.min_offset
        if len(self.fifo) <= i:
            self.fifo.extend(bytes(i + 1 - len(self.fifo)))
        self.fifo[i] = 1

    def is_fifo(self, offset: int) -> bool:
        fifo = self.fifo
        i = offset - self.min_offset
        return fifo is not None and i < len(fifo) and fifo[i] == 1

    def next_fifo(self, start: int) -> int:
        """The first FIFO message's offset >= start, or max_offset when none."""
        if self.fifo is None:
            return self.max_offset
        i = self.fifo.find(1, max(0, start - self.min_offset))
        return self.max_offset if i < 0 else self.min_offset + i

    def store_ms_at(self, offset: int) -> int:
        return self.store_ms[offset - self.min_offset]

    def tag_at(self, offset: int) -> str | None:
        return self.tags[offset - self.min_offset]

    def stored_before(self, cut_ms: int, end: int) -> int:
        """The first offset in [min_offset, end) whose message was stored at or after `cut_ms`, or end: every
        message before it is older. Store times rise with offsets but for a clock set back, so a binary search
        is checked, and a plain scan (in C) done when it was misled; both look at no more than [min, end)."""
        window = self.store_ms[: max(0, end - self.min_offset)]
        i = bisect_left(window, cut_ms)
        if i and max(window[:i]) >= cut_ms:  # not sorted there: the first newer message lies before i
            i = next(compress(count(), map(cut_ms.__le__, window)))
        return self.min_offset + i

    def trim(self, new_min: int) -> None:
        """Forget the messages below `new_min` (deleted by retention): store times, tags, FIFO marks and the tag
        summaries of whole blocks before `new_min`'s block. That block's summary is counted again from what
        stays of it, so the index is the one a start on the trimmed store loads. The payload cache is the
        caller's (`PayloadCache.drop`)."""
        n = new_min - self.min_offset
        if n <= 0:
            return
        if n >= len(self.store_ms):
            raise AssertionError(f"{self.topic}/{self.queue_id}: trim to {new_min} would empty the queue")
        del self.store_ms[:n]
        del self.tags[:n]
        if self.fifo is not None:
            del self.fifo[:n]
            if self.fifo.find(1) < 0:
                self.fifo = None
        if self.priority is not None:
            self.priority = {o: p for o, p in self.priority.items() if o >= new_min} or None
        old_block, new_block = self.min_offset >> BLOCK_BITS, new_min >> BLOCK_BITS
        del self._blocks[: new_block - old_block]
        self.min_offset = new_min
        hi = min((new_min | (BLOCK - 1)) + 1, self.max_offset)
        counts = dict(Counter(self.tags[: hi - new_min]))
        self._blocks[0] = counts if len(counts) <= MAX_BLOCK_TAGS else None

    def first_match(self, start: int, tag_filter: TagFilter, end: int | None = None) -> int:
        """The first offset in [start, end) whose tag matches, or end (default max_offset) when none."""
        end = self.max_offset if end is None else min(end, self.max_offset)
        start = max(start, self.min_offset)
        if tag_filter.tags is None:
            return min(start, end)
        wanted = tag_filter.tags
        lo = start
        while lo < end:
            hi = min((lo | (BLOCK - 1)) + 1, end)
            if self._may_hold(lo, wanted):
                found = self._scan_first(lo, hi, wanted)
                if found is not None:
                    return found
            lo = hi
        return end

    def matching(self, start: int, tag_filter: TagFilter, limit: int, end: int | None = None) -> Iterator[int]:
        """Up to ``limit`` matching offsets in [start, end) (default: to max_offset)."""
        end = self.max_offset if end is None else min(end, self.max_offset)
        offset = self.first_match(start, tag_filter, end)
        wanted = tag_filter.tags
        if wanted is None:
            yield from range(offset, min(end, offset + limit))
            return
        tags = self.tags
        base = self.min_offset
        found = 0
        while offset < end and found < limit:
            # ``offset`` matches: take it and the rest of its block tag by tag, then skip to the next
            # block that may hold a match.
            block_end = min((offset | (BLOCK - 1)) + 1, end)
            for i in range(offset - base, block_end - base):
                if tags[i] in wanted:
                    yield base + i
                    found += 1
                    if found == limit:
                        return
            offset = self.first_match(block_end, tag_filter, end)

    def count_matching(self, start: int, end: int, tag_filter: TagFilter) -> int:
        start = max(start, self.min_offset)
        end = min(end, self.max_offset)
        if end <= start:
            return 0
        if tag_filter.tags is None:
            return end - start
        wanted = tag_filter.tags
        # Whole blocks inside [start, end) are counted from their summaries, the rest tag by tag.
        first_whole = (start + BLOCK - 1) >> BLOCK_BITS
        last_whole = end >> BLOCK_BITS
        if first_whole >= last_whole:
            return self._scan_count(start, end, wanted)
        count = self._scan_count(start, first_whole << BLOCK_BITS, wanted)
        count += self._scan_count(last_whole << BLOCK_BITS, end, wanted)
        base = self.min_offset >> BLOCK_BITS
        for block, counts in enumerate(islice(self._blocks, first_whole - base, last_whole - base), start=first_whole):
            if counts is None:
                count += self._scan_count(block << BLOCK_BITS, (block + 1) << BLOCK_BITS, wanted)
            elif len(wanted) <= len(counts):
                count += sum(counts.get(tag, 0) for tag in wanted)
            else:
                count += sum(n for tag, n in counts.items() if tag in wanted)
        return count

    def tags_between(self, start: int, end: int, max_blocks: int) -> set[str | None] | None:
        """The tags of the blocks overlapping [start, end): every tag in the range and maybe some around it.
        None when a block keeps no summary or more than ``max_blocks`` blocks overlap (not worth it)."""
        start = max(start, self.min_offset)
        end = min(end, self.max_offset)
        if end <= start:
            return set()
        base = self.min_offset >> BLOCK_BITS
        first, last = (start >> BLOCK_BITS) - base, ((end - 1) >> BLOCK_BITS) - base
        if last - first >= max_blocks:
            return None
        present: set[str | None] = set()
        for counts in islice(self._blocks, first, last + 1):
            if counts is None:
                return None
            present.update(counts)
        return present

    def _may_hold(self, offset: int, wanted: frozenset[str]) -> bool:
        """Whether the block holding ``offset`` may hold a wanted tag (False only when it surely does not)."""
        counts = self._blocks[(offset >> BLOCK_BITS) - (self.min_offset >> BLOCK_BITS)]
        return counts is None or not wanted.isdisjoint(counts)

    def _scan_first(self, start: int, end: int, wanted: frozenset[str]) -> int | None:
        tags = self.tags
        base = self.min_offset
        for i in range(start - base, end - base):
            if tags[i] in wanted:
                return base + i
        return None

    def _scan_count(self, start: int, end: int, wanted: frozenset[str]) -> int:
        base = self.min_offset
        return sum(map(wanted.__contains__, self.tags[start - base : end - base]))


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
