"""When the SQLite store commits a request, and on which thread: a small commit while the event loop's thread is
mostly idle is made on that thread at once (`LoopLoad`, `small_enough`); anything else goes to the writer thread
with whatever else is waiting (group commit), and consumer state under --flush async waits STATE_DELAY_S first.
"""

from __future__ import annotations

import time

from broker.store import PURGES
from broker.store_writes import Request

# A commit made on the event loop's thread (`SqliteStore._commit_here`): only while that thread is busy less than
# this share of the time (measured over LOAD_WINDOW_S), and holding at most this much.
INLINE_MAX_LOOP_BUSY = 0.5
LOAD_WINDOW_S = 0.05
INLINE_MAX_MESSAGES = 64
INLINE_MAX_OPS = 256
INLINE_MAX_BYTES = 256 * 1024

# How long consumer-state writes (deliveries, acks, pull offsets) wait under --flush async before they go to the
# writer thread, all of them then in one commit: a broker that is not saturated still commits them in batches, and
# a Pop acked within this time never writes its delivery (`coalesce`). Nobody waits for them (a Send that comes
# meanwhile takes them along at once); a kill -9 loses at most this much of them, whose messages then come back
# (at least once) — tests/unit/broker/test_sqlite_store.py::
# test_consumer_state_written_a_moment_later_keeps_its_order_and_is_flushed_at_close. RocketMQ's pop buffer keeps
# checkpoints up to 10 s.
STATE_DELAY_S = 0.05


class LoopLoad:
    """The share of wall time the calling thread (the event loop's) spent on a CPU, over the last window of at
    least LOAD_WINDOW_S: near 1 when the loop never waits for I/O (a saturated broker)."""

    def __init__(self) -> None:
        self._since = time.monotonic()
        self._cpu = time.thread_time()
        self._busy = 0.0

    def busy(self) -> float:
        now = time.monotonic()
        if now - self._since >= LOAD_WINDOW_S:
            cpu = time.thread_time()
            self._busy = (cpu - self._cpu) / (now - self._since)
            self._since, self._cpu = now, cpu
        return self._busy


def small_enough(request: Request, deferred: list[Request]) -> bool:
    """Whether `request`, with the consumer state `deferred` before it, is small enough to commit on the event
    loop's thread (INLINE_MAX_MESSAGES, INLINE_MAX_BYTES, INLINE_MAX_OPS). Never with a purge, which deletes as many
    rows as its topic or group has — tests/unit/broker/test_sqlite_store.py::
    test_a_purge_is_never_committed_on_the_event_loop."""
    if len(request.appends) > INLINE_MAX_MESSAGES:  # deferred requests hold consumer state only
        return False
    if sum(len(m.payload) for m in request.appends) > INLINE_MAX_BYTES:
        return False
    if len(request.ops) + sum(len(r.ops) for r in deferred) > INLINE_MAX_OPS:
        return False
    return not any(isinstance(op, PURGES) for r in (*deferred, request) for op in r.ops)
