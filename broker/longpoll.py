"""Long polling: held Pops and Notifications, woken on arrival (PopLongPollingService).

Requests are held per (topic, group) key in arrival order. The broker core calls
``arrived`` when messages a group can consume appear (an append, a redelivery
coming due); it wakes as many held requests as there are new matching messages,
oldest first whatever their kind. Each hold ends with an explicit outcome. A
caller that goes away (task cancelled) is removed at once; one woken that goes away
before it is answered hands its wake to ``unused_wake``. Capacity is bounded: past
it ``enter`` returns FULL immediately.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections import Counter
from collections.abc import Callable, Sequence

from broker.filters import TagFilter

Key = tuple[str, str]  # (topic, group)


class Outcome(enum.Enum):
    SERVED = "served"
    TIMED_OUT = "timed_out"
    FULL = "full"
    CLOSED = "closed"  # the broker is stopping
    ENDED = "ended"  # the key's group or topic was deleted


class Kind(enum.Enum):
    POP = "pop"
    NOTIFICATION = "notification"


class Waiter:
    """A held request: its caller awaits `future` (the outcome), then gives it to `HoldService.leave`."""

    __slots__ = ("kind", "filter", "future", "seq", "timer")

    def __init__(self, kind: Kind, tag_filter: TagFilter, future: asyncio.Future[Outcome], seq: int) -> None:
        self.kind = kind
        self.filter = tag_filter
        self.future = future
        self.seq = seq  # arrival order across kinds
        self.timer: asyncio.TimerHandle | None = None

    def resolve(self, outcome: Outcome) -> bool:
        if self.future.done():
            return False
        self.future.set_result(outcome)
        return True

    @property
    def served(self) -> bool:
        """Woken for something ready (its future is cancelled when its caller is cancelled before a wake)."""
        return self.future.done() and not self.future.cancelled() and self.future.result() is Outcome.SERVED


def _ready_once(
    groups: dict[tuple[Kind, TagFilter], dict[Waiter, None]], ready_check: Callable[[int], Callable[[TagFilter], bool]]
) -> Callable[[TagFilter], bool]:
    """Whether something is ready for each filter held (`ready_check` set up for them all), each asked once."""
    has_ready = ready_check(len({tag_filter for _, tag_filter in groups}))
    ready: dict[TagFilter, bool] = {}

    def check(tag_filter: TagFilter) -> bool:
        found = ready.get(tag_filter)
        if found is None:
            found = ready[tag_filter] = has_ready(tag_filter)
        return found

    return check


class HoldService:
    def __init__(self, capacity: int, *, unused_wake: Callable[[Key], object] | None = None) -> None:
        """unused_wake(key): a request woken for the key was cancelled before its caller was answered (the owner
        passes the wake on to another held request, as for an answer handed back)."""
        self.capacity = capacity
        self._unused_wake = unused_wake
        # Per key, per (kind, filter), in arrival order: an arrival costs one look per filter and one
        # step per request it wakes, however many are held (it never scans every held request).
        self._waiters: dict[Key, dict[tuple[Kind, TagFilter], dict[Waiter, None]]] = {}
        self._by_topic: dict[str, set[str]] = {}
        self.held = {Kind.POP: 0, Kind.NOTIFICATION: 0}
        self._closed = False
        self._arrivals = itertools.count()

    @property
    def closed(self) -> bool:
        """The broker is stopping: every request held was answered, and none is held any more."""
        return self._closed

    @property
    def total_held(self) -> int:
        return self.held[Kind.POP] + self.held[Kind.NOTIFICATION]

    def keys(self) -> list[Key]:
        return list(self._waiters)

    def enter(self, key: Key, kind: Kind, tag_filter: TagFilter, timeout_s: float) -> Waiter | Outcome:
        """Hold a request for at most `timeout_s`: its waiter, or the outcome at once when it is not held (closed,
        no time, full). The caller awaits the waiter's future itself and then calls `leave`: a held Pop or
        Notification keeps no coroutine of this service — tests/unit/broker/test_session_more.py::
        test_a_held_pop_or_notification_is_two_coroutines_and_holds_no_protobuf."""
        if self._closed:
            return Outcome.CLOSED
        if timeout_s <= 0:
            return Outcome.TIMED_OUT
        if self.total_held >= self.capacity:
            return Outcome.FULL
        loop = asyncio.get_running_loop()
        waiter = Waiter(kind, tag_filter, loop.create_future(), next(self._arrivals))
        self._add(key, waiter)
        waiter.timer = loop.call_later(timeout_s, waiter.resolve, Outcome.TIMED_OUT)
        return waiter

    def leave(self, key: Key, waiter: Waiter, *, cancelled: bool = False) -> None:
        """The caller is done with `waiter` (answered, or `cancelled`: its task was cancelled while it waited)."""
        if waiter.timer is not None:
            waiter.timer.cancel()
        self._remove(key, waiter)
        if cancelled and waiter.served and self._unused_wake is not None:
            # Woken, then cancelled before its task ran again (a cancel frame read in the wake's turn): its caller
            # never sees the wake, which an arrival gives to one request per message, so another held request gets
            # it (the woken one is no longer held) — tests/unit/broker/test_arrival.py::
            # test_a_request_woken_and_cancelled_before_it_is_answered_passes_its_wake_on
            self._unused_wake(key)

    def _add(self, key: Key, waiter: Waiter) -> None:
        self._waiters.setdefault(key, {}).setdefault((waiter.kind, waiter.filter), {})[waiter] = None
        self._by_topic.setdefault(key[0], set()).add(key[1])
        self.held[waiter.kind] += 1

    def _remove(self, key: Key, waiter: Waiter) -> None:
        """Forget a held request (once: woken requests are removed when woken, and again on return)."""
        groups = self._waiters.get(key)
        group = groups.get((waiter.kind, waiter.filter)) if groups is not None else None
        if group is None or group.pop(waiter, False) is False:
            return
        self.held[waiter.kind] -= 1
        if group:
            return
        assert groups is not None
        del groups[(waiter.kind, waiter.filter)]
        if groups:
            return
        del self._waiters[key]
        topic_groups = self._by_topic.get(key[0])
        if topic_groups is not None:
            topic_groups.discard(key[1])
            if not topic_groups:
                del self._by_topic[key[0]]

    def groups_waiting(self, topic: str) -> list[str]:
        return list(self._by_topic.get(topic, ()))

    def holding(self, key: Key) -> bool:
        """Whether any request of the key is held."""
        return key in self._waiters

    def arrived(self, key: Key, tags: Sequence[str | None], counts: Counter[str | None] | None = None) -> int:
        """New messages with these tags can be consumed by the key's group: wake who can be served.
        ``counts``: ``Counter(tags)`` when the caller has it (one arrival, several groups waiting)."""
        if key not in self._waiters:
            return 0
        if counts is None:
            counts = Counter(tags)
        return self._wake(key, lambda f: f.count(counts, len(tags)))  # each held filter counts from the tally

    def wake(self, key: Key, count: int) -> int:
        """``count`` messages became ready whatever their tags (redeliveries): wake up to that many Pops."""
        return self._wake(key, lambda _: count) if count > 0 else 0

    def _wake(self, key: Key, matching: Callable[[TagFilter], int]) -> int:
        """Wake one held request per new matching message, oldest first whatever its kind: a Pop consumes what
        woke it, a Notification's answer leads to one Pop. Waking every Notification for one message would make
        all but one of their Pops lose the race (RocketMQ wakes one too); a message nobody took is caught by the
        safety sweep. Not Pops first: a consumer whose receives hold Notifications (a quiet group's, adaptive
        mode) would get nothing for a whole long poll while another's held Pops took every message —
        tests/unit/broker/test_longpoll.py::test_arrival_wakes_one_request_per_message_oldest_first_whatever_its_kind.
        """
        groups = self._waiters.get(key)
        if not groups:
            return 0
        woken = 0
        empty: dict[Waiter, None] = {}
        for tag_filter in {f for _, f in groups}:
            budget = matching(tag_filter)
            pops = groups.get((Kind.POP, tag_filter), empty)  # emptied in place as they are woken
            notes = groups.get((Kind.NOTIFICATION, tag_filter), empty)
            while budget > 0 and (pops or notes):
                pop = next(iter(pops)) if pops else None
                note = next(iter(notes)) if notes else None
                waiter = pop if note is None or (pop is not None and pop.seq < note.seq) else note
                assert waiter is not None
                self._remove(key, waiter)
                if waiter.resolve(Outcome.SERVED):  # not one that timed out a moment ago
                    woken += 1
                    budget -= 1
        return woken

    def wake_ready(self, key: Key, ready_check: Callable[[int], Callable[[TagFilter], bool]]) -> None:
        """Wake every held request of the key whose own filter has something ready (the safety sweep).
        ``ready_check(n)``: a predicate for the n distinct filters held (set up once for them all)."""
        groups = self._waiters.get(key)
        if not groups:
            return
        ready = _ready_once(groups, ready_check)
        for (_, tag_filter), group in list(groups.items()):
            if ready(tag_filter):
                for waiter in list(group):
                    self._remove(key, waiter)
                    waiter.resolve(Outcome.SERVED)

    def wake_oldest_ready(self, key: Key, ready_check: Callable[[int], Callable[[TagFilter], bool]]) -> bool:
        """Wake the key's oldest held request whose own filter has something ready (a wake passed on); whether
        one was woken. ``ready_check`` as for `wake_ready`. A request whose caller was cancelled, still listed until
        its task runs, is passed over: the wake goes to the next one —
        tests/unit/broker/test_arrival.py::test_a_wake_passed_on_goes_past_a_request_cancelled_in_the_same_turn."""
        groups = self._waiters.get(key)
        if not groups:
            return False
        ready = _ready_once(groups, ready_check)
        oldest: Waiter | None = None
        for (_, tag_filter), group in groups.items():
            first = next((w for w in group if not w.future.done()), None)  # each group is in arrival order
            if first is not None and (oldest is None or first.seq < oldest.seq) and ready(tag_filter):
                oldest = first
        if oldest is None:
            return False
        self._remove(key, oldest)
        return oldest.resolve(Outcome.SERVED)

    def end(self, key: Key) -> int:
        """Answer the key's held requests now, empty (its group or topic was deleted); how many."""
        ended = 0
        for group in list(self._waiters.get(key, {}).values()):
            for waiter in list(group):
                self._remove(key, waiter)
                ended += waiter.resolve(Outcome.ENDED)
        return ended

    def end_topic(self, topic: str) -> int:
        """`end` for every group's held requests of the topic; how many."""
        return sum(self.end((topic, group)) for group in self.groups_waiting(topic))

    def close(self) -> None:
        """Answer every held request now (shutdown)."""
        self._closed = True
        for groups in list(self._waiters.values()):
            for group in list(groups.values()):
                for waiter in list(group):
                    waiter.resolve(Outcome.CLOSED)
