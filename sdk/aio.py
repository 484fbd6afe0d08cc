"""asyncio twins of `sdk.Producer` and `sdk.SimpleConsumer`: the same methods, as coroutines.

async with Producer("127.0.0.1:8081") as producer:
    await producer.send("orders", b"hello")
async with SimpleConsumer("127.0.0.1:8081", "billing", {"orders": "*"}) as consumer:
    async for message in consumer:
        await consumer.ack(message)

The Producer is here; the SimpleConsumer is in `_aio_consumer`, their connection, Session stream and retries in
`_aio_client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Self

from . import _resend, _waiting, _wire, client, errors
from ._aio_client import _AsyncClient, answered
from ._aio_consumer import SimpleConsumer
from ._base import ProducerBase, receipts_so_far, send_window
from .message import Message, SendReceipt
from .transactions import AsyncCheckStream, AsyncTransaction

__all__ = ["Producer", "SimpleConsumer"]


_Attempt = Callable[[], AbstractContextManager[None]]  # wraps each attempt of one send_many call

NOT_RESENT = "not sent again: another call of the same send_many failed"


class Producer(ProducerBase, _AsyncClient):
    """asyncio Producer; arguments and behaviour as `sdk.Producer`."""

    async def send(
        self,
        topic: str,
        body: bytes | str | Message,
        *,
        tag: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        delay: float | None = None,
        deliver_at: float | None = None,
        message_group: str | None = None,
        priority: int | None = None,
    ) -> SendReceipt:
        """Send one message; see `sdk.Producer.send`."""
        receipts = await self.send_many(
            topic,
            [body],
            tag=tag,
            keys=keys,
            properties=properties,
            delay=delay,
            deliver_at=deliver_at,
            message_group=message_group,
            priority=priority,
        )
        return receipts[0]

    async def send_many(
        self,
        topic: str,
        messages: Iterable[bytes | str | Message],
        *,
        tag: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        delay: float | None = None,
        deliver_at: float | None = None,
        message_group: str | None = None,
        priority: int | None = None,
    ) -> list[SendReceipt]:
        """Send many messages in batched calls, several in flight; see `sdk.Producer.send_many`."""
        requests = self._plan(
            topic,
            messages,
            tag=tag,
            keys=keys,
            properties=properties,
            delay=delay,
            deliver_at=deliver_at,
            message_group=message_group,
            priority=priority,
            shared=self._may_serve("_shared_served") and self._may_serve("_session_served"),
        )
        results: list[list[SendReceipt | None] | None] = [None] * len(requests)
        in_flight = send_window(requests)
        window = asyncio.Semaphore(in_flight)
        flight = _Flight()

        async def one(index: int) -> None:
            async with window:
                try:
                    results[index] = list(await self._send(topic, requests[index], flight.attempt(index)))
                except BaseException as exc:
                    flight.stopped = True  # before the window lets the next call in
                    if isinstance(exc, errors.PopgateError):
                        results[index] = exc.receipts  # those of a partly stored request, else None
                    raise

        try:
            if len(requests) == 1 or in_flight == 1:  # one after another: a failed batch stops the rest
                for index in range(len(requests)):
                    await one(index)
            else:
                calls = [asyncio.ensure_future(one(i)) for i in range(len(requests))]
                try:
                    await asyncio.gather(*calls)
                except Exception:  # one failed: the calls not on their way are not made, those on their way end
                    await flight.settle(calls)
                    raise
                except BaseException:  # the caller gave up
                    for call in calls:
                        call.cancel()
                    raise
        except errors.PopgateError as exc:
            exc.receipts = receipts_so_far(requests, results)
            raise
        return [receipt for got in results for receipt in got or () if receipt is not None]

    async def _send(
        self, topic: str, request: _wire.SendPlan, attempt: _Attempt = contextlib.nullcontext
    ) -> list[SendReceipt]:
        async def op() -> list[SendReceipt]:
            with attempt():
                return await self._send_once(topic, request)

        return await self._retrying(op)

    async def _send_once(self, topic: str, request: _wire.SendPlan) -> list[SendReceipt]:
        timeout = self.options.request_timeout
        response = None
        if isinstance(request, _wire.SharedSend) and self._shared_served is not False:
            try:
                response = await self._over_session("send_shared", request, timeout)
                if response is not None:
                    self._shared_served = True
            except _waiting.KindUnknown:
                self._not_served("_shared_served", "%s's Session takes no SendShared: sending SendMessage")
        if response is None:
            v2_request = request.as_v2() if isinstance(request, _wire.SharedSend) else request
            response = await self._over_session("send", v2_request, timeout)
            if response is None:
                call = self._stub.SendMessage(v2_request, timeout=timeout, metadata=self._metadata())
                response = answered(await call)
        return _wire.send_receipts(topic, request, response)

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Withdraw a scheduled message before its delivery time; see `sdk.Producer.recall`."""
        request = _wire.recall_request(topic, recall_handle, namespace=self.options.namespace)
        attempts = itertools.count(1)

        async def op() -> str:
            resent = next(attempts) > 1
            call = self._stub.RecallMessage(request, timeout=self.options.request_timeout, metadata=self._metadata())
            return _resend.recalled(answered(await call), resent=resent)

        return await self._retrying(op)

    def transaction(self) -> AsyncTransaction:
        """A transaction (``async with``): commits when the block ends, rolls back when it raises; see
        `sdk.Producer.transaction`."""
        return AsyncTransaction(self)

    async def _send_half(self, topic: str, body: bytes | str | Message, **options: Any) -> SendReceipt:
        plan = self._plan(topic, [body], delay=None, deliver_at=None, message_group=None, transactional=True, **options)
        return (await self._send(topic, plan[0]))[0]

    async def _end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool | None, *, from_check: bool
    ) -> None:
        namespace = self.options.namespace
        request = _wire.end_transaction_request(
            topic, message_id, transaction_id, commit, from_check=from_check, namespace=namespace
        )

        attempts = itertools.count(1)

        async def op() -> None:
            resent = next(attempts) > 1
            response = await self._end_over_session(request)
            if response is None:
                timeout = self.options.request_timeout
                response = answered(
                    await self._stub.EndTransaction(request, timeout=timeout, metadata=self._metadata())
                )
            _resend.transaction_ended(response, resent=resent, commit=commit)

        await self._retrying(op)

    async def _end_over_session(self, request: Any) -> Any:
        """EndTransaction over the Session stream (a frame, not a call); None where the proxy serves it only as the
        unary call (no Session, or one older than this request) — tests/integration/sdk/test_session.py::
        test_transactions_end_over_the_session_stream."""
        if self._ends_served is False:
            return None
        try:
            response = await self._over_session("end_transaction", request, self.options.request_timeout)
        except _waiting.KindUnknown:
            self._not_served("_ends_served", "%s's Session takes no EndTransaction: calling it")
            return None
        if response is not None:
            self._ends_served = True
        return response

    async def __aenter__(self) -> Self:
        """The producer; with a ``checker``, its check stream starts here (and stops at the end of the block)."""
        if self._checker is not None and getattr(self, "_checks", None) is None:
            self._checks = AsyncCheckStream(self, self._checker, self._topics)
            self._checks.start()
        return self

    async def _closing(self) -> None:
        if getattr(self, "_checks", None) is not None:
            await self._checks.close()


class _Flight:
    """One send_many's calls: which have an attempt on its way, and whether a failure stopped the others.

    Once a call failed, a call with no attempt on its way is not made (or not retried); one on its way is
    awaited, so that what it stored is reported — tests/unit/sdk/test_send_many.py::
    test_the_asyncio_producer_reports_what_its_calls_on_their_way_stored_after_one_is_refused."""

    def __init__(self) -> None:
        self.stopped = False
        self._on_way: set[int] = set()

    def attempt(self, index: int) -> _Attempt:
        @contextlib.contextmanager
        def attempting() -> Iterator[None]:
            if self.stopped:
                raise errors.Unavailable(NOT_RESENT, retriable=False)
            self._on_way.add(index)
            try:
                yield
            finally:
                self._on_way.discard(index)

        return attempting

    async def settle(self, calls: Sequence[asyncio.Future[None]]) -> None:
        """After a call failed: cancel the calls with nothing on its way, let the others end (each within its
        request timeout, with no retry)."""
        self.stopped = True
        for index, call in enumerate(calls):
            if index not in self._on_way:
                call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


def _twin_docs() -> None:
    """Each coroutine gets its blocking twin's whole docstring (Args, Returns, Raises) after its own first line:
    ``help()`` on an asyncio method shows what the one in `popgate.client` does."""
    for twin, blocking in ((Producer, client.Producer), (SimpleConsumer, client.SimpleConsumer)):
        for name in ("send", "send_many", "receive", "ack", "ack_many", "nack", "forward_to_dlq", "close"):
            method, original = getattr(twin, name, None), getattr(blocking, name, None)
            if method is None or original is None or not method.__doc__ or not original.__doc__:
                continue
            first, _, _ = method.__doc__.partition("\n\n")  # each one's first paragraph (its summary)
            _, _, rest = original.__doc__.partition("\n\n")
            method.__doc__ = first + ("\n\n" + rest if rest else "")


_twin_docs()
