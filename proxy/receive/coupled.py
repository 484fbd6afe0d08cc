"""Coupled long polling (DESIGN §3, `--receive-mode longpoll`): one Pop to one live broker, held for the
client's long-polling time; the broker is the one where this proxy holds the fewest of the group's Pops.

Covered (the adaptive mode's long polls): where none of a group's Pops is held, a Notification watches for the
group, and when a message comes there one of its Pops held elsewhere moves there (`LongPollStrategy(cover=True)`)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from popgate_pb import broker_pb2 as bpb

from popgate_contract.errors import (
    BrokerTimeout,
    BrokerUnavailable,
    DomainError,
    ShuttingDown,
    TooManyRequests,
    TopicNotFound,
)
from proxy.ports import BrokerClient, HeldPop, Metrics, NoMetrics
from proxy.receive.seam import MIN_ATTEMPT_S, CloseWatch, ReceiveRequest, ReceiveResult
from proxy.routing import BrokerPool


class _Held:
    """A Pop held for a receive; `moved_to` once `_move` moved it (its call cancelled, to be made there)."""

    __slots__ = ("call", "moved_to")

    def __init__(self, call: asyncio.Future[bpb.PopResponse]) -> None:
        self.call = call
        self.moved_to: str | None = None


class _Moved(Exception):
    def __init__(self, broker: str) -> None:
        self.broker = broker


WATCH_S = 30.0  # a coverage watch's hold (the longest long poll); made again while still needed
WATCH_MIN_S = 1.0  # a watch answered empty sooner was not held (a closing broker): made again only after
WATCH_RETRY_S = 1.0  # this long, as after a watch refused (polling_full) or failed while the broker looks up
COVER_DELAY_S = 0.02  # a broker whose last Pop of the group just ended is watched this much later: the consumer's
# next Pop usually lands there first (a watch at once was sent and cancelled for about every message)
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

    The broker is the live one where this proxy holds the fewest Pops of the request's group for its topic
    (ties in turn): a group's long polls spread evenly over the brokers, so that with as many of them as brokers
    every broker has one and a message anywhere wakes one of them. A turn shared by all groups (as before)
    let one group's long polls pile up on some brokers while others had none: with 6 consumers of a group
    on 3 brokers beside one other group, messages waited 12-21 s for a consumer (a review's probe).

    With `cover` (the adaptive mode, whose promise is no false empty), a group's Pops cover every live broker:
    even spread, a burst can bring a broker more messages than the group has Pops there, and once those are
    answered nobody of the group waits there while its other Pops wait on empty brokers (3 and 3 messages on
    two of three brokers, 2 Pops on each: 2 messages waited 11.9 s, and consumers got empty answers meanwhile,
    in a review's probe). So where this proxy holds none of the group's Pops while it holds some elsewhere, a
    Notification watches; when it has a message, the oldest Pop of the broker with the most moves there. Plain
    `longpoll` mode stays one Pop to one broker: the baseline that shows the false empties."""

    mode = "longpoll"

    def __init__(
        self, pool: BrokerPool, *, broker_timeout_s: float, metrics: Metrics | None = None, cover: bool = False
    ) -> None:
        self._pool = pool
        self._cover_brokers = cover
        # (topic, group) -> broker -> the Notification watching there (`cover`), and the group's filter
        self._watches: dict[tuple[str, str], dict[str, asyncio.Future[bpb.NotificationResponse]]] = {}
        self._filters: dict[tuple[str, str], str] = {}
        self._awaiting: set[tuple[tuple[str, str], str]] = set()  # (key, broker) waiting for the broker to be up
        self._timeout = broker_timeout_s
        self._metrics = metrics or NoMetrics()
        self._close_watch = CloseWatch()
        # (topic, group) -> broker -> Pops of the group for the topic held there now, oldest first
        self._held: dict[tuple[str, str], dict[str, dict[_Held, None]]] = {}
        # (topic, broker) -> loop time until which the broker is tried last for the topic: it just failed a Pop
        # at once (no such topic there under --no-auto-create, or down and not yet marked so). Holding no Pop,
        # it would otherwise sort first for every receive and cost each one a round trip. With the broker's
        # `recoveries` then for a failure of the broker itself: forgotten once its health checks see it back
        # (a resumed broker stayed last for 5 s, its backlog waiting, in a review's probe); None for the topic.
        self._failed: dict[tuple[str, str], tuple[float, int | None]] = {}

    def _order(self, request: ReceiveRequest, now: float) -> list[BrokerClient]:
        """The brokers to try: live ones by how few of the group's Pops they hold (ties in turn), those that just
        failed for the topic after the others, then down ones."""
        held = self._held.get((request.topic, request.group), {})
        failed = self._failed

        def recently_failed(client: BrokerClient) -> bool:
            until, recoveries = failed.get((request.topic, client.name), (0.0, None))
            return until > now and (recoveries is None or recoveries == client.recoveries)

        candidates = self._pool.candidates(rotation="receive")
        # stable: keeps the turn among equals
        return sorted(candidates, key=lambda c: (not c.healthy, recently_failed(c), len(held.get(c.name, ()))))

    def _failed_now(self, topic: str, client: BrokerClient, now: float, *, broker_failed: bool) -> None:
        if len(self._failed) >= MAX_FAILED_REMEMBERED:
            self._failed = {k: v for k, v in self._failed.items() if v[0] > now}
            if len(self._failed) >= MAX_FAILED_REMEMBERED:
                self._failed.clear()
        self._failed[(topic, client.name)] = (now + FAILED_LAST_S, client.recoveries if broker_failed else None)

    async def receive(self, request: ReceiveRequest, closing: asyncio.Event) -> ReceiveResult:
        loop = asyncio.get_running_loop()
        poll_end = loop.time() + request.poll_s  # one long-polling time for the receive, not one per broker
        last: DomainError = BrokerUnavailable("no broker is configured")
        answered = False  # some broker answered (empty)
        # A broker found down (or hung) during the call is skipped and the next is tried with the time left;
        # so is one that had nothing for a Pop that did not wait (a receive that does not wait asks every broker).
        # A held Pop moved by `_move` is made again at its new broker with the time left.
        order = self._order(request, loop.time())
        counted = _Counted(self._metrics, request.group)
        while order:
            client = order.pop(0)
            now = loop.time()
            remaining = request.deadline - now
            if remaining <= MIN_ATTEMPT_S:
                break
            poll_s = max(0.0, min(poll_end - now, remaining))
            pop = request.pop_request(round(poll_s * 1000))
            timeout = max(MIN_ATTEMPT_S, min(poll_s + self._timeout, remaining))
            call = client.begin_pop(pop, timeout_s=timeout)
            try:
                response = await self._held_pop((request.topic, request.group), client.name, call, request, closing)
            except _Moved as moved:
                counted.long_poll()  # only a held Pop is moved
                target = self._pool.get(moved.broker)
                if target is not None:
                    order = [target, *(c for c in order if c is not target)]
                continue
            except (asyncio.CancelledError, ShuttingDown) as exc:
                if call.done() and not call.cancelled() and call.exception() is None and call.result().messages:
                    client.release(call)  # answered as the client left or the proxy closed: nobody receives them
                elif not call.done() and pop.poll_ms > 0:
                    counted.long_poll()  # left while a broker held it
                if isinstance(exc, ShuttingDown):
                    return ReceiveResult([], "closing")
                raise
            except (BrokerUnavailable, BrokerTimeout, TopicNotFound) as exc:  # down, hung, or without this topic
                self._failed_now(request.topic, client, loop.time(), broker_failed=not isinstance(exc, TopicNotFound))
                last = exc
                continue
            if response.polling_full and not response.messages:
                raise TooManyRequests(f"broker {client.name} holds too many long polls; retry shortly")
            messages = list(response.messages)
            counted.answer(response)
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

    def _cover(self, key: tuple[str, str]) -> None:
        """Watch, with a Notification, each live broker where none of the group's Pops is held while some are held
        elsewhere (a down one once it is up); end the watches no longer needed."""
        held = self._held.get(key)
        watches = self._watches.get(key, {})
        for broker in list(watches):
            if not held or held.get(broker):
                watches.pop(broker).cancel()  # a has_message crossing the cancel is handed back (the client)
        if held:
            for name in self._pool.names:
                client = self._pool.get(name)
                if client is None or name in held or name in watches:
                    continue
                if not client.healthy:  # watched once its health checks see it up (a restart)
                    if (key, client.name) not in self._awaiting:
                        self._awaiting.add((key, client.name))
                        client.when_up().add_done_callback(functools.partial(self._came_up, key, client.name))
                    continue
                request = bpb.NotificationRequest(
                    topic=key[0], group=key[1], filter=self._filters.get(key, "*"), poll_ms=int(WATCH_S * 1000)
                )
                call = client.begin_notification(request, timeout_s=WATCH_S + self._timeout)
                started = asyncio.get_running_loop().time()
                call.add_done_callback(functools.partial(self._watched, key, client, started))
                watches[name] = call
        if watches:
            self._watches[key] = watches
        else:
            self._watches.pop(key, None)
            if not held:
                self._filters.pop(key, None)

    def _watched(self, key: tuple[str, str], client: BrokerClient, started: float, call: asyncio.Future[Any]) -> None:
        watches = self._watches.get(key)
        if watches is None or watches.get(client.name) is not call:
            return  # ended by `_cover`
        del watches[client.name]
        if not watches:
            del self._watches[key]
        if call.cancelled():
            return
        loop = asyncio.get_running_loop()
        error = call.exception()
        if isinstance(error, TopicNotFound):
            return  # not there under --no-auto-create: nothing to watch for (a restart does not change that)
        if error is None and call.result().has_message:
            if not self._move(key, client.name):
                client.release(call)  # no Pop to move: the broker passes the wake on to another request it holds
        elif error is not None or call.result().polling_full or loop.time() - started < WATCH_MIN_S:
            # Failed (a restart: once up again, `_cover` hears of it), refused, or not held: again a moment later,
            # so that a restarted broker's messages are not left to the end of every long poll (a review's probe).
            loop.call_later(WATCH_RETRY_S, self._cover, key)
        else:
            self._cover(key)  # held to its end: watch on

    def _came_up(self, key: tuple[str, str], broker: str, _up: asyncio.Future[None]) -> None:
        self._awaiting.discard((key, broker))
        self._cover(key)

    def _move(self, key: tuple[str, str], broker: str) -> bool:
        """Move the oldest of the group's Pops held where it holds the most to `broker`; whether one moved."""
        held = self._held.get(key)
        if not held or held.get(broker):
            return False
        for source in sorted(held, key=lambda name: len(held[name]), reverse=True):
            # the oldest still waiting (one answered already, its broker having had something, stays)
            entry = next((e for e in held[source] if not e.call.done() and e.moved_to is None), None)
            if entry is not None:
                entry.moved_to = broker
                entry.call.cancel()  # its receive makes it again there; an answer crossing this is handed back
                self._metrics.pop_moved(key[1])
                return True
        return False

    def track(self, key: tuple[str, str], broker: str, call: asyncio.Future[bpb.PopResponse], tag_filter: str) -> _Held:
        """Count a held Pop of the (topic, group) at `broker` until `untrack`: the group's Pops made elsewhere
        (a pop-with-notify run handed off to a long poll, `proxy.receive.notify_driver`) are covered and moved as this
        strategy's own are. Its `moved_to` is set when `_move` cancelled it for a broker with a message."""
        entry = _Held(call)
        if self._cover_brokers:
            self._filters[key] = tag_filter
        held = self._held.setdefault(key, {})
        at = held.setdefault(broker, {})
        at[entry] = None
        if self._cover_brokers and len(at) == 1:  # the broker's first: its watch ends, or the group's first
            self._cover(key)
        return entry

    def untrack(self, key: tuple[str, str], broker: str, entry: HeldPop) -> None:
        held = self._held.get(key)
        at = held.get(broker) if held is not None else None
        if at is None or not isinstance(entry, _Held) or at.pop(entry, False) is False:
            return
        if not at:
            del held[broker]  # type: ignore[union-attr]
            if not held:
                del self._held[key]
            if self._cover_brokers:
                asyncio.get_running_loop().call_later(COVER_DELAY_S, self._cover, key)

    async def _held_pop(
        self,
        key: tuple[str, str],
        broker: str,
        call: asyncio.Future[bpb.PopResponse],
        request: ReceiveRequest,
        closing: asyncio.Event,
    ) -> bpb.PopResponse:
        """Await a Pop, counted among the (topic, group)'s Pops held at that broker meanwhile; `_Moved` when
        `_move` moved it."""
        entry = self.track(key, broker, call, request.filter)
        try:
            return await self._close_watch.run(call, closing)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if entry.moved_to is not None and call.cancelled() and task is not None and not task.cancelling():
                raise _Moved(entry.moved_to) from None
            raise
        finally:
            self.untrack(key, broker, entry)
