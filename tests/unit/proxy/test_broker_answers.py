"""Broker answers that do not make sense, at the proxy's broker client (proxy.brokers.GrpcBrokerClient), no sockets:
an answer that does not decode is a failure naming the broker and the call, never a successful empty answer; the
brokers that did answer are still heard."""

from __future__ import annotations

from typing import Any

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.admin import AdminService
from proxy.auth import Authenticator
from proxy.brokers import GrpcBrokerClient
from proxy.ports import NoMetrics
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress
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
