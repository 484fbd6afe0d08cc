"""Broker clients over gRPC (popgate_pb.broker_pb2_grpc.BrokerStub), each with its health (`proxy.health` checks it).

Each client keeps one channel and a health flag: a failed health check (standard
grpc.health.v1, with a deadline) or a call failing with UNAVAILABLE marks the
broker down; a passing check or a successful call marks it up again. Broker
errors become proxy errors here: the ``popgate-error`` trailer names the domain
error, otherwise the gRPC code decides.

Sends, Pops, Acks, invisibility changes, Notifications and GroupConfigs travel on one
multiplexed ``Session`` stream per broker (`popgate_contract.session_client.BrokerSession`): a held
request there costs the broker a small record instead of a whole gRPC call, the proxy one future
instead of a call, and a request a fraction of a call's CPU.
A broken session (broker restarted or unreachable) fails its pending requests with
UNAVAILABLE and is replaced on the next request. Cancelling a caller sends a cancel
frame, so the broker drops the held request at once.

Acks and invisibility changes can only go to the broker their receipt handle names. While
that broker is connected but failing its health checks (hung), they are refused unsent
(HA_NOT_AVAILABLE) instead of waiting out their deadline there. One that never left for it
(its Session stream was lost or could not connect before the request was written:
`BrokerNotReached`) waits, within its deadline and at most `RECONNECT_WAIT_S`, for the
channel to that broker to connect again and is tried once more, when something listens at its
address (`proxy.broker_channel.listening`: a dead broker's port refuses at once, and so is the
request): a broker that has just restarted serves it instead of the client getting HA_NOT_AVAILABLE
while the channel's reconnect back-off runs. One that may have reached
the broker is not tried again: had it been applied, the retry would be answered "stale
handle" for an operation that took effect.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc

from popgate_contract import errors
from popgate_contract.broker_name import name_said
from popgate_contract.session_client import BrokerSession
from popgate_contract.trailer import error_of, from_broker, session_error
from proxy.broker_call import SESSION_FIELDS, BrokerCall
from proxy.broker_channel import listening, open_channel, reconnected
from proxy.outgoing import Chunk
from proxy.ports import Health, Metrics, NoMetrics
from proxy.settings import BrokerAddress

log = logging.getLogger(__name__)
R = TypeVar("R")
RECONNECT_WAIT_S = 2.0  # at most this long for a broker's channel to connect again (see the module docstring)
RETRY_MARGIN_S = 0.05  # a retry needs at least this much of its deadline left
# A Send's time at the broker (SendRequest.timeout_ms), as a share of the proxy's: a Send whose commit has not started
# there by then is not stored and refused, and that refusal (TOO_MANY_REQUESTS) reaches the client before the proxy's
# own timeout (PROXY_TIMEOUT: outcome unknown) — tests/unit/proxy/test_broker_send.py::
# test_a_send_the_broker_did_not_store_in_its_time_reaches_a_v2_client_as_too_many_requests.
BROKER_SEND_SHARE = 0.8


class GrpcBrokerClient:
    def __init__(
        self,
        address: BrokerAddress,
        *,
        metrics: Metrics | None = None,
        token: str = "",
        tls_ca: bytes | None = None,
        up: bool = True,
    ) -> None:
        """`token`, `tls_ca`: its channel's (`proxy.broker_channel.open_channel`). `up`: the health it has until its
        first check (optimistic for a listed broker, checked before the proxy serves; down for one discovery adds
        while serving)."""
        self._address = address
        self._metrics = metrics or NoMetrics()
        self._channel = open_channel(address, token=token, tls_ca=tls_ca)
        self._stub = broker_pb2_grpc.BrokerStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._status = Health(up)
        self._session: BrokerSession | None = None
        self._retired: set[asyncio.Task[None]] = set()
        self._closed = False
        self._gone = False  # retired by discovery: down for good (`retire`)
        self._own_name: str | None = None  # the broker's own name when its health checks say another than `name`
        self.check_timed_out_connected = False  # the last health check's, with the channel connected (proxy.health)
        self.on_up: Callable[[GrpcBrokerClient], None] | None = None  # told each time it comes up (was down)

    @property
    def name(self) -> str:
        return self._address.name

    @property
    def healthy(self) -> bool:
        return self._status.up

    @property
    def recoveries(self) -> int:
        return self._status.recoveries

    def when_up(self) -> asyncio.Future[None]:
        return self._status.when_up()

    @property
    def address(self) -> BrokerAddress:
        return self._address

    @property
    def closed(self) -> bool:
        return self._closed

    def retire(self, why: str = "gone from broker discovery") -> None:
        """Gone from discovery, or replaced: down from now on, whatever a health check would say; calls still go to
        its address until it is closed, then are refused (a receipt handle of it is answered as a down broker's).
        Whoever waits for it to be up is woken to look at the pool again (`Health.wake`) —
        tests/integration/proxy/test_discovery.py::test_a_broker_that_moves_while_down_is_watched_again_at_its_new_address."""
        self._gone = True
        self._set_health(False, why)
        self._status.wake()

    def _set_health(self, healthy: bool, why: str) -> None:
        healthy = healthy and not self._gone and self._own_name is None
        if self._status.set(healthy):
            log.warning(
                "broker %s (%s) is now %s: %s", self.name, self._address.target, "up" if healthy else "down", why
            )
            if healthy and self.on_up is not None:
                self.on_up(self)

    def _named(self, said: str | None) -> bool:
        """Whether the broker runs under the name it is listed under, as its health check's answer says (None: an
        older broker that does not say it, taken as it is listed). Under another name it stays down, whatever its
        calls do, until a check says the listed one: every receipt handle it writes names the other, so acks of
        its messages would go to another broker or none — tests/unit/proxy/test_broker_names.py."""
        own = said if said is not None and said != self.name else None
        if own is not None and own != self._own_name:
            log.error(
                "broker listed as %s at %s runs under the name %r (its --name), which its receipt handles carry: "
                "kept out of routing until it runs as %s, or is listed as %s=%s",
                self.name,
                self._address.target,
                own,
                self.name,
                own,
                self._address.target,
            )
        self._own_name = own
        return own is None

    def _not_open(self) -> errors.BrokerNotReached:
        """What a call to a closed client (retired, replaced, or this proxy stopping) is answered: a down broker."""
        return errors.BrokerNotReached(
            f"broker {self.name} at {self._address.target} is no longer reached by this proxy"
        )

    async def _call(self, method: str, call: Callable[..., Awaitable[R]], request: Any, timeout_s: float) -> R:
        if self._closed:
            raise self._not_open()
        try:
            response = await call(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self.failed(method, exc) from None
        except asyncio.CancelledError:
            self.count(method, "cancelled")
            raise
        if response is None:  # grpc.aio's answer that did not decode ("Exception deserializing message!"): a
            # failure of this broker, not an empty success — tests/unit/proxy/test_broker_answers.py::
            # test_a_unary_answer_that_did_not_decode_is_a_broker_failure_naming_the_broker_and_call
            error = errors.BrokerFailure(f"broker {self.name}: its {method} answer did not decode")
            self.count(method, error.name)
            raise error
        self._succeeded(method)
        return response

    def count(self, method: str, outcome: str) -> None:
        """One broker call of `method` ended with `outcome` (its metric)."""
        self._metrics.broker_rpc(self.name, method, outcome)

    def failed(self, method: str, exc: grpc.aio.AioRpcError) -> errors.DomainError:
        """The proxy's error for a broker call that failed with `exc`; a broker found unreachable is marked down."""
        error = error_of(exc, self.name)
        if self._closed:  # this proxy is stopping: its own calls end, the broker is not down (nor reported so)
            self.count(method, "cancelled")
            return error
        if isinstance(error, errors.BrokerUnavailable):
            self._set_health(False, f"{method}: {exc.code().name}")
        self.count(method, error.name)
        return error

    def _succeeded(self, method: str) -> None:
        self.count(method, "ok")
        if not self._status.up:
            self._set_health(True, f"{method} succeeded")

    async def send(self, chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        session = self._session  # the one `begin` takes when it is live: a new one has said nothing yet
        runs = session is not None and not session.broken and session.reads_runs
        request = chunk.request(runs=runs, timeout_ms=max(1, int(timeout_s * BROKER_SEND_SHARE * 1000)))
        response: bpb.SendResponse = await self.begin("Send", request, timeout_s=timeout_s)
        results: Sequence[bpb.SendResult] = response.results
        return results

    def _live_session(self) -> BrokerSession:
        session = self._session
        if session is None or session.broken:
            if session is not None:  # its reader ended; stop its writer in the background
                task = asyncio.get_running_loop().create_task(session.close())
                self._retired.add(task)
                task.add_done_callback(self._retired.discard)
            session = self._session = BrokerSession(channel=self._channel, name=self.name).open()
        return session

    async def _said_session(self, timeout_s: float) -> tuple[BrokerSession | None, float]:
        """The Session stream `begin` writes to, once its broker said what it reads (a stream opened just now has
        said nothing yet; its first write waits for that anyway), None when it is not live; and what is left of
        `timeout_s` for the request (at least RETRY_MARGIN_S) —
        tests/unit/proxy/test_change_many.py::test_a_new_stream_is_waited_for_until_its_broker_said_what_it_reads,
        `::test_the_wait_for_a_new_stream_is_taken_out_of_the_calls_time`; a broker failing its health checks is not
        waited for (`::test_a_broker_failing_its_health_checks_is_refused_at_once_not_waited_for`)."""
        if self._closed:
            return None, timeout_s
        try:
            session = self._live_session()
        except grpc.aio.AioRpcError:
            return None, timeout_s
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        if self.healthy:  # else refused at once, unsent (`_to_this_broker`)
            await session.said(timeout_s)
        return (None if session.broken else session), max(RETRY_MARGIN_S, end - loop.time())

    def begin(self, method: str, request: Any, *, timeout_s: float) -> asyncio.Future[Any]:
        """Send a Session request now; a future of the method's response (or its DomainError).

        ``request``: the method's request, or a SessionRequest with it filled in, or that SessionRequest encoded
        without its id, in parts (`BrokerSession.submit`). Cancelling the
        future cancels the broker request (a cancel frame). No task per request: a held receive
        over N brokers costs N of these, so each is a `BrokerCall` and its timer."""
        loop = asyncio.get_running_loop()
        result = BrokerCall(loop=loop)
        result.client, result.method = self, method
        if self._closed:
            result.set_exception(self._not_open())
            return result
        if not isinstance(request, bpb.SessionRequest | list):
            request = bpb.SessionRequest(**{SESSION_FIELDS[method]: request})
        try:
            session = self._live_session()
            result.request_id = session.submit(request, result)
        except grpc.aio.AioRpcError as exc:
            result.set_exception(self.failed(method, exc))
            return result
        result.session = session
        result.timer = loop.call_later(timeout_s, result.expire)
        return result

    def answered(self, result: BrokerCall, answer: Any) -> None:
        """`result`'s broker answer (a SessionResponse) or its stream's error."""
        method = result.method
        if result.done():  # settled already: the session forgot it then, so no answer comes (a guard)
            return
        if isinstance(answer, grpc.aio.AioRpcError):
            result.set_exception(self.failed(method, answer))
        elif (kind := answer.WhichOneof("body")) == SESSION_FIELDS[method]:
            self._succeeded(method)
            result.set_result(getattr(answer, kind))
        elif kind == "error":
            e = answer.error
            result.set_exception(self.failed(method, session_error(e.error, e.message, e.grpc_code)))
        else:
            result.set_exception(self._other_kind(result, kind))
        result.settle()

    def _other_kind(self, result: BrokerCall, kind: str | None) -> errors.BrokerFailure:
        """An answer of another kind than its request, or with no body: a failure of this broker, not an empty answer
        (whose Pop's messages would stay invisible unseen); a Pop's or a Notification's is handed back (`release`) —
        tests/unit/proxy/test_broker_answers.py::test_a_pop_answered_with_another_kind_fails_and_its_messages_are_handed_back."""
        error = errors.BrokerFailure(f"broker {self.name} answered {kind or 'no body'} to a {result.method}")
        self.count(result.method, error.name)
        if result.method in ("Pop", "Notification"):
            self.release(result)
        return error

    async def ack(self, request: bpb.AckRequest, *, timeout_s: float) -> bpb.AckResponse:
        return await self._to_this_broker(lambda t: self.begin("Ack", request, timeout_s=t), timeout_s)

    async def change_invisible_time(
        self, request: bpb.ChangeInvisibleTimeRequest, *, timeout_s: float
    ) -> bpb.ChangeInvisibleTimeResponse:
        return await self._to_this_broker(lambda t: self.begin("ChangeInvisibleTime", request, timeout_s=t), timeout_s)

    async def change_invisible_times(
        self, request: bpb.ChangeInvisibleTimesRequest, *, timeout_s: float
    ) -> list[str | errors.DomainError]:
        """Per handle its new receipt handle or its error: one request on the Session stream of a broker that said it
        reads it; else a ChangeInvisibleTime per handle (an older broker), each failing as that call fails (a broker
        not reached stays retriable) —
        tests/unit/proxy/test_change_many.py::test_a_broker_that_has_not_said_it_reads_many_gets_one_change_a_handle."""
        session, timeout_s = await self._said_session(timeout_s)
        handles = request.receipt_handles
        if session is not None and session.changes_many:
            method = "ChangeInvisibleTimes"
            response: bpb.ChangeInvisibleTimesResponse = await self._to_this_broker(
                lambda t: self.begin(method, request, timeout_s=t), timeout_s
            )
            results = response.results
            outcome: list[str | errors.DomainError] = [
                r.receipt_handle if r.ok else from_broker(r.error, r.error_message, broker=self.name) for r in results
            ]
            missing = errors.BrokerFailure(f"broker {self.name} returned no result for this handle")
            return outcome[: len(handles)] + [missing] * (len(handles) - len(outcome))

        async def one(handle: str) -> str | errors.DomainError:
            alone = bpb.ChangeInvisibleTimeRequest(
                topic=request.topic, group=request.group, receipt_handle=handle, invisible_ms=request.invisible_ms
            )
            try:
                return (await self.change_invisible_time(alone, timeout_s=timeout_s)).receipt_handle
            except errors.DomainError as exc:
                return exc

        return list(await asyncio.gather(*(one(handle) for handle in handles)))

    async def dead_letter(self, request: bpb.DeadLetterRequest, *, timeout_s: float) -> bpb.DeadLetterResponse:
        return await self._call("DeadLetter", self._stub.DeadLetter, request, timeout_s)

    async def renew(self, request: bpb.RenewRequest, *, timeout_s: float) -> bpb.RenewResponse:
        # Not retried: a renewal that fails is sent again a period later (proxy.renewal).
        response: bpb.RenewResponse = await self.begin("Renew", request, timeout_s=timeout_s)
        return response

    async def _to_this_broker(self, attempt: Callable[[float], Awaitable[R]], timeout_s: float) -> R:
        """`attempt(timeout_s)`, and once more if it never reached the broker and the channel connects again in
        time (see the module docstring)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        session = self._session
        if self._closed:
            raise self._not_open()
        if not self.healthy and session is not None and not session.broken:
            # Connected, yet failing its health checks: hung (a stopped process keeps its sockets). Written, the
            # request would wait out its whole deadline, every retry of it too; refused unsent instead:
            # HA_NOT_AVAILABLE, safe to retry — tests/integration/proxy/test_broker_failure.py::
            # test_an_ack_to_a_hung_broker_marked_down_is_refused_unsent_not_held_to_its_deadline. (A restarted
            # broker breaks the session: that path below waits for the channel to connect again.)
            raise errors.BrokerNotReached(
                f"broker {self.name} is not answering its health checks; this receipt handle can only be acked or "
                "changed there: retry shortly"
            )
        try:
            return await attempt(timeout_s)
        except errors.BrokerNotReached as exc:
            wait_s = min(RECONNECT_WAIT_S, end - loop.time() - RETRY_MARGIN_S)
            # Nothing listening at its address (a dead broker's port refuses at once): no reconnect to wait for, so
            # an ack for a broker that is down fails at once, each retry of it too — test_broker_failure.py::
            # test_an_ack_to_a_dead_broker_is_refused_at_once_not_after_a_reconnect_wait.
            # (The probe may take the whole wait: a far broker or a slow DNS answer is not taken for a dead one.)
            if wait_s <= 0 or not await listening(self._address, wait_s):
                raise exc from None
            wait_s = min(wait_s, end - loop.time() - RETRY_MARGIN_S)
            if wait_s <= 0 or not await reconnected(self._channel, wait_s):
                raise exc from None
        return await attempt(max(RETRY_MARGIN_S, end - loop.time()))

    def begin_pop(self, request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        request.v2 = True  # each message with its stored v2 system properties: proxy.v2.convert.client_items
        return self.begin("Pop", request, timeout_s=timeout_s)

    def release(self, call: asyncio.Future[Any]) -> None:
        """`call` answered and nobody will use the answer: a cancel frame for it after the fact. The broker puts a
        Pop's messages back, and passes a Notification's has_message on to another request it holds."""
        session = getattr(call, "session", None)  # unset when the request was never submitted
        if session is not None:
            session.release(call.request_id)  # type: ignore[attr-defined]

    def begin_notification(
        self, request: bpb.NotificationRequest, *, timeout_s: float
    ) -> asyncio.Future[bpb.NotificationResponse]:
        return self.begin("Notification", request, timeout_s=timeout_s)

    async def group_config(self, group: str, *, timeout_s: float) -> bpb.GroupConfigResponse:
        response: bpb.GroupConfigResponse = await self.begin(
            "GroupConfig", bpb.GroupConfigRequest(group=group), timeout_s=timeout_s
        )
        return response

    async def stats(self, request: bpb.StatsRequest, *, timeout_s: float) -> bpb.StatsResponse:
        return await self._call("Stats", self._stub.Stats, request, timeout_s)

    async def list_messages(self, request: bpb.ListMessagesRequest, *, timeout_s: float) -> bpb.ListMessagesResponse:
        return await self._call("ListMessages", self._stub.ListMessages, request, timeout_s)

    async def admin(self, method: str, request: Any, *, timeout_s: float) -> Any:
        return await self._call(method, getattr(self._stub, method), request, timeout_s)

    async def recall(self, request: bpb.RecallRequest, *, timeout_s: float) -> bpb.RecallResponse:
        return await self._call("Recall", self._stub.Recall, request, timeout_s)

    async def end_transaction(
        self, request: bpb.EndTransactionRequest, *, timeout_s: float
    ) -> bpb.EndTransactionResponse:
        """On the Session stream once its broker said it reads it (a frame, not a call), else the unary call (an
        older broker) — tests/unit/proxy/test_broker_send.py::
        test_a_transactions_end_rides_the_stream_of_a_broker_that_said_it_reads_it."""
        session, timeout_s = await self._said_session(timeout_s)
        if session is not None and session.ends_transactions:
            response: bpb.EndTransactionResponse = await self.begin("EndTransaction", request, timeout_s=timeout_s)
            return response
        return await self._call("EndTransaction", self._stub.EndTransaction, request, timeout_s)

    async def transaction_checks(
        self, request: bpb.TransactionChecksRequest, *, timeout_s: float
    ) -> bpb.TransactionChecksResponse:
        return await self._call("TransactionChecks", self._stub.TransactionChecks, request, timeout_s)

    async def check_health(self, *, timeout_s: float) -> bool:
        """One grpc.health.v1 check with a deadline; updates and returns the health flag."""
        if self._gone:
            return False
        try:
            call = self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
            reply = await call
            said = name_said(await call.initial_metadata())
        except grpc.aio.AioRpcError as exc:
            connected = self._channel.get_state() == grpc.ChannelConnectivity.READY
            self.check_timed_out_connected = connected and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            self._set_health(False, f"health check: {exc.code().name}")
            return False
        self.check_timed_out_connected = False
        serving: bool = reply.status == health_pb2.HealthCheckResponse.SERVING
        if not self._named(said):
            self._set_health(False, f"health check: it runs under the name {said!r}")
            return False
        self._set_health(serving, f"health check: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
        return serving

    def connect(self) -> None:
        """Open its Session stream now: an ack for a hung broker is refused unsent on this connection too
        (`_to_this_broker`) — tests/integration/proxy/test_silent_link.py::
        test_an_ack_to_a_hung_broker_is_refused_unsent_on_the_connection_made_again_too."""
        self._live_session()

    async def close(self) -> None:
        self._closed = True  # what fails from here on failed because this proxy stops, not the broker
        if self._session is not None:
            await self._session.close()
            self._session = None
        await asyncio.gather(*self._retired, return_exceptions=True)
        await self._channel.close()
