"""`popgate bench`: produce, consume+ack and idle-wake latency through a proxy with the asyncio SDK."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sdk import aio
from sdk.commands import Sub, client_options, connection, progress

STAMP = struct.Struct("<Q")  # send time (time.monotonic_ns) in the first 8 body bytes


def add_parsers(sub: Sub) -> None:
    bench = sub.add_parser("bench", help="measure produce, consume+ack and idle-wake latency through the proxy")
    client_options(bench)
    bench.add_argument("--topic", default="", help="topic (default: a fresh one per run)")
    bench.add_argument("--count", type=int, default=20_000, help="messages to produce and consume")
    bench.add_argument("--size", type=int, default=256, help="body bytes")
    bench.add_argument("--batch", type=int, default=256, help="messages per SendMessage call")
    bench.add_argument("--concurrency", type=int, default=8, help="calls in flight (producers and consumers each)")
    bench.add_argument("--samples", type=int, default=50, help="idle-wake latency samples (0 = skip)")
    bench.set_defaults(handler=bench_command)


@dataclass
class Phase:
    name: str
    messages: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * p / 100
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


async def produce(args: argparse.Namespace, topic: str, advance: Callable[[int], None]) -> Phase:
    body = b"x" * max(8, args.size)
    remaining = args.count
    phase = Phase("produce")

    async with aio.Producer(args.endpoint, **connection(args)) as producer:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                n = min(args.batch, remaining)
                remaining -= n
                await producer.send_many(topic, [body] * n)
                phase.messages += n
                advance(n)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        phase.seconds = time.perf_counter() - started
    return phase


async def consume(args: argparse.Namespace, topic: str, group: str, advance: Callable[[int], None]) -> Phase:
    phase = Phase("consume+ack")
    done = asyncio.Event()
    options = connection(args)
    async with aio.SimpleConsumer(args.endpoint, group, {topic: "*"}, batch=32, wait=1.0, **options) as consumer:

        async def worker() -> None:
            while not done.is_set():
                batch = await consumer.receive(max=32, wait=1.0)
                if batch:
                    await consumer.ack_many(batch)
                    phase.messages += len(batch)
                    advance(len(batch))
                if phase.messages >= args.count:
                    done.set()

        started = time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(args.concurrency))), 60 + args.count / 500)
        except TimeoutError:
            pass  # reported as fewer messages than produced
        phase.seconds = time.perf_counter() - started
    return phase


async def idle_wake(args: argparse.Namespace, topic: str, group: str) -> Phase:
    """Send one message at a time to an idle, long-polling consumer; send-to-receive latency."""
    phase = Phase("idle wake")
    options = connection(args)
    async with (
        aio.Producer(args.endpoint, **options) as producer,
        aio.SimpleConsumer(args.endpoint, group, {topic: "*"}, wait=5.0, **options) as consumer,
    ):
        for _ in range(args.samples):
            receiver = asyncio.ensure_future(consumer.receive(max=1, wait=5.0))
            await asyncio.sleep(0.02)  # let the receive reach the broker and be held (idle), as in the peers' harness
            await producer.send(topic, STAMP.pack(time.monotonic_ns()) + b"x" * 56)
            for message in await receiver:
                (sent,) = STAMP.unpack_from(message.body)
                phase.latencies_ms.append((time.monotonic_ns() - sent) / 1e6)
                phase.messages += 1
                await consumer.ack(message)
    return phase


async def run(args: argparse.Namespace, bar: Progress) -> list[Phase]:
    topic = args.topic or f"bench-{uuid.uuid4().hex[:8]}"
    group = f"bench-{uuid.uuid4().hex[:8]}"
    task = bar.add_task("produce", total=args.count, rate="")
    phases = [await produce(args, topic, lambda n: bar.advance(task, n))]
    task = bar.add_task("consume+ack", total=args.count, rate="")
    phases.append(await consume(args, topic, group, lambda n: bar.advance(task, n)))
    if args.samples > 0:
        phases.append(await idle_wake(args, topic + "-idle", group))
    return phases


def summary(phases: list[Phase], args: argparse.Namespace) -> Table:
    table = Table(title=f"popgate bench via {args.endpoint}: {args.count} x {args.size} B, batch {args.batch}")
    for column in ("phase", "messages", "seconds", "msg/s", "p50 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for p in phases:
        lat = p.latencies_ms
        cells = [f"{percentile(lat, q):.2f}" for q in (50, 99)] + [f"{max(lat):.2f}"] if lat else ["-", "-", "-"]
        rate = f"{p.rate:,.0f}" if not lat else "-"
        table.add_row(p.name, str(p.messages), f"{p.seconds:.2f}", rate, *cells)
    return table


def bench_command(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    if args.count < 1 or args.concurrency < 1 or not 1 <= args.batch <= 1024:
        console.print("popgate bench: need --count >= 1, --concurrency >= 1, --batch 1..1024", style="red")
        return 2
    with progress(Console(stderr=True)) as bar:
        phases = asyncio.run(run(args, bar))
    console.print(summary(phases, args))
    if phases[1].messages < args.count:
        console.print(f"consumed {phases[1].messages} of {args.count} within the time limit", style="yellow")
    if len(phases) > 2 and phases[2].latencies_ms:
        console.print(f"idle wake mean {statistics.fmean(phases[2].latencies_ms):.2f} ms", style="dim")
    return 0
