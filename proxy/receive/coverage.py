"""Where a proxy holds each group's long polls, and the watches that cover the brokers holding none. Sans-IO:
events in, commands out; no asyncio, no clock (times are plain float seconds on the driver's clock).

Every held Pop of a (topic, group, filter) is counted at its broker until its receive ends, oldest first; coupled
long polling sends the next one where the group holds the fewest with its filter. Covered (the adaptive mode, whose
promise is no false empty), a group's Pops also cover every live broker: where none of them is held while some are
held elsewhere, a Notification watches for the group, and when it answers ``has_message`` the oldest Pop still
waiting at the broker holding the most moves there (`Move`: its receive makes it again at that broker) —
tests/unit/proxy/receive/test_coupled.py::test_covered_long_polls_move_to_a_broker_where_a_message_has_no_taker.
A ``has_message`` no Pop can move to is handed back (`PassOn`), so that the broker wakes another request it
holds. A watch ends once a Pop of the group is held at its broker, or none is held anywhere.

All of this is per filter: a Pop takes only what its filter accepts, so a broker holding Pops of the group with
another filter is watched all the same, each watch with its own filter, and a ``has_message`` moves only a Pop
with the watch's filter (consumers of a group with different filters: a subscription being changed) —
tests/unit/proxy/receive/test_coverage.py::test_a_groups_pops_cover_the_brokers_for_their_own_filter_only.

The driver (`proxy.receive.coupled.LongPollStrategy`) executes the commands and reports back: `watched` when a
Notification ends, `came_up` when a broker that was down is up, `cover` when a `CoverLater` is due.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

WATCH_S = 30.0  # a watch's hold (the longest long poll); made again while still needed
WATCH_MIN_S = 1.0  # a watch answered empty sooner was not held (a closing broker): made again only after
WATCH_RETRY_S = 1.0  # this long, as after a watch refused (polling_full) or failed while the broker looks up
# A broker whose last Pop of the group just ended is watched this much later: the consumer's next Pop usually
# lands there first, and a watch sent at once would mostly be cancelled right after —
# tests/unit/proxy/receive/test_coverage.py::test_a_broker_whose_last_pop_ended_is_watched_after_a_delay
COVER_DELAY_S = 0.02

Key = tuple[str, str, str]  # (topic, group, filter)


class Pending(Protocol):
    """A held Pop's call, as far as coverage needs it."""

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...


class Held:
    """A Pop held for a receive; `moved_to` once a `Move` moved it (its call cancelled, to be made there)."""

    __slots__ = ("call", "moved_to")

    def __init__(self, call: Pending) -> None:
        self.call = call
        self.moved_to: str | None = None


class Answer(Enum):
    """How a watch's Notification ended."""

    HAS_MESSAGE = "has_message"
    EMPTY = "empty"  # nothing came while the broker held it (or it answered at once: see WATCH_MIN_S)
    FULL = "full"  # refused: the broker holds too many requests
    FAILED = "failed"  # unreachable, timed out (a restart)
    NO_TOPIC = "no_topic"  # the broker has no such topic (--no-auto-create): nothing to watch for there
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True, eq=False)
class Watch:
    """Send `broker` a Notification for the group with its filter, held WATCH_S; report `watched(this, ...)`.
    Compared by identity: a later watch of the same broker is another one."""

    key: Key
    broker: str
    started: float

    @property
    def filter(self) -> str:
        return self.key[2]


@dataclass(frozen=True, slots=True)
class Unwatch:
    """Cancel `watch`'s Notification: a Pop of the group is held at its broker now, or none is held anywhere."""

    watch: Watch


@dataclass(frozen=True, slots=True)
class AwaitUp:
    """Report `came_up(key, broker)` once the broker's health checks see it up."""

    key: Key
    broker: str


@dataclass(frozen=True, slots=True)
class Unawait:
    """Stop waiting for `broker` to be up for the group: its last Pop with the filter ended, or it is seen up."""

    key: Key
    broker: str


@dataclass(frozen=True, slots=True)
class Move:
    """Cancel `entry`'s Pop: its receive makes it again at `entry.moved_to` (count it as moved for the group)."""

    key: Key
    entry: Held


@dataclass(frozen=True, slots=True)
class PassOn:
    """`watch` answered has_message and no Pop moves there: hand the answer back, so that its broker passes the
    wake on to another request it holds."""

    watch: Watch


@dataclass(frozen=True, slots=True)
class CoverLater:
    """Report `cover(key)` after `delay_s`."""

    key: Key
    delay_s: float


Command = Watch | Unwatch | AwaitUp | Unawait | Move | PassOn | CoverLater


class Coverage:
    """The held Pops of each (topic, group, filter) per broker and, with `cover`, the watches of the brokers
    holding none.

    brokers: the pool's brokers in order, each as (name, whether its health checks see it up), read when a group
    is covered.
    """

    def __init__(self, brokers: Callable[[], Iterable[tuple[str, bool]]], *, cover: bool) -> None:
        self._brokers = brokers
        self._cover = cover
        # (topic, group, filter) -> broker -> Pops of the group for the topic with the filter held there now,
        # oldest first
        self._held: dict[Key, dict[str, dict[Held, None]]] = {}
        # (topic, group, filter) -> broker -> the watch there (`cover`)
        self._watches: dict[Key, dict[str, Watch]] = {}
        # (topic, group, filter) -> the down brokers waited for (`AwaitUp`) while the group holds Pops with it
        self._awaiting: dict[Key, set[str]] = {}

    def held(self, key: Key) -> Mapping[str, Mapping[Held, None]]:
        """The group's held Pops with the filter by broker (brokers holding none are absent)."""
        return self._held.get(key, {})

    def watching(self, watch: Watch) -> bool:
        """Whether `watch` is still one of the group's watches (not ended by `cover`)."""
        watches = self._watches.get(watch.key)
        return watches is not None and watches.get(watch.broker) is watch

    # -- events ----------------------------------------------------------------

    def track(self, key: Key, broker: str, call: Pending, *, now: float) -> tuple[Held, list[Command]]:
        """A Pop of the group with the filter is held at `broker` until `untrack`; the first there ends that
        broker's watch (or, the first anywhere, watches the others)."""
        entry = Held(call)
        at = self._held.setdefault(key, {}).setdefault(broker, {})
        at[entry] = None
        if self._cover and len(at) == 1:
            return entry, self.cover(key, now=now)
        return entry, []

    def untrack(self, key: Key, broker: str, entry: object) -> list[Command]:
        """The Pop's receive ended (answered, moved, cancelled). An entry not tracked is ignored."""
        held = self._held.get(key)
        at = held.get(broker) if held is not None else None
        if held is None or at is None or not isinstance(entry, Held) or at.pop(entry, False) is False:
            return []
        if at:
            return []
        del held[broker]
        if not held:
            del self._held[key]
        return [CoverLater(key, COVER_DELAY_S)] if self._cover else []

    def cover(self, key: Key, *, now: float) -> list[Command]:
        """Watch each live broker where none of the group's Pops is held while some are held elsewhere (a down
        one once it is up); end the watches no longer needed."""
        commands: list[Command] = []
        held = self._held.get(key)
        watches = self._watches.get(key, {})
        for broker in list(watches):
            if not held or held.get(broker):
                commands.append(Unwatch(watches.pop(broker)))
        if not held:  # no wait outlives the filter's last Pop — test_coverage.py::
            # test_a_down_broker_is_no_longer_awaited_for_a_filter_whose_last_pop_ended
            commands.extend(Unawait(key, name) for name in self._awaiting.pop(key, ()))
        else:
            awaiting = self._awaiting.setdefault(key, set())
            for name, healthy in self._brokers():
                if name in held or name in watches:
                    continue
                if not healthy:  # watched once its health checks see it up (a restart)
                    if name not in awaiting:
                        awaiting.add(name)
                        commands.append(AwaitUp(key, name))
                    continue
                # Seen up, by whatever path (its client replaced: the wait may never answer): awaited again the
                # next time it is down — test_coverage.py::
                # test_a_down_broker_seen_up_without_its_await_answering_is_awaited_again_when_it_goes_down_again
                if name in awaiting:
                    awaiting.discard(name)
                    commands.append(Unawait(key, name))
                watch = Watch(key, name, now)
                watches[name] = watch
                commands.append(watch)
            if not awaiting:
                del self._awaiting[key]
        if watches:
            self._watches[key] = watches
        else:
            self._watches.pop(key, None)
        return commands

    def watched(self, watch: Watch, answer: Answer, *, now: float) -> list[Command]:
        """`watch`'s Notification ended with `answer`. One `cover` ended first is ignored."""
        if not self.watching(watch):
            return []
        watches = self._watches[watch.key]
        del watches[watch.broker]
        if not watches:
            del self._watches[watch.key]
        if answer in (Answer.CANCELLED, Answer.NO_TOPIC):  # a missing topic: a restart does not change that
            return []
        if answer is Answer.HAS_MESSAGE:
            move = self._move(watch.key, watch.broker)
            return [move] if move is not None else [PassOn(watch)]
        if answer in (Answer.FAILED, Answer.FULL) or now - watch.started < WATCH_MIN_S:
            # Failed (a restart: once up again, `cover` hears of it), refused, or not held: watched again a
            # moment later, so that a restarted broker's messages do not wait for the end of every long poll —
            # test_coverage.py::test_a_failed_or_refused_watch_is_made_again_after_a_pause, and
            # tests/integration/proxy/test_broker_failure.py::
            # test_a_broker_restarted_while_covered_long_polls_wait_is_watched_again
            return [CoverLater(watch.key, WATCH_RETRY_S)]
        return self.cover(watch.key, now=now)  # held to its end: watch on

    def came_up(self, key: Key, broker: str, *, now: float) -> list[Command]:
        """An `AwaitUp` broker's health checks see it up, or its client was replaced (`cover` looks again). One no
        longer awaited (`Unawait` given) is ignored."""
        awaiting = self._awaiting.get(key)
        if awaiting is None or broker not in awaiting:
            return []
        awaiting.discard(broker)
        if not awaiting:
            del self._awaiting[key]
        return self.cover(key, now=now)

    def broker_up(self, broker: str, *, now: float) -> list[Command]:
        """`broker` came up (discovery added it, or it is back): every group holding Pops covers it too when none is
        held there — test_coverage.py::test_a_broker_added_while_pops_are_held_is_watched_at_once. (One the group
        awaited is also told by its `AwaitUp`; `cover` does not watch a broker twice.)"""
        if not self._cover:
            return []
        commands: list[Command] = []
        for key in list(self._held):
            commands += self.cover(key, now=now)
        return commands

    # -- helpers ---------------------------------------------------------------

    def _move(self, key: Key, broker: str) -> Move | None:
        """Move the oldest of the group's Pops still waiting where it holds the most to `broker`, if any."""
        held = self._held.get(key)
        if not held or held.get(broker):
            return None
        for source in sorted(held, key=lambda name: len(held[name]), reverse=True):
            # the oldest still waiting (one answered already, its broker having had something, stays)
            entry = next((e for e in held[source] if not e.call.done() and e.moved_to is None), None)
            if entry is not None:
                entry.moved_to = broker
                return Move(key, entry)
        return None
