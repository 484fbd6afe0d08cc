"""Proxy throughput: produce and consume+ack msg/s through the proxy vs. direct broker calls
(on the brokers' Session streams, as the proxy calls them).

    .venv/bin/python -m bench.proxy_bench [--brokers 2] [--seconds 5] [--concurrency 8] [--size 256] [--batch 32]

Starts its own brokers and proxy (popgate.cli.cluster, loopback, temporary data dir), runs
each phase for --seconds, prints a table. The proxy phases are a v2 client's (as an official
client calls it: SendMessage of --batch; ReceiveMessage of up to --batch, one frame a message,
then AckMessage of them; a call answered with an error status stops the run). Then, in the same
run, a bare grpc.aio server with trivial handlers (bench.transport_compare's) streams the same v2
frames and takes the same SendMessage calls, and the last table gives issue 28's official-client
ratio: the proxy's CPU per message over the bare
server's. Not a test: numbers depend on the machine.
Run it as a module (`-m bench.proxy_bench`): its client then runs on grpc's poller I/O, as popgate's own
programs do (bench/__init__.py, proto/popgate_process/grpc_engine.py); an application importing the SDK
gets grpc's default EventEngine unless it sets GRPC_EXPERIMENTS (docs/SDK.md, "gRPC I/O engine").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc

from bench import transport_compare
from bench.common import cpu_seconds
from popgate import _wire as wire
from popgate.cli.cluster import Cluster, ClusterConfig
from popgate_contract.session_client import BrokerSession


@dataclass
class Phase:
    rate: float  # messages per second
    cpu_us: float  # CPU microseconds per message spent in the measured processes


async def run_for(seconds: float, workers: int, step: Callable[[], Awaitable[int]], pids: list[int]) -> Phase:
    """Run `step` in `workers` concurrent loops for `seconds`."""
    end = time.perf_counter() + seconds
    counts = [0] * workers

    async def loop(i: int) -> None:
        while time.perf_counter() < end:
            counts[i] += await step()

    def cpu() -> float:  # user + system CPU time the measured processes used so far
        return sum(cpu_seconds(pid) for pid in pids)

    started, cpu_before = time.perf_counter(), cpu()
    await asyncio.gather(*(loop(i) for i in range(workers)))
    total = max(1, sum(counts))
    return Phase(total / (time.perf_counter() - started), (cpu() - cpu_before) / total * 1e6)


def v2_batch(topic: str, body: bytes, batch: int) -> pb.SendMessageRequest:
    messages = []
    for _ in range(batch):
        m = v2.Message(topic=v2.Resource(name=topic), body=body)
        m.system_properties.message_id = uuid.uuid4().hex
        m.system_properties.body_encoding = v2.IDENTITY
        m.system_properties.message_type = v2.NORMAL
        messages.append(m)
    return pb.SendMessageRequest(messages=messages)


def broker_batch(topic: str, body: bytes, batch: int) -> bpb.SendRequest:
    return bpb.SendRequest(messages=[bpb.Message(topic=topic, body=body, queue_id=-1) for _ in range(batch)])


def ok(status: v2.Status, what: str) -> None:
    """A call counts only when answered OK: an error stops the run instead of counting 0 messages (which would
    inflate the proxy's CPU per message) — tests/unit/bench/test_proxy_bench.py."""
    if status.code != v2.OK:
        raise RuntimeError(f"{what} answered {v2.Code.Name(status.code)}: {status.message}")


class ProxySteps:
    """An official client's calls on the proxy (generated stub, no SDK), each checked by `ok`."""

    def __init__(self, stub: service_pb2_grpc.MessagingServiceStub, args: argparse.Namespace) -> None:
        self.stub, self.args, self.body = stub, args, b"x" * args.size

    async def produce(self) -> int:
        reply = await self.stub.SendMessage(v2_batch("bench_proxy", self.body, self.args.batch), timeout=10)
        ok(reply.status, "SendMessage")
        for entry in reply.entries:
            ok(entry.status, "SendMessage entry")
        return len(reply.entries)

    async def consume(self) -> int:
        request = wire.receive_request("bench", wire.Subscription("bench_proxy"), max=self.args.batch, invisible=60,
                                       wait=1)  # fmt: skip
        entries = []
        async for frame in self.stub.ReceiveMessage(request, timeout=10):
            if frame.HasField("message"):
                entries.append(pb.AckMessageEntry(receipt_handle=frame.message.system_properties.receipt_handle))
            elif frame.HasField("status") and frame.status.code != v2.MESSAGE_NOT_FOUND:  # that one: nothing yet
                ok(frame.status, "ReceiveMessage")
        if not entries:
            return 0
        ack = pb.AckMessageRequest(group=request.group, topic=request.message_queue.topic, entries=entries)
        reply = await self.stub.AckMessage(ack, timeout=10)
        ok(reply.status, "AckMessage")
        for entry in reply.entries:
            ok(entry.status, "AckMessage entry")
        return len(entries)


async def proxy_phases(endpoint: str, pids: list[int], args: argparse.Namespace) -> tuple[Phase, Phase]:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        steps = ProxySteps(service_pb2_grpc.MessagingServiceStub(channel), args)  # type: ignore[no-untyped-call]
        produced = await run_for(args.seconds, args.concurrency, steps.produce, pids)
        consumed = await run_for(args.seconds, args.concurrency, steps.consume, pids)
    return produced, consumed


async def direct_phases(addresses: list[str], pids: list[int], args: argparse.Namespace) -> tuple[Phase, Phase]:
    body = b"x" * args.size
    # The proxy's own transport to the brokers: one Session stream per broker.
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    sessions = [BrokerSession(channel=c).open() for c in channels]
    turn = [0]

    def next_session() -> BrokerSession:
        turn[0] += 1
        return sessions[turn[0] % len(sessions)]

    async def produce() -> int:
        reply = await next_session().send(broker_batch("bench_direct", body, args.batch))
        return len(reply.results)

    async def consume() -> int:
        session = next_session()
        popped = await session.pop(
            bpb.PopRequest(topic="bench_direct", group="bench", filter="*", max_messages=args.batch,
                           invisible_ms=60000, poll_ms=1000),
        )  # fmt: skip
        if not popped.messages:
            return 0
        handles = [m.receipt_handle for m in popped.messages]
        await session.ack(bpb.AckRequest(topic="bench_direct", group="bench", receipt_handles=handles))
        return len(handles)

    try:
        produced = await run_for(args.seconds, args.concurrency, produce, pids)
        consumed = await run_for(args.seconds, args.concurrency, consume, pids)
    finally:
        for session in sessions:
            await session.close()
        for channel in channels:
            await channel.close()
    return produced, consumed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = ClusterConfig(brokers=args.brokers, listen="127.0.0.1:0", data_dir=Path(tmp))
        with Cluster(config) as cluster:
            addresses = [c.address for c in cluster.brokers.values()]
            broker_pids = [c.process.pid for c in cluster.brokers.values() if c.process]
            proxy_pids = [c.process.pid for c in cluster.proxies if c.process]
            direct = asyncio.run(direct_phases(addresses, broker_pids, args))
            proxied = asyncio.run(proxy_phases(cluster.endpoint, proxy_pids, args))
    print(f"proxy bench: {args.brokers} brokers, body {args.size} B, batch {args.batch}, "
          f"concurrency {args.concurrency}, {args.seconds:g} s per phase")  # fmt: skip
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}")  # fmt: skip
    print("cpu us/msg: CPU time of the brokers (direct) or of the proxy process alone (proxy) per message;")
    print("1e6 / (proxy cpu us/msg) is what one fully available core could push through the proxy.")
    header = f"{'phase':<14}{'direct msg/s':>14}{'broker cpu us/msg':>19}{'proxy msg/s':>13}{'proxy cpu us/msg':>18}"
    print(header + f"{'proxy/direct':>14}{'1 core cap':>12}")
    for name, d, p in (("produce", direct[0], proxied[0]), ("consume+ack", direct[1], proxied[1])):
        ratio = p.rate / d.rate if d.rate else 0.0
        cap = 1e6 / p.cpu_us if p.cpu_us else 0.0
        print(f"{name:<14}{d.rate:>14.0f}{d.cpu_us:>19.1f}{p.rate:>13.0f}{p.cpu_us:>18.1f}{ratio:>13.0%}{cap:>12.0f}")
    process, port = transport_compare.start("grpc.aio")
    try:
        bare = asyncio.run(transport_compare.throughput(port, process.pid or 0, args.seconds))
    finally:
        process.terminate()
        process.join(10)
    print("official-client path, same run: the proxy's CPU per message over a bare grpc.aio server's (trivial")
    print("handlers: ReceiveMessage streaming 32 prebuilt frames, SendMessage of 32) — issue 28's target <= 1.3x")
    print(f"{'phase':<14}{'proxy cpu us/msg':>18}{'bare cpu us/msg':>17}{'ratio':>8}")
    for name, p, kind in (("produce", proxied[0], "unary32"), ("consume+ack", proxied[1], "stream")):
        floor = bare[kind][1]
        print(f"{name:<14}{p.cpu_us:>18.1f}{floor:>17.1f}{p.cpu_us / floor if floor else 0.0:>7.2f}x")


if __name__ == "__main__":
    main()
