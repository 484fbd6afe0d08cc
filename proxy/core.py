"""The protocol-neutral proxy: routing, fail-over and receive, over `BrokerClient`s. Imports no gRPC.

Input arrives already validated and converted to the broker protocol's messages by
the v2 edge (`proxy.v2`); errors leave as `popgate_contract.errors.DomainError`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors, trailer
from proxy.consumers import ConsumerBook
from proxy.outgoing import Run, runs_of
from proxy.ports import BrokerClient, Metrics, NoMetrics
from proxy.receive.announce import Announcer
from proxy.receive.over_max import PopCuts
from proxy.receive.seam import ReceiveRequest, ReceiveResult, ReceiveStrategy
from proxy.renewal import Renewer
from proxy.renewal_book import RenewalLimits
from proxy.routing import BrokerPool
from proxy.sending import Sender

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueueRoute:
    broker: str
    queue_id: int


REPLY_RESERVE_S = 0.1  # a unary answer's time to reach the client before its deadline
MIN_BROKER_CALL_S = 0.05  # a broker call gets at least this much, even when the client's time is nearly up
ANSWER_OVERHEAD = 1024  # the same for a received message waiting to be written (its frame, handle, ids)


class Proxy:
    def __init__(
        self,
        pool: BrokerPool,
        strategy: ReceiveStrategy,
        *,
        queues_per_broker: int = 4,
        broker_timeout_s: float = 3.0,
        max_held_receives: int = 10_000,
        send_chunk_bytes: int = 8 * 1024 * 1024,
        max_send_bytes: int = 256 * 1024 * 1024,
        max_answer_bytes: int = 256 * 1024 * 1024,
        metrics: Metrics | None = None,
        renewer: Renewer | None = None,
    ) -> None:
        self.pool = pool
        # auto_renew handles renewed while their client is alive (proxy.renewal); started by whoever runs the proxy.
        self.renewer = renewer or Renewer(pool, RenewalLimits(period_s=20.0), invisible_ms=60_000, metrics=metrics)
        self.strategy = strategy
        self.closing = asyncio.Event()
        self._queues = queues_per_broker
        self._timeout = broker_timeout_s
        self.metrics = metrics or NoMetrics()
        self._max_held = max_held_receives
        self._held = 0  # receives in progress: bounded, so overload is TOO_MANY_REQUESTS, not memory
        self._announcer = Announcer(timeout_s=broker_timeout_s)  # groups announced to brokers (proxy.receive.announce)
        self.sender = Sender(
            pool, self._announcer, self._timeout_until, chunk_bytes=send_chunk_bytes, max_bytes=max_send_bytes
        )
        self.consumers = ConsumerBook()  # live consumers, reported to every broker (proxy.consumers)
        # Messages received and not yet written to their clients (a client that does not read keeps them):
        # such a receive still counts in `_held`, and past this many bytes new receives are refused.
        self._max_answer_bytes = max_answer_bytes
        self._answer_bytes = 0
        self.cuts = PopCuts(pool, timeout_s=broker_timeout_s)

    def close(self) -> None:
        """Stop taking new long polls; held receives answer at once (empty)."""
        self.closing.set()
        self._announcer.close()

    def route(self) -> list[QueueRoute]:
        """The queues clients see: `queues_per_broker` on every live broker (topics auto-create on send)."""
        live = self.pool.live()
        if not live:
            raise errors.BrokerUnavailable("no broker is live; the proxy cannot route any topic")
        return [QueueRoute(c.name, q) for c in live for q in range(self._queues)]

    def _timeout_until(self, deadline: float | None) -> float:
        """A broker call's time: `broker_timeout_s`, cut so that the proxy answers (PROXY_TIMEOUT at worst)
        before the client's deadline (`deadline`, loop time) instead of the client giving up first."""
        if deadline is None:
            return self._timeout
        left = deadline - asyncio.get_running_loop().time() - REPLY_RESERVE_S
        return max(MIN_BROKER_CALL_S, min(self._timeout, left))

    async def send(self, messages: Sequence[bpb.Message], *, deadline: float | None = None) -> list[bpb.SendResult]:
        """`send_runs` of broker messages."""
        return await self.send_runs(runs_of(messages), deadline=deadline)

    async def send_runs(
        self, runs: Sequence[Run], *, deadline: float | None = None, admitted: bool = False
    ) -> list[bpb.SendResult]:
        """Store the runs' messages; results in request order. Messages of one message group go to one broker.
        `deadline`: the client's (loop time), when it has one."""
        if self.closing.is_set():
            raise errors.ShuttingDown("the proxy is shutting down")
        return await self.sender.send_runs(runs, deadline, admitted=admitted)

    def check_send_room(self, messages: Sequence[Message]) -> int:
        """`Sender.check_room`: what the edge asks before it converts a request."""
        return self.sender.check_room(messages)

    def check_send_bytes(self, held_bytes: int, count: int) -> int:
        """`Sender.check_bytes`."""
        return self.sender.check_bytes(held_bytes, count)

    def deleted(self, *, topic: str = "", group: str = "") -> None:
        """An admin deleted `group` (on `topic`, or every topic) or the whole `topic`: no longer announced."""
        self._announcer.seen.forget(topic=topic, group=group)

    def broker_up(self, client: BrokerClient) -> None:
        """`client`'s broker came up (added, moved, or back from down): told of the consumer groups this proxy
        received most recently, so that each starts there as on the other brokers (proxy.receive.announce),
        watched by the receives held now (`ReceiveStrategy.broker_up`: a broker discovery adds is not left unwatched
        until they end), and back in the send rotation if its sends timed out in a row before (`Sender.broker_up`)."""
        self.sender.broker_up(client.name)
        if not self.closing.is_set():
            self._announcer.broker_up(client)
            self.strategy.broker_up(client.name)

    async def receive(self, request: ReceiveRequest) -> ReceiveResult:
        if self.closing.is_set():
            return ReceiveResult([], "closing")
        started = time.perf_counter()
        outcome = "error"
        held = False  # this call counts in `_held` (an answer with messages takes that over: `_account`)
        try:
            self._admit()
            held = True
            self._announcer.received(request.topic, request.group, request.filter, self.pool.live())
            result = await self.strategy.receive(request, self.closing)
            if len(result.messages) > request.batch:  # a broker's answer past its Pop's max (proxy.receive.over_max)
                self.cuts.cut(request, result)
            outcome = result.outcome
            if result.messages:
                self._account(result)
                held = False
            return result
        except errors.TooManyRequests:
            outcome = "full"
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"  # the client went away (or the call's deadline passed)
            raise
        finally:
            if held:
                self._held -= 1
            seconds = time.perf_counter() - started
            self.metrics.receive(request.group, self.strategy.mode, outcome, seconds, request=request)

    def not_read(self, group: str) -> None:
        """An answer of `group` was not read by its client within its write deadline (docs/PROXY.md)."""
        self.metrics.answer_not_read(group)

    def refused(self, group: str, error: errors.DomainError) -> None:
        """A receive of `group` refused for its poll time before it was served (`proxy.receive.polltime`): counted, as
        `behind` when its deadline left no time to poll because the proxy is behind (TOO_MANY_REQUESTS), else as
        `illegal_polling_time` (a negative poll time, or a request timeout too short to poll)."""
        outcome = "behind" if isinstance(error, errors.TooManyRequests) else "illegal_polling_time"
        self.metrics.receive(group, self.strategy.mode, outcome, 0.0)

    def _admit(self) -> None:
        """Count one more receive in `_held`, or TooManyRequests: too many held, or too many bytes unread."""
        if self._held >= self._max_held:
            raise errors.TooManyRequests(f"the proxy already holds {self._held} receives; retry shortly")
        if self._answer_bytes >= self._max_answer_bytes:
            raise self._unread_answers()
        self._held += 1

    def _account(self, result: ReceiveResult) -> None:
        """An answer with messages: it stays held, and its bytes count, until its caller releases it (written, or
        the client gone), so a client that does not read cannot make the proxy keep answers without bound. Past
        the limit its messages go back to their broker instead, and TooManyRequests (the receive still held)."""
        sizes = result.body_sizes()
        size = sum(sizes) + ANSWER_OVERHEAD * len(sizes)
        if self._answer_bytes and self._answer_bytes + size > self._max_answer_bytes:
            # Held before the limit was reached, answered after (one answer alone always fits): the limit holds for
            # the answers of receives already held too, not only at admission —
            # tests/unit/proxy/test_core_receive.py::
            # test_a_receive_held_before_the_answer_limit_and_answered_after_it_gives_its_messages_back
            result.give_back()
            result.release()
            raise self._unread_answers()
        self._answer_bytes += size
        inner = result.release
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._held -= 1
                self._answer_bytes -= size
                inner()

        def keep_only(frame: range) -> None:
            nonlocal size
            if not released:
                kept = sum(sizes[i] + ANSWER_OVERHEAD for i in frame if 0 <= i < len(sizes))
                self._answer_bytes -= size - kept
                size = kept

        result.release = release
        result.keep_only = keep_only

    def _unread_answers(self) -> errors.TooManyRequests:
        return errors.TooManyRequests(
            f"the proxy holds {self._answer_bytes} bytes of messages its clients have not read; retry shortly"
        )

    async def ack(
        self, topic: str, group: str, handles: Sequence[str], *, deadline: float | None = None
    ) -> list[errors.DomainError | None]:
        """Ack each handle at the broker it names; per handle None (acked) or the error. Renewal of a handle stops
        once its ack is answered, unless it failed retriably (the client acks again: meanwhile the message stays
        invisible) — test_core.py::test_a_handle_whose_ack_failed_retriably_goes_on_being_renewed."""
        outcome: list[errors.DomainError | None] = [None] * len(handles)

        async def one(client: BrokerClient, indexes: list[int]) -> None:
            request = bpb.AckRequest(topic=topic, group=group, receipt_handles=[handles[i] for i in indexes])
            response = await client.ack(request, timeout_s=self._timeout_until(deadline))
            for i, result in zip(indexes, response.results, strict=False):
                if not result.ok:
                    outcome[i] = trailer.from_broker(result.error, result.error_message, broker=client.name)
            for i in indexes[len(response.results) :]:
                outcome[i] = errors.BrokerFailure(f"broker {client.name} returned no result for this handle")

        try:
            await self._per_broker(handles, outcome, one)
        finally:
            self.renewer.forget(h for h, error in zip(handles, outcome, strict=True) if not _retriable(error))
        return outcome

    async def _per_broker(
        self,
        handles: Sequence[str],
        outcome: list[Any],
        one: Callable[[BrokerClient, list[int]], Awaitable[None]],
    ) -> None:
        """`one` of each broker and the indexes of its handles, the brokers asked at once; a handle no broker takes,
        and every handle of a broker whose `one` raised, gets its error in `outcome`."""
        by_broker, refused = self.pool.by_broker(handles)
        for index, error in refused:
            outcome[index] = error

        async def guarded(client: BrokerClient, indexes: list[int]) -> None:
            try:
                await one(client, indexes)
            except errors.DomainError as exc:
                for i in indexes:
                    outcome[i] = exc

        if len(by_broker) == 1:  # awaited in place: a task per call only where brokers are asked at once
            [(client, indexes)] = by_broker.values()
            await guarded(client, indexes)
        else:
            await asyncio.gather(*(guarded(client, indexes) for client, indexes in by_broker.values()))

    async def change_invisible(
        self, topic: str, group: str, handle: str, invisible_ms: int, *, deadline: float | None = None
    ) -> str:
        """A new receipt handle, invisible for `invisible_ms` from now (the client chose: no more renewal)."""
        client = self.pool.for_handle(handle)
        self.renewer.forget((handle,))
        request = bpb.ChangeInvisibleTimeRequest(
            topic=topic, group=group, receipt_handle=handle, invisible_ms=invisible_ms
        )
        response = await client.change_invisible_time(request, timeout_s=self._timeout_until(deadline))
        return response.receipt_handle

    async def change_invisible_many(
        self,
        topic: str,
        group: str,
        handles: Sequence[str],
        invisible_ms: int,
        *,
        deadline: float | None = None,
        undelivered: bool = False,
    ) -> list[str | errors.DomainError]:
        """`change_invisible` of each handle at the broker it names, one request a broker: per handle its new receipt
        handle or the error (the client chose: no more renewal of any) —
        tests/unit/proxy/test_change_many.py::test_handles_of_two_brokers_are_changed_one_request_each_in_order.
        `undelivered`: given back not counted as a delivery (ChangeInvisibleTimesRequest.undelivered)."""
        outcome: list[str | errors.DomainError] = [""] * len(handles)
        self.renewer.forget(handles)

        async def one(client: BrokerClient, indexes: list[int]) -> None:
            request = bpb.ChangeInvisibleTimesRequest(
                topic=topic,
                group=group,
                receipt_handles=[handles[i] for i in indexes],
                invisible_ms=invisible_ms,
                undelivered=undelivered,
            )
            changed = await client.change_invisible_times(request, timeout_s=self._timeout_until(deadline))
            for i, result in zip(indexes, changed, strict=True):
                outcome[i] = result

        await self._per_broker(handles, outcome, one)
        return outcome

    async def dead_letter(
        self, topic: str, group: str, handle: str, message_id: str = "", *, deadline: float | None = None
    ) -> None:
        client = self.pool.for_handle(handle)
        self.renewer.forget((handle,))
        request = bpb.DeadLetterRequest(topic=topic, group=group, receipt_handle=handle, message_id=message_id)
        await client.dead_letter(request, timeout_s=self._timeout_until(deadline))


def _retriable(error: errors.DomainError | None) -> bool:
    return error is not None and error.retriable
