"""Broker benchmark, direct gRPC to one broker process (256 B bodies).

Prints: Send msg/s (batch 32), Pop+Ack msg/s (batch 32) — on the broker's Session
stream (what the proxy uses), then with one unary call per request — wake latency
of a held Pop (from the Send call to the Pop answer), and memory/CPU of 10,000
held Pops.

    .venv/bin/python -m bench.broker_bench [--messages 200000] [--concurrency 16] [--channels 4] [--flush async|sync]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import grpc
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import cpu_seconds, machine, rss_bytes, summary, table  # noqa: E402
from popgate_contract.session_client import BrokerSession  # noqa: E402
from tests.procs import ServerProcess, broker_args  # noqa: E402

BODY = b"x" * 256
BATCH = 32


class Unary:
    """One gRPC call per request."""

    def __init__(self, stub: pb_grpc.BrokerStub) -> None:
        self.send, self.pop, self.ack = stub.Send, stub.Pop, stub.Ack


class Session:
    """Requests multiplexed on the broker's Session stream (what the proxy uses)."""

    def __init__(self, session: BrokerSession) -> None:
        self.send, self.pop, self.ack = session.send, session.pop, session.ack


Caller = Unary | Session


async def send_phase(callers: list[Caller], topic: str, total: int, concurrency: int) -> tuple[int, float]:
    request = pb.SendRequest(messages=[pb.Message(topic=topic, body=BODY) for _ in range(BATCH)])
    per_worker = total // BATCH // concurrency

    async def worker(caller: Caller) -> None:
        for _ in range(per_worker):
            await caller.send(request)

    started = time.perf_counter()
    await asyncio.gather(*(worker(callers[i % len(callers)]) for i in range(concurrency)))
    sent = per_worker * concurrency * BATCH
    return sent, sent / (time.perf_counter() - started)


async def pop_ack_phase(callers: list[Caller], topic: str, total: int, concurrency: int) -> float:
    done = 0

    async def worker(caller: Caller) -> None:
        nonlocal done
        request = pb.PopRequest(topic=topic, group="g", max_messages=BATCH, invisible_ms=60000, poll_ms=0)
        while done < total:
            response = await caller.pop(request)
            if not response.messages:
                if done >= total:
                    return
                await asyncio.sleep(0.001)
                continue
            done += len(response.messages)
            await caller.ack(
                pb.AckRequest(topic=topic, group="g", receipt_handles=[m.receipt_handle for m in response.messages])
            )

    started = time.perf_counter()
    await asyncio.gather(*(worker(callers[i % len(callers)]) for i in range(concurrency)))
    return done / (time.perf_counter() - started)


async def wake_phase(stub: pb_grpc.BrokerStub, rounds: int) -> list[float]:
    latencies = []
    for i in range(rounds):
        held = asyncio.ensure_future(
            stub.Pop(pb.PopRequest(topic="wake", group="w", max_messages=1, invisible_ms=60000, poll_ms=10000))
        )
        # The held count lives in another process: poll it (bounded by the Pop's own 10 s).
        while (await stub.Stats(pb.StatsRequest(topic="none"))).held_pops < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        started = time.perf_counter()
        await stub.Send(pb.SendRequest(messages=[pb.Message(topic="wake", body=b"%d" % i)]))
        response = await held
        latencies.append((time.perf_counter() - started) * 1000)
        assert len(response.messages) == 1
        await stub.Ack(pb.AckRequest(topic="wake", group="w", receipt_handles=[response.messages[0].receipt_handle]))
    return latencies


async def held_phase(address: str, pid: int, count: int, *, session: bool) -> tuple[float, float]:
    """Hold ``count`` Pops (on 8 Session streams, or one unary call each); broker RSS per held Pop and idle CPU."""
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(8)]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    sessions = [BrokerSession(channel=c).open() for c in channels] if session else []
    await stubs[0].Stats(pb.StatsRequest())
    await asyncio.sleep(1)
    before = rss_bytes(pid)
    request = pb.PopRequest(topic="idle", group="idle", max_messages=1, invisible_ms=60000, poll_ms=30000)
    if session:
        tasks = [asyncio.ensure_future(sessions[i % 8].pop(request)) for i in range(count)]
    else:
        tasks = [asyncio.ensure_future(stubs[i % 8].Pop(request, timeout=60)) for i in range(count)]
    deadline = time.monotonic() + 60
    held_now = stubs[0].Stats  # the held count lives in another process: poll it with a deadline
    while (await held_now(pb.StatsRequest(topic="none"))).held_pops < count and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    held = (await stubs[0].Stats(pb.StatsRequest(topic="none"))).held_pops
    await asyncio.sleep(1)
    per_request = (rss_bytes(pid) - before) / max(1, held)
    cpu_start, wall_start = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(5)
    idle_cpu = (cpu_seconds(pid) - cpu_start) / (time.monotonic() - wall_start) * 100
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in sessions:
        await s.close()
    for c in channels:
        await c.close()
    assert held == count, f"only {held} of {count} pops were held"
    return per_request, idle_cpu


async def run(args: argparse.Namespace, address: str, pid: int) -> list[tuple[str, str, str]]:
    channels = [grpc.aio.insecure_channel(address) for _ in range(args.channels)]
    stubs = [pb_grpc.BrokerStub(c) for c in channels]
    await stubs[0].Stats(pb.StatsRequest())
    sessions = [BrokerSession(channel=c).open() for c in channels]
    rates = {}
    kinds: list[tuple[str, list[Caller]]] = [
        ("Session", [Session(s) for s in sessions]),
        ("unary", [Unary(s) for s in stubs]),
    ]
    for name, callers in kinds:
        topic = f"bench-{name.lower()}"
        sent, rates[name, "send"] = await send_phase(callers, topic, args.messages, args.concurrency)
        rates[name, "pop"] = await pop_ack_phase(callers, topic, sent, args.concurrency)
    for s in sessions:
        await s.close()
    wake = summary(await wake_phase(stubs[0], args.wake_rounds))
    for c in channels:
        await c.close()
    per_held, idle_cpu = await held_phase(address, pid, args.held, session=True)
    per_unary, _ = await held_phase(address, pid, 2000, session=False)
    return [
        ("metric", "value", "target"),
        ("---", "---:", "---"),
        (
            f"Send msg/s (batch {BATCH}, 256 B, flush={args.flush}, Session)",
            f"{rates['Session', 'send']:,.0f}",
            ">= 60,000",
        ),
        (f"Pop+Ack msg/s (batch {BATCH}, Session)", f"{rates['Session', 'pop']:,.0f}", ">= 40,000"),
        (f"Send msg/s (batch {BATCH}, one unary call each)", f"{rates['unary', 'send']:,.0f}", "-"),
        (f"Pop+Ack msg/s (batch {BATCH}, one unary call each)", f"{rates['unary', 'pop']:,.0f}", "-"),
        ("wake latency p50 / p99 / max (ms)", f"{wake['p50']:.2f} / {wake['p99']:.2f} / {wake['max']:.2f}", "p99 <= 5"),
        (f"memory per held Pop ({args.held:,} held on 8 Session streams)", f"{per_held / 1024:.2f} KB", "<= 4 KB"),
        ("memory per held unary Pop (2,000 held, one gRPC call each)", f"{per_unary / 1024:.2f} KB", "-"),
        (f"broker CPU while {args.held:,} Pops are held", f"{idle_cpu:.1f} %", "-"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--wake-rounds", type=int, default=300)
    parser.add_argument("--held", type=int, default=10_000)
    parser.add_argument("--flush", choices=["async", "sync"], default="async")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="popgate-bench-"))
    broker = ServerProcess("broker", broker_args("b1", data, "--flush", args.flush, "--max-held", "20000")).start()
    try:
        assert broker.proc is not None
        rows = asyncio.run(run(args, broker.address, broker.proc.pid))
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
    print(f"broker_bench on {machine()}")
    print(table(rows))


if __name__ == "__main__":
    main()
