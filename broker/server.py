"""The broker's gRPC edge: request → core call → response, and the one error table."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

from broker import errors
from broker.budget import ByteBudget
from broker.core import BrokerCore
from broker.longpoll import Kind
from broker.metrics import BrokerMetrics
from broker.model import PopResult, now_ms

log = logging.getLogger(__name__)

ERROR_KEY = "popgate-error"
WRITER_DRAIN_S = 5.0
SESSION_SETTLE_S = 5.0  # a stopping broker waits this long at most for a Session's requests in progress

# Domain error → gRPC status code. The most specific class wins (checked via the MRO).
STATUS_OF: dict[type[errors.BrokerError], grpc.StatusCode] = {
    errors.BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.TopicNotFound: grpc.StatusCode.NOT_FOUND,
    errors.TooManyRequests: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.BrokerError: grpc.StatusCode.INTERNAL,
}


def status_of(exc: errors.BrokerError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


def rpc(method: str) -> Callable[[Handler[Req, Resp]], Handler[Req, Resp]]:
    """Time the call, map domain errors to a status (+ trailing error name), never let anything escape."""

    def wrap(fn: Handler[Req, Resp]) -> Handler[Req, Resp]:
        @functools.wraps(fn)
        async def call(self: BrokerServicer, request: Req, context: grpc.aio.ServicerContext) -> Resp:
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                return await fn(self, request, context)
            except errors.BrokerError as exc:
                code = status_of(exc)
                context.set_trailing_metadata(((ERROR_KEY, exc.name),))
                await context.abort(code, exc.message)
            except Exception as exc:
                if isinstance(exc, grpc.aio.AbortError):
                    raise
                code = grpc.StatusCode.INTERNAL
                log.exception("%s failed", method)
                await context.abort(code, f"internal error in {method}: {type(exc).__name__}")
            finally:
                self.metrics.rpc_duration.labels(method, code.name).observe(time.perf_counter() - started)
            raise AssertionError("unreachable")

        return call

    return wrap


class BrokerServicer(pb_grpc.BrokerServicer):
    def __init__(self, core: BrokerCore, metrics: BrokerMetrics) -> None:
        self.core = core
        self.metrics = metrics
        self.stopping = asyncio.Event()  # set on SIGTERM: Session streams end (see Session)
        # Unary Pop answers until their RPC ends: a caller that stops reading keeps its answers in grpc's buffers.
        self.pop_answers = ByteBudget(
            core.settings.max_pop_answer_bytes, what="bytes of Pop answers not taken", setting="--max-pop-answer-bytes"
        )

    @rpc("Send")
    async def Send(self, request: pb.SendRequest, context: grpc.aio.ServicerContext) -> pb.SendResponse:
        out = pb.SendResponse()
        await send(self.core, request, out)
        return out

    @rpc("Pop")
    async def Pop(self, request: pb.PopRequest, context: grpc.aio.ServicerContext) -> pb.PopResponse:
        if self.pop_answers.full():
            raise self.pop_answers.refusal()  # before anything is popped
        out = pb.PopResponse()
        result = await pop(self.core, request, out)
        if result.messages:
            popped = result.messages
            size = sum(len(p.payload) for p in popped) + POPPED_OVERHEAD * len(popped)
            if not self.pop_answers.fits(size):  # Pops taken together while there was room: this one is too many
                self.core.release(request.topic, request.group, [p.handle for p in popped])  # ready again at once
                raise self.pop_answers.refusal(size)
            self.pop_answers.take(size)
            context.add_done_callback(lambda _: self.pop_answers.give(size))
        return out

    async def Session(
        self, request_iterator: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> None:
        session = _Session(self, self.core.settings.max_held)

        async def write() -> None:
            while (item := await session.outbox.get()) is not None:
                response, size = item
                await context.write(response)
                session.written(size)

        async def read() -> None:
            async for request in request_iterator:
                session.dispatch(request)
                if session.outbox_bytes > SESSION_MAX_OUTBOX_BYTES:
                    # The caller reads its answers slower than it asks: stop reading its requests (HTTP/2
                    # flow control then holds it back) until the answers it has not taken fit again.
                    await session.room.wait()

        loop = asyncio.get_running_loop()
        writer = loop.create_task(write())
        reader = loop.create_task(read())
        stopping = loop.create_task(self.stopping.wait())
        try:
            await asyncio.wait((reader, stopping), return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                # The broker is stopping (its held requests are being answered): read no more requests, let
                # those taken finish, then end the stream. Left open, it would take requests for the whole
                # shutdown grace; a proxy's requests written meanwhile fail with UNAVAILABLE, unread, and it
                # fails over at once.
                reader.cancel()
                await session.settle(SESSION_SETTLE_S)
            elif not reader.cancelled() and (exc := reader.exception()) is not None:
                raise exc
        finally:
            reader.cancel()
            stopping.cancel()
            # The caller closed its side or went away: nothing pending on this stream survives it.
            # The writer is never cancelled mid-write (grpc core would then lose the final status):
            # it finishes what is queued and stops at the end marker.
            await session.close()
            session.outbox.put_nowait(None)
            session.room.set()
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError, TimeoutError):
                await asyncio.wait_for(writer, WRITER_DRAIN_S)

    @rpc("Ack")
    async def Ack(self, request: pb.AckRequest, context: grpc.aio.ServicerContext) -> pb.AckResponse:
        out = pb.AckResponse()
        await ack(self.core, request, out)
        return out

    @rpc("ChangeInvisibleTime")
    async def ChangeInvisibleTime(
        self, request: pb.ChangeInvisibleTimeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ChangeInvisibleTimeResponse:
        out = pb.ChangeInvisibleTimeResponse()
        await change_invisible(self.core, request, out)
        return out

    @rpc("Notification")
    async def Notification(
        self, request: pb.NotificationRequest, context: grpc.aio.ServicerContext
    ) -> pb.NotificationResponse:
        out = pb.NotificationResponse()
        await notification(self.core, request, out)
        return out

    @rpc("DeadLetter")
    async def DeadLetter(
        self, request: pb.DeadLetterRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeadLetterResponse:
        stored = await self.core.dead_letter(request.topic, request.group, request.receipt_handle)
        return pb.DeadLetterResponse(dlq_topic=stored.message.topic, offset=stored.offset)

    @rpc("Stats")
    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        core = self.core
        response = pb.StatsResponse(
            broker=core.name,
            held_pops=core.hold.held[Kind.POP],
            held_notifications=core.hold.held[Kind.NOTIFICATION],
            now_ms=now_ms(),
        )
        for name, topic in sorted(core.topics.items()):
            if request.topic and name != request.topic:
                continue
            for q in topic.queues:
                response.queues.add(topic=name, queue_id=q.queue_id, min_offset=q.min_offset, max_offset=q.max_offset)
        for row in core.lags(request.topic, request.group):
            lag = row.lag
            response.groups.add(
                topic=row.topic,
                group=row.group,
                queue_id=row.queue_id,
                max_offset=lag.max_offset,
                consumer_offset=lag.consumer_offset,
                pull_offset=lag.pull_offset,
                ready=lag.ready,
                inflight=lag.inflight,
                lag=lag.lag,
                oldest_unacked_store_ms=lag.oldest_unacked_store_ms,
            )
        return response

    @rpc("ListMessages")
    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMessagesResponse:
        records = await self.core.list_messages(request.topic, request.queue_id, request.from_offset, request.limit)
        return pb.ListMessagesResponse(
            messages=[
                pb.StoredMessage(
                    message=pb.Message.FromString(r.payload), queue_id=r.queue_id, offset=r.offset, store_ms=r.store_ms
                )
                for r in records
            ]
        )


# -- request → core call → response, shared by the unary RPCs and the Session stream ---------
# Each fills in the response it is given: building a sub-message in place costs about half of
# building it apart and copying it into its parent (a Pop answer's payloads would be copied twice).


async def send(core: BrokerCore, request: pb.SendRequest, out: pb.SendResponse) -> None:
    add = out.results.add
    for s in await core.send(request.messages):
        add(message_id=s.message_id, topic=s.topic, queue_id=s.queue_id, offset=s.offset)


async def pop(core: BrokerCore, request: pb.PopRequest, out: pb.PopResponse) -> PopResult:
    r = request
    result = await core.pop(r.topic, r.group, r.filter, r.max_messages, r.invisible_ms, r.poll_ms)
    add = out.messages.add
    for p in result.messages:
        popped = add(receipt_handle=p.handle, delivery_attempt=p.attempt, invisible_until_ms=p.invisible_until_ms)
        stored = popped.stored
        stored.message.MergeFromString(p.payload)
        stored.queue_id = p.queue_id
        stored.offset = p.offset
        stored.store_ms = p.store_ms
    out.polling_full = result.polling_full
    return result


async def ack(core: BrokerCore, request: pb.AckRequest, out: pb.AckResponse) -> None:
    handles = request.receipt_handles
    add = out.results.add
    for handle, e in zip(handles, await core.ack(request.topic, request.group, handles), strict=True):
        if e is None:
            add(receipt_handle=handle, ok=True)
        else:
            add(receipt_handle=handle, ok=False, error=e.name, error_message=e.message)


async def change_invisible(
    core: BrokerCore, request: pb.ChangeInvisibleTimeRequest, out: pb.ChangeInvisibleTimeResponse
) -> None:
    r = request
    out.receipt_handle, out.invisible_until_ms = await core.change_invisible(
        r.topic, r.group, r.receipt_handle, r.invisible_ms
    )


async def notification(core: BrokerCore, request: pb.NotificationRequest, out: pb.NotificationResponse) -> None:
    out.has_message, out.polling_full = await core.notification(
        request.topic, request.group, request.filter, request.poll_ms
    )


# What a Session request of each kind runs; its response goes in the field of the same name.
SESSION_CALLS: dict[str, Callable[[BrokerCore, Any, Any], Awaitable[Any]]] = {
    "pop": pop,
    "notification": notification,
    "send": send,
    "ack": ack,
    "change_invisible": change_invisible,
}


# Requests that may be held (long polls) count against the broker's --max-held per session; the
# others (Send, Ack, ChangeInvisibleTime: each a store commit away from done) against this.
HELD_KINDS = frozenset({"pop", "notification"})
SESSION_MAX_SHORT = 4096
# Answers written to the stream's outbox and not yet taken by grpc (a slow reader): past this, the
# session stops reading requests. One Pop answer may be up to --max-pop-bytes (8 MiB) on its own.
SESSION_MAX_OUTBOX_BYTES = 32 * 1024 * 1024
SESSION_RECENT_POPS = 256  # answered Pops a late cancel frame can still release, per stream
POPPED_OVERHEAD = 128  # bytes of a popped message's answer beyond its payload (handle, ids, offsets)


class _Session:
    """One multiplexed stream: a task per pending request, one writer, everything cancelled at the end."""

    def __init__(self, servicer: BrokerServicer, max_pending: int) -> None:
        self.servicer = servicer
        self.max_pending = max_pending
        self.pending: dict[int, asyncio.Task[None]] = {}
        self.short = 0  # pending requests not of HELD_KINDS
        self.held: dict[int, str] = {}  # pending long polls (HELD_KINDS with a poll time): their kind by id
        # Answers with their encoded size, bounded in bytes by the reader pausing (see Session).
        self.outbox: asyncio.Queue[tuple[pb.SessionResponse, int] | None] = asyncio.Queue()
        self.outbox_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        # The last Pops answered with messages, (topic, group, handles) by id: a cancel frame that
        # crossed the answer releases them (see `dispatch`). A cancel comes within a round trip.
        self.answered_pops: OrderedDict[int, tuple[str, str, list[str]]] = OrderedDict()

    def answer(self, response: pb.SessionResponse, size: int | None = None) -> None:
        """Queue an answer; `size`, when the caller knows it, saves encoding-size work on the hot path."""
        if size is None:
            size = response.ByteSize()
        self.outbox_bytes += size
        self.outbox.put_nowait((response, size))
        if self.outbox_bytes > SESSION_MAX_OUTBOX_BYTES:
            self.room.clear()
            self._end_long_polls()

    def _end_long_polls(self) -> None:
        """Over its outbox budget, the stream's held Pops and Notifications end now with an empty answer: held on,
        each would take messages when it woke and queue them past the budget (the caller is not reading)."""
        held, self.held = self.held, {}
        answering = asyncio.current_task()  # the Pop whose answer passed the budget: it is answered already
        for request_id, kind in held.items():
            task = self.pending.get(request_id)
            if task is None or task.done() or task is answering:
                continue
            del self.pending[request_id]
            task.cancel()  # a Pop caught taking its messages puts them back (BrokerCore.pop)
            response = pb.SessionResponse(id=request_id)
            getattr(response, kind).SetInParent()
            self.answer(response)

    def written(self, size: int) -> None:
        self.outbox_bytes -= size
        if self.outbox_bytes <= SESSION_MAX_OUTBOX_BYTES // 2:
            self.room.set()

    def dispatch(self, request: pb.SessionRequest) -> None:
        kind = request.WhichOneof("body")
        if kind == "cancel":
            task = self.pending.pop(request.id, None)
            if task is not None:
                task.cancel()
            elif (popped := self.answered_pops.pop(request.id, None)) is not None:
                self.servicer.core.release(*popped)  # answered before the cancel was read: nobody got it
            return
        if kind is None or request.id in self.pending:
            why = "unknown request" if kind is None else f"request id {request.id} is already pending"
            self._error(request.id, errors.BadRequest(f"session: {why}"))
            return
        self.answered_pops.pop(request.id, None)  # an id used again: a later cancel is about this request
        held = kind in HELD_KINDS and getattr(request, kind).poll_ms > 0  # poll 0: answered at once
        if held and len(self.pending) - self.short >= self.max_pending:
            self._error(request.id, errors.TooManyRequests(f"session has {self.max_pending} pending long polls"))
            return
        if not held and self.short >= SESSION_MAX_SHORT:
            self._error(request.id, errors.TooManyRequests(f"session has {SESSION_MAX_SHORT} pending {kind} requests"))
            return
        task = asyncio.get_running_loop().create_task(self._serve(request, kind))
        self.pending[request.id] = task
        if held:
            self.held[request.id] = kind
            task.add_done_callback(functools.partial(self._held_done, request.id))
        else:
            self.short += 1
            task.add_done_callback(self._short_done)

    def _held_done(self, request_id: int, _: asyncio.Task[None]) -> None:
        self.held.pop(request_id, None)

    def _short_done(self, _: asyncio.Task[None]) -> None:
        self.short -= 1

    async def _serve(self, request: pb.SessionRequest, kind: str) -> None:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        core = self.servicer.core
        try:
            response = pb.SessionResponse(id=request.id)
            body = getattr(response, kind)
            body.SetInParent()  # an answer with no field set is still an answer of this kind
            result = await SESSION_CALLS[kind](core, getattr(request, kind), body)
            if kind == "pop" and result.messages:
                popped = result.messages  # sizes and handles from the core's own values, not the protobuf
                self.answer(response, sum(len(p.payload) for p in popped) + POPPED_OVERHEAD * len(popped))
                pop = request.pop
                self.answered_pops[request.id] = (pop.topic, pop.group, [p.handle for p in popped])
                if len(self.answered_pops) > SESSION_RECENT_POPS:
                    self.answered_pops.popitem(last=False)
            else:
                self.answer(response)
        except errors.BrokerError as exc:
            code = status_of(exc)
            self._error(request.id, exc)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code = grpc.StatusCode.INTERNAL
            log.exception("session %s failed", kind)
            self._error(request.id, errors.BrokerError(f"internal error: {type(exc).__name__}"))
        finally:
            self.pending.pop(request.id, None)
            self.servicer.metrics.rpc_duration.labels(f"Session.{kind}", code.name).observe(
                time.perf_counter() - started
            )

    def _error(self, request_id: int, exc: errors.BrokerError) -> None:
        error = pb.SessionError(error=exc.name, message=exc.message, grpc_code=status_of(exc).value[0])
        self.answer(pb.SessionResponse(id=request_id, error=error))

    async def settle(self, within_s: float) -> None:
        """Wait (at most `within_s`) for the requests taken to be answered."""
        tasks = list(self.pending.values())
        if tasks:
            await asyncio.wait(tasks, timeout=within_s)

    async def close(self) -> None:
        tasks = list(self.pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
