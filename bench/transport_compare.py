"""Would another Python gRPC server help? grpc.aio (what popgate uses) against grpclib (pure-asyncio h2).

    .venv/bin/pip install --target /tmp/grpclib grpclib      # not a popgate dependency
    PYTHONPATH=/tmp/grpclib .venv/bin/python -m bench.transport_compare [--seconds 4] [--held 10000]

For each server kind a child process serves MessagingService with trivial handlers
(prebuilt answers); this process is a grpc.aio client, like the SDK and the official
client. Measured per server kind:
- stream: ReceiveMessage streaming 32 prebuilt message frames (+ timestamp and status),
  8 concurrent calls over 4 connections: msg/s, the server's and the client's CPU per message frame;
- unary32: SendMessage carrying 32 messages, 8 concurrent: msg/s, server and client CPU per message;
- idle: one unary call (Heartbeat) at a time, back to back and after 20 ms of idleness (p50/p99 ms),
  for grpc.aio and grpclib clients against each server;
- held: RSS growth per held ReceiveMessage call (10,000 over 20 connections, fresh server).
grpclib's HTTP/2 layer (h2) caps streams per connection at 100 by default; it is raised here
so that the held calls are really held. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from typing import Any

import grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc

from bench import grpc_call_floor
from bench.common import cpu_seconds, percentile

SERVICE = "/apache.rocketmq.v2.MessagingService/"


def frames(n: int) -> list[pb.ReceiveMessageResponse]:
    out = [pb.ReceiveMessageResponse()]
    out[0].delivery_timestamp.FromNanoseconds(time.time_ns())
    for _ in range(n):
        frame = pb.ReceiveMessageResponse()
        m = frame.message
        m.topic.name, m.body = "bench", b"x" * 256
        m.system_properties.message_id = "01" + "A" * 30
        m.system_properties.receipt_handle = "rh" * 40
        m.system_properties.delivery_attempt = 1
        m.system_properties.born_timestamp.FromNanoseconds(time.time_ns())
        out.append(frame)
    out.append(pb.ReceiveMessageResponse(status=v2.Status(code=v2.OK, message="OK")))
    return out


def long_polls(request: pb.ReceiveMessageRequest) -> bool:
    """Whether a receive is the held one (`grpc_call_floor.held_request`, a long poll) rather than the stream phase's
    (batch 32, no long-polling time), which is answered at once."""
    return request.HasField("long_polling_timeout")


def sent(request: pb.SendMessageRequest) -> pb.SendMessageResponse:
    entries = [pb.SendResultEntry(message_id=m.system_properties.message_id) for m in request.messages]
    return pb.SendMessageResponse(status=v2.Status(code=v2.OK), entries=entries)


def serve_aio(ports: Any) -> None:
    answer = frames(32)

    class Servicer(service_pb2_grpc.MessagingServiceServicer):
        async def ReceiveMessage(self, request: Any, context: Any) -> Any:  # type: ignore[override]
            if long_polls(request):
                await asyncio.sleep(300)
            for frame in answer:
                yield frame

        async def SendMessage(self, request: Any, context: Any) -> Any:  # type: ignore[override]
            return sent(request)

        async def Heartbeat(self, request: Any, context: Any) -> Any:  # type: ignore[override]
            return pb.HeartbeatResponse(status=v2.Status(code=v2.OK))

    asyncio.run(grpc_call_floor.run_server(Servicer(), ports, 600))


def serve_grpclib(ports: Any) -> None:
    import h2.connection
    import h2.settings
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    original = h2.connection.H2Connection.__init__

    def more_streams(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        codes = h2.settings.SettingCodes
        values = {codes.MAX_CONCURRENT_STREAMS: 1 << 20, codes.MAX_HEADER_LIST_SIZE: 65536}
        self.local_settings = h2.settings.Settings(client=self.config.client_side, initial_values=values)

    h2.connection.H2Connection.__init__ = more_streams  # type: ignore[method-assign]
    answer = frames(32)

    class Servicer:
        async def receive(self, stream: Any) -> None:
            request = await stream.recv_message()
            if long_polls(request):
                await asyncio.sleep(300)
            for frame in answer:
                await stream.send_message(frame)

        async def send(self, stream: Any) -> None:
            await stream.send_message(sent(await stream.recv_message()))

        async def heartbeat(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_message(pb.HeartbeatResponse(status=v2.Status(code=v2.OK)))

        def __mapping__(self) -> dict[str, Any]:
            return {
                SERVICE + "ReceiveMessage": Handler(
                    self.receive, Cardinality.UNARY_STREAM, pb.ReceiveMessageRequest, pb.ReceiveMessageResponse
                ),
                SERVICE + "SendMessage": Handler(
                    self.send, Cardinality.UNARY_UNARY, pb.SendMessageRequest, pb.SendMessageResponse
                ),
                SERVICE + "Heartbeat": Handler(
                    self.heartbeat, Cardinality.UNARY_UNARY, pb.HeartbeatRequest, pb.HeartbeatResponse
                ),
            }

    async def run() -> None:
        server = Server([Servicer()])
        await server.start("127.0.0.1", 0)
        ports.put(server._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.sleep(600)

    asyncio.run(run())


SERVERS = {"grpc.aio": serve_aio, "grpclib": serve_grpclib}


def start(kind: str) -> tuple[multiprocessing.Process, int]:
    ports: Any = multiprocessing.Queue()
    process = multiprocessing.Process(target=SERVERS[kind], args=(ports,), daemon=True)
    process.start()
    return process, ports.get(timeout=30)


async def throughput(port: int, pid: int, seconds: float) -> dict[str, tuple[float, float, float]]:
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.channel_id", i)]) for i in range(4)]
    stubs = [service_pb2_grpc.MessagingServiceStub(c) for c in channels]  # type: ignore[no-untyped-call]
    receive = pb.ReceiveMessageRequest(batch_size=32)
    send = pb.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name="t"), body=b"x" * 256)] * 32)

    async def stream(i: int, stop: float) -> int:
        count = 0
        while time.monotonic() < stop:
            async for frame in stubs[i % 4].ReceiveMessage(receive, timeout=10):
                count += frame.HasField("message")
        return count

    async def unary(i: int, stop: float) -> int:
        count = 0
        while time.monotonic() < stop:
            count += len((await stubs[i % 4].SendMessage(send, timeout=10)).entries)
        return count

    out = {}
    for name, step in (("stream", stream), ("unary32", unary)):
        await asyncio.gather(*(step(i, time.monotonic() + 0.5) for i in range(8)))  # warm up
        cpu0, own0, t0 = cpu_seconds(pid), time.process_time(), time.monotonic()
        counts = await asyncio.gather(*(step(i, t0 + seconds) for i in range(8)))
        elapsed, cpu, total = time.monotonic() - t0, cpu_seconds(pid) - cpu0, sum(counts)
        out[name] = (total / elapsed, cpu / total * 1e6, (time.process_time() - own0) / total * 1e6)
    for channel in channels:
        await channel.close()
    return out


async def idle_latency(client: str, port: int) -> dict[str, tuple[float, float]]:
    if client == "grpc.aio":
        channel: Any = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]

        async def call() -> None:
            await stub.Heartbeat(pb.HeartbeatRequest(), timeout=5)
    else:
        from grpclib.client import Channel, UnaryUnaryMethod

        channel = Channel("127.0.0.1", port)
        method: Any = UnaryUnaryMethod(channel, SERVICE + "Heartbeat", pb.HeartbeatRequest, pb.HeartbeatResponse)

        async def call() -> None:
            await method(pb.HeartbeatRequest(), timeout=5)

    for _ in range(50):
        await call()
    out = {}
    for gap in (0.0, 0.02):
        samples = []
        for _ in range(150):
            await asyncio.sleep(gap)
            t = time.perf_counter()
            await call()
            samples.append((time.perf_counter() - t) * 1e3)
        out[f"gap {gap * 1e3:.0f} ms"] = (percentile(samples, 50), percentile(samples, 99))
    result = channel.close()
    if asyncio.iscoroutine(result):
        await result
    return out


async def held(port: int, pid: int, calls: int) -> float:
    """KB of the server's RSS per held ReceiveMessage call: bench/grpc_call_floor's measurement."""
    args = argparse.Namespace(calls=calls, channels=20, settle_s=max(5.0, calls / 1500))
    return await grpc_call_floor.measure(port, pid, None, args) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--held", type=int, default=10_000)
    args = parser.parse_args()
    print(f"transport comparison, {os.cpu_count()} cpus; client: grpc.aio unless named")
    for kind in SERVERS:
        process, port = start(kind)
        for name, (rate, cpu_us, client_us) in asyncio.run(throughput(port, process.pid or 0, args.seconds)).items():
            print(f"{kind:9} {name:8} {rate:>9,.0f} msg/s   server CPU {cpu_us:5.1f} us/msg   client {client_us:5.1f}")
        for client in SERVERS:
            for gap, (p50, p99) in asyncio.run(idle_latency(client, port)).items():
                print(f"{kind:9} idle     client {client:9} {gap}: p50 {p50:.2f} ms  p99 {p99:.2f} ms")
        process.kill()
        process, port = start(kind)  # a fresh server: heap growth not hidden by earlier phases
        print(f"{kind:9} held     {asyncio.run(held(port, process.pid or 0, args.held)):.2f} KB RSS per held call")
        process.kill()


if __name__ == "__main__":
    main()
