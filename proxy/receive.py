"""Receive strategies: how one client ReceiveMessage becomes broker calls.

`ReceiveStrategy` is the seam: the core calls `receive()` and does not care how it
is served. Three implement it (DESIGN §3): `LongPollStrategy` here (coupled long
polling: one Pop to one live broker — the one with the fewest of the group's Pops
this proxy holds, ties in turn — held for the client's long-polling time minus the
proxy's reserve), `proxy.notify_driver.NotifyStrategy` (pop with
notify) and `AdaptiveStrategy` here, which asks `proxy.adaptive.AdaptivePolicy`
which of the two serves each request.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from popgate_pb import broker_pb2 as bpb

from proxy.adaptive import AdaptivePolicy
from proxy.errors import (
    BrokerTimeout,
    BrokerUnavailable,
    ProxyError,
    ShuttingDown,
    TooManyRequests,
    TopicNotFound,
)
from proxy.ports import BrokerClient, Metrics, NoMetrics
from proxy.routing import BrokerPool

T = TypeVar("T")
R = TypeVar("R")
MIN_ATTEMPT_S = 0.05  # less time than this left: no further broker attempt, and a broker call gets at least this
FAILED_LAST_S = 5.0  # a broker whose Pop for a topic just failed is tried last for it this long
MAX_FAILED_REMEMBERED = 10_000


@dataclass(frozen=True, slots=True)
class ReceiveRequest:
    topic: str
    group: str
    filter: str  # broker form: "*" or "a||b"
    batch: int
    invisible_ms: int
    poll_s: float  # how long a broker may hold the request (already clamped and cut to the deadline)
    deadline: float  # loop.time() by which the answer must be on its way

    def pop_request(self, poll_ms: int) -> bpb.PopRequest:
        """The broker Pop for this receive, held at most `poll_ms` there."""
        return bpb.PopRequest(
            topic=self.topic,
            group=self.group,
            filter=self.filter,
            max_messages=self.batch,
            invisible_ms=self.invisible_ms,
            poll_ms=poll_ms,
        )


def _nothing() -> None:
    pass


@dataclass(slots=True)
class ReceiveResult:
    """What a receive got. The caller calls ``release()`` once the answer is written to the client:
    a strategy may leave broker requests outstanding until then (pop with notify cancels the other
    brokers' Notifications there, so the answer's frames do not queue behind the cancel frames).
    ``give_back()`` instead of answering: the broker puts the messages back, ready at once."""

    messages: list[bpb.PoppedMessage]
    outcome: str  # "messages", "empty" (poll timed out), "closing" (proxy shutting down)
    release: Callable[[], None] = _nothing
    give_back: Callable[[], None] = _nothing


class ReceiveStrategy(Protocol):
    mode: str

    async def receive(self, request: ReceiveRequest, closing: asyncio.Event) -> ReceiveResult: ...


class OnClose(Generic[R]):
    """One waiter task on the proxy's `closing` event for everything `registered`: on close, ``act`` is called
    for each. A held receive is the proxy's unit of memory (10,000 of them is an ordinary load): a waiter task
    per receive on the event would cost more than the rest of the receive's Python state."""

    def __init__(self, act: Callable[[R], None], name: str) -> None:
        self.registered: set[R] = set()
        self._act = act
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def watch(self, closing: asyncio.Event) -> None:
        """Start the waiter unless it is running (again after it has fired)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._wait(closing), name=self._name)

    async def _wait(self, closing: asyncio.Event) -> None:
        await closing.wait()
        for item in list(self.registered):
            self._act(item)


class CloseWatch:
    """Ends awaits with ShuttingDown when the proxy closes, with one waiter task for all of them (`OnClose`):
    the awaiting task registers itself; on close it is cancelled (which cancels the broker request it awaits)
    and the cancellation becomes ShuttingDown."""

    def __init__(self) -> None:
        self._waiting: OnClose[asyncio.Task[Any]] = OnClose(self._close, "receive-closing")
        self._closed: set[asyncio.Task[Any]] = set()

    def _close(self, task: asyncio.Task[Any]) -> None:
        self._closed.add(task)
        task.cancel()

    async def run(self, call: asyncio.Future[T], closing: asyncio.Event) -> T:
        """Await a started broker call (cancelled if the proxy closes first)."""
        if closing.is_set():
            call.cancel()
            raise ShuttingDown("the proxy is shutting down")
        task = asyncio.current_task()
        assert task is not None
        self._waiting.watch(closing)
        self._waiting.registered.add(task)
        try:
            return await call
        except asyncio.CancelledError:
            if task not in self._closed:
                raise  # the client went away
            task.uncancel()
            raise ShuttingDown("the proxy is shutting down") from None
        finally:
            self._waiting.registered.discard(task)
            self._closed.discard(task)


class LongPollStrategy:
    """Coupled long polling: one Pop to one broker, held up to the client's long-polling time.

    The broker is the live one where this proxy holds the fewest Pops of the request's group for its topic
    (ties in turn): a group's long polls spread evenly over the brokers, so that with as many of them as brokers
    every broker has one and a message anywhere wakes one of them. A turn shared by all groups (as before)
    let one group's long polls pile up on some brokers while others had none: with 6 consumers of a group
    on 3 brokers beside one other group, messages waited 12-21 s for a consumer (a review's probe)."""

    mode = "longpoll"

    def __init__(self, pool: BrokerPool, *, broker_timeout_s: float, metrics: Metrics | None = None) -> None:
        self._pool = pool
        self._timeout = broker_timeout_s
        self._metrics = metrics or NoMetrics()
        self._close_watch = CloseWatch()
        # (topic, group) -> broker -> Pops of the group for the topic held there now
        self._held: dict[tuple[str, str], dict[str, int]] = {}
        # (topic, broker) -> loop time until which the broker is tried last for the topic: it just failed a Pop
        # at once (no such topic there under --no-auto-create, or down and not yet marked so). Holding no Pop,
        # it would otherwise sort first for every receive and cost each one a round trip.
        self._failed: dict[tuple[str, str], float] = {}

    def _order(self, request: ReceiveRequest, now: float) -> list[BrokerClient]:
        """The brokers to try: live ones by how few of the group's Pops they hold (ties in turn), those that just
        failed for the topic after the others, then down ones."""
        held = self._held.get((request.topic, request.group), {})
        failed = self._failed

        def recently_failed(name: str) -> bool:
            until = failed.get((request.topic, name))
            return until is not None and until > now

        candidates = self._pool.candidates(rotation="receive")
        # stable: keeps the turn among equals
        return sorted(candidates, key=lambda c: (not c.healthy, recently_failed(c.name), held.get(c.name, 0)))

    def _failed_now(self, topic: str, broker: str, now: float) -> None:
        if len(self._failed) >= MAX_FAILED_REMEMBERED:
            self._failed = {k: t for k, t in self._failed.items() if t > now}
            if len(self._failed) >= MAX_FAILED_REMEMBERED:
                self._failed.clear()
        self._failed[(topic, broker)] = now + FAILED_LAST_S

    async def receive(self, request: ReceiveRequest, closing: asyncio.Event) -> ReceiveResult:
        loop = asyncio.get_running_loop()
        poll_end = loop.time() + request.poll_s  # one long-polling time for the receive, not one per broker
        last: ProxyError = BrokerUnavailable("no broker is configured")
        answered = False  # some broker answered (empty)
        # A broker found down (or hung) during the call is skipped and the next is tried with the time left;
        # so is one that had nothing for a Pop that did not wait (a receive that does not wait asks every broker).
        for attempt, client in enumerate(self._order(request, loop.time())):
            now = loop.time()
            remaining = request.deadline - now
            if remaining <= MIN_ATTEMPT_S:
                break
            poll_s = max(0.0, min(poll_end - now, remaining))
            pop = request.pop_request(round(poll_s * 1000))
            if pop.poll_ms > 0 and attempt == 0:
                self._metrics.long_poll(request.group)  # is_long_polling: the broker may hold this receive
            timeout = max(MIN_ATTEMPT_S, min(poll_s + self._timeout, remaining))
            call = client.begin_pop(pop, timeout_s=timeout)
            try:
                response = await self._held_pop((request.topic, request.group), client.name, call, closing)
            except (asyncio.CancelledError, ShuttingDown) as exc:
                if call.done() and not call.cancelled() and call.exception() is None and call.result().messages:
                    client.release(call)  # answered as the client left or the proxy closed: nobody receives them
                if isinstance(exc, ShuttingDown):
                    return ReceiveResult([], "closing")
                raise
            except (BrokerUnavailable, BrokerTimeout, TopicNotFound) as exc:  # down, hung, or without this topic
                self._failed_now(request.topic, client.name, loop.time())
                last = exc
                continue
            if response.polling_full and not response.messages:
                raise TooManyRequests(f"broker {client.name} holds too many long polls; retry shortly")
            messages = list(response.messages)
            if not messages and pop.poll_ms == 0:
                answered = True
                continue
            result = ReceiveResult(messages, "messages" if messages else "empty")
            if messages:
                result.give_back = functools.partial(client.release, call)
            return result
        if answered or request.deadline - loop.time() <= MIN_ATTEMPT_S:
            return ReceiveResult([], "empty")  # nothing anywhere, or the client's time is up: not an error
        raise last

    async def _held_pop(
        self, key: tuple[str, str], broker: str, call: asyncio.Future[bpb.PopResponse], closing: asyncio.Event
    ) -> bpb.PopResponse:
        """Await a Pop, counted among the (topic, group)'s Pops held at that broker meanwhile."""
        held = self._held.setdefault(key, {})
        held[broker] = held.get(broker, 0) + 1
        try:
            return await self._close_watch.run(call, closing)
        finally:
            if held[broker] > 1:
                held[broker] -= 1
            else:
                del held[broker]
                if not held:
                    del self._held[key]


class AdaptiveStrategy:
    """Per request: pop with notify while the group is quiet, coupled long polling when it is busy."""

    mode = "adaptive"

    def __init__(
        self,
        pool: BrokerPool,
        policy: AdaptivePolicy,
        notify: ReceiveStrategy,
        longpoll: ReceiveStrategy,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self._pool = pool
        self._policy = policy
        self._by_mode = {"notify": notify, "longpoll": longpoll}
        self._metrics = metrics or NoMetrics()

    async def receive(self, request: ReceiveRequest, closing: asyncio.Event) -> ReceiveResult:
        loop = asyncio.get_running_loop()
        decision = self._policy.start(request.group, now=loop.time(), live_brokers=len(self._pool.live()))
        self._metrics.mode_decision(request.group, decision.mode, decision.reason)
        try:
            return await self._by_mode[decision.mode].receive(request, closing)
        finally:
            self._policy.end(request.group, now=loop.time())
