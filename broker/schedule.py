"""Delayed and scheduled delivery: a durable schedule index and its asynchronous deliverer.

A scheduled message is stored in the schedule (not in its topic) until its due
time; then the deliverer moves it into the topic in one transaction (append and
delete together, so it is delivered exactly once, also after a crash).
Delivery is asynchronous with flow control, as RocketMQ 4.9.3's scheduled
delivery: at most ``max_in_flight`` messages are being delivered at once; when
the bound is reached the deliverer waits instead of reading more. A failed
delivery is retried with growing back-off; after ``max_retries`` failed retries
the deliverer blocks (delivers nothing else) and keeps retrying that batch until
it succeeds, rather than skipping it.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.clock import Clock
from popgate_contract.errors import IllegalDeliveryTime

log = logging.getLogger(__name__)

# RocketMQ's 18 delay levels, in seconds.
DELAY_LEVELS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)

Entry = tuple[int, int]  # (due_ms, schedule id)


def due_time_ms(now_ms: int, *, deliver_at_ms: int, delay_level: int, max_delay_ms: int) -> int | None:
    """When a message becomes visible: None for at once (no delay, or a time already past)."""
    if delay_level:
        if not 1 <= delay_level <= len(DELAY_LEVELS_S):
            raise IllegalDeliveryTime(f"delay level {delay_level} is outside 1..{len(DELAY_LEVELS_S)}")
        due = now_ms + DELAY_LEVELS_S[delay_level - 1] * 1000
    elif deliver_at_ms > now_ms:
        due = deliver_at_ms
    else:
        return None
    if due - now_ms > max_delay_ms:
        raise IllegalDeliveryTime(
            f"delivery time is {(due - now_ms) / 1000:.0f} s away, more than the maximum delay of "
            f"{max_delay_ms / 1000:.0f} s (is it in milliseconds where seconds were meant, or the reverse?)"
        )
    return due


class ScheduleIndex:
    """Due times of scheduled messages, earliest first (pure). A message recalled (`remove`) leaves at once; its
    heap entry is dropped when it comes to the top, or when such entries are more than half of the heap (the heap
    is rebuilt of the waiting ones, amortized O(1) a removal), so recalled messages do not stay in memory until
    their due time — tests/unit/broker/test_schedule.py::
    test_recalled_entries_do_not_stay_in_memory_until_their_due_time."""

    def __init__(self) -> None:
        self._heap: list[Entry] = []
        self._waiting: set[int] = set()  # schedule ids in the heap, neither taken nor removed
        # The largest due time in the heap. Entries leave only from the minimum, or all but the waiting ones at
        # once (`_compact`, which sets it again), so it stays exact: when the maximum itself leaves from the
        # minimum, every entry left has that same due time.
        self._max_due = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, due_ms: int, schedule_id: int) -> None:
        self._max_due = max(self._max_due, due_ms) if self._heap else due_ms
        heapq.heappush(self._heap, (due_ms, schedule_id))
        self._waiting.add(schedule_id)

    def waiting(self, schedule_id: int) -> bool:
        """Whether the message still waits for its time: not taken for delivery, not removed."""
        return schedule_id in self._waiting

    def remove(self, schedule_id: int) -> None:
        self._waiting.discard(schedule_id)
        if 2 * len(self._waiting) < len(self._heap):  # removed entries are more than half of the heap
            self._compact()

    def _compact(self) -> None:
        """The heap of the waiting entries only (once each: a message recalled and added back may have two)."""
        live = {sid: due for due, sid in self._heap if sid in self._waiting}
        self._heap = [(due, sid) for sid, due in live.items()]
        heapq.heapify(self._heap)
        self._max_due = max(live.values(), default=0)

    def _drop_removed(self) -> None:
        heap = self._heap
        while heap and heap[0][1] not in self._waiting:
            heapq.heappop(heap)

    def next_due(self) -> int | None:
        self._drop_removed()
        return self._heap[0][0] if self._heap else None

    def take_due(self, now_ms: int, limit: int) -> list[Entry]:
        out: list[Entry] = []
        heap = self._heap
        self._drop_removed()
        while heap and heap[0][0] <= now_ms and len(out) < limit:
            entry = heapq.heappop(heap)
            self._waiting.discard(entry[1])
            out.append(entry)
            self._drop_removed()
        return out

    def count_due(self, now_ms: int) -> int:
        """Waiting entries due at ``now_ms``, visiting only the due ones (O(due)), not the whole schedule.

        A heap entry is never due earlier than its parent, so the due entries form a subtree at the
        root: walk it, descending only into due children. When everything is due, the answer is O(1).
        """
        heap = self._heap
        n = len(heap)
        if not n or heap[0][0] > now_ms:
            return 0
        waiting = self._waiting
        if self._max_due <= now_ms:
            return len(waiting)
        count = 0
        stack = [0]
        pop, push = stack.pop, stack.append
        while stack:
            i = pop()
            count += heap[i][1] in waiting  # not a removed entry
            child = 2 * i + 1
            if child < n and heap[child][0] <= now_ms:
                push(child)
            child += 1
            if child < n and heap[child][0] <= now_ms:
                push(child)
        return count


@dataclass
class DeliveryStats:
    retries: int = 0
    blocked_s: float = 0.0


Deliver = Callable[[list[Entry]], Awaitable[None]]


class ScheduledDelivery:
    def __init__(
        self,
        index: ScheduleIndex,
        deliver: Deliver,
        *,
        clock: Clock,
        max_in_flight: int = 2000,
        batch: int = 256,
        backoff_s: tuple[float, ...] = (0.05, 0.2, 1.0),
    ) -> None:
        self.index = index
        self._deliver = deliver
        self.max_in_flight = max_in_flight
        self.batch = batch
        self.backoff_s = backoff_s
        self.max_retries = len(backoff_s)
        self.clock = clock
        self.in_flight = 0
        self._blocking = 0  # batches failing past their retries: delivery waits while any does
        self._blocked_since = 0.0
        self.stats = DeliveryStats()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None

    @property
    def blocked(self) -> bool:
        """Delivery of anything else waits: some batch has failed past its retries and not succeeded since."""
        return self._blocking > 0

    def start(self) -> None:
        self._runner = asyncio.get_running_loop().create_task(self.run())

    def put_back(self, count: int, due_ms: int) -> None:
        """`count` entries of a batch under way went back to the index, due at `due_ms`, and out of the batch's list:
        waiting, no longer in flight."""
        self.in_flight -= count
        self.added(due_ms)

    def added(self, due_ms: int) -> None:
        """A new entry: wake the loop if it is due earlier than what the loop waits for."""
        self._wake.set()

    def due_pending(self) -> int:
        return self.index.count_due(self.clock.now_ms()) + self.in_flight

    async def run(self) -> None:
        while True:
            await self._wait_for_work()
            entries = self.index.take_due(self.clock.now_ms(), min(self.batch, self.max_in_flight - self.in_flight))
            if not entries:
                continue
            self.in_flight += len(entries)
            task = asyncio.get_running_loop().create_task(self._deliver_with_retry(entries))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _wait_for_work(self) -> None:
        """Until something is due, there is room in flight, and delivery is not blocked."""
        while True:
            self._wake.clear()
            next_due = self.index.next_due()
            if not self.blocked and self.in_flight < self.max_in_flight and next_due is not None:
                delay = (next_due - self.clock.now_ms()) / 1000
                if delay <= 0:
                    return
            else:
                delay = None
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except TimeoutError:
                pass

    async def _deliver_with_retry(self, entries: list[Entry]) -> None:
        """Deliver `entries` until it succeeds. The delivery may take entries out of the list (put back in the
        index for later, `put_back`): a retry leaves them out."""
        failures = 0
        blocking = False  # this batch holds delivery back (counted in `_blocking` until it succeeds)
        try:
            while True:
                try:
                    await self._deliver(entries)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failures += 1
                    self.stats.retries += 1
                    if failures > self.max_retries and not blocking:
                        log.error("scheduled delivery failed %s times, blocking until it succeeds: %s", failures, exc)
                        blocking = True
                        if self._blocking == 0:
                            self._blocked_since = time.monotonic()
                        self._blocking += 1
                    else:
                        log.warning("scheduled delivery failed (try %s), retrying: %s", failures, exc)
                    await asyncio.sleep(self.backoff_s[min(failures, self.max_retries) - 1])
        finally:
            if blocking:
                self._blocking -= 1
                if self._blocking == 0:  # blocked time is the union of the blocking batches' spans
                    self.stats.blocked_s += time.monotonic() - self._blocked_since
            self.in_flight -= len(entries)
            self._wake.set()

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
