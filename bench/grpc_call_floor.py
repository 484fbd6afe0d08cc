"""The floor under a held receive: RSS per held server-streaming call in a bare grpc.aio server.

    .venv/bin/python -m bench.grpc_call_floor [--calls 10000] [--channels 20]

A child process serves MessagingService.ReceiveMessage with a handler that only sleeps
(the server options the proxy uses); this process opens --calls calls over --channels
connections and reads the child's RSS growth per call. Whatever popgate's proxy costs
per held receive above this number is its own; this number is grpc's. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
from collections.abc import AsyncIterator
from typing import Any

import grpc
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc

from bench.common import machine, rss_bytes

OPTIONS = [
    ("grpc.server.max_pending_requests", 1 << 20),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
    ("grpc.max_concurrent_streams", 1 << 20),
]


class Idle(service_pb2_grpc.MessagingServiceServicer):
    async def ReceiveMessage(self, request: pb.ReceiveMessageRequest, context: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        await asyncio.sleep(120)
        yield pb.ReceiveMessageResponse()


async def run_server(servicer: Any, ports: Any, hold_s: float) -> None:
    """A bare grpc.aio server with the proxy's options serving `servicer`; its port goes to `ports`."""
    server = grpc.aio.server(options=OPTIONS)
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ports.put(port)
    await asyncio.sleep(hold_s)


def serve(ports: multiprocessing.Queue[int]) -> None:
    asyncio.run(run_server(Idle(), ports, 300))


async def measure(port: int, pid: int, args: argparse.Namespace) -> float:
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.channel_id", i)]) for i in range(args.channels)
    ]
    stubs = [service_pb2_grpc.MessagingServiceStub(ch) for ch in channels]  # type: ignore[no-untyped-call]
    warm = [stub.ReceiveMessage(pb.ReceiveMessageRequest(), timeout=0.5) for stub in stubs]
    await asyncio.gather(*(call.read() for call in warm), return_exceptions=True)
    await asyncio.sleep(1)
    base = rss_bytes(pid)
    calls = [stubs[i % len(stubs)].ReceiveMessage(pb.ReceiveMessageRequest(), timeout=60) for i in range(args.calls)]
    readers = [asyncio.ensure_future(call.read()) for call in calls]
    await asyncio.sleep(args.settle_s)
    held = sum(not reader.done() for reader in readers)  # a call grpc refused would make the number look small
    if held < args.calls:
        print(f"only {held} of {args.calls} calls were held")
    per_call = (rss_bytes(pid) - base) / max(1, held)
    for call in calls:
        call.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for ch in channels:
        await ch.close()
    return per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--channels", type=int, default=20)
    parser.add_argument("--settle-s", type=float, default=8.0)
    args = parser.parse_args()
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    child = multiprocessing.Process(target=serve, args=(ports,), daemon=True)
    child.start()
    try:
        assert child.pid is not None
        per_call = asyncio.run(measure(ports.get(timeout=30), child.pid, args))
    finally:
        child.kill()
        child.join(10)
    print(f"{machine()}; grpcio {grpc.__version__}")
    print(f"bare grpc.aio server, {args.calls} held server-streaming calls: {per_call / 1024:.2f} KB RSS per call")


if __name__ == "__main__":
    main()
