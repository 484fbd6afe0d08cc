"""Both of the proxy's client-facing servers (`--server h2`, the default, and `--server grpcio`, grpc's own) serve
the same calls with the same answers: v2 unary and streaming calls, popgate's Session stream, health, and a
bad request's status (docs/PROXY.md "Server")."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate.aio import Producer, SimpleConsumer
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster


@pytest.mark.parametrize("server", ["h2", "grpcio"])
def test_each_server_serves_v2_session_health_and_refusals_alike(make_cluster: MakeCluster, server: str) -> None:
    cluster = make_cluster(brokers=2, proxy_args=("--server", server))
    client = V2Client(cluster.endpoint)
    try:
        sent = client.send("choice", [f"m{i}".encode() for i in range(40)])
        assert sent.status.code == v2.OK and len(sent.entries) == 40
        got: list[v2.Message] = []
        while len(got) < 40:
            status, messages = client.receive("choice", "g")
            assert status.code in (v2.OK, v2.MESSAGE_NOT_FOUND)
            got += messages
        assert sorted(m.body for m in got) == sorted(f"m{i}".encode() for i in range(40))
        assert client.ack("choice", "g", got).status.code == v2.OK
        bad = client.stub.SendMessage(pb.SendMessageRequest(), timeout=5)
        assert bad.status.code == v2.BAD_REQUEST
        health = health_pb2_grpc.HealthStub(client.channel)  # type: ignore[no-untyped-call]
        serving = health.Check(health_pb2.HealthCheckRequest(service="apache.rocketmq.v2.MessagingService"))
        assert serving.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="nothing"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        client.close()
    assert asyncio.run(session_round(cluster.endpoint)) == [b"over the session"]


async def session_round(endpoint: str) -> list[bytes]:
    """A send, receive and ack through popgate.aio, which uses the proxy's Session stream."""
    async with Producer(endpoint) as producer, SimpleConsumer(endpoint, "gs", "choice_s") as consumer:
        await producer.send("choice_s", b"over the session")
        messages = await consumer.receive(max=32, wait=5)
        await consumer.ack_many(messages)
        return [m.body for m in messages]
