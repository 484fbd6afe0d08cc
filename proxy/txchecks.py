"""Transaction checks: brokers keep each half message's check state; a proxy with producers online asks the
brokers for the due checks of those producers' topics and hands each to one producer of the topic, on that
producer's Telemetry stream (a RecoverOrphanedTransactionCommand); the producer answers with EndTransaction.

Stateless across proxies: a broker hands a check to whichever proxy asks first and records it before answering,
so no other proxy gets it again within the check interval; a check lost with a stream or a proxy is handed out
again at the next interval (docs/BROKER.md, "Transactions"). A v2 producer's check group is its topic, as in
RocketMQ's proxy. Protocol-neutral: the v2 edge turns a check into its command (`to_command`) and owns the
streams' writers — tests/unit/proxy/test_txchecks.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.ports import BrokerClient
from proxy.routing import BrokerPool

log = logging.getLogger(__name__)
CHECK_POLL_S = 1.0  # a proxy with producers online asks every live broker this often (sooner when one is due)
IDLE_FLOOR_S = 0.1  # after a round that handed out no check, the least wait, whatever the brokers' next due time
MAX_CHECKS_PER_CALL = 64
TOPICS_PER_CALL = 512  # a broker takes up to 1,024 topics a call
OUTBOX_COMMANDS = 64  # most checks a producer's stream may have unanswered; past them a check goes to another or waits
FIRST_WINDOW = 4  # checks a producer may have unanswered before its answers tell how fast it answers
ANSWER_WAIT_S = 10.0  # the longest a check holds its place unanswered


class Outbox:
    """Commands for one producer's Telemetry stream, the topics (as stored) it publishes to, and the checks handed
    to it and not answered yet (transaction id -> when handed out, time.monotonic(), and how many were ahead of
    it; oldest first).

    A check holds a place from its hand-out until its producer answers it (EndTransaction through this proxy,
    `answered`), answers a check handed after it (a client answers its checks in turn: this one was skipped, as
    the official Node.js and Java clients send nothing for UNKNOWN), or ANSWER_WAIT_S passed (an answer through
    another proxy, a checker stuck); not until the stream took it: the stream's writes do not wait for the
    producer, so a producer answering slower than checks fall due would otherwise queue checks that the broker
    counts as asked and rolls back after its last one while they wait — tests/unit/proxy/test_txchecks.py::
    test_a_producer_answering_slower_than_checks_come_is_handed_no_more_than_it_has_room_for,
    ::test_a_check_skipped_frees_its_place_when_a_later_one_is_answered.

    At most `window` checks hold places at once, sized by the answers' times against the brokers' check interval
    (an answer after its place was freed counts too, up to twice the interval later): one more after an answer
    within a quarter of it; after one past half of it, no more than the producer answered in half an interval then
    (the checks ahead of that one and itself, in the time it took). A producer then gets no more checks than it
    answers within about half an interval, so it answers a last check before the broker rolls its transaction
    back — test_txchecks.py::test_a_slow_checker_gets_no_more_checks_than_it_answers_within_half_an_interval."""

    def __init__(self, namespace: str = "") -> None:
        self.namespace = namespace
        self.topics: frozenset[str] = frozenset()
        self.commands: asyncio.Queue[Any] = asyncio.Queue()
        self.unanswered: dict[str, tuple[float, int]] = {}  # holding a place: (when handed, how many were ahead)
        self._overdue: dict[str, tuple[float, int]] = {}  # past their place, kept to time a late answer
        self.window = FIRST_WINDOW
        self._woke = False  # the poller was woken for room since the last hand-out

    def room(self, interval_s: float = math.inf) -> int:
        """How many more checks this producer takes now."""
        now = time.monotonic()
        while self.unanswered and (first := next(iter(self.unanswered.items())))[1][0] <= now - ANSWER_WAIT_S:
            self._overdue[first[0]] = self.unanswered.pop(first[0])
        forgot_at = now - ANSWER_WAIT_S - (2 * interval_s if interval_s < math.inf else 0)
        while self._overdue and (first := next(iter(self._overdue.items())))[1][0] <= forgot_at:
            del self._overdue[first[0]]
        return max(0, self.window - max(len(self.unanswered), self.commands.qsize()))  # also a stream not read

    def hand(self, transaction_id: str, command: Any) -> None:
        """Queue a check's command for the stream; it holds a place until answered."""
        self.unanswered.pop(transaction_id, None)  # handed again: counts once, from now
        self._overdue.pop(transaction_id, None)
        self.unanswered[transaction_id] = (time.monotonic(), len(self.unanswered))
        self.commands.put_nowait(command)
        self._woke = False

    def answered(self, transaction_id: str, interval_s: float) -> bool:
        """The producer answered the check of `transaction_id` (or resolved it unasked): it and the checks handed
        before it no longer hold places, and its time sizes the window. True when the unanswered checks just came
        down to half the window: the poller should ask for more now, not at its next round."""
        entry = self.unanswered.pop(transaction_id, None)
        if entry is not None:
            while self.unanswered and (first := next(iter(self.unanswered.items())))[1][0] < entry[0]:
                self._overdue[first[0]] = self.unanswered.pop(first[0])  # skipped
        elif (entry := self._overdue.pop(transaction_id, None)) is None:
            return False
        handed, ahead = entry
        took_s = time.monotonic() - handed
        if took_s > interval_s / 2:  # it answered the `ahead` and this one in `took_s`: as many in half an interval
            self.window = max(1, min(self.window, int((ahead + 1) * interval_s / 2 / took_s)))
        elif took_s <= interval_s / 4:
            self.window = min(OUTBOX_COMMANDS, self.window + 1)
        if self._woke or len(self.unanswered) > self.window // 2:
            return False
        self._woke = True
        return True


class ProducerStreams:
    def __init__(self) -> None:
        self._by_topic: dict[str, list[Outbox]] = {}
        self._turn = 0
        self.changed = asyncio.Event()  # a topic gained its first producer here, or a producer room (`answered`)
        self.interval_s = math.inf  # the brokers' shortest check interval (CheckPoller; inf: none told it yet)

    def register(self, outbox: Outbox, topics: Iterable[str]) -> None:
        self.unregister(outbox)
        outbox.topics = frozenset(topics)
        for topic in outbox.topics:
            self._by_topic.setdefault(topic, []).append(outbox)
        if outbox.topics:
            self.changed.set()

    def unregister(self, outbox: Outbox) -> None:
        for topic in outbox.topics:
            streams = self._by_topic.get(topic, [])
            if outbox in streams:
                streams.remove(outbox)
            if not streams:
                self._by_topic.pop(topic, None)
        outbox.topics = frozenset()

    def topics(self) -> list[str]:
        return sorted(self._by_topic)

    def room(self, topic: str) -> int:
        """How many more checks the topic's producers take now."""
        return sum(outbox.room(self.interval_s) for outbox in self._by_topic.get(topic, []))

    def deliver(self, topic: str, transaction_id: str, command: Callable[[Outbox], Any]) -> bool:
        """Queue `command(outbox)`, the check of `transaction_id`, for one of the topic's producers (round robin);
        False when none has room."""
        streams = self._by_topic.get(topic, [])
        for i in range(len(streams)):
            outbox = streams[(self._turn + i) % len(streams)]
            if outbox.room(self.interval_s) > 0:
                self._turn += 1
                outbox.hand(transaction_id, command(outbox))
                return True
        return False

    def answered(self, topic: str, transaction_id: str) -> None:
        """A producer answered the check of `transaction_id` (or resolved it unasked): it no longer counts."""
        for outbox in self._by_topic.get(topic, []):
            if outbox.answered(transaction_id, self.interval_s):
                self.changed.set()


ToCommand = Callable[[bpb.TransactionCheck, Outbox], Any]


class CheckPoller:
    """Asks the live brokers for due checks while this proxy has producers online; started on the first one."""

    def __init__(
        self,
        pool: BrokerPool,
        streams: ProducerStreams,
        to_command: ToCommand,
        *,
        timeout_s: float,
    ) -> None:
        self.pool = pool
        self.streams = streams
        self.to_command = to_command
        self.timeout_s = timeout_s
        self.poll_s = CHECK_POLL_S
        self.handed = 0  # checks queued for a producer
        self._rounds = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop asking: the polling task is cancelled and has ended when this returns (a round under way ends
        with it; its checks the brokers recorded are handed out again at their next interval)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            self.streams.changed.clear()  # before the round: what changes during it wakes the wait below
            topics = self.streams.topics()
            wait_s = min(self.poll_s, self.streams.interval_s / 2)  # each broker told of its topics every half interval
            if topics:
                handed = self.handed
                try:
                    next_due_s = await self.poll_once(topics)
                except Exception:  # a bug must not end the checks for good: logged, tried again next round
                    log.exception("asking the brokers for transaction checks failed")
                    next_due_s = None
                if next_due_s is not None:
                    # A check due but not handed out (its transaction being ended, or another proxy's check of it
                    # being recorded) keeps the brokers' next due time in the past: after a round that handed out
                    # nothing, asked again a moment later, not at once —
                    # tests/unit/proxy/test_txchecks.py::test_a_due_check_not_handed_out_is_asked_for_a_moment_later.
                    floor_s = 0.0 if self.handed > handed else IDLE_FLOOR_S
                    wait_s = min(wait_s, max(floor_s, next_due_s))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.streams.changed.wait(), None if not topics else wait_s)

    async def poll_once(self, topics: list[str]) -> float | None:
        """One round over the live brokers (topics in chunks a broker takes); the seconds until the earliest next
        check they told of, each measured on its broker's clock (None: none pending) —
        tests/unit/proxy/test_txchecks.py::test_the_next_check_is_awaited_on_the_brokers_clock_whatever_the_proxys_says."""
        next_due: float | None = None
        live = self.pool.live()
        self._rounds += 1
        turn = self._rounds % len(live) if live else 0  # the broker asked first (taking the room) goes round
        for client in live[turn:] + live[:turn]:
            for start in range(0, len(topics), TOPICS_PER_CALL):
                try:
                    due = await self._ask(client, topics[start : start + TOPICS_PER_CALL])
                except Exception as exc:  # one broker's failure ends its round only: the others are still asked,
                    # and it is logged once a round — test_txchecks.py::
                    # test_one_brokers_failure_does_not_keep_the_poller_from_asking_the_others
                    log.warning("asking broker %s for transaction checks failed: %r", client.name, exc)
                    break
                if due is not None:
                    next_due = due if next_due is None else min(next_due, due)
        return next_due

    async def _ask(self, client: BrokerClient, topics: list[str]) -> float | None:
        # A broker records each check it hands out (its count and next time) and a check no outbox takes is
        # dropped here, so no more are asked for than every asked topic's producers take: a check of any topic
        # then finds room, however the answer mixes topics. A topic with no room takes no check until its
        # producers answer, but is still named (`asked_topics`): its half messages wait for their checks instead
        # of rolling back unchecked, at every broker whichever took the room — tests/unit/proxy/test_txchecks.py::
        # test_the_poller_asks_for_no_more_checks_than_its_producers_outboxes_take,
        # ::test_every_broker_is_told_of_the_topics_asked_for_when_the_first_takes_the_room.
        rooms = {topic: room for topic in topics if (room := self.streams.room(topic)) > 0}
        asked = [topic for topic in topics if topic not in rooms]
        most = min(MAX_CHECKS_PER_CALL, *rooms.values()) if rooms else 0
        request = bpb.TransactionChecksRequest(topics=list(rooms), max_checks=most, asked_topics=asked)
        try:
            response = await client.transaction_checks(request, timeout_s=self.timeout_s)
        except errors.DomainError as exc:
            log.debug("transaction checks of broker %s failed: %s", client.name, exc)
            return None
        if response.check_interval_ms > 0:  # 0 from a broker older than the field: the windows as they are
            self.streams.interval_s = min(self.streams.interval_s, response.check_interval_ms / 1000)
        if not rooms:
            return None  # no check asked for: its next due time is no reason to ask sooner
        for check in response.checks:
            topic = check.message.message.topic
            if self.streams.deliver(topic, check.transaction_id, functools.partial(self.to_command, check)):
                self.handed += 1
        if not response.next_due_ms:
            return None
        now_ms = response.now_ms or time.time() * 1000  # a broker older than `now_ms`: this proxy's clock
        return (response.next_due_ms - now_ms) / 1000
