"""Pop with notify as a sans-IO state machine: events in, commands out. No asyncio, no clocks.

One `NotifyRun` serves one client ReceiveMessage (docs/ARCHITECTURE.md §3, way 2):

1. a first Pop with poll 0 to one broker (backlog is served at once);
2. if it is empty and poll time remains: a Notification to every live broker at once,
   held by each broker until the poll ends — with a single broker, a Pop held by it
   instead (that broker is the only source, so a held Pop cannot miss a message elsewhere,
   and it saves the Pop round trip after each Notification; a broker added meanwhile ends that
   Pop for Notifications to both, once it is up); if no poll time remains
   (a receive that does not wait): a Notification with poll 0 to every other live broker,
   the last look, so that a backlog on another broker is not answered empty;
3. every ``has_message`` goes into a small per-request queue; one consume step at a time
   takes the next broker from it and Pops it with poll 0;
4. messages: answer, cancel every other outstanding Notification, and hand back every
   ``has_message`` not followed by a Pop (the broker passes its wake on to another held
   request: one arrival wakes one, so another consumer's would otherwise wait for it);
   empty (another consumer won the race): notify that broker again and continue;
   — unless the caller says the group is busy (the adaptive mode): then many receives of
   the group wait at every broker already, each arrival would wake this run for a race it
   mostly loses, so it hands off to coupled long polling on that broker for the time left;
5. at the end of the poll time: answer empty (a Pop still in flight is waited for, so
   popped messages are not dropped) and cancel the rest; at the hard deadline, or when
   the client goes away or the proxy closes: answer and cancel everything.

A broker down when the receive starts, or whose request fails during it, is watched again
once it is back (a restart): a message stored there meanwhile is not answered empty. One that
only timed out (slow under a burst, not down) is not the run's error while it is to be looked at again: it is
waited for, and the run is at worst empty at the poll's end (test_notify.py::
test_a_lone_broker_that_times_out_a_pop_is_looked_at_again_and_the_long_poll_is_never_its_error); once its rewatches
are used up it is (::test_a_lone_broker_timing_out_past_its_rewatches_is_the_runs_error_not_an_idle_wait).

The driver (`proxy.receive.notify_driver`) executes commands and feeds back events with the
current time; times are plain float seconds on the driver's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from popgate_pb import broker_pb2 as bpb

from popgate_contract.errors import BrokerTimeout, BrokerUnavailable, DomainError, TooManyRequests, TopicNotFound
from proxy.receive.notify_commands import AwaitUp, Cancel, Command, Finish, Notify, PassOn, Pop, Rewatch


class Phase(Enum):
    FIRST_POP = "first_pop"
    NOTIFYING = "notifying"
    LONGPOLL = "longpoll"  # handed off: one Pop held by one broker until the poll ends
    DRAINING = "draining"  # the poll time is over; a Pop is still in flight
    DONE = "done"


@dataclass(slots=True)
class RunStats:
    """What the run did, for metrics."""

    first_pop_hit: bool = False
    notifications: int = 0
    notified_has_message: int = 0
    notified_empty: int = 0
    notified_full: int = 0
    pops: int = 0
    lost_races: int = 0
    handoff: bool = False
    held_pop: bool = False  # one live broker: a held Pop instead of a Notification
    waited: bool = False  # a broker was asked to hold this receive (is_long_polling): not only the poll-0 last look


@dataclass(slots=True)
class NotifyRun:
    """One receive served by pop with notify.

    brokers: names of the live brokers, the first one gets the first Pop.
    down: names of the brokers down when the receive starts: notified once their health checks see them up.
    poll_end: when the client's long-polling time is over (answer empty then).
    min_notify_s: below this much poll time left, a broker is not notified again.
    min_hold_s: a Notification answered empty sooner than this was not held: saying `closing` (the broker is
        stopping), or a second time in this run, that broker is not notified again in it, so it cannot make the
        run spin; else (its hold ended by a deletion or a purge) it is notified once more, and a deleted topic's
        TOPIC_NOT_FOUND comes (test_notify.py::
        test_notifications_a_deletion_ends_at_once_are_made_again_so_the_receive_is_told_topic_not_found).
    max_lost_per_broker: after this many lost races at one broker it is no longer watched in this
        run (a `has_message` that no Pop can serve must not make it spin either).
    covered: the adaptive mode's covered long polls count the run's held Pops and watch the brokers they leave (a Pop
        held at the only broker is then left to them when a broker is added).
    rewatch_s, max_rewatches: a broker whose request failed (unreachable, timed out) is looked at again
        this long after, up to this many times per run while its health checks still see it up; once they
        see it down it is notified again when they see it up (`AwaitUp`): a broker restarted during a long
        poll is watched for the rest of it (no false empty for its messages).
    """

    brokers: Sequence[str]
    poll_end: float
    down: Sequence[str] = ()
    min_notify_s: float = 0.005
    min_hold_s: float = 0.05
    max_lost_per_broker: int = 32
    rewatch_s: float = 1.0
    max_rewatches: int = 5
    covered: bool = False
    phase: Phase = Phase.FIRST_POP
    stats: RunStats = field(default_factory=RunStats)
    notifying: set[str] = field(default_factory=set)
    ready: list[str] = field(default_factory=list)  # at most one per broker: a list is small, a deque is not
    popping: str | None = None
    # failed, full, dropped, early: usually empty all run long; frozen, so that every run shares the class's empty
    # defaults instead of making four sets
    failed: frozenset[str] = frozenset()
    full: frozenset[str] = frozenset()
    dropped: frozenset[str] = frozenset()  # no longer watched in this run
    early: frozenset[str] = frozenset()  # notified again after an empty answer sooner than min_hold_s
    awaiting: frozenset[str] = frozenset()  # failed brokers with a Rewatch or an AwaitUp given and not yet come
    slow: frozenset[str] = frozenset()  # failed brokers whose last failure was a timeout (outcome unknown, not down)
    sent_at: dict[str, float] = field(default_factory=dict)  # when each broker was last notified
    lost: dict[str, int] = field(default_factory=dict)  # lost races per broker
    rewatches: dict[str, int] = field(default_factory=dict)  # Rewatch commands given per broker
    last_look: bool = False  # no poll time was left after the first Pop: every broker asked once, poll 0
    last_error: DomainError | None = None
    refused: dict[str, TooManyRequests] = field(default_factory=dict)  # brokers refusing the group (--max-groups)

    # -- events ----------------------------------------------------------------

    def start(self) -> list[Command]:
        if not self.brokers:
            return self._finish([], "error", BrokerUnavailable("no broker is live"))
        self.popping = self.brokers[0]
        self.stats.pops += 1
        if self.down:  # else the shared empty default stays
            self.failed |= frozenset(self.down)
            self.awaiting |= frozenset(self.down)
        return [Pop(self.brokers[0]), *(AwaitUp(broker) for broker in self.down)]

    def popped(
        self,
        broker: str,
        messages: Sequence[bpb.PoppedMessage],
        *,
        polling_full: bool,
        now: float,
        busy: bool = False,
        closing: bool = False,
    ) -> list[Command]:
        """A Pop answered. `busy`: the group has many receives waiting (hand off after a lost race). `closing`: the
        broker is stopping (it answers what it holds at once)."""
        if self.phase is Phase.DONE or broker != self.popping:
            return []
        self.popping = None
        self.refused.pop(broker, None)
        if messages:
            if self.stats.pops == 1 and not self.stats.notifications:
                self.stats.first_pop_hit = True  # also when the poll time ended while it was in flight
            return self._finish(messages, "messages")
        if polling_full:
            self.full |= {broker}
        if self.phase is Phase.FIRST_POP:
            return self._notify_all(now)
        if self.phase is Phase.LONGPOLL and polling_full:  # not held: an empty answer would make the client spin
            full = TooManyRequests(f"broker {broker} holds too many long polls; retry shortly")
            return self._finish([], "error", full)
        if self.phase is Phase.LONGPOLL and closing and self.stats.handoff and self.poll_end - now >= self.min_notify_s:
            return self._stopping(broker, now)
        if self.phase in (Phase.DRAINING, Phase.LONGPOLL):
            return self._finish([], "empty")
        # Lost the race for what the broker announced: watch that broker again (or hand off when busy).
        self.stats.lost_races += 1
        if busy and self.poll_end - now >= self.min_notify_s:
            return self._handoff(broker, now)
        self.lost[broker] = self.lost.get(broker, 0) + 1
        if self.lost[broker] >= self.max_lost_per_broker:
            self.dropped |= {broker}
            return [*self._next_pop(), *self._maybe_exhausted(now)]
        return [*self._renotify(broker, now), *self._next_pop()] or self._maybe_exhausted(now)  # no time left: done

    def notified(
        self, broker: str, *, has_message: bool, polling_full: bool, now: float, closing: bool = False
    ) -> list[Command]:
        """A Notification answered. `closing`: the broker is stopping (it answers what it holds at once)."""
        if self.phase is Phase.DONE or broker not in self.notifying:
            return [PassOn(broker)] if has_message else []  # came as the run ended or stopped watching it
        self.notifying.discard(broker)
        self.refused.pop(broker, None)
        if has_message:
            self.stats.notified_has_message += 1
            if broker not in self.ready and broker != self.popping:
                self.ready.append(broker)
            return self._next_pop()
        if polling_full:
            self.stats.notified_full += 1
            self.full |= {broker}
            return self._maybe_exhausted(now)
        self.stats.notified_empty += 1
        if now - self.sent_at.get(broker, now) < self.min_hold_s:
            if closing or broker in self.early:
                self.dropped |= {broker}  # answered without holding again or stopping: do not spin on it
                return self._maybe_exhausted(now)
            self.early |= {broker}
        # Its hold ended without a message (its clock ran ahead of ours, or a deletion or purge ended it): watch on.
        cmds = self._renotify(broker, now)
        return cmds or self._maybe_exhausted(now)

    def failed_call(self, broker: str, error: DomainError, *, now: float) -> list[Command]:
        """A Pop or Notification to `broker` failed with `error`."""
        if self.phase is Phase.DONE:
            return []
        was_pop = broker == self.popping
        if not was_pop and broker not in self.notifying:
            return []
        self.notifying.discard(broker)
        if was_pop:
            self.popping = None
        if not error.retriable and not isinstance(error, TopicNotFound):
            return self._finish([], "error", error)  # the request itself is bad: every broker would say so
        # A broker without the topic (created on some brokers only, auto-create off) has nothing for this
        # receive; the others may. TOPIC_NOT_FOUND only when no broker has it.
        self.last_error = error
        if isinstance(error, TooManyRequests):
            self.refused[broker] = error  # what it holds for the group is out of reach: said if nothing else comes
        self.failed |= {broker}
        self.slow = self.slow | {broker} if isinstance(error, BrokerTimeout) else self.slow - {broker}
        if self.phase is Phase.LONGPOLL:  # the held Pop failed: its (retriable) error, so the client backs off
            return self._finish([], "error", error)
        if self.phase is Phase.DRAINING:
            return self._finish([], "empty")
        # A broker without the topic is not a failure a restart undoes: not looked at again.
        rewatch = [] if isinstance(error, TopicNotFound) else self._rewatch_later(broker, now)
        if self.phase is Phase.FIRST_POP:
            cmds = self._notify_all(now)
        else:
            cmds = [*self._next_pop(), *self._maybe_exhausted(now)]
        return cmds if self.done else [*cmds, *rewatch]

    def rewatch(self, broker: str, *, healthy: bool, now: float) -> list[Command]:
        """The time a `Rewatch` named has come, or an `AwaitUp` broker is up: notify `broker` again if healthy."""
        self.awaiting -= {broker}
        if self._held_alone and broker in self.failed:  # a broker added while the lone broker holds the Pop
            return self._watch_added(broker, healthy=healthy, now=now)
        if self.phase not in (Phase.FIRST_POP, Phase.NOTIFYING) or broker not in self.failed or broker in self.dropped:
            return []
        if not healthy:
            self.awaiting |= {broker}
            return [AwaitUp(broker)]  # down: notified again when the health checks see it up
        self.failed -= {broker}
        if self.phase is Phase.FIRST_POP:
            return []  # notified with the others if the first Pop finds nothing
        return self._renotify(broker, now) or self._maybe_exhausted(now)

    def added(self, broker: str, *, healthy: bool, now: float) -> list[Command]:
        """A broker the pool did not have when the run started (discovery added it) is watched as one down then
        that came up: notified for the poll time left, or with the others if the first Pop finds nothing (once its
        health checks see it up) — tests/unit/proxy/receive/test_brokers_added.py::
        test_a_broker_added_while_the_run_notifies_is_notified_for_the_poll_time_left. One the run knows (a
        restart, a client replaced) is left to `rewatch`."""
        if broker in self.brokers or broker in self.down:
            return []
        if not (self._held_alone or self.phase in (Phase.FIRST_POP, Phase.NOTIFYING)):
            return []
        self.down = (*self.down, broker)
        self.failed |= {broker}
        return self.rewatch(broker, healthy=healthy, now=now)

    @property
    def _held_alone(self) -> bool:
        """The Pop held at the only broker the run knew, unless `covered` watches the other brokers for it."""
        return self.phase is Phase.LONGPOLL and self.stats.held_pop and not self.stats.handoff and not self.covered

    def _watch_added(self, broker: str, *, healthy: bool, now: float) -> list[Command]:
        """A broker added while the run's Pop is held at the only broker it knew: once the added one is up, the held
        Pop no longer watches every broker, so it is cancelled (an answer already on its way is handed back) and
        every broker is notified for the poll time left — test_brokers_added.py::
        test_a_pop_held_at_the_only_broker_gives_way_to_notifications_once_an_added_broker_is_up."""
        if not healthy:
            self.awaiting |= {broker}
            return [AwaitUp(broker)]
        self.failed -= {broker}
        if self.poll_end - now < self.min_notify_s or self.popping is None:
            return []
        held, self.popping = self.popping, None
        return [Cancel(held), *self._notify_all(now)]

    def _rewatch_later(self, broker: str, now: float) -> list[Command]:
        """A Rewatch of `broker`, if it has rewatches left and the poll time to use one; the run then waits for it
        before answering empty (test_notify.py::test_a_run_waits_for_a_failed_broker_to_be_looked_at_again)."""
        count = self.rewatches.get(broker, 0)
        if count >= self.max_rewatches or self.poll_end - now <= self.rewatch_s:
            return []
        self.rewatches[broker] = count + 1
        self.awaiting |= {broker}
        return [Rewatch(broker, now + self.rewatch_s)]

    def poll_over(self) -> list[Command]:
        """The client's long-polling time is over: answer empty, unless a Pop is in flight.

        Not during the first Pop or the last look: a receive that does not wait still asks every broker once."""
        if self.phase in (Phase.DONE, Phase.FIRST_POP) or self.last_look:
            return []
        self.stats.notified_empty += len(self.notifying)  # held until the poll ended, nothing came
        if self.popping is not None:
            self.phase = Phase.DRAINING
            cancels: list[Command] = [Cancel(b) for b in sorted(self.notifying)]
            self.notifying.clear()
            return [*cancels, *self._pass_on_ready()]
        return self._finish([], "empty")

    def deadline(self) -> list[Command]:
        """The hard deadline: answer empty now, whatever is in flight."""
        if self.phase is Phase.DONE:
            return []
        return self._finish([], "empty")

    def closing(self) -> list[Command]:
        """The proxy is shutting down (or the client went away): answer at once."""
        if self.phase is Phase.DONE:
            return []
        return self._finish([], "closing")

    # -- helpers ---------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def outstanding(self) -> list[str]:
        """Brokers with a request in flight (sorted; the popping broker included)."""
        names = set(self.notifying)
        if self.popping is not None:
            names.add(self.popping)
        return sorted(names)

    def _poll_ms(self, now: float) -> int:
        return int((self.poll_end - now) * 1000)

    def _notify_all(self, now: float) -> list[Command]:
        self.phase = Phase.NOTIFYING
        poll_ms = self._poll_ms(now)
        watched = [b for b in (*self.brokers, *self.down) if b not in self.failed and b not in self.full]
        watched = [b for b in watched if b not in self.dropped] if self.dropped else watched
        if self.poll_end - now < self.min_notify_s:
            # No time to wait: the last look. A Notification with poll 0 answers at once whether the broker
            # has a message for the group (empty ones end as brokers answering without holding: dropped).
            self.last_look, poll_ms = True, 0
            watched = [b for b in watched if b != self.brokers[0]]  # the first Pop just found it empty
        elif len(watched) == 1 and len(self.brokers) + len(self.down) == 1:
            self.phase = Phase.LONGPOLL
            self.popping = watched[0]
            self.stats.pops += 1
            self.stats.held_pop = self.stats.waited = True
            return [Pop(watched[0], poll_ms)]
        cmds: list[Command] = []
        for broker in watched:
            self.notifying.add(broker)
            self.sent_at[broker] = now
            self.stats.notifications += 1
            self.stats.waited = self.stats.waited or not self.last_look
            cmds.append(Notify(broker, poll_ms))
        return cmds or self._maybe_exhausted(now)

    def _handoff(self, broker: str, now: float) -> list[Command]:
        self.phase = Phase.LONGPOLL
        cancels: list[Command] = [Cancel(b) for b in sorted(self.notifying)]
        self.notifying.clear()
        cancels += self._pass_on_ready()
        self.popping = broker
        self.stats.pops += 1
        self.stats.handoff = self.stats.waited = True
        return [*cancels, Pop(broker, self._poll_ms(now))]

    def _stopping(self, broker: str, now: float) -> list[Command]:
        """The handed-off Pop's broker is stopping with poll time left: the other brokers are watched for the time
        left and it is looked at again later (a restart), as a long poll goes on at the next broker —
        test_notify_handoff.py::test_a_handed_off_pop_whose_broker_is_stopping_watches_the_other_brokers_for_the_time_left."""
        self.failed |= {broker}
        cmds = self._notify_all(now)
        return cmds if self.done else [*cmds, *self._rewatch_later(broker, now)]

    def moved(self, broker: str, to: str, *, now: float) -> list[Command]:
        """The held Pop at `broker` (a hand-off) was cancelled to be made at `to`, where a message came that
        nobody of the group waited for (the adaptive mode's covered long polls move the group's held Pops, a
        handed-off run's among them): Pop there for the poll time left — none once the poll is over and the run
        drains its Pop, whose answer then ends it (test_notify_handoff.py::
        test_a_handed_off_pop_moved_after_the_poll_ended_pops_there_at_once_and_ends_the_run)."""
        if self.phase not in (Phase.LONGPOLL, Phase.DRAINING) or broker != self.popping:
            return []
        self.popping = to
        self.stats.pops += 1
        return [Pop(to, max(0, self._poll_ms(now)))]

    def _renotify(self, broker: str, now: float) -> list[Command]:
        if self.poll_end - now < self.min_notify_s or broker in self.notifying:
            return []
        self.notifying.add(broker)
        self.sent_at[broker] = now
        self.stats.notifications += 1
        self.stats.waited = True
        return [Notify(broker, self._poll_ms(now))]

    def _next_pop(self) -> list[Command]:
        """One consume step at a time: Pop the next broker that announced a message."""
        if self.popping is not None or not self.ready or self.phase is not Phase.NOTIFYING:
            return []
        broker = self.ready.pop(0)
        self.popping = broker
        self.stats.pops += 1
        return [Pop(broker)]

    def _pass_on_ready(self) -> list[Command]:
        """The brokers that announced a message this run will not Pop now: their wakes go to other requests."""
        commands: list[Command] = [PassOn(b) for b in self.ready]
        self.ready.clear()
        return commands

    def _maybe_exhausted(self, now: float) -> list[Command]:
        """Nothing outstanding and nothing to pop: no broker can serve this receive any more."""
        if self.phase is Phase.DONE or self.notifying or self.popping is not None or self.ready:
            return []
        if self.full and not (set(self.brokers) - self.full - self.failed):
            return self._finish([], "error", TooManyRequests("every broker holds too many long polls; retry shortly"))
        if self.failed and not (set(self.brokers) - self.failed):
            slow = self.slow & self.failed
            left_s = self.poll_end - now
            if slow and self.phase is Phase.NOTIFYING and left_s >= self.min_notify_s:
                if slow & self.awaiting or left_s <= self.rewatch_s:
                    return []  # one only timed out: looked at again (a Rewatch), else empty at the poll's end
            return self._finish([], "error", self.last_error or BrokerUnavailable("no broker is reachable"))
        if self.awaiting - self.dropped and self.phase is Phase.NOTIFYING and self.poll_end - now >= self.min_notify_s:
            return []  # a failed broker is to be looked at again: wait for it, or for the poll's end
        return self._finish([], "empty")

    def _finish(
        self, messages: Sequence[bpb.PoppedMessage], outcome: str, error: DomainError | None = None
    ) -> list[Command]:
        if outcome == "empty" and self.refused:
            # Empty here while a broker refuses the group: its messages are out of reach, and the client is
            # told so (the longpoll mode passes the refusal on too) rather than "no new message" for good.
            outcome, error = "error", next(iter(self.refused.values()))
        cancels: list[Command] = [Cancel(b) for b in self.outstanding]
        self.notifying.clear()
        cancels += self._pass_on_ready()
        self.popping = None
        self.phase = Phase.DONE
        return [*cancels, Finish(messages, outcome, error)]
