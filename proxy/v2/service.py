"""The MessagingService servicer: dispatch to handlers, turn errors into v2 status, time every RPC.

Every answer carries a v2 status; a handler bug becomes INTERNAL_SERVER_ERROR, never a
crashed call or process. RPCs popgate does not serve answer NOT_IMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.ext import messaging_pb2_grpc as ext_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from popgate_contract import errors
from popgate_contract.codes import name_of, status_of
from popgate_contract.receipt import MAX_HANDLE_LEN
from proxy import validate
from proxy.attempts import LOOKUP_TIMEOUT_S, GroupAttempts
from proxy.auth import Authenticator
from proxy.consumers import wall_ms
from proxy.core import Proxy
from proxy.ports import Metrics
from proxy.producer import ProducerFeatures
from proxy.settings import Settings
from proxy.txchecks import CheckPoller, ProducerStreams
from proxy.v2 import access, ack, producer, receive, route, send, session, telemetry
from proxy.v2.context import Call

log = logging.getLogger(__name__)
Req = TypeVar("Req")
Resp = TypeVar("Resp")
_NO_DEADLINE = 1e8  # grpc reports "no deadline" as a huge remaining time


def _status(error: BaseException) -> v2.Status:
    if isinstance(error, errors.DomainError):
        return status_of(error)
    log.exception("unexpected error serving a request", exc_info=error)
    return v2.Status(code=v2.INTERNAL_SERVER_ERROR, message=f"internal error: {type(error).__name__}")


_BRIEF_ACK = functools.partial(ack.ack_message, brief=True)


class MessagingService(pb_grpc.MessagingServiceServicer):
    def __init__(self, proxy: Proxy, settings: Settings, endpoints: v2.Endpoints, metrics: Metrics) -> None:
        self._proxy = proxy
        self._settings = settings
        self._endpoints = endpoints
        self._metrics = metrics
        self.auth = self._auth = Authenticator(settings.accounts, skew_s=settings.auth_skew_s)
        self._telemetry_streams = 0
        self._attempts = GroupAttempts(proxy.pool.live, timeout_s=min(LOOKUP_TIMEOUT_S, settings.broker_timeout_s))
        self._inflation = send.Inflation()
        self._send = functools.partial(send.send_message, inflation=self._inflation)
        self._send_shared = functools.partial(send.send_shared, inflation=self._inflation)
        self._producer = ProducerFeatures(proxy.pool)
        self._producers = ProducerStreams()
        self._checks = CheckPoller(
            proxy.pool, self._producers, telemetry.recover_command, timeout_s=settings.broker_timeout_s
        )
        self._recall = functools.partial(producer.recall_message, self._producer)
        self._end_transaction = functools.partial(producer.end_transaction, self._producer)

    @property
    def closing(self) -> asyncio.Event:
        """Set when the proxy stops: held receives answer at once, streams end."""
        return self._proxy.closing

    async def close(self) -> None:
        """Stop the GZIP inflation threads (a conversion already running finishes; none waits for it) and the
        transaction checks (their task has ended when this returns)."""
        self._inflation.close()
        await self._checks.close()

    def _call(self, context: grpc.aio.ServicerContext[Any, Any], account: str) -> Call:
        remaining = context.time_remaining()
        deadline = None
        if remaining is not None and remaining < _NO_DEADLINE:
            deadline = asyncio.get_running_loop().time() + remaining
        metadata = context.invocation_metadata() or ()
        return Call(self._proxy, self._settings, self._endpoints, deadline, metadata, account)

    async def _unary(
        self,
        method: str,
        handler: Callable[[Call, Req], Awaitable[Resp]],
        request: Req,
        context: grpc.aio.ServicerContext[Any, Any],
        response_type: Callable[..., Resp],
        auth: Authenticator | None = None,
    ) -> Resp:
        """`handler`'s answer, authorized by `auth` (a Session stream's account) or the call's own metadata."""
        started = time.perf_counter()
        try:
            account = access.check(self._auth if auth is None else auth, context.invocation_metadata(), request)
            response = await handler(self._call(context, account), request)
            code = response.status.code  # type: ignore[attr-defined]
        except Exception as exc:  # every error becomes a v2 status, the call never fails
            status = _status(exc)
            response, code = response_type(status=status), status.code
        self._metrics.rpc(method, name_of(code), time.perf_counter() - started)
        return response

    async def QueryRoute(self, request: pb.QueryRouteRequest, context: Any) -> pb.QueryRouteResponse:
        return await self._unary("QueryRoute", route.query_route, request, context, pb.QueryRouteResponse)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        return await self._unary("Heartbeat", route.heartbeat, request, context, pb.HeartbeatResponse)

    async def QueryAssignment(self, request: pb.QueryAssignmentRequest, context: Any) -> pb.QueryAssignmentResponse:
        return await self._unary(
            "QueryAssignment", route.query_assignment, request, context, pb.QueryAssignmentResponse
        )

    async def NotifyClientTermination(
        self, request: pb.NotifyClientTerminationRequest, context: Any
    ) -> pb.NotifyClientTerminationResponse:
        return await self._unary(
            "NotifyClientTermination",
            route.notify_client_termination,
            request,
            context,
            pb.NotifyClientTerminationResponse,
        )

    async def SendMessage(
        self, request: pb.SendMessageRequest, context: Any, auth: Authenticator | None = None
    ) -> pb.SendMessageResponse:
        return await self._unary("SendMessage", self._send, request, context, pb.SendMessageResponse, auth)

    async def SendShared(
        self, request: ext.SendShared, context: Any, auth: Authenticator | None = None
    ) -> pb.SendMessageResponse:
        """A Session stream's SendShared (send.send_shared), counted as the SendMessage it stands for."""
        return await self._unary("SendMessage", self._send_shared, request, context, pb.SendMessageResponse, auth)

    async def RecallMessage(self, request: pb.RecallMessageRequest, context: Any) -> pb.RecallMessageResponse:
        return await self._unary("RecallMessage", self._recall, request, context, pb.RecallMessageResponse)

    async def EndTransaction(
        self, request: pb.EndTransactionRequest, context: Any, auth: Authenticator | None = None
    ) -> pb.EndTransactionResponse:
        with contextlib.suppress(errors.DomainError):  # a bad topic is refused by the handler
            topic = validate.topic_in(request.topic.resource_namespace, request.topic.name)
            self._producers.answered(topic, request.transaction_id)  # its check no longer counts (proxy.txchecks)
        return await self._unary(
            "EndTransaction", self._end_transaction, request, context, pb.EndTransactionResponse, auth
        )

    async def AckMessage(
        self, request: pb.AckMessageRequest, context: Any, auth: Authenticator | None = None, *, brief: bool = False
    ) -> pb.AckMessageResponse:
        """`brief`: a Session stream's ack, answered OK without its entries when every entry is acked
        (ack.ack_message)."""
        handler = _BRIEF_ACK if brief else ack.ack_message
        return await self._unary("AckMessage", handler, request, context, pb.AckMessageResponse, auth)

    async def ChangeInvisibleDuration(
        self, request: pb.ChangeInvisibleDurationRequest, context: Any, auth: Authenticator | None = None
    ) -> pb.ChangeInvisibleDurationResponse:
        response = await self._unary(
            "ChangeInvisibleDuration",
            ack.change_invisible_duration,
            request,
            context,
            pb.ChangeInvisibleDurationResponse,
            auth,
        )
        if not response.receipt_handle and len(request.receipt_handle) <= MAX_HANDLE_LEN:
            # The official client stores the answer's handle in the message before it checks the status:
            # a failed change must leave the message its handle, which is still valid. One too long to be a
            # handle is not echoed, so the answer stays small enough for the client to read its status —
            # test_bad_input.py::test_a_handle_too_long_to_be_one_is_not_echoed_so_the_client_can_read_why
            response.receipt_handle = request.receipt_handle
        return response

    async def ChangeInvisibleMany(
        self, request: ext.ChangeInvisibleMany, context: Any, auth: Authenticator | None = None
    ) -> ext.ChangeInvisibleManyResponse:
        """popgate.ext.v1's many-entry ChangeInvisibleDuration (ack.change_invisible_many), unary or on a Session."""
        return await self._unary(
            "ChangeInvisibleMany",
            ack.change_invisible_many,
            request,
            context,
            ext.ChangeInvisibleManyResponse,
            auth,
        )

    async def ForwardMessageToDeadLetterQueue(
        self, request: pb.ForwardMessageToDeadLetterQueueRequest, context: Any
    ) -> pb.ForwardMessageToDeadLetterQueueResponse:
        return await self._unary(
            "ForwardMessageToDeadLetterQueue",
            ack.forward_to_dead_letter_queue,
            request,
            context,
            pb.ForwardMessageToDeadLetterQueueResponse,
        )

    async def ReceiveMessage(
        self,
        request: pb.ReceiveMessageRequest,
        context: Any,
        *,
        framing: receive.Framing = receive.V2,
        method: str = "ReceiveMessage",
        auth: Authenticator | None = None,
        max_fifo: int = 0,
    ) -> None:
        """A receive answered in `framing` through `context.write`: v2's frames, or popgate's ReceiveMessages
        (`ExtMessaging`, also on its Session stream, whose account is `auth` and whose receives may stand for several
        of the client's when they say one's batch, `max_fifo`: `receive.build_request`). A coroutine writing its
        frames, which both servers take for a server-streaming handler as grpc.aio does."""
        started = time.perf_counter()
        code: int = v2.OK
        outcome = ""  # set when the call ends without a status of ours
        try:
            account = access.check(self._auth if auth is None else auth, context.invocation_metadata(), request)
            self._consumer_seen(request, context)
            call = self._call(context, account)
            asked = receive.build_request(call, request, max_fifo=max_fifo)
            namespace, auto_renew = request.group.resource_namespace, request.auto_renew
            # Held with no protobuf: a parsed request keeps an arena of its own or, from a Session stream, the whole
            # stream message it came in — test_v2_service.py::
            # test_a_held_receive_is_three_coroutines_and_no_generator_or_protobuf.
            del request
            result = await call.proxy.receive(asked)
            flushing = context if hasattr(context, "flushed") else None  # popgate's HTTP/2 server
            code = await receive.answer(
                call,
                asked,
                result,
                context.write,
                framing,
                namespace=namespace,
                auto_renew=auto_renew,
                flushing=flushing,
            )
        except asyncio.CancelledError:  # the client went away (or its deadline passed)
            outcome = "CANCELLED"
            raise
        except Exception as exc:
            status = _status(exc)
            code = status.code
            await context.write(framing.status(status))
        finally:
            self._metrics.rpc(method, outcome or name_of(code), time.perf_counter() - started)

    @property
    def session_receive_batch(self) -> int:
        """The largest batch_size of a receive on a Session stream: `JOINED_RECEIVES` receives joined."""
        return self._settings.max_batch * receive.JOINED_RECEIVES

    @property
    def max_message(self) -> int:
        """The largest request message the proxy reads (`max_message_bytes`), said to Session clients."""
        return self._settings.max_message_bytes

    def _consumer_seen(self, request: pb.ReceiveMessageRequest, context: Any) -> None:
        """A receive is a sign of life of its consumer (proxy.consumers); a bad group is the receive's to refuse."""
        client_id = access.client_id_of(context.invocation_metadata())
        if client_id and request.group.name:
            with contextlib.suppress(errors.DomainError):
                group = validate.group_in(request.group.resource_namespace, request.group.name)
                self._proxy.consumers.seen(client_id, group, wall_ms())

    async def Telemetry(
        self, request_iterator: AsyncIterator[pb.TelemetryCommand], context: Any
    ) -> AsyncIterator[pb.TelemetryCommand]:
        if self._telemetry_streams >= self._settings.max_telemetry_streams:  # each held stream costs memory: bounded
            busy = errors.TooManyRequests(f"the proxy already has {self._telemetry_streams} Telemetry streams open")
            yield pb.TelemetryCommand(status=_status(busy))
            return
        self._telemetry_streams += 1
        client_id = account = ""  # alive while this stream is open: its auto_renew receives are renewed
        try:
            account = access.check(self._auth, context.invocation_metadata(), None)
            publishable = access.publishable(self._auth, context.invocation_metadata())
            client_id = access.client_id_of(context.invocation_metadata())
            self._proxy.renewer.opened(client_id, account=account)
            self._checks.start()
            async for reply in telemetry.telemetry(
                request_iterator, self._settings, self._proxy.closing, self._attempts, self._producers, publishable
            ):
                yield reply
        except Exception as exc:
            yield pb.TelemetryCommand(status=_status(exc))
        finally:
            self._telemetry_streams -= 1
            self._proxy.renewer.closed(client_id, account=account)

    # RPCs popgate does not serve: a clear status, not a gRPC error.
    async def _unsupported(self, method: str, response_type: Callable[..., Resp]) -> Resp:
        error = errors.NotImplementedRpc(f"{method} is not implemented by popgate (see docs/PROXY.md)")
        status = _status(error)
        self._metrics.rpc(method, name_of(status.code), 0.0)
        return response_type(status=status)

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[pb.PullMessageResponse]:
        yield await self._unsupported("PullMessage", pb.PullMessageResponse)

    async def UpdateOffset(self, request: Any, context: Any) -> pb.UpdateOffsetResponse:
        return await self._unsupported("UpdateOffset", pb.UpdateOffsetResponse)

    async def GetOffset(self, request: Any, context: Any) -> pb.GetOffsetResponse:
        return await self._unsupported("GetOffset", pb.GetOffsetResponse)

    async def QueryOffset(self, request: Any, context: Any) -> pb.QueryOffsetResponse:
        return await self._unsupported("QueryOffset", pb.QueryOffsetResponse)

    async def SyncLiteSubscription(self, request: Any, context: Any) -> pb.SyncLiteSubscriptionResponse:
        return await self._unsupported("SyncLiteSubscription", pb.SyncLiteSubscriptionResponse)


class ExtMessaging(ext_grpc.MessagingServicer):
    """popgate.ext.v1.Messaging (proto/ext/messaging.proto), served beside v2 on the same port: the same
    receive as v2's ReceiveMessage, many messages per frame; SendShared; ChangeInvisibleMany; the Session stream
    (proxy/v2/session.py)."""

    def __init__(self, messaging: MessagingService) -> None:
        self._messaging = messaging

    async def ReceiveMessages(self, request: pb.ReceiveMessageRequest, context: Any) -> None:
        await self._messaging.ReceiveMessage(request, context, framing=receive.BATCH, method="ReceiveMessages")

    async def SendShared(self, request: ext.SendShared, context: Any) -> pb.SendMessageResponse:
        return await self._messaging.SendShared(request, context)

    async def ChangeInvisibleMany(
        self, request: ext.ChangeInvisibleMany, context: Any
    ) -> ext.ChangeInvisibleManyResponse:
        return await self._messaging.ChangeInvisibleMany(request, context)

    async def Session(self, request_iterator: AsyncIterator[ext.SessionRequest], context: Any) -> None:
        await session.serve(self._messaging, request_iterator, context)
