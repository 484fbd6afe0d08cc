"""Broker answers that do not make sense, at the proxy's broker client (proxy.brokers.GrpcBrokerClient), no sockets:
an answer that does not decode, or of another kind than its request, is a failure naming the broker and the call,
never a successful empty answer; the brokers that did answer are still heard. And at the core: a Pop answer past the
Pop's max is cut to it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.admin import AdminService
from proxy.auth import Authenticator
from proxy.brokers import GrpcBrokerClient
from proxy.core import Proxy
from proxy.outgoing import chunks, shared_run
from proxy.ports import NoMetrics
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.seam import ReceiveRequest
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress
from tests.unit.broker.test_session_stream import AnsweringCall, session_on
from tests.unit.proxy.fakes import FakeBroker, handle, popped
from tests.unit.proxy.test_admin_fanout import AdminBroker, Context


class Counted(NoMetrics):
    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str, str]] = []

    def broker_rpc(self, broker: str, method: str, outcome: str) -> None:
        self.outcomes.append((broker, method, outcome))


class Undecodable:
    """A broker stub whose every unary answer did not decode: grpc.aio logs "Exception deserializing message!" and
    the call returns None."""

    def __getattr__(self, method: str) -> Any:
        async def call(request: Any, **options: Any) -> None:
            return None

        return call


def undecodable_client(metrics: Counted | None = None) -> GrpcBrokerClient:
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"), metrics=metrics)
    client._stub = Undecodable()
    return client


async def test_a_unary_answer_that_did_not_decode_is_a_broker_failure_naming_the_broker_and_call() -> None:
    metrics = Counted()
    client = undecodable_client(metrics)
    try:
        request = bpb.TransactionChecksRequest(topics=["t"], max_checks=1)
        try:
            await client.transaction_checks(request, timeout_s=1)
        except errors.BrokerFailure as exc:
            assert "b1" in exc.message and "TransactionChecks" in exc.message
        else:
            raise AssertionError("a None answer was taken as a success")
    finally:
        await client.close()
    assert metrics.outcomes == [("b1", "TransactionChecks", "BrokerFailure")]


async def test_a_change_one_broker_answered_undecodably_is_applied_on_the_others_and_says_so() -> None:
    """`popgate topic create` then says "applied on b2 only", as when b1 fails with a status, not UNKNOWN."""
    b1 = undecodable_client()
    b2 = AdminBroker("b2", bpb.CreateTopicResponse(broker="b2"))
    pool = BrokerPool({"b1": b1, "b2": b2})  # type: ignore[dict-item]
    service = AdminService(pool, list, Authenticator((), skew_s=300), timeout_s=1.0)
    try:
        answer = await service.CreateTopic(bpb.CreateTopicRequest(topic="t"), Context())  # type: ignore[arg-type]
    finally:
        await b1.close()
    assert [a.broker for a in answer.answers] == ["b2"]
    assert [(f.broker, f.code) for f in answer.failures] == [("b1", "INTERNAL")]


class AnswersOtherKind(AnsweringCall):
    """A broker that answers every request with a body of `kind` (None: no body), whatever the request's kind."""

    def __init__(self, kind: str | None) -> None:
        super().__init__()
        self.kind = kind

    async def write(self, message: bytes) -> None:
        request = bpb.SessionRequest.FromString(message)
        self.written.append(request)
        if not request.cancel:
            answer = bpb.SessionResponse(id=request.id)
            if self.kind is not None:
                getattr(answer, self.kind).SetInParent()
            self.answers.put_nowait(answer)


def session_client(call: AnsweringCall, metrics: Counted | None = None) -> GrpcBrokerClient:
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"), metrics=metrics)
    client._session = session_on(call).open()  # its stream: this call (no socket)
    return client


@pytest.mark.parametrize("kind", ["notification", "send", None])
async def test_a_pop_answered_with_another_kind_fails_and_its_messages_are_handed_back(kind: str | None) -> None:
    """Not an empty answer whose popped messages would stay invisible for their whole invisible time: a failure
    naming the broker, and a cancel frame on which the broker makes what it popped ready again."""
    call = AnswersOtherKind(kind)
    metrics = Counted()
    client = session_client(call, metrics)
    pop = bpb.PopRequest(topic="t", group="g", filter="*", max_messages=4, invisible_ms=60_000)
    try:
        with pytest.raises(errors.BrokerFailure, match=f"b1 answered {kind or 'no body'} to a Pop"):
            await client.begin_pop(pop, timeout_s=1)
        for _ in range(5):
            await asyncio.sleep(0)
    finally:
        await client.close()
    assert [(r.id, r.WhichOneof("body")) for r in call.written] == [(1, "pop"), (1, "cancel")]
    assert metrics.outcomes == [("b1", "Pop", "BrokerFailure")]


@pytest.mark.parametrize("kind", ["ack", None])
async def test_a_send_answered_with_another_kind_fails_naming_the_broker(kind: str | None) -> None:
    """Not "the broker stored 0 of 1 messages", which it did not say."""
    client = session_client(AnswersOtherKind(kind))
    [chunk] = chunks([(0, shared_run(bpb.Message(topic="t"), [b"a"], ["1"]))], budget=1 << 20)
    try:
        with pytest.raises(errors.BrokerFailure, match=f"b1 answered {kind or 'no body'} to a Send"):
            await client.send(chunk, timeout_s=1)
    finally:
        await client.close()


async def test_an_answer_of_the_requests_kind_is_the_answer() -> None:
    client = session_client(AnsweringCall())
    pop = bpb.PopRequest(topic="t", group="g", filter="*", max_messages=4, invisible_ms=60_000)
    try:
        assert await client.begin_pop(pop, timeout_s=1) == bpb.PopResponse()
    finally:
        await client.close()


class RefusesUnknown(AnsweringCall):
    """A newer broker refusing every request with an error whose name this proxy does not know, as UNAVAILABLE."""

    async def write(self, message: bytes) -> None:
        request = bpb.SessionRequest.FromString(message)
        self.written.append(request)
        if not request.cancel:
            error = bpb.SessionError(error="BrokerUnavailable", message="refused", grpc_code=14)
            self.answers.put_nowait(bpb.SessionResponse(id=request.id, error=error))


async def test_a_send_refused_with_an_unknown_error_name_fails_as_its_grpc_code_says() -> None:
    """UNAVAILABLE: the broker marked down and the send failed over (`Sender._with_failover`), not INTERNAL."""
    client = session_client(RefusesUnknown())
    [chunk] = chunks([(0, shared_run(bpb.Message(topic="t"), [b"a"], ["1"]))], budget=1 << 20)
    try:
        with pytest.raises(errors.BrokerUnavailable, match="b1.*BrokerUnavailable: refused"):
            await client.send(chunk, timeout_s=1)
    finally:
        await client.close()
    assert not client.healthy


class AnswersTooMany(FakeBroker):
    """A broker whose Pop answers every ready message, past the Pop's max_messages, each after a copy of the first
    (the same delivery twice: its receipt handle too); records the give-backs (ChangeInvisibleTime)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.changed_invisible: list[bpb.ChangeInvisibleTimeRequest] = []

    async def pop(self, request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        self.pops.append(request)
        taken, self.ready = self.ready, []
        return bpb.PopResponse(messages=[taken[0], *taken])

    async def change_invisible_time(
        self, request: bpb.ChangeInvisibleTimeRequest, *, timeout_s: float
    ) -> bpb.ChangeInvisibleTimeResponse:
        self.changed_invisible.append(request)
        return await super().change_invisible_time(request, timeout_s=timeout_s)


async def test_a_pop_answer_past_the_pops_max_is_cut_to_it_and_the_rest_given_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client gets no more than it asked for (our SDK refuses such an answer whole); the messages past the max
    are ready again at the broker at once (ChangeInvisibleTime 0), except a copy of one the client got, whose
    delivery stays the client's. Logged the 1st, 10th, 100th ... time."""
    broker = AnswersTooMany("b1")
    pool = BrokerPool({"b1": broker}, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0))
    loop = asyncio.get_running_loop()
    for round_ in range(10):
        broker.ready = [popped("b1", f"m{i}", token=f"{round_:02x}{i:02x}") for i in range(6)]
        ask = ReceiveRequest("t", "g", "*", 4, 30_000, 0.0, loop.time() + 5)
        result = await proxy.receive(ask)
        assert [m.stored.message.message_id for m in result.messages] == ["m0", "m0", "m1", "m2"]
        result.release()
        await proxy.cuts.given_back()
        given_back = [(r.topic, r.group, r.receipt_handle, r.invisible_ms) for r in broker.changed_invisible]
        assert given_back == [("t", "g", handle("b1", token=f"{round_:02x}{i:02x}"), 0) for i in (3, 4, 5)]
        broker.changed_invisible.clear()
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "proxy.receive.over_max" and r.levelname == "WARNING"
    ]
    assert len(warnings) == 2 and all("b1" in w and "4" in w for w in warnings)
