"""A broker Send from the proxy's broker client: runs go only to a broker that said it stores them, so that a new
proxy keeps working beside older brokers during a rolling upgrade; the broker is given less time than the proxy."""

from __future__ import annotations

import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2
from prometheus_client import CollectorRegistry

from popgate_contract import errors
from popgate_contract.session_client import MORE_KEY, RUNS_KEY, TRANSACTIONS_KEY
from popgate_contract.trailer import status_of
from proxy.brokers import GrpcBrokerClient
from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.outgoing import chunks, shared_run
from proxy.receive.notify_driver import NotifyStrategy
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.v2.context import endpoints_for
from proxy.v2.service import MessagingService
from tests.unit.broker.test_session_stream import AnsweringCall, session_on
from tests.unit.proxy.test_session import send_request
from tests.unit.proxy.test_v2_service import Context


class Broker(AnsweringCall):
    """A broker's Session call that answers every request at once, and says in its initial metadata what it reads."""

    def __init__(self, *, stores_runs: bool = False, reads_ends: bool = False) -> None:
        super().__init__()
        self.says = ((MORE_KEY, "1"),) + ((RUNS_KEY, "1"),) * stores_runs + ((TRANSACTIONS_KEY, "1"),) * reads_ends

    async def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.says


@pytest.mark.parametrize("stores_runs", [True, False])
async def test_a_broker_is_sent_runs_only_once_it_said_it_stores_them(stores_runs: bool) -> None:
    call = Broker(stores_runs=stores_runs)
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"))
    client._session = session_on(call).open()  # its stream: this call (no socket)
    [chunk] = chunks([(0, shared_run(bpb.Message(topic="t"), [b"a", b"b"], ["1", "2"]))], budget=1 << 20)
    try:
        await client.send(chunk, timeout_s=1)  # the first, before the broker said anything: whole messages
        await client.send(chunk, timeout_s=1)
    finally:
        await client.close()
    sent = [request.send for request in call.written]
    assert [(len(s.messages), len(s.runs)) for s in sent] == [(2, 0), (0, 1) if stores_runs else (2, 0)]
    assert [m.message_id for m in sent[0].messages] == ["1", "2"]


@pytest.mark.parametrize("reads_ends", [True, False])
async def test_a_transactions_end_rides_the_stream_of_a_broker_that_said_it_reads_it(reads_ends: bool) -> None:
    """A frame on the Session stream, not a call, once the broker said it reads it; an older broker (a rolling
    upgrade) gets the EndTransaction call."""
    call = Broker(reads_ends=reads_ends)
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"))
    client._session = session_on(call).open()  # its stream: this call (no socket)
    unary: list[bpb.EndTransactionRequest] = []

    async def end_transaction(request: bpb.EndTransactionRequest, **_: object) -> bpb.EndTransactionResponse:
        unary.append(request)
        return bpb.EndTransactionResponse()

    client._stub = type("Stub", (), {"EndTransaction": staticmethod(end_transaction)})()
    request = bpb.EndTransactionRequest(topic="t", transaction_id="tid", commit=True)
    try:
        await client.send(
            chunks([(0, shared_run(bpb.Message(topic="t"), [b"a"], ["1"]))], budget=1 << 20)[0], timeout_s=1
        )
        await client.end_transaction(request, timeout_s=1)  # the stream has said what it reads by now
    finally:
        await client.close()
    on_stream = [r.end_transaction for r in call.written if r.WhichOneof("body") == "end_transaction"]
    assert (len(on_stream), len(unary)) == ((1, 0) if reads_ends else (0, 1))


class NotStoring(Broker):
    """A broker whose store did not start a Send's commit within the time the Send gave it: refused, not stored."""

    async def write(self, message: bytes) -> None:
        request = bpb.SessionRequest.FromString(message)
        self.written.append(request)
        if not request.cancel:
            refusal = errors.TooManyRequests("the store is behind: not stored, retry")
            error = bpb.SessionError(error=refusal.name, message=refusal.message, grpc_code=status_of(refusal).value[0])
            self.answers.put_nowait(bpb.SessionResponse(id=request.id, error=error))


async def test_a_send_the_broker_did_not_store_in_its_time_reaches_a_v2_client_as_too_many_requests() -> None:
    """The broker is given less time than the proxy's own, so that its refusal (nothing stored: a retry makes no
    duplicate) comes first and reaches the client as itself, not as the proxy's PROXY_TIMEOUT (outcome unknown)."""
    call = NotStoring(stores_runs=True)
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"))
    client._session = session_on(call).open()  # its stream: this call (no socket)
    pool = BrokerPool({"b1": client}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=3.0))
    metrics = ProxyMetrics(CollectorRegistry())
    service = MessagingService(proxy, Settings(brokers=(client.address,)), endpoints_for("127.0.0.1:8081"), metrics)
    try:
        response = await service.SendMessage(send_request(), Context())
    finally:
        await client.close()
    assert response.status.code == v2.TOO_MANY_REQUESTS and "not stored" in response.status.message
    [sent] = [request.send for request in call.written]
    assert 1000 < sent.timeout_ms < 3000  # the proxy's own: its broker timeout (the client's deadline is later)
