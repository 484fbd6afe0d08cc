"""The broker's gRPC servicer: request → core call (`broker.handlers`) → response; the Session stream is
`broker.session`."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

from broker import admin, session
from broker.budget import ByteBudget
from broker.core import BrokerCore
from broker.handlers import (
    ack,
    answer_bytes,
    change_invisible,
    change_invisible_many,
    end_transaction,
    notification,
    pop,
    recall,
    renew,
    send,
    transaction_checks,
)
from broker.metrics import BrokerMetrics
from broker.stats import stats
from popgate_contract import errors, validation
from popgate_contract.trailer import ERROR_KEY, status_of

log = logging.getLogger(__name__)
# A DeleteTopic still deleting its rows answers this long before its caller's deadline (applied: the rest goes on).
DEADLINE_MARGIN_S = 0.5

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
            except errors.DomainError as exc:
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


def _filled(
    method: str, fill: Callable[..., Awaitable[None]], response: Callable[[], Resp], *, deadline: bool = False
) -> Handler[Any, Resp]:
    """A unary RPC whose handler fills in a new `response` from the request (`rpc` around it); with `deadline`,
    told until when it may wait for a topic's rows (`_rows_by`)."""

    async def call(self: BrokerServicer, request: Any, context: grpc.aio.ServicerContext) -> Resp:
        out = response()
        if deadline:
            await fill(self.core, request, out, rows_by=_rows_by(context))
        else:
            await fill(self.core, request, out)
        return out

    return rpc(method)(call)


def _rows_by(context: grpc.aio.ServicerContext) -> float | None:
    """Until when (the loop's time) a topic deletion may wait for its rows before it answers, applied, the rest
    going on: DEADLINE_MARGIN_S before the caller's deadline (not a DEADLINE_EXCEEDED of unknown outcome), however
    long its commits took before — tests/unit/broker/test_topic_purges.py::
    test_a_deletion_past_its_callers_deadline_is_answered_and_goes_on."""
    left = context.time_remaining()
    return None if left is None else asyncio.get_running_loop().time() + left - DEADLINE_MARGIN_S


def add_to_server(servicer: BrokerServicer, server: grpc.aio.Server) -> None:
    """The Broker service on `server`; its Session stream writes the answers `broker.session` encodes (bytes, no
    serializer), joined for a caller that reads them so."""
    pb_grpc.add_BrokerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    encoded = grpc.stream_stream_rpc_method_handler(
        servicer.Session, request_deserializer=pb.SessionRequest.FromString, response_serializer=None
    )
    # A registered method's handler is the one used: this replaces the generated one (which encodes messages).
    server.add_registered_method_handlers("popgate.broker.v1.Broker", {"Session": encoded})


class BrokerServicer(pb_grpc.BrokerServicer):
    def __init__(self, core: BrokerCore, metrics: BrokerMetrics) -> None:
        self.core = core
        self.metrics = metrics
        self.stopping = asyncio.Event()  # set on SIGTERM: Session streams end (see Session)
        # Unary Pop answers until their RPC ends: a caller that stops reading keeps its answers in grpc's buffers.
        self.pop_answers = ByteBudget(
            core.settings.max_pop_answer_bytes, what="bytes of Pop answers not taken", setting="--max-pop-answer-bytes"
        )

    @rpc("Pop")
    async def Pop(self, request: pb.PopRequest, context: grpc.aio.ServicerContext) -> pb.PopResponse:
        if self.pop_answers.full():
            raise self.pop_answers.refusal()  # before anything is popped
        out = pb.PopResponse()
        result = await pop(self.core, request, out)
        if result.messages:
            size = answer_bytes(result)
            if not self.pop_answers.fits(size):  # Pops taken together while there was room: this one is too many
                self.core.release(request.topic, request.group, [p.handle for p in result.messages])  # ready again
                raise self.pop_answers.refusal(size)
            self.pop_answers.take(size)
            context.add_done_callback(lambda _: self.pop_answers.give(size))
        return out

    async def Session(
        self, request_iterator: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> None:
        await session.serve(self.core, self.metrics, self.stopping, request_iterator, context)

    @rpc("DeadLetter")
    async def DeadLetter(
        self, request: pb.DeadLetterRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeadLetterResponse:
        stored = await self.core.dead_letter(
            request.topic, request.group, request.receipt_handle, message_id=request.message_id
        )
        if stored is None:  # no longer the group's (acked, dead-lettered already): nothing written
            return pb.DeadLetterResponse(dlq_topic=validation.DLQ_PREFIX + request.group, offset=-1)
        return pb.DeadLetterResponse(dlq_topic=stored.message.topic, offset=stored.offset)

    # Each fills in a new response from its request (broker.handlers, broker.admin).
    Send = _filled("Send", send, pb.SendResponse)
    Stats = _filled("Stats", stats, pb.StatsResponse)
    Ack = _filled("Ack", ack, pb.AckResponse)
    ChangeInvisibleTime = _filled("ChangeInvisibleTime", change_invisible, pb.ChangeInvisibleTimeResponse)
    ChangeInvisibleTimes = _filled("ChangeInvisibleTimes", change_invisible_many, pb.ChangeInvisibleTimesResponse)
    Renew = _filled("Renew", renew, pb.RenewResponse)
    Notification = _filled("Notification", notification, pb.NotificationResponse)
    Recall = _filled("Recall", recall, pb.RecallResponse)
    EndTransaction = _filled("EndTransaction", end_transaction, pb.EndTransactionResponse)
    TransactionChecks = _filled("TransactionChecks", transaction_checks, pb.TransactionChecksResponse)
    ResetOffset = _filled("ResetOffset", admin.reset_offset, pb.ResetOffsetResponse)
    QueryMessages = _filled("QueryMessages", admin.query_messages, pb.QueryMessagesResponse)
    ReportConsumers = _filled("ReportConsumers", admin.report_consumers, pb.ReportConsumersResponse)
    ListConsumers = _filled("ListConsumers", admin.list_consumers, pb.ListConsumersResponse)

    # Their topic deletion (DeleteGroup's with --dlq), or CreateTopic's wait for one, answered before the caller's
    # deadline (`_rows_by`).
    CreateTopic = _filled("CreateTopic", admin.create_topic, pb.CreateTopicResponse, deadline=True)
    DeleteTopic = _filled("DeleteTopic", admin.delete_topic, pb.DeleteTopicResponse, deadline=True)
    DeleteGroup = _filled("DeleteGroup", admin.delete_group, pb.DeleteGroupResponse, deadline=True)

    @rpc("ListMessages")
    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMessagesResponse:
        records = await self.core.list_messages(request.topic, request.queue_id, request.from_offset, request.limit)
        answer = pb.ListMessagesResponse(
            messages=[
                pb.StoredMessage(
                    message=pb.Message.FromString(r.payload), queue_id=r.queue_id, offset=r.offset, store_ms=r.store_ms
                )
                for r in records
            ]
        )
        for stored in answer.messages:  # the proxy's byte path's alone: not in admin answers (test_v2_system.py)
            stored.message.ClearField("v2_system")
        return answer
