"""asyncio twins of `sdk.Producer` and `sdk.SimpleConsumer`: the same methods, as coroutines.

async with Producer("127.0.0.1:8081") as producer:
    await producer.send("orders", b"hello")
async with SimpleConsumer("127.0.0.1:8081", "billing", {"orders": "*"}) as consumer:
    async for message in consumer:
        await consumer.ack(message)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
from popgate_pb.ext import messaging_pb2_grpc as ext_grpc
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from . import _resend, _session, _wire, client, errors
from ._acks import AsyncAcks
from ._base import ClientBase, ConsumerBase, ProducerBase, log_give_back_failures, receipts_so_far, send_window
from ._transport import CHANNEL_OPTIONS, channel_credentials, convert
from .message import Message, SendReceipt
from .transactions import AsyncCheckStream, AsyncTransaction

__all__ = ["Producer", "SimpleConsumer"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class _AsyncClient(ClientBase):
    _channel: grpc.aio.Channel | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    # The proxy's Session stream (sdk/_session.py), opened on first use; whether the proxy serves one: None until
    # a request tells, False once it answered UNIMPLEMENTED (then the unary RPCs serve every request).
    _session: _session.Session | None = None
    _session_served: bool | None = None

    @property
    def _stub(self) -> Any:
        # The channel binds to the running loop, so it is made on first use inside it.
        loop = asyncio.get_running_loop()
        if self._channel is not None and self._loop is not None and self._loop is not loop:
            if not self._loop.is_closed():
                raise RuntimeError(
                    "an popgate.aio client works in the event loop it was first used in, and that loop is not "
                    "closed: make one client per event loop"
                )
            # Its first loop is closed (asyncio.run again, a test per loop): that channel died with it.
            self._channel = self._session = None
        if self._channel is None:
            if self._closed:
                raise errors.Unavailable("the client is closed", retriable=False)
            creds = channel_credentials(self.options)
            target = self.options.endpoint
            if creds is None:
                self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.aio.secure_channel(target, creds, options=CHANNEL_OPTIONS)
            self._stub_ = pb_grpc.MessagingServiceStub(self._channel)  # type: ignore[no-untyped-call]
            self._ext_stub_ = ext_grpc.MessagingStub(self._channel)  # type: ignore[no-untyped-call]
            self._loop = loop
        return self._stub_

    def _orphaned(self, messages: list[Any]) -> None:
        """Messages of a receive's answer nobody waits for any more (the consumer gives them back)."""

    async def _over_session(self, kind: str, request: Any, within_s: float) -> Any:
        """The answer to `request` over the Session stream (a receive's: its frames); None when the proxy serves
        no Session (the caller then makes its unary call: nothing was served). A lost stream raises a retriable
        Unavailable and the next request opens a new one — tests/integration/sdk/test_session.py."""
        if self._session_served is False:
            return None
        _ = self._stub  # the channel, made in this loop (Unavailable once the client is closed)
        session = self._session
        if session is None or session.broken is not None:
            assert self._channel is not None
            convert_ = functools.partial(convert, tls=self.options.tls)
            session = self._session = _session.Session(self._channel, self._metadata(), convert_, self._orphaned)
        try:
            answer = await session.request(kind, request, within_s)
        except _session.Unimplemented:
            log.info("%s serves no Session stream: using the unary RPCs", self.options.endpoint)
            self._session_served = False
            return None
        self._session_served = True
        return answer

    @property
    def _ext_stub(self) -> Any:
        """popgate's extensions (proto/ext/messaging.proto), on the same channel."""
        _ = self._stub  # the channel, made in this loop
        return self._ext_stub_

    async def _retrying(self, op: Callable[[], Awaitable[T]], *, forever: bool = False) -> T:
        delays = self.options.retry.delays(forever=forever)
        while True:
            try:
                try:
                    return await op()
                except grpc.RpcError as exc:
                    if self._closed:
                        raise errors.Unavailable("the client is closed", retriable=False) from None
                    raise convert(exc, tls=self.options.tls) from None
                except asyncio.CancelledError:
                    # Closing the channel cancels its calls; only a cancellation of *this* task propagates.
                    task = asyncio.current_task()
                    if self._closed and task is not None and not task.cancelling():
                        raise errors.Unavailable("the client is closed", retriable=False) from None
                    raise
            except errors.PopgateError as exc:
                delay = next(delays, None) if exc.retriable and not self._closed else None
                if delay is None:
                    raise
                log.debug("retrying in %.3f s after %s", delay, exc)
                await asyncio.sleep(delay)

    async def close(self) -> None:
        """Close the connection; calls in progress are cancelled (a consumer's iteration just stops, after giving
        back the messages it had not yielded yet, and give-backs of cancelled receives end first)."""
        try:
            if not self._closed:
                self._closed = True
                if self._channel is not None:
                    await self._closing()
        finally:
            if self._session is not None:
                session, self._session = self._session, None
                await session.close()
            if self._channel is not None:
                channel, self._channel = self._channel, None
                if self._loop is None or not self._loop.is_closed():  # else it died with its loop
                    await channel.close()

    async def _closing(self) -> None:
        """What to do between marking the client closed and closing its channel."""

    async def __aenter__(self) -> Self:
        """The client itself; leaving the ``async with`` block closes it."""
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


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
        )
        results: list[list[SendReceipt | None] | None] = [None] * len(requests)
        in_flight = send_window(requests)
        window = asyncio.Semaphore(in_flight)

        async def one(index: int) -> None:
            async with window:
                try:
                    results[index] = list(await self._send(topic, requests[index]))
                except errors.PopgateError as exc:
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
                except BaseException:  # one failed (or the caller gave up): the batches not sent yet are not sent
                    for call in calls:
                        call.cancel()
                    raise
        except errors.PopgateError as exc:
            exc.receipts = receipts_so_far(requests, results)
            raise
        return [receipt for got in results for receipt in got or () if receipt is not None]

    async def _send(self, topic: str, request: pb.SendMessageRequest) -> list[SendReceipt]:
        async def op() -> list[SendReceipt]:
            timeout = self.options.request_timeout
            response = await self._over_session("send", request, timeout)
            if response is None:
                response = await self._stub.SendMessage(request, timeout=timeout, metadata=self._metadata())
            return _wire.send_receipts(topic, request, response)

        return await self._retrying(op)

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Withdraw a scheduled message before its delivery time; see `sdk.Producer.recall`."""
        request = _wire.recall_request(topic, recall_handle, namespace=self.options.namespace)

        async def op() -> str:
            call = self._stub.RecallMessage(request, timeout=self.options.request_timeout, metadata=self._metadata())
            response = await call
            _wire.check(response.status)
            return str(response.message_id)

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

        async def op() -> None:
            call = self._stub.EndTransaction(request, timeout=self.options.request_timeout, metadata=self._metadata())
            _wire.check((await call).status)

        await self._retrying(op)

    async def __aenter__(self) -> Self:
        """The producer; with a ``checker``, its check stream starts here (and stops at the end of the block)."""
        if self._checker is not None and getattr(self, "_checks", None) is None:
            self._checks = AsyncCheckStream(self, self._checker, self._topics)
            self._checks.start()
        return self

    async def _closing(self) -> None:
        if getattr(self, "_checks", None) is not None:
            await self._checks.close()


class SimpleConsumer(ConsumerBase, _AsyncClient):
    """asyncio SimpleConsumer; arguments and behaviour as `sdk.SimpleConsumer` (``async for`` iterates).

    A `receive` cancelled while its answer comes in gives back the messages it had read, in a task of its
    own that `close` (and the end of `asyncio.run`) waits for.
    """

    async def receive(
        self, *, max: int | None = None, invisible: float | None = None, wait: float | None = None
    ) -> list[Message]:
        """Receive up to ``max`` messages, long-polling up to ``wait`` seconds; see `sdk.SimpleConsumer.receive`."""
        return await self._retrying(lambda: self._receive_once(max, invisible, wait))

    async def _receive_once(self, max: int | None, invisible: float | None, wait: float | None) -> list[Message]:
        request, timeout = self._receive_plan(max, invisible, wait)
        # Cancelled while its answer comes in, a receive on the Session stream gives back what it had read and what
        # still comes (`_orphaned`); on the RPCs, `_read` does.
        frames = await self._over_session("receive", request, timeout)
        if frames is not None:
            self._batch_receive = True
            return _wire.received(frames)
        metadata = self._metadata()
        if self._batch_receive is not False:  # many messages per frame, where the proxy serves it
            try:
                messages = await self._read(self._ext_stub.ReceiveMessages(request, timeout=timeout, metadata=metadata))
            except grpc.RpcError as exc:
                if not self._batch_unimplemented(exc):
                    raise
            else:
                self._batch_receive = True
                return messages
        return await self._read(self._stub.ReceiveMessage(request, timeout=timeout, metadata=metadata))

    async def _read(self, call: AsyncIterator[Any]) -> list[Message]:
        """The messages of a receive's answer (either framing)."""
        frames: list[Any] = []
        try:
            async for frame in call:
                frames.append(frame)
        except asyncio.CancelledError:
            # Cancelled mid-answer: the messages read so far reach no one; give them back in the background (this
            # task is being cancelled) rather than leave them invisible for `invisible`.
            await self._give_back_later(_wire.received(f for f in frames if f.WhichOneof("content") != "status"))
            raise
        return _wire.received(frames)

    def __aiter__(self) -> AsyncIterator[Message]:
        """Messages as they come, long-polling forever (``async for``); see `sdk.SimpleConsumer.__iter__`."""
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        while not self._closed:
            try:
                batch = await self._retrying(lambda: self._receive_once(None, None, self._iteration_wait), forever=True)
            except errors.PopgateError:
                if self._closed:
                    return
                raise
            key = self._unyielded.start(batch)
            try:
                while not self._closed and (message := self._unyielded.next(key)) is not None:
                    yield message
            finally:  # also at `break` (the generator is closed: aclose()), an error in the loop's body, or close()
                await self._give_back(self._unyielded.end(key))

    async def _closing(self) -> None:
        await self._give_back(self._unyielded.take_all())  # what iterations in progress had not yielded yet
        await self._given_back()
        if self._shutdown_guard is not None:
            await self._shutdown_guard.aclose()

    def _open(self) -> None:
        # No connection yet (made on first use, inside the loop): only the give-backs and the acks not waited for
        # running in the background.
        self._giving_back: set[asyncio.Future[None]] = set()
        self._unwaited = AsyncAcks(log)
        self._shutdown_guard: AsyncGenerator[None, None] | None = None

    async def close(self) -> None:
        """Close the connection, once the acks not waited for have ended (at most 10 s); see `_AsyncClient.close`."""
        try:
            if not self._closed:
                await self._unwaited.stop()
        finally:
            await super().close()

    async def _give_back_later(self, messages: list[Message]) -> None:
        """`_give_back` in a task of its own (the caller is being cancelled), held until done and awaited by
        `close` and by the loop's shutdown."""
        if not messages or self._closed:
            return
        task = asyncio.ensure_future(self._give_back(messages))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)
        if self._shutdown_guard is None:
            self._shutdown_guard = self._awaited_at_shutdown()
            await anext(self._shutdown_guard)  # runs to its `yield` at once: no suspension in a cancelled task

    async def _awaited_at_shutdown(self) -> AsyncGenerator[None, None]:
        # asyncio.run cancels the loop's tasks, then closes every open async generator (loop.shutdown_asyncgens),
        # then closes the loop. A give-back started by a task it cancelled is not among those tasks, and a closed
        # loop would destroy it pending ("Task was destroyed but it is pending!"); this generator, open from the
        # first give-back on, has the shutdown wait for them.
        try:
            yield
        finally:
            await self._given_back()

    async def _given_back(self) -> None:
        """Wait for the give-backs running in the background (each ends within its deadline)."""
        if self._giving_back:
            await asyncio.wait(self._giving_back)

    async def _give_back(self, messages: list[Message]) -> None:
        """Make received messages that nobody will handle ready again at once; see `sdk.SimpleConsumer._give_back`."""
        if not messages:
            return
        if self._channel is None:  # closed, or never connected
            return
        timeout = self._give_back_timeout
        calls = [self._change_invisible(request, timeout) for request in self._give_back_plan(messages)]
        # Never raised out of an iteration's end or close(); a call the channel's close cancelled is a failure too.
        answers = await asyncio.gather(*calls, return_exceptions=True)
        log_give_back_failures(log, answers)

    def _orphaned(self, messages: list[Any]) -> None:
        if not self._closed:  # once closed, the proxy gives back what the closed stream left unanswered
            task = asyncio.ensure_future(self._give_back_later([_wire.from_v2(m) for m in messages]))
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)

    async def _change_invisible(
        self, request: pb.ChangeInvisibleDurationRequest, within_s: float
    ) -> pb.ChangeInvisibleDurationResponse:
        response = await self._over_session("change_invisible", request, within_s)
        if response is None:
            response = await self._stub.ChangeInvisibleDuration(request, timeout=within_s, metadata=self._metadata())
        return response  # type: ignore[no-any-return]

    async def ack(self, message: Message, *, wait: bool = True) -> None:
        """Acknowledge one message; see `sdk.SimpleConsumer.ack`."""
        if not wait:
            await self.ack_many([message], wait=False)
            return
        failures = await self._ack(self._ack_plan([message]))
        if failures:
            raise failures[0][1]

    async def ack_many(self, messages: Iterable[Message], *, wait: bool = True) -> None:
        """Acknowledge many messages in batched calls; see `sdk.SimpleConsumer.ack_many`."""
        plan = self._ack_plan(messages)  # a bad argument raises here, to the caller, waiting or not
        if not wait:
            await self._unwaited.start(lambda: self._ack(plan), sum(len(r.entries) for r in plan))
            return
        failures = await self._ack(plan)
        if failures:
            raise errors.AckError(failures)

    async def _ack(self, plan: list[pb.AckMessageRequest]) -> list[tuple[str, errors.PopgateError]]:
        pending = [_resend.PendingAck(request) for request in plan]
        if len(pending) == 1:  # no task for the one call of most acks
            return await self._ack_request(pending[0])
        results = await asyncio.gather(*(self._ack_request(one) for one in pending))
        return [failure for chunk in results for failure in chunk]

    async def _ack_request(self, pending: _resend.PendingAck) -> list[tuple[str, errors.PopgateError]]:
        async def op() -> list[tuple[str, errors.PopgateError]]:
            request = pending.next_request()
            timeout = self.options.request_timeout
            response = await self._over_session("ack", request, timeout)
            if response is None:
                response = await self._stub.AckMessage(request, timeout=timeout, metadata=self._metadata())
            return pending.read(response)

        try:
            return await self._retrying(op)
        except errors.PopgateError as exc:
            return pending.given_up(exc)

    async def nack(self, message: Message, delay: float = 0.0) -> Message:
        """Deliver the message again after ``delay`` seconds, replacing its handle; see `sdk.SimpleConsumer.nack`."""
        request = _wire.change_invisible_request(self.group, message, delay, namespace=self.options.namespace)
        attempts = itertools.count(1)

        async def op() -> str:
            resent = next(attempts) > 1
            response = await self._change_invisible(request, self.options.request_timeout)
            return _resend.new_handle(response, resent=resent)

        message.receipt_handle = await self._retrying(op)
        return message

    async def forward_to_dlq(self, message: Message) -> None:
        """Move the message to ``%DLQ%<group>`` now; see `sdk.SimpleConsumer.forward_to_dlq`."""
        request = _wire.dlq_request(self.group, message, namespace=self.options.namespace)
        attempts = itertools.count(1)

        async def op() -> None:
            resent = next(attempts) > 1
            response = await self._stub.ForwardMessageToDeadLetterQueue(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            _resend.dead_lettered(response, resent=resent)

        await self._retrying(op)


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
