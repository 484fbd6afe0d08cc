"""A broker Send from the proxy's broker client: runs go only to a broker that said it stores them, so that a new
proxy keeps working beside older brokers during a rolling upgrade."""

from __future__ import annotations

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate_contract.session_client import MORE_KEY, RUNS_KEY
from proxy.brokers import GrpcBrokerClient
from proxy.outgoing import chunks, shared_run
from proxy.settings import BrokerAddress
from tests.unit.broker.test_session_stream import AnsweringCall, session_on


class Broker(AnsweringCall):
    """A broker's Session call that answers every request at once, and says in its initial metadata what it reads."""

    def __init__(self, *, stores_runs: bool) -> None:
        super().__init__()
        self.says = ((MORE_KEY, "1"), (RUNS_KEY, "1")) if stores_runs else ((MORE_KEY, "1"),)

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
