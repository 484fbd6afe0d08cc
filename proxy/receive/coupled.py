"""Coupled long polling (docs/ARCHITECTURE.md §3, `--receive-mode longpoll`): one Pop to one live broker, held
for the client's long-polling time; the broker is the one where this proxy holds the fewest of the group's Pops
with the request's filter.

Covered (the adaptive mode's long polls, `LongPollStrategy(cover=True)`): where none of a group's Pops is held, a
Notification watches for the group, and when a message comes there one of its Pops held elsewhere moves there.
What is held where and what is watched is decided by the pure `proxy.receive.coverage.Coverage`; this module
makes the broker calls it asks for."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from typing import Any

from popgate_pb import broker_pb2 as bpb

from popgate_contract.errors import (
    BrokerTimeout,
    BrokerUnavailable,
    DomainError,
    TooManyRequests,
    TopicNotFound,
)
from proxy.ports import BrokerClient, HeldPop, Metrics, NoMetrics
from proxy.receive.coverage import (
    WATCH_S,
    Answer,
    AwaitUp,
    Command,
    Coverage,
    CoverLater,
    Held,
    Key,
    Move,
    PassOn,
    Unawait,
    Unwatch,
    Watch,
)
from proxy.receive.seam import IMMEDIATE_TIMEOUT_S, MIN_ATTEMPT_S, EndsReceives, OnClose, ReceiveRequest, ReceiveResult
from proxy.routing import BrokerPool

FAILED_LAST_S = 5.0  # a broker whose Pop for a topic just failed is tried last for it this long
MAX_FAILED_REMEMBERED = 10_000


class _Counted:
    """A receive's polling metrics, each counted once: `is_long_polling` when a broker held one of its Pops
    (RocketMQ's "suspended": the broker says so in `held`), `is_short_polling_hit` when the first Pop a broker
    answered had messages without holding it (a longpoll receive on a backlog, as notify's first poll-0 Pop)."""

    __slots__ = ("_metrics", "_group", "_answers", "_long_polled")

    def __init__(self, metrics: Metrics, group: str) -> None:
        self._metrics, self._group = metrics, group
        self._answers = 0
        self._long_polled = False

    def answer(self, response: bpb.PopResponse) -> None:
        self._answers += 1
        if response.held:
            self.long_poll()
        elif self._answers == 1 and response.messages:
            self._metrics.first_pop_hit(self._group)

    def long_poll(self) -> None:
        if not self._long_polled:
            self._long_polled = True
            self._metrics.long_poll(self._group)


class LongPollStrategy:
    """Coupled long polling: one Pop to one broker, held up to the client's long-polling time.

    The broker is the live one where this proxy holds the fewest Pops of the request's group for its topic and
    with its filter (ties in turn), whatever other groups hold: a group's long polls spread evenly over the
    brokers, so that with as many of them as brokers every broker has one and a message anywhere wakes one of them
    (each filter's alike: test_coupled.py::test_a_groups_long_polls_spread_over_the_brokers_per_filter) —
    tests/unit/proxy/receive/test_coupled.py::test_a_groups_long_polls_spread_evenly_over_the_brokers_whatever_other_groups_do.

    With `cover` (the adaptive mode, whose promise is no false empty), a group's Pops cover every live broker
    (`proxy.receive.coverage`): where this proxy holds none of the group's Pops while it holds some elsewhere, a
    Notification watches; when it has a message, the oldest Pop of the broker with the most moves there, so a
    burst larger than a broker's share of Pops does not leave messages without a taker while Pops wait on empty
    brokers — test_coupled.py::test_covered_long_polls_move_to_a_broker_where_a_message_has_no_taker. Plain
    `longpoll` mode stays one Pop to one broker: the baseline that shows the false empties."""

    mode = "longpoll"

    def __init__(
        self, pool: BrokerPool, *, broker_timeout_s: float, metrics: Metrics | None = None, cover: bool = False
    ) -> None:
        self._pool = pool
        self._coverage = Coverage(self._broker_health, cover=cover)
        self._watch_calls: dict[Watch, asyncio.Future[bpb.NotificationResponse]] = {}  # until each call ends
        # (key, broker) -> the broker's up-wait and the callback on it, until it answers or `Unawait`
        self._up_waits: dict[tuple[Key, str], tuple[asyncio.Future[None], Callable[[asyncio.Future[None]], None]]] = {}
        self._timeout = broker_timeout_s
        self._metrics = metrics or NoMetrics()
        # One waiter on the proxy's closing event for every held receive (`OnClose`): on close each receive's task
        # is cancelled (which cancels its broker call) and answers "closing".
        self._closer: OnClose[asyncio.Task[Any]] = OnClose(self._close, "longpoll-closing")
        self._closed: set[asyncio.Task[Any]] = set()
        # (topic, broker) -> loop time until which the broker is tried last for the topic: it just failed a Pop
        # at once (no such topic there under --no-auto-create, or down and not yet marked so). Holding no Pop,
        # it would otherwise sort first for every receive and cost each one a round trip. With the broker's
        # `recoveries` then for a failure of the broker itself: forgotten once its health checks see it back, so a
        # resumed broker's backlog is not left waiting (None for the topic) —
        # test_coupled.py::test_a_broker_that_failed_is_tried_first_again_once_its_health_checks_see_it_back.
        self._failed: dict[tuple[str, str], tuple[float, int | None]] = {}

    def _order(self, request: ReceiveRequest, now: float) -> list[BrokerClient]:
        """The brokers to try: live ones by how few of the group's Pops with the filter they hold (ties in turn),
        those that just failed for the topic after the others, then down ones."""
        held = self._coverage.held((request.topic, request.group, request.filter))
        failed = self._failed

        def recently_failed(client: BrokerClient) -> bool:
            until, recoveries = failed.get((request.topic, client.name), (0.0, None))
            return until > now and (recoveries is None or recoveries == client.recoveries)

        candidates = self._pool.candidates(rotation=f"receive\x00{request.topic}\x00{request.group}")
        # stable: keeps the turn among equals
        return sorted(candidates, key=lambda c: (not c.healthy, recently_failed(c), len(held.get(c.name, ()))))

    def _failed_now(self, topic: str, client: BrokerClient, now: float, *, broker_failed: bool) -> None:
        if len(self._failed) >= MAX_FAILED_REMEMBERED:
            self._failed = {k: v for k, v in self._failed.items() if v[0] > now}
            if len(self._failed) >= MAX_FAILED_REMEMBERED:
                self._failed.clear()
        self._failed[(topic, client.name)] = (now + FAILED_LAST_S, client.recoveries if broker_failed else None)

    async def receive(
        self, request: ReceiveRequest, closing: asyncio.Event, *, policy: EndsReceives | None = None
    ) -> ReceiveResult:
        """`policy`: told when the receive ends (the adaptive mode's, which chose this strategy for it).

        One coroutine for the whole receive, its broker calls futures: a held receive is the proxy's unit of memory,
        so no frame per attempt or per awaited call (`_attempt` computes each attempt's times and returns) —
        tests/unit/proxy/receive/test_adaptive_driver.py::
        test_a_held_adaptive_long_poll_is_one_strategy_coroutine_and_every_receive_ends_at_the_policy."""
        loop = asyncio.get_running_loop()
        poll_end = loop.time() + request.poll_s  # one long-polling time for the receive, not one per broker
        last: DomainError | None = None
        answered = False  # some broker answered (empty)
        task = asyncio.current_task()
        assert task is not None
        # A broker found down (or hung) during the call is skipped and the next is tried with the time left;
        # so is one that had nothing for a Pop that did not wait (a receive that does not wait asks every broker).
        # A held Pop coverage moved is made again at its new broker with the time left.
        order = self._order(request, loop.time())
        counted: _Counted | None = None  # made at the first event it counts: none while the first Pop is held
        try:
            while order:
                client = order.pop(0)
                attempt = self._attempt(client, request, poll_end, loop.time())
                if attempt is None:
                    break
                call, waits = attempt  # of the Pop, only whether it waits stays in this frame while it is held
                del attempt
                if closing.is_set():
                    call.cancel()
                    return ReceiveResult([], "closing")
                entry = self.track((request.topic, request.group, request.filter), client.name, call)
                self._closer.watch(closing)
                self._closer.registered.add(task)
                try:
                    response = await call
                except asyncio.CancelledError:
                    shut = task in self._closed
                    if not shut and entry.moved_to is not None and call.cancelled() and not task.cancelling():
                        counted = counted or _Counted(self._metrics, request.group)
                        counted.long_poll()  # only a held Pop is moved: made again at its new broker
                        target = self._pool.get(entry.moved_to)
                        if target is not None:
                            order = [target, *(c for c in order if c is not target)]
                        continue
                    if call.done() and not call.cancelled() and call.exception() is None and call.result().messages:
                        client.release(call)  # answered as the client left or the proxy closed: nobody receives them
                    elif not call.done() and waits:
                        counted = counted or _Counted(self._metrics, request.group)
                        counted.long_poll()  # left while a broker held it
                    if shut:
                        task.uncancel()
                        return ReceiveResult([], "closing")
                    raise
                except (BrokerUnavailable, BrokerTimeout, TopicNotFound) as exc:  # down, hung, or without this topic
                    failed = not isinstance(exc, TopicNotFound)
                    self._failed_now(request.topic, client, loop.time(), broker_failed=failed)
                    last = exc
                    continue
                finally:
                    self._closer.registered.discard(task)
                    self._closed.discard(task)
                    self.untrack((request.topic, request.group, request.filter), client.name, entry)
                if response.polling_full and not response.messages:
                    raise TooManyRequests(f"broker {client.name} holds too many long polls; retry shortly")
                counted = counted or _Counted(self._metrics, request.group)
                counted.answer(response)
                if not response.messages and not waits:
                    answered = True
                    continue
                if not response.messages and response.closing and poll_end - loop.time() > MIN_ATTEMPT_S:
                    # The broker is stopping (it answers what it holds at once): the next broker is asked for the
                    # time left, as when a broker is down — test_coupled.py::
                    # test_a_long_poll_a_stopping_broker_ends_at_once_goes_on_at_the_next_broker
                    self._failed_now(request.topic, client, loop.time(), broker_failed=True)
                    answered = True
                    continue
                return self._result(client, call, response)
            if answered or request.deadline - loop.time() <= MIN_ATTEMPT_S:
                return ReceiveResult([], "empty")  # nothing anywhere, or the client's time is up: not an error
            raise last or BrokerUnavailable("no broker is configured")
        finally:
            if policy is not None:
                policy.end(request.group, now=loop.time())

    def _attempt(
        self, client: BrokerClient, request: ReceiveRequest, poll_end: float, now: float
    ) -> tuple[asyncio.Future[bpb.PopResponse], bool] | None:
        """A Pop of `client` with the receive's time left, and whether it waits there; None when no time is left."""
        remaining = request.deadline - now
        if remaining <= MIN_ATTEMPT_S:
            return None
        poll_s = max(0.0, min(poll_end - now, remaining))
        poll_ms = round(poll_s * 1000)
        # Poll 0 as in notify mode: a hung broker is passed over in IMMEDIATE_TIMEOUT_S, not the whole broker timeout
        # (test_coupled.py::test_a_pop_that_does_not_wait_passes_a_hung_broker_over_in_its_short_timeout).
        timeout = min(poll_s + self._timeout, remaining) if poll_ms > 0 else min(self._timeout, IMMEDIATE_TIMEOUT_S)
        timeout = max(MIN_ATTEMPT_S, min(timeout, remaining))
        return client.begin_pop(request.pop_request(poll_ms), timeout_s=timeout), poll_ms > 0

    @staticmethod
    def _result(
        client: BrokerClient, call: asyncio.Future[bpb.PopResponse], response: bpb.PopResponse
    ) -> ReceiveResult:
        messages = list(response.messages)
        result = ReceiveResult(messages, "messages" if messages else "empty")
        if messages:
            result.give_back = functools.partial(client.release, call)
        return result

    def _close(self, task: asyncio.Task[Any]) -> None:
        self._closed.add(task)
        task.cancel()

    def track(self, key: Key, broker: str, call: asyncio.Future[bpb.PopResponse]) -> Held:
        """Count a held Pop of the (topic, group, filter) at `broker` until `untrack`: the group's Pops made
        elsewhere (a pop-with-notify run handed off to a long poll, `proxy.receive.notify_driver`) are covered and
        moved as this strategy's own are. Its `moved_to` is set when coverage cancelled it for a broker with a
        message."""
        entry, commands = self._coverage.track(key, broker, call, now=asyncio.get_running_loop().time())
        self._apply(commands)
        return entry

    def untrack(self, key: Key, broker: str, entry: HeldPop) -> None:
        self._apply(self._coverage.untrack(key, broker, entry))

    def broker_up(self, broker: str) -> None:
        """`broker` came up: covered long polls watch it too (`Coverage.broker_up`)."""
        self._apply(self._coverage.broker_up(broker, now=asyncio.get_running_loop().time()))

    def _broker_health(self) -> Iterator[tuple[str, bool]]:
        for name in self._pool.names:
            client = self._pool.get(name)
            if client is not None:
                yield name, client.healthy

    def _client(self, broker: str) -> BrokerClient:
        client = self._pool.get(broker)
        assert client is not None, broker
        return client

    def _apply(self, commands: list[Command]) -> None:
        for command in commands:
            if isinstance(command, Watch):
                request = bpb.NotificationRequest(
                    topic=command.key[0], group=command.key[1], filter=command.key[2], poll_ms=int(WATCH_S * 1000)
                )
                call = self._client(command.broker).begin_notification(request, timeout_s=WATCH_S + self._timeout)
                self._watch_calls[command] = call
                call.add_done_callback(functools.partial(self._watched, command))
            elif isinstance(command, Unwatch):
                # a has_message crossing the cancel is handed back (the broker client)
                self._watch_calls[command.watch].cancel()
            elif isinstance(command, Move):
                command.entry.call.cancel()  # its receive makes it again there; an answer crossing this is handed back
                self._metrics.pop_moved(command.key[1])
            elif isinstance(command, PassOn):
                self._client(command.watch.broker).release(self._watch_calls[command.watch])
            elif isinstance(command, AwaitUp):
                up = self._client(command.broker).when_up()
                callback = functools.partial(self._came_up, command.key, command.broker)
                up.add_done_callback(callback)
                self._up_waits[(command.key, command.broker)] = (up, callback)
            elif isinstance(command, Unawait):
                wait = self._up_waits.pop((command.key, command.broker), None)
                if wait is not None:
                    wait[0].remove_done_callback(wait[1])
            elif isinstance(command, CoverLater):
                asyncio.get_running_loop().call_later(command.delay_s, self._cover, command.key)

    def _cover(self, key: Key) -> None:
        self._apply(self._coverage.cover(key, now=asyncio.get_running_loop().time()))

    def _watched(self, watch: Watch, call: asyncio.Future[bpb.NotificationResponse]) -> None:
        try:
            if self._coverage.watching(watch):  # else ended by coverage: its answer is not read
                now = asyncio.get_running_loop().time()
                self._apply(self._coverage.watched(watch, _answer(call), now=now))
        finally:
            del self._watch_calls[watch]

    def _came_up(self, key: Key, broker: str, _up: asyncio.Future[None]) -> None:
        self._up_waits.pop((key, broker), None)
        self._apply(self._coverage.came_up(key, broker, now=asyncio.get_running_loop().time()))


def _answer(call: asyncio.Future[bpb.NotificationResponse]) -> Answer:
    if call.cancelled():
        return Answer.CANCELLED
    error = call.exception()
    if isinstance(error, TopicNotFound):
        return Answer.NO_TOPIC
    if error is not None:
        return Answer.FAILED
    response = call.result()
    if response.has_message:
        return Answer.HAS_MESSAGE
    return Answer.FULL if response.polling_full else Answer.EMPTY
