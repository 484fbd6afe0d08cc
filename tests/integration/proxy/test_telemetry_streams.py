"""Telemetry streams the client cancels (every official client does at shutdown) end cleanly in the proxy:
no task left behind with an error nobody reads (each was an ERROR with a traceback in the proxy's log)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.receive.coupled import LongPollStrategy
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.v2.context import endpoints_for
from proxy.v2.service import MessagingService
from tests.unit.proxy.fakes import FakeBroker


def test_cancelled_telemetry_streams_leave_no_unread_error() -> None:
    async def scenario() -> list[dict[str, Any]]:
        problems: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, context: problems.append(context))
        pool = BrokerPool({"b1": FakeBroker("b1")})
        proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1))
        settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
        service = MessagingService(proxy, settings, endpoints_for("127.0.0.1:1"), ProxyMetrics(CollectorRegistry()))
        server = grpc.aio.server()
        pb_grpc.add_MessagingServiceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
                for _ in range(10):
                    call = stub.Telemetry()
                    await call.write(pb.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER)))
                    assert (await call.read()).status.code == v2.OK
                    call.cancel()
                await asyncio.sleep(0.5)
        finally:
            await server.stop(0)
        gc.collect()
        await asyncio.sleep(0.2)
        return problems

    problems = asyncio.run(scenario())
    assert problems == []
