"""Coupled long polling (DESIGN §3, `--receive-mode longpoll`): one Pop to one live broker, held for the
client's long-polling time; the broker is the one where this proxy holds the fewest of the group's Pops."""

from __future__ import annotations

import asyncio
import functools

from popgate_pb import broker_pb2 as bpb

from proxy.errors import BrokerTimeout, BrokerUnavailable, ProxyError, ShuttingDown, TooManyRequests, TopicNotFound
from proxy.ports import BrokerClient, Metrics, NoMetrics
from proxy.receive import MIN_ATTEMPT_S, CloseWatch, ReceiveRequest, ReceiveResult
from proxy.routing import BrokerPool

FAILED_LAST_S = 5.0  # a broker whose Pop for a topic just failed is tried last for it this long
MAX_FAILED_REMEMBERED = 10_000


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
