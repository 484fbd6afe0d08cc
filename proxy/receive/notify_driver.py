"""The asyncio driver of pop with notify: runs `proxy.receive.notify.NotifyRun` commands against brokers.

Thin on purpose: every decision is in the state machine. The driver turns commands
into broker calls (one future per outstanding broker request, no task: cancelled on
`Cancel`), feeds their results back as events from the futures' done callbacks, arms two timers
(end of poll time, hard deadline) and watches the proxy's `closing` event. When the
awaiting coroutine is cancelled (the client went away), everything outstanding is
cancelled too: the broker sessions send cancel frames, so no broker keeps a hold.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from popgate_pb import broker_pb2 as bpb

from popgate_contract.errors import BrokerFailure, DomainError
from proxy.ports import BrokerClient, HeldPop, HeldPops, Metrics, NoMetrics
from proxy.receive.notify import NotifyRun, Phase
from proxy.receive.notify_commands import AwaitUp, Cancel, Command, Finish, Notify, PassOn, Pop, Rewatch
from proxy.receive.seam import IMMEDIATE_TIMEOUT_S, EndsReceives, OnClose, ReceiveRequest, ReceiveResult
from proxy.routing import BrokerPool


class _Run:
    """One receive in flight: the machine, its broker requests and timers."""

    __slots__ = (
        "machine",
        "busy",
        "cover",
        "tracked",
        "request",
        "pool",
        "timeout_s",
        "loop",
        "result",
        "requests",
        "answer",
        "announced",
        "following",
        "timers",
        "up_waits",
    )

    def __init__(
        self,
        machine: NotifyRun,
        request: ReceiveRequest,
        pool: BrokerPool,
        timeout_s: float,
        busy: Callable[[str], bool],
        cover: HeldPops | None = None,
    ) -> None:
        self.machine = machine
        self.busy = busy
        self.cover = cover
        self.tracked: dict[asyncio.Future[Any], tuple[str, HeldPop]] = {}  # held Pops counted in `cover`
        self.request = request
        self.pool = pool
        self.timeout_s = timeout_s
        self.loop = asyncio.get_running_loop()
        self.result: asyncio.Future[Finish] = self.loop.create_future()
        self.requests: dict[str, asyncio.Future[Any]] = {}  # the request outstanding at each broker
        self.answer: tuple[str, asyncio.Future[Any]] | None = None  # the Pop whose messages were taken
        self.announced: dict[str, asyncio.Future[Any]] = {}  # has_message answers not yet followed by a Pop
        self.following: dict[asyncio.Future[Any], asyncio.Future[Any]] = {}  # a Pop in flight: the has_message it uses
        self.timers: list[asyncio.TimerHandle] = []  # Rewatch timers, cancelled with the run
        self.up_waits: list[tuple[asyncio.Future[None], Callable[[asyncio.Future[None]], None]]] = []  # AwaitUp

    def apply(self, commands: list[Command]) -> None:
        # Answering with messages: the other brokers' requests are cancelled by release(), after the answer.
        answering = bool(commands) and isinstance(commands[-1], Finish) and bool(commands[-1].messages)
        for command in commands:
            if isinstance(command, Pop):
                announced = self.announced.pop(command.broker, None)  # the Pop uses that broker's wake
                pop = self._pop(command.broker, command.poll_ms)
                if announced is not None:
                    self.following[pop] = announced
                self._spawn(command.broker, pop, "pop")
                if self.cover is not None and command.poll_ms > 0 and self.machine.phase is Phase.LONGPOLL:
                    # A hand-off's held Pop: counted with the group's long polls, so that the other brokers stay
                    # watched and a message there moves it — tests/unit/proxy/receive/test_adaptive_driver.py::
                    # test_a_handed_off_run_is_covered_and_moves_to_the_broker_a_message_lands_on
                    r = self.request
                    entry = self.cover.track((r.topic, r.group, r.filter), command.broker, pop)
                    self.tracked[pop] = (command.broker, entry)
            elif isinstance(command, PassOn):
                announced = self.announced.pop(command.broker, None)
                if announced is not None:
                    self._client(command.broker).release(announced)
            elif isinstance(command, Notify):
                self._spawn(command.broker, self._notify(command.broker, command.poll_ms), "notify")
            elif isinstance(command, Cancel):
                if answering:
                    continue
                call = self.requests.pop(command.broker, None)
                if call is not None:
                    call.cancel()
            elif isinstance(command, Rewatch):
                self.timers.append(self.loop.call_at(command.at, self._rewatch, command.broker))
            elif isinstance(command, AwaitUp):
                up = self._client(command.broker).when_up()
                callback = functools.partial(self._came_up, command.broker)
                up.add_done_callback(callback)
                self.up_waits.append((up, callback))
            elif not self.result.done():
                self.result.set_result(command)
            elif command.messages:  # nobody awaits the run any more (the client left): nobody receives them
                self.hand_back()

    def close(self) -> None:
        """The proxy is closing: the machine decides what the run answers."""
        self.apply(self.machine.closing())

    def poll_over(self) -> None:
        self.apply(self.machine.poll_over())

    def deadline(self) -> None:
        self.apply(self.machine.deadline())

    def _rewatch(self, broker: str) -> None:
        client = self.pool.get(broker)
        healthy = client is not None and client.healthy
        self.apply(self.machine.rewatch(broker, healthy=healthy, now=self.loop.time()))

    def added(self, broker: str) -> None:
        client = self.pool.get(broker)
        healthy = client is not None and client.healthy
        self.apply(self.machine.added(broker, healthy=healthy, now=self.loop.time()))

    def _came_up(self, broker: str, _up: asyncio.Future[None]) -> None:
        # Up, or its client replaced (moved while down): the pool's client of the name says which.
        self._rewatch(broker)

    def _client(self, broker: str) -> BrokerClient:
        client = self.pool.get(broker)
        assert client is not None, broker
        return client

    def _pop(self, broker: str, poll_ms: int) -> asyncio.Future[bpb.PopResponse]:
        request = self.request.pop_request(max(0, poll_ms))
        return self._client(broker).begin_pop(request, timeout_s=self._timeout_for(poll_ms))

    def _notify(self, broker: str, poll_ms: int) -> asyncio.Future[bpb.NotificationResponse]:
        r = self.request
        request = bpb.NotificationRequest(topic=r.topic, group=r.group, filter=r.filter, poll_ms=max(0, poll_ms))
        return self._client(broker).begin_notification(request, timeout_s=self._timeout_for(poll_ms))

    def _timeout_for(self, poll_ms: int) -> float:
        # A request that does not wait is answered in milliseconds: one stuck at a hung broker (not yet marked
        # down) must not hold the whole receive for the broker timeout while the other brokers go unwatched.
        return poll_ms / 1000 + self.timeout_s if poll_ms > 0 else min(self.timeout_s, IMMEDIATE_TIMEOUT_S)

    def _spawn(self, broker: str, call: asyncio.Future[Any], kind: str) -> None:
        self.requests[broker] = call
        call.add_done_callback(functools.partial(self._done, broker, kind))

    def _done(self, broker: str, kind: str, call: asyncio.Future[Any]) -> None:
        if self.requests.get(broker) is call:
            del self.requests[broker]
        tracked = self.tracked.pop(call, None)
        if tracked is not None and self.cover is not None:
            r = self.request
            self.cover.untrack((r.topic, r.group, r.filter), broker, tracked[1])
        announced = self.following.pop(call, None)
        if announced is not None and (call.cancelled() or call.exception() is not None):
            # A Pop after has_message that ended unanswered (timed out, cancelled with the run) may never have run
            # at the broker: its wake is handed back, or the message would wait for the safety sweep while another
            # consumer's request is held there — tests/unit/proxy/receive/test_notify_driver.py::
            # test_a_has_message_whose_pop_ends_unanswered_is_handed_back_to_its_broker
            self._client(broker).release(announced)
        if call.cancelled():
            if tracked is not None and tracked[1].moved_to is not None:  # moved to a broker with a message
                self.apply(self.machine.moved(broker, tracked[1].moved_to, now=self.loop.time()))
            return
        error = call.exception()  # retrieved even when the run is over: no "never retrieved" noise
        now = self.loop.time()
        if error is not None:
            proxy_error = error if isinstance(error, DomainError) else BrokerFailure(f"broker {broker}: {error!r}")
            self.apply(self.machine.failed_call(broker, proxy_error, now=now))
        elif kind == "pop":
            response = call.result()
            assert isinstance(response, bpb.PopResponse)
            if response.messages and (self.machine.done or broker != self.machine.popping):
                # Answered in the same turn as the run's end (deadline, client gone, shutdown): nobody will
                # receive these, so the broker puts them back instead of hiding them for the invisible time.
                self._client(broker).release(call)
                return
            if response.messages:
                self.answer = (broker, call)
            busy = not response.messages and self.busy(self.request.group)
            full, closing = response.polling_full, response.closing
            self.apply(
                self.machine.popped(broker, response.messages, polling_full=full, now=now, busy=busy, closing=closing)
            )
        else:
            answer = call.result()
            assert isinstance(answer, bpb.NotificationResponse)
            if answer.has_message:
                self.announced[broker] = call
            has, full, closing = answer.has_message, answer.polling_full, answer.closing
            self.apply(self.machine.notified(broker, has_message=has, polling_full=full, now=now, closing=closing))

    def abandon(self) -> None:
        """The receive is gone (the client left): end the run, cancel what is outstanding, and hand back
        the messages an answer already brought, as later answers are (`_done`): nobody will receive them."""
        self.apply(self.machine.closing())
        self.cancel_all()
        if self.result.done() and not self.result.cancelled() and self.result.result().messages:
            self.hand_back()

    def hand_back(self) -> None:
        if self.answer is not None:
            broker, call = self.answer
            self.answer = None
            self._client(broker).release(call)
            # Its messages no longer kept through the run (the receive's `release` holds the run until the call
            # ends: an answer given back at its write deadline may wait long for that).
            self.result = self.loop.create_future()
            self.result.set_result(Finish([], "empty"))

    def cancel_all(self) -> None:
        for call in self.requests.values():
            call.cancel()
        self.requests.clear()
        for timer in self.timers:
            timer.cancel()
        self.timers.clear()
        for up, callback in self.up_waits:
            up.remove_done_callback(callback)
        self.up_waits.clear()


class NotifyStrategy:
    """Pop with notify (docs/ARCHITECTURE.md §3, way 2): no false empty responses with few consumers and many
    brokers."""

    mode = "notify"

    def __init__(
        self,
        pool: BrokerPool,
        *,
        broker_timeout_s: float,
        metrics: Metrics | None = None,
        busy: Callable[[str], bool] | None = None,
        cover: HeldPops | None = None,
    ) -> None:
        """busy(group): whether a run that lost a race should hand off to long polling (adaptive mode);
        cover: the adaptive mode's covered long polls, which count (and move) a hand-off's held Pop."""
        self._busy = busy or (lambda group: False)
        self._cover = cover
        self._pool = pool
        self._timeout = broker_timeout_s
        self._metrics = metrics or NoMetrics()
        # One waiter on the proxy's closing event for all runs (not one task per receive).
        self._closer: OnClose[_Run] = OnClose(_Run.close, "notify-closing")

    def broker_up(self, broker: str) -> None:
        """`broker` came up: a run that started before the pool had it watches it too (`NotifyRun.added`)."""
        for run in list(self._closer.registered):
            run.added(broker)

    async def receive(
        self, request: ReceiveRequest, closing: asyncio.Event, *, policy: EndsReceives | None = None
    ) -> ReceiveResult:
        """`policy`: told when the receive ends (the adaptive mode's, which chose this strategy for it)."""
        loop = asyncio.get_running_loop()
        try:
            if closing.is_set():
                return ReceiveResult([], "closing")
            now = loop.time()
            candidates = self._pool.candidates(rotation=f"receive\x00{request.topic}\x00{request.group}")
            live = [c.name for c in candidates if c.healthy]
            # Those down are watched once they are back. Every broker when none passed its last health check:
            # the checks may be stale, the calls will tell.
            down = [c.name for c in candidates if not c.healthy] if live else []
            poll_end = min(now + request.poll_s, request.deadline)
            machine = NotifyRun(
                live or [c.name for c in candidates], poll_end, down=down, covered=self._cover is not None
            )
            run = _Run(machine, request, self._pool, self._timeout, self._busy, self._cover)
            self._closer.watch(closing)
            self._closer.registered.add(run)
            timers = [
                loop.call_at(poll_end, run.poll_over),
                loop.call_at(request.deadline, run.deadline),
            ]
            outcome = "cancelled"
            try:
                run.apply(run.machine.start())
                finish = await run.result
                outcome = finish.outcome
            except BaseException:  # the client went away: nothing may stay held for it
                run.abandon()
                raise
            finally:
                for timer in timers:
                    timer.cancel()
                self._closer.registered.discard(run)
                self._metrics.notify_run(request.group, run.machine.stats, outcome)
            result = ReceiveResult(list(finish.messages), finish.outcome)
            if finish.messages:
                # The other brokers' Notifications end after the answer is written: cancel frames sent now would
                # go out on this event loop ahead of the answer's frames.
                result.release = run.cancel_all
                result.give_back = run.hand_back
            else:
                run.cancel_all()
            if finish.error is not None:
                raise finish.error
            return result
        finally:
            if policy is not None:
                policy.end(request.group, now=loop.time())
