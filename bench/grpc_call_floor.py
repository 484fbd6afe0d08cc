"""The floor under a held receive: RSS per held server-streaming call in a bare grpc.aio server.

    .venv/bin/python -m bench.grpc_call_floor [--calls 10000] [--channels 20] [--python-share]

A child process serves MessagingService.ReceiveMessage with a handler that only sleeps
(the server options and call bound the proxy uses); this process opens --calls calls (the
request of a held receive, as bench.idle_receives sends) over --channels connections and
reads the child's RSS growth per call. Whatever popgate's proxy costs per held receive above
this number is its own; this number is grpc's. bench.idle_receives measures it beside the
proxy in the same run. Not a test.

--python-share: the child traces Python's allocations (tracemalloc) and reports how much
of a held call is Python objects (grpc.aio's per-RPC objects, the handler's task and
coroutines, the request message); the rest of the RSS number is grpc core's C memory
(the call, its arena, its HTTP/2 stream). Tracing inflates RSS, so that run prints only
the Python share.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import threading
import tracemalloc
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from typing import Any

import grpc
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc

from bench.common import machine, rss_bytes
from popgate import _wire as wire

OPTIONS = [
    ("grpc.server.max_pending_requests", 1 << 20),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
    ("grpc.max_concurrent_streams", 1 << 20),
]
MAX_CALLS = 1 << 20


def held_request(wait: float = 30) -> pb.ReceiveMessageRequest:
    """The request of a held receive (bench.idle_receives sends the same): the server parses and keeps it."""
    return wire.receive_request("g-idle", wire.Subscription("idle"), max=16, invisible=60, wait=wait)


class Idle(service_pb2_grpc.MessagingServiceServicer):
    async def ReceiveMessage(self, request: pb.ReceiveMessageRequest, context: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        await asyncio.sleep(3600)  # held until the client cancels the call or its deadline passes
        yield pb.ReceiveMessageResponse()


async def run_server(servicer: Any, ports: Any, hold_s: float) -> None:
    """A bare grpc.aio server with the proxy's options serving `servicer`; its port goes to `ports`."""
    # The proxy bounds its calls (proxy.server.max_calls): grpc's limiter then adds to every call, so here too.
    server = grpc.aio.server(options=OPTIONS, maximum_concurrent_rpcs=MAX_CALLS)
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ports.put(port)
    await asyncio.sleep(hold_s)


def serve(ports: multiprocessing.Queue[int], traced: Connection | None) -> None:
    if traced is not None:
        tracemalloc.start()
        threading.Thread(target=_answer_traced, args=(traced,), daemon=True).start()
    asyncio.run(run_server(Idle(), ports, 300))


def _answer_traced(conn: Connection) -> None:
    """Answers every message on `conn` with the bytes Python has allocated now (tracemalloc)."""
    while conn.recv() is not None:
        conn.send(tracemalloc.get_traced_memory()[0])


def _sample(pid: int, traced: Connection | None) -> int:
    """The child's RSS, or the bytes of Python objects it holds when tracing."""
    if traced is None:
        return rss_bytes(pid)
    traced.send(True)
    return int(traced.recv())


async def measure(port: int, pid: int, traced: Connection | None, args: argparse.Namespace) -> float:
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.channel_id", i)]) for i in range(args.channels)
    ]
    stubs = [service_pb2_grpc.MessagingServiceStub(ch) for ch in channels]  # type: ignore[no-untyped-call]
    warm = [stub.ReceiveMessage(pb.ReceiveMessageRequest(), timeout=0.5) for stub in stubs]
    await asyncio.gather(*(call.read() for call in warm), return_exceptions=True)
    await asyncio.sleep(1)
    base = _sample(pid, traced)
    request = held_request()
    calls = [stubs[i % len(stubs)].ReceiveMessage(request, timeout=60) for i in range(args.calls)]
    readers = [asyncio.ensure_future(call.read()) for call in calls]
    await asyncio.sleep(args.settle_s)
    held = sum(not reader.done() for reader in readers)  # a call grpc refused would make the number look small
    if held < args.calls:
        print(f"only {held} of {args.calls} calls were held")
    per_call = (_sample(pid, traced) - base) / max(1, held)
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
    parser.add_argument("--python-share", action="store_true", help="measure the Python objects of a held call")
    args = parser.parse_args()
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    ours, theirs = multiprocessing.Pipe() if args.python_share else (None, None)
    child = multiprocessing.Process(target=serve, args=(ports, theirs), daemon=True)
    child.start()
    try:
        assert child.pid is not None
        per_call = asyncio.run(measure(ports.get(timeout=30), child.pid, ours, args))
    finally:
        child.kill()
        child.join(10)
    print(f"{machine()}; grpcio {grpc.__version__}")
    what = "Python objects (tracemalloc)" if args.python_share else "RSS"
    print(f"bare grpc.aio server, {args.calls} held server-streaming calls: {per_call / 1024:.2f} KB {what} per call")


if __name__ == "__main__":
    main()
