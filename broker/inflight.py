"""Per consumer group and topic: pull offsets, in-flight deliveries and their deadlines.

Pure bookkeeping, no I/O. For each queue: the **pull offset** (next message
never popped) and the in-flight deliveries between the consumer offset and it.
The consumer offset is derived: the lowest in-flight offset, else the pull
offset. The in-flight FIFO messages of a queue (``fifo``) hold back its later ones
(broker.core, "FIFO order"). A min-heap of (deadline, queue, offset, token) finds deliveries whose
invisibility has passed; entries made stale by an ack or a new delivery are
skipped lazily and the heap is rebuilt when stale ones dominate.
"""

from __future__ import annotations

import heapq
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from broker.filters import MATCH_ALL, TagFilter
from broker.store import DeleteInflight, Op, PutInflight, SetGroupFilter, SetPullOffset


class _Tokens:
    """Delivery and transaction tokens: random bits from the OS (a consumer seeing many handles cannot predict the
    next ones, as it could a seeded PRNG's), read 1,024 tokens at a time so that a token costs no syscall —
    tests/unit/broker/test_inflight_and_lag.py::test_tokens_are_48_random_bits_that_do_not_repeat."""

    __slots__ = ("_buffer", "_at")

    def __init__(self) -> None:
        self._buffer = b""
        self._at = 0

    def getrandbits(self, bits: int) -> int:
        size = (bits + 7) // 8
        if self._at + size > len(self._buffer):
            self._buffer, self._at = os.urandom(1024 * size), 0
        token = int.from_bytes(self._buffer[self._at : self._at + size], "big") >> (8 * size - bits)
        self._at += size
        return token


tokens = _Tokens()

# The attempt of a stored in-flight row that is no delivery but a mark: the message was taken ahead of the pull
# offset (broker.priority) and is acked or dead-lettered. It keeps the message taken across a restart until the
# pull offset passes it, and then goes (`GroupTopic.done_op`, broker.priority.take_prioritized).
ACKED_AHEAD = -1


@dataclass(slots=True)
class Delivery:
    attempt: int
    token: int
    deadline_ms: int
    expired: bool = False  # taken off the heap by take_expired: waiting to be popped again, or dead-lettered
    queued: bool = False  # its entry is in its group's `ready` queue (broker.redelivery counts these, not walks)
    # Counted by the Pop that made it (its attempt), and so uncounted by an undelivered give-back (broker.acks); one
    # a change or a restart made is not: a handle from a nack given back undelivered still counts its delivery.
    popped: bool = False


class GroupQueue:
    __slots__ = ("queue_id", "pull_offset", "inflight", "fifo", "counted", "ahead", "moving")

    def __init__(self, queue_id: int, pull_offset: int) -> None:
        self.queue_id = queue_id
        self.pull_offset = pull_offset
        self.inflight: dict[int, Delivery] = {}
        self.fifo: set[int] = set()  # offsets of FIFO messages in flight, or being dead-lettered (not yet committed)
        # The group's last count of matching messages here, (filter, start, end, count): broker.lag's memo.
        self.counted: tuple[TagFilter, int, int, int] | None = None
        # Offsets at or past the pull offset already taken out of order (broker.priority); None when none.
        self.ahead: set[int] | None = None
        # Offsets out of flight whose DLQ commit is on its way (broker.redelivery): a reset forgets them, so that a
        # failed commit puts back only what is still the group's to put back. None when none.
        self.moving: set[int] | None = None

    @property
    def consumer_offset(self) -> int:
        """Everything below is acked (RocketMQ's ConsumerOffset): never past the pull offset, which a priority Pop may
        leave behind a message it took ahead — test_priority.py::
        test_a_message_taken_ahead_in_flight_leaves_the_lag_and_offset_of_the_older_one_waiting."""
        return min(min(self.inflight), self.pull_offset) if self.inflight else self.pull_offset


class GroupTopic:
    def __init__(self, group: str, topic: str, tag_filter: TagFilter = MATCH_ALL) -> None:
        self.group = group
        self.topic = topic
        self.filter = tag_filter
        self.queues: dict[int, GroupQueue] = {}
        self._heap: list[tuple[int, int, int, int]] = []
        # Deliveries whose invisibility passed, waiting to be popped again: (queue, offset, token). `stale` of them
        # name a delivery no longer in flight (acked, dropped by a reset, given a new invisibility).
        self.ready: deque[tuple[int, int, int]] = deque()
        self.stale = 0
        self.next_queue = 0
        self.pops = 0  # Pop passes on this state: which take redeliveries first (broker.pop.redeliveries_first)
        # (queue, offset) of deliveries a Pop undid unreceived (broker.pop `_undo`): taken first in every pass.
        self.undone: set[tuple[int, int]] = set()
        self.dead_lettered = 0
        self.filtered = 0  # redeliveries acked for a Pop whose filter does not take their tag (Redelivery.take)
        self._pushes = 0

    def queue(self, queue_id: int, start_offset: int) -> GroupQueue:
        state = self.queues.get(queue_id)
        if state is None:
            state = self.queues[queue_id] = GroupQueue(queue_id, start_offset)
        return state

    def start_delivery(
        self,
        queue_id: int,
        offset: int,
        attempt: int,
        deadline_ms: int,
        ops: list[Op] | None,
        *,
        fifo: bool = False,
        popped: bool = False,
    ) -> Delivery:
        """A new delivery of a message (a fresh token: earlier handles go stale), recorded by `deliver`; the
        PutInflight that makes it durable is appended to `ops` (None: it stays in memory only). `popped`: a Pop's,
        counted (`Delivery.popped`)."""
        delivery = Delivery(attempt, tokens.getrandbits(48), deadline_ms, popped=popped)
        self.deliver(queue_id, offset, delivery, fifo=fifo)
        if ops is not None:
            ops.append(PutInflight(self.group, self.topic, queue_id, offset, attempt, delivery.token, deadline_ms))
        return delivery

    def deliver(self, queue_id: int, offset: int, delivery: Delivery, *, fifo: bool = False) -> None:
        """Record a (re)delivery: the offset must already be below the queue's pull offset. ``fifo``: a FIFO
        message (it stays in the queue's ``fifo`` set until removed)."""
        queue = self.queues[queue_id]
        old = queue.inflight.get(offset)
        queue.inflight[offset] = delivery
        if fifo:
            queue.fifo.add(offset)
        self._push(queue_id, offset, delivery)
        if old is not None and old is not delivery:
            self._gone([old])

    def extend(self, queue_id: int, offset: int, delivery: Delivery, deadline_ms: int, ops: list[Op]) -> None:
        """Move an in-flight delivery's deadline, keeping the delivery (same token and attempt: its receipt handle
        stays valid); the PutInflight that makes it durable is appended to `ops`. Its old heap entry goes stale
        (its deadline no longer matches). Not for an expired delivery: it is queued for redelivery already."""
        assert not delivery.expired
        delivery.deadline_ms = deadline_ms
        self._push(queue_id, offset, delivery)
        ops.append(PutInflight(self.group, self.topic, queue_id, offset, delivery.attempt, delivery.token, deadline_ms))

    def _push(self, queue_id: int, offset: int, delivery: Delivery) -> None:
        heapq.heappush(self._heap, (delivery.deadline_ms, queue_id, offset, delivery.token))
        self._pushes += 1
        if self._pushes >= 1024:
            self._pushes = 0
            self._maybe_compact()

    def current(self, queue_id: int, offset: int, token: int) -> Delivery | None:
        """The in-flight delivery a handle names, or None when acked or superseded."""
        state = self.queues.get(queue_id)
        delivery = state.inflight.get(offset) if state else None
        return delivery if delivery is not None and delivery.token == token else None

    def remove(self, queue_id: int, offset: int, *, keep_fifo: bool = False) -> bool:
        """Acked or dead-lettered; whether it was a FIFO message (its queue's next ones may go now). With
        ``keep_fifo`` a FIFO message still holds its queue back (a dead letter not committed yet)."""
        state = self.queues.get(queue_id)
        if state is None:
            return False
        self._gone([state.inflight.pop(offset, None)])
        if offset not in state.fifo:
            return False
        if not keep_fifo:
            state.fifo.discard(offset)
        return True

    def drop_all(self, queue_id: int) -> None:
        """Forget the queue's deliveries (a reset). Their heap entries go with the rebuild `_maybe_compact` makes
        once stale ones dominate, in one pass, not one by one as the timer meets them — tests/unit/broker/
        test_reset.py::test_a_reset_of_many_deliveries_leaves_no_stale_deadlines_to_drain."""
        inflight = self.queues[queue_id].inflight
        gone = list(inflight.values())
        inflight.clear()
        self._gone(gone)
        self._maybe_compact()

    def make_ready(self, queue_id: int, offset: int, delivery: Delivery) -> None:
        """Queue an expired delivery to be popped again."""
        self.ready.append((queue_id, offset, delivery.token))
        delivery.queued = True

    @property
    def queued(self) -> int:
        """The entries of `ready` that name a delivery still in flight."""
        return len(self.ready) - self.stale

    def _gone(self, deliveries: Iterable[Delivery | None]) -> None:
        """Deliveries left the flight: their entries in `ready`, if any, are stale now. Stale entries are dropped
        once they are the majority, also for a group that never pops again — tests/unit/broker/
        test_redelivery_storm.py::test_late_acks_of_expired_deliveries_leave_no_stale_entries_behind."""
        for delivery in deliveries:
            if delivery is not None and delivery.queued:
                delivery.queued = False
                self.stale += 1
        if self.stale > self.queued + 1024:
            live = [entry for entry in self.ready if self.current(*entry) is not None]
            self.ready.clear()  # in place: a caller may hold the deque
            self.ready.extend(live)
            self.stale = 0

    def done_op(self, queue_id: int, offset: int) -> Op:
        """The store op for a message no longer in flight to the group (acked, dead-lettered): its row goes, unless
        the message was taken ahead of the pull offset — then the row becomes an ACKED_AHEAD mark, for the pull offset
        alone would let a restart deliver it again (tests/unit/broker/test_priority.py::
        test_an_ack_of_a_message_taken_ahead_holds_across_a_restart)."""
        queue = self.queues.get(queue_id)
        if queue is not None and queue.ahead is not None and offset in queue.ahead and offset not in queue.inflight:
            return PutInflight(self.group, self.topic, queue_id, offset, ACKED_AHEAD, 0, 0)
        return DeleteInflight(self.group, self.topic, queue_id, offset)

    def rows(self) -> list[Op]:
        """The ops that store this state as it is: its filter, pull offsets, deliveries and ACKED_AHEAD marks."""
        ops: list[Op] = [SetGroupFilter(self.group, self.topic, str(self.filter))]
        for q in self.queues.values():
            ops.append(SetPullOffset(self.group, self.topic, q.queue_id, q.pull_offset))
            ops.extend(self.inflight_rows(q.queue_id))
        return ops

    def inflight_rows(self, queue_id: int) -> list[Op]:
        """The ops that store the queue's deliveries and ACKED_AHEAD marks as they are."""
        group, topic, q = self.group, self.topic, self.queues.get(queue_id)
        if q is None:
            return []
        ops: list[Op] = [
            PutInflight(group, topic, queue_id, offset, d.attempt, d.token, d.deadline_ms)
            for offset, d in q.inflight.items()
        ]
        ops.extend(
            PutInflight(group, topic, queue_id, o, ACKED_AHEAD, 0, 0) for o in q.ahead or () if o not in q.inflight
        )
        return ops

    def _valid(self, entry: tuple[int, int, int, int]) -> bool:
        deadline, queue_id, offset, token = entry
        delivery = self.current(queue_id, offset, token)
        return delivery is not None and delivery.deadline_ms == deadline and not delivery.expired

    def next_deadline(self) -> int | None:
        """The earliest deadline of a live delivery (drops stale heap heads)."""
        heap = self._heap
        while heap and not self._valid(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def take_expired(self, now_ms: int, limit: int) -> list[tuple[int, int, Delivery]]:
        """Deliveries whose invisibility has passed, earliest first, removed from the heap."""
        out: list[tuple[int, int, Delivery]] = []
        heap = self._heap
        while heap and len(out) < limit:
            deadline = self.next_deadline()
            if deadline is None or deadline > now_ms:
                break
            _, queue_id, offset, _ = heapq.heappop(heap)
            delivery = self.queues[queue_id].inflight[offset]
            delivery.expired = True
            out.append((queue_id, offset, delivery))
        return out

    @property
    def inflight_count(self) -> int:
        return sum(len(q.inflight) for q in self.queues.values())

    def _maybe_compact(self) -> None:
        live = self.inflight_count
        if len(self._heap) > 2 * live + 1024:
            # Not the expired ones: they are in `ready` (or being dead-lettered) already, and back on
            # the heap they would expire a second time — one message twice in a Pop's answer.
            self._heap = [
                (d.deadline_ms, q.queue_id, offset, d.token)
                for q in self.queues.values()
                for offset, d in q.inflight.items()
                if not d.expired
            ]
            heapq.heapify(self._heap)
