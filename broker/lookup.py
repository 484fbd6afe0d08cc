"""Messages of a topic by message id or by key: a bounded scan of each queue's newest messages, newest first.

No index is kept (it would cost memory for every message, ids and keys being up to 128 and 64 × 128 characters):
a query reads, on the store's reader thread, at most `max_scan` messages of this broker (MAX_SCAN, 100,000, at
most), that many divided among the topic's queues, from each queue's end backwards, in pages of at most SCAN_STEP
messages and `--max-pop-bytes`; a payload is decoded only when the id or key occurs in its bytes. A queue stops
once it gave `max_messages` matches (older ones cannot be among the newest). The answer says how many messages it
looked at and whether older ones were left unscanned (docs/BROKER.md, "Admin operations";
tests/unit/broker/test_admin.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError
from popgate_pb import broker_pb2 as pb

from broker.log import QueueLog
from broker.store import Record, Store
from popgate_contract import validation
from popgate_contract.errors import BadRequest, IllegalBatchSize

MAX_SCAN = 100_000
SCAN_STEP = 256
MAX_ANSWERS = 1_000


@dataclass
class Found:
    messages: list[tuple[Record, pb.Message]] = field(default_factory=list)
    scanned: int = 0
    cut: bool = False


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
    want: int,
    needle: bytes,
    test: Callable[[pb.Message], bool],
    *,
    max_bytes: int,
) -> Found:
    """The newest `want` matches among the queue's newest `budget` messages, newest first."""
    found = Found()
    hi = queue.max_offset
    lo = max(queue.min_offset, hi - budget)
    found.cut = lo > queue.min_offset
    while hi > lo and len(found.messages) < want:
        start = max(lo, hi - SCAN_STEP)
        step: list[tuple[Record, pb.Message]] = []
        at = start
        while at < hi:  # a page at a time: only matches are kept, never a whole step's payloads
            page = await store.read_range(queue.topic, queue.queue_id, at, hi - at, max_bytes=max_bytes)
            if not page:
                break
            for record in page:
                if record.offset >= hi:
                    break
                found.scanned += 1
                if needle in record.payload and (m := _decoded(record.payload)) is not None and test(m):
                    step.append((record, m))
            at = page[-1].offset + 1
        found.messages.extend(reversed(step))
        hi = start
    del found.messages[want:]
    return found


def _decoded(payload: bytes) -> pb.Message | None:
    try:
        message = pb.Message.FromString(payload)
    except DecodeError:  # damaged on disk: not a match
        return None
    message.ClearField("v2_system")  # the proxy's byte path's alone: not in admin answers (test_v2_system.py)
    return message


async def query(
    store: Store, queues: list[QueueLog], request: pb.QueryMessagesRequest, *, max_bytes: int
) -> tuple[list[tuple[Record, pb.Message]], int, bool]:
    """Every queue's newest matches merged, newest first, at most max_messages; messages scanned; whether some
    queue was left with older messages unscanned."""
    needle, test = matcher(request)
    total = min(request.max_scan or MAX_SCAN, MAX_SCAN)
    budget = max(1, total // max(1, len(queues)))
    matches: list[tuple[Record, pb.Message]] = []
    scanned, cut = 0, False
    for queue in queues:
        found = await scan_queue(store, queue, budget, request.max_messages, needle, test, max_bytes=max_bytes)
        matches.extend(found.messages)
        scanned += found.scanned
        cut = cut or found.cut
    matches.sort(key=lambda f: (f[0].store_ms, f[0].queue_id, f[0].offset), reverse=True)
    return matches[: request.max_messages], scanned, cut
