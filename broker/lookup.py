"""Messages of a topic by message id or by key: a bounded scan of each queue's newest messages, newest first.

No index is kept (it would cost memory for every message, ids and keys being up to 128 and 64 × 128 characters):
a query reads, on the store's reader thread, at most `max_scan` messages of this broker (MAX_SCAN, 100,000, at
most), that many divided among the topic's queues, from each queue's end backwards, in pages of at most SCAN_STEP
messages and `--max-pop-bytes`; a payload is decoded only when the id or key occurs in its bytes. A queue stops
once it gave `max_messages` matches (older ones cannot be among the newest). The query holds the newest
`max_messages` matches over all queues, decoded and without their payloads (a body only when asked), and one page:
its memory does not grow with the topic's queues (tests/unit/broker/test_lookup.py::
test_a_querys_memory_grows_with_the_matches_asked_not_the_queues). The answer says how many messages it looked at
and whether older ones were left unscanned (docs/BROKER.md, "Admin operations"; tests/unit/broker/test_admin.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from google.protobuf.message import DecodeError
from popgate_pb import broker_pb2 as pb

from broker.log import QueueLog
from broker.store import Record, Store
from popgate_contract import validation
from popgate_contract.errors import BadRequest, IllegalBatchSize

MAX_SCAN = 100_000
SCAN_STEP = 256
MAX_ANSWERS = 1_000


class Match(NamedTuple):
    """A message found, without its payload; ordered by store time, then queue and offset (the newest greatest)."""

    store_ms: int
    queue_id: int
    offset: int
    body_size: int
    message: pb.Message


@dataclass
class Found:
    """The newest `want` matches so far over the queues scanned (a min-heap), and what the scan looked at."""

    want: int
    heap: list[Match] = field(default_factory=list)
    scanned: int = 0
    cut: bool = False

    def passed_over(self, record: Record) -> bool:
        """Whether the record is older than every match kept, with `want` kept: it cannot be among the newest."""
        return len(self.heap) >= self.want and (record.store_ms, record.queue_id, record.offset) < self.heap[0][:3]

    def add(self, match: Match) -> None:
        if len(self.heap) < self.want:
            heapq.heappush(self.heap, match)
        else:
            heapq.heappushpop(self.heap, match)

    def newest_first(self) -> list[Match]:
        return sorted(self.heap, key=lambda m: m[:3], reverse=True)


def matcher(request: pb.QueryMessagesRequest) -> tuple[bytes, Callable[[pb.Message], bool]]:
    """The bytes a matching payload holds, and the test of a decoded message; BadRequest for a bad request."""
    if bool(request.message_id) == bool(request.key):
        raise BadRequest("a message query names a message id or a key (one of them)")
    if not 1 <= request.max_messages <= MAX_ANSWERS:
        raise IllegalBatchSize(f"max messages {request.max_messages} is outside 1..{MAX_ANSWERS}")
    if request.max_scan < 0:
        raise BadRequest(f"max scan {request.max_scan} is negative")
    validation.check_topic(request.topic)
    if request.message_id:
        wanted = validation.check_message_id(request.message_id)
        return wanted.encode(), lambda m: m.message_id == wanted
    key = request.key
    if len(key) > validation.MAX_TAG_LEN:
        raise BadRequest(f"a key is at most {validation.MAX_TAG_LEN} characters")
    return key.encode(), lambda m: key in m.keys


async def scan_queue(
    store: Store,
    queue: QueueLog,
    budget: int,
    needle: bytes,
    test: Callable[[pb.Message], bool],
    found: Found,
    *,
    max_bytes: int,
    with_body: bool,
) -> None:
    """The queue's matches among its newest `budget` messages offered to `found`, newest pages first, until the queue
    gave `found.want` of them."""
    hi = queue.max_offset
    lo = max(queue.min_offset, hi - budget)
    found.cut = found.cut or lo > queue.min_offset
    given = 0
    while hi > lo and given < found.want:
        start = at = max(lo, hi - SCAN_STEP)
        while at < hi:  # a page at a time: only matches are kept, never a whole step's payloads
            page = await store.read_range(queue.topic, queue.queue_id, at, hi - at, max_bytes=max_bytes)
            if not page:
                break
            for record in page:
                if record.offset >= hi:
                    break
                found.scanned += 1
                if needle not in record.payload or found.passed_over(record):
                    continue
                if (m := _decoded(record.payload)) is not None and test(m):
                    size = len(m.body)
                    if not with_body:
                        m.ClearField("body")
                    found.add(Match(record.store_ms, record.queue_id, record.offset, size, m))
                    given += 1
            at = page[-1].offset + 1
        hi = start


def _decoded(payload: bytes) -> pb.Message | None:
    try:
        message = pb.Message.FromString(payload)
    except DecodeError:  # damaged on disk: not a match
        return None
    message.ClearField("v2_system")  # the proxy's byte path's alone: not in admin answers (test_v2_system.py)
    return message


async def query(store: Store, queues: list[QueueLog], request: pb.QueryMessagesRequest, *, max_bytes: int) -> Found:
    """The newest max_messages matches over the queues, how many messages were scanned and whether some queue was
    left with older messages unscanned."""
    needle, test = matcher(request)
    total = min(request.max_scan or MAX_SCAN, MAX_SCAN)
    budget = max(1, total // max(1, len(queues)))
    found = Found(request.max_messages)
    for queue in queues:
        await scan_queue(store, queue, budget, needle, test, found, max_bytes=max_bytes, with_body=request.with_body)
    return found
