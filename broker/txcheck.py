"""The check schedule of half messages (pure, no I/O): when each is checked next, which checks are due for the
topics a caller asks about, and which half messages are past their last check and roll back.

A half message is first checked `immunity_ms` after its send, then every `interval_ms` while unresolved; its
check number `max_checks` is its last, and `interval_ms` after it, unresolved, it is rolled back. A half message
whose checks nobody asks for (no producer of its topic online) is rolled back when the time of its last check
has passed too: `immunity_ms + max_checks * interval_ms` after its send — tests/unit/broker/test_transactions.py.
That time does not roll back a half message of a topic whose checks a caller asked for within the last interval
(a producer online, answering slower than its checks fall due): it waits for its turn and ends after its last
check, as RocketMQ counts checks (TRANSACTION_CHECK_TIMES), not time — test_transactions.py::
test_a_half_message_of_a_topic_still_asked_for_waits_for_its_checks_past_their_time. After a start, its askers
have an interval to ask again before that time rolls any half message back.

Its times are on one clock, whichever the caller keeps them on (broker.transactions: the monotonic clock).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class Half:
    half_id: int
    token: int
    topic: str
    queue_id: int
    tag: str | None
    store_ms: int
    checks: int
    next_check_ms: int
    expire_ms: int = 0
    busy: bool = False  # being resolved: no other resolution, check or expiry takes it meanwhile
    checking: bool = False  # its check being recorded: no other check takes it meanwhile


class CheckSchedule:
    def __init__(self, *, immunity_ms: int, interval_ms: int, max_checks: int, started_ms: int = 0) -> None:
        """`started_ms`: when the broker started (on the schedule's clock); callers had no interval to ask before."""
        self.immunity_ms = immunity_ms
        self.interval_ms = interval_ms
        self.max_checks = max_checks
        self._halves: dict[int, Half] = {}
        self._due: dict[str, list[tuple[int, int]]] = {}  # topic -> heap of (next_check_ms, half id)
        self._expiry: list[tuple[int, int]] = []  # heap of (expire_ms, half id)
        self._asked: dict[str, int] = {}  # topic -> when a caller last asked for its checks (`due`)
        self._started_ms = started_ms

    def __len__(self) -> int:
        return len(self._halves)

    def get(self, half_id: int) -> Half | None:
        return self._halves.get(half_id)

    def first_check_ms(self, store_ms: int) -> int:
        return store_ms + self.immunity_ms

    def add(self, half: Half) -> None:
        """A half message stored (or loaded at start) with its check state."""
        self._halves[half.half_id] = half
        half.expire_ms = half.store_ms + self.immunity_ms + self.max_checks * self.interval_ms
        if half.checks >= self.max_checks:
            half.expire_ms = min(half.expire_ms, half.next_check_ms)
        heapq.heappush(self._expiry, (half.expire_ms, half.half_id))
        if half.checks < self.max_checks:
            heapq.heappush(self._due.setdefault(half.topic, []), (half.next_check_ms, half.half_id))

    def remove(self, half_id: int) -> None:
        """Resolved (committed, rolled back): its heap entries are dropped when they come up, or all at once when
        such entries are most of the heaps (rebuilt of the halves left, amortized O(1) a removal), so resolved
        half messages do not stay in memory until their checks would have ended — test_transactions.py::
        test_resolved_half_messages_leave_the_check_schedules_memory_early."""
        self._halves.pop(half_id, None)
        if 2 * len(self._halves) < len(self._expiry):
            self._compact()

    def _compact(self) -> None:
        """The heaps of the halves left only: each one's expiry and, before its last check, its next check."""
        self._expiry = [(half.expire_ms, half_id) for half_id, half in self._halves.items()]
        heapq.heapify(self._expiry)
        due: dict[str, list[tuple[int, int]]] = {}
        for half_id, half in self._halves.items():
            if half.checks < self.max_checks:
                due.setdefault(half.topic, []).append((half.next_check_ms, half_id))
        for heap in due.values():
            heapq.heapify(heap)
        self._due = due

    def asked(self, topics: Iterable[str], now_ms: int) -> None:
        """A caller asks for these topics' checks and takes none now: their half messages wait for their checks."""
        for topic in topics:
            self._asked[topic] = now_ms

    def due(self, topics: Iterable[str], now_ms: int, limit: int) -> list[Half]:
        """Up to `limit` half messages of these topics whose check is due, earliest first; not busy, not past
        their last check. They stay scheduled until `checked` records their check."""
        out: list[Half] = []
        for topic in topics:
            self._asked[topic] = now_ms
            heap = self._due.get(topic)
            if heap is None:
                continue
            kept: list[tuple[int, int]] = []
            while heap and heap[0][0] <= now_ms and len(out) < limit:
                entry = heapq.heappop(heap)
                if self._stale(entry):
                    continue  # resolved, rescheduled, or past its last check
                half = self._halves[entry[1]]
                kept.append(entry)
                if not (half.busy or half.checking):
                    out.append(half)
            for entry in kept:
                heapq.heappush(heap, entry)  # `checked` moves them on; a busy one stays due
            if not heap:
                del self._due[topic]
        return out

    def check_state(self, half: Half, now_ms: int) -> tuple[int, int]:
        """The (checks, next_check_ms) a check handed out now leaves the half message with."""
        return half.checks + 1, now_ms + self.interval_ms

    def checked(self, half: Half, checks: int, next_check_ms: int) -> None:
        """Its check is recorded: due again at `next_check_ms`, or, after its last, expiring then."""
        half.checks, half.next_check_ms = checks, next_check_ms
        if checks < self.max_checks:
            heapq.heappush(self._due.setdefault(half.topic, []), (next_check_ms, half.half_id))
        elif next_check_ms != half.expire_ms:  # its producer has an interval to answer its last check, also a late one
            half.expire_ms = next_check_ms
            heapq.heappush(self._expiry, (next_check_ms, half.half_id))

    def expired(self, now_ms: int) -> list[Half]:
        """Half messages to roll back now: past their last check, or past the time of it with nobody asking for
        their topic's checks; not busy."""
        out: list[Half] = []
        later: list[tuple[int, int]] = []
        heap = self._expiry
        while heap and heap[0][0] <= now_ms:
            entry = heapq.heappop(heap)
            half = self._halves.get(entry[1])
            if half is None or half.expire_ms != entry[0]:
                continue
            if half.busy:
                later.append(entry)  # tried again at the next look
            elif half.checks < self.max_checks and (asked := self._asked_since(half.topic, now_ms)) is not None:
                half.expire_ms = asked + self.interval_ms  # its checks are asked for: looked at again then
                later.append((half.expire_ms, half.half_id))
            else:
                out.append(half)
        for entry in later:
            heapq.heappush(heap, entry)
        return out

    def _asked_since(self, topic: str, now_ms: int) -> int | None:
        """When a caller last asked for the topic's checks (or the start), if within the last interval."""
        asked = max(self._asked.get(topic, 0), self._started_ms)
        return asked if asked > now_ms - self.interval_ms else None

    def next_due_ms(self, topics: Iterable[str]) -> int:
        """When the next check of these topics is due (0: none scheduled)."""
        heads = []
        for topic in topics:
            heap = self._due.get(topic, [])
            while heap and self._stale(heap[0]):
                heapq.heappop(heap)
            if heap:
                heads.append(heap[0][0])
        return min(heads, default=0)

    def _stale(self, entry: tuple[int, int]) -> bool:
        half = self._halves.get(entry[1])
        return half is None or half.next_check_ms != entry[0] or half.checks >= self.max_checks
