"""The gRPC server takes a bounded number of calls: also calls whose request never comes, which no handler sees."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from proxy.server import UNARY_CALLS
from tests.integration.proxy.conftest import MakeCluster


def test_calls_whose_request_never_comes_are_bounded_and_the_proxy_serves_again_once_they_go(
    make_cluster: MakeCluster,
) -> None:
    """Before, each such call held ~21 KB in grpc with no bound: 40,000 took a proxy from 50 to 882 MiB."""
    cluster = make_cluster(brokers=1, proxy_args=("--max-held-receives", "1", "--max-telemetry-streams", "1"))
    bound = 1 + 1 + UNARY_CALLS

    async def scenario() -> tuple[list[grpc.StatusCode], grpc.StatusCode | None]:
        never = asyncio.Event()

        async def nothing() -> AsyncIterator[bytes]:  # headers go out, the request message never does
            await never.wait()
            yield b""

        options = [("grpc.max_concurrent_streams", 1 << 20)]
        async with grpc.aio.insecure_channel(cluster.endpoint, options=options) as channel:
            path = "/apache.rocketmq.v2.MessagingService/ReceiveMessage"
            open_call = channel.stream_stream(path, request_serializer=bytes, response_deserializer=bytes)
            held = [open_call(nothing()) for _ in range(bound)]
            for call in held[:: bound // 8]:
                await call.wait_for_connection()
            extra = [open_call(nothing()) for _ in range(20)]
            refused = [await call.code() for call in extra]  # answered at once, the others still open
            for call in held:
                call.cancel()
            await asyncio.gather(*(c.code() for c in held))
            stub = pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
            for _ in range(100):  # the server counts a call out once grpc has finished it
                try:
                    await stub.Heartbeat(pb.HeartbeatRequest(), timeout=5)
                    return refused, None
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        return refused, exc.code()
                    await asyncio.sleep(0.05)
            return refused, grpc.StatusCode.RESOURCE_EXHAUSTED

    refused, after = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 20
    assert after is None, f"a heartbeat after the calls went: {after}"
