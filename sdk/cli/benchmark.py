"""`popgate bench`: produce, consume+ack and idle-wake latency through a proxy with the asyncio SDK."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from popgate_pb import broker_pb2 as bpb
from rich.progress import Progress
from rich.table import Table

from .. import aio, errors
from .._transport import MAX_MESSAGE_BYTES
from .options import (
    NON_NEGATIVE_INT,
    POSITIVE,
    Size,
    Sub,
    check_listening,
    client_options,
    connection,
    json_option,
    number,
    quiet_option,
)
from .output import error_console, explain, print_json, print_table, progress
from .proxy_admin import ProxyAdmin, ProxyAdminError
from .sending import check_in_memory

STAMP = struct.Struct("<Q")  # send time (time.monotonic_ns) in the first 8 body bytes
# One consumer group for every run: a run on a reused --topic goes on where the last one stopped instead of
# reading every earlier run's messages again (and timing the idle wake of their old stamps) as a new group would.
GROUP = "popgate-bench"


def add_parsers(sub: Sub) -> None:
    bench = sub.add_parser("bench", help="measure produce, consume+ack and idle-wake latency through the proxy")
    client_options(bench)
    bench.add_argument(
        "-t",
        "--topic",
        default="",
        help="topic to reuse, and <topic>-idle (default: a fresh bench-<id> per run, left behind)",
    )
    bench.add_argument("-n", "--count", type=POSITIVE, default=20_000, help="messages to produce and consume")
    bench.add_argument(
        "--size",
        type=Size(low=STAMP.size, high=MAX_MESSAGE_BYTES),
        default=256,
        help=f"body size, bytes or with a unit: 4KiB (>= {STAMP.size}: a send time)",
    )
    bench.add_argument(
        "-b", "--batch", type=number(int, low=1, high=1024), default=256, help="messages per SendMessage call"
    )
    bench.add_argument("--concurrency", type=POSITIVE, default=8, help="calls in flight (producers and consumers each)")
    bench.add_argument("--samples", type=NON_NEGATIVE_INT, default=50, help="idle-wake latency samples (0 = skip)")
    json_option(bench)
    quiet_option(bench)
    bench.set_defaults(handler=bench_command)


@dataclass
class Phase:
    """One phase's result. A throughput phase is timed; a latency phase (idle wake) only has latencies."""

    name: str
    timed: bool = True
    messages: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by nearest rank: the sample whose rank is nearest to
    ``q`` % of the way from the smallest to the largest, never a value between two samples (NaN for none).

    One definition for `popgate bench` and the benchmarks in ``bench/`` (``bench.common`` imports it), so the
    figures in docs/BENCHMARKS.md compare."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def produce(args: argparse.Namespace, topic: str, phase: Phase, advance: Callable[[int], None]) -> None:
    body = b"x" * max(8, args.size)
    remaining = args.count

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
        try:
            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        finally:  # interrupted too: the time so far
            phase.seconds = time.perf_counter() - started


async def consume(
    args: argparse.Namespace, topic: str, group: str, phase: Phase, advance: Callable[[int], None]
) -> None:
    """Receive and ack `args.count` messages; the clock stops when the last one is acked.

    Workers still in a (by then empty) long poll are cancelled, not waited for: their wait is
    not part of the consume time.
    """
    done = asyncio.Event()
    options = connection(args)
    async with aio.SimpleConsumer(args.endpoint, group, {topic: "*"}, batch=32, wait=1.0, **options) as consumer:

        async def worker() -> None:
            while True:
                batch = await consumer.receive(max=32, wait=1.0)
                if not batch:
                    continue
                await consumer.ack_many(batch)
                phase.messages += len(batch)
                advance(len(batch))
                if phase.messages >= args.count and not done.is_set():
                    phase.seconds = time.perf_counter() - started
                    done.set()

        started = time.perf_counter()
        workers = [asyncio.ensure_future(worker()) for _ in range(args.concurrency)]
        tasks = [asyncio.ensure_future(done.wait()), *workers]
        try:
            # Past the limit: reported as fewer messages than produced. A failed worker ends the phase too.
            await asyncio.wait(tasks, timeout=60 + args.count / 500, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not done.is_set():
                phase.seconds = time.perf_counter() - started
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            raise result


async def idle_wake(
    args: argparse.Namespace, topic: str, group: str, phase: Phase, advance: Callable[[int], None]
) -> None:
    """Send one message at a time to an idle, long-polling consumer; send-to-receive latency."""
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
            advance(1)


def create_topics(args: argparse.Namespace, *topics: str) -> None:
    """Brokers that do not auto-create topics (their default outside `popgate up`) need them made first: asked of
    the proxy's admin service. A proxy that refuses (an account without `admin = true`, an older proxy) leaves it to
    the sends, which then fail with TOPIC_NOT_FOUND on such brokers."""
    with contextlib.suppress(ProxyAdminError), ProxyAdmin(args, 3.0) as admin:
        for topic in topics:
            admin.call("CreateTopic", bpb.CreateTopicRequest(topic=topic), f"create topic {topic}")


async def run(args: argparse.Namespace, topic: str, bar: Progress, phases: list[Phase]) -> None:
    """Each phase in turn, appended to `phases` as it starts (an interrupted run still has its numbers)."""
    phases.append(Phase("produce"))
    task = bar.add_task("produce", total=args.count, rate="")
    await produce(args, topic, phases[-1], lambda n: bar.advance(task, n))
    phases.append(Phase("consume+ack"))
    task = bar.add_task("consume+ack", total=args.count, rate="")
    await consume(args, topic, GROUP, phases[-1], lambda n: bar.advance(task, n))
    if args.samples > 0:
        phases.append(Phase("idle wake", timed=False))
        task = bar.add_task("idle wake", total=args.samples, rate="")
        await idle_wake(args, topic + "-idle", GROUP, phases[-1], lambda n: bar.advance(task, n))


def summary(phases: list[Phase], args: argparse.Namespace) -> Table:
    """Throughput phases show seconds and msg/s; the idle-wake phase shows latencies only."""
    table = Table(title=f"popgate bench via {args.endpoint}: {args.count} x {args.size} B, batch {args.batch}")
    for column in ("phase", "messages", "seconds", "msg/s", "p50 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for p in phases:
        lat = p.latencies_ms
        cells = [f"{percentile(lat, q):.2f}" for q in (50, 99)] + [f"{max(lat):.2f}"] if lat else ["-", "-", "-"]
        timing = [f"{p.seconds:.2f}", f"{p.rate:,.0f}"] if p.timed else ["-", "-"]
        table.add_row(p.name, str(p.messages), *timing, *cells)
    return table


def shortfalls(phases: list[Phase], args: argparse.Namespace) -> list[str]:
    """What a finished run got fewer of than asked, one line each: a run with any fails (exit code 1) —
    test_cli_conventions.py::test_bench_that_got_fewer_messages_than_asked_fails."""
    out = []
    for p in phases:
        if p.name == "consume+ack" and p.messages < args.count:
            out.append(f"consumed {p.messages} of {args.count} within the time limit")
        if p.name == "idle wake" and p.messages < args.samples:
            out.append(f"idle wake got {p.messages} of {args.samples} samples (each waited 5 s for its message)")
    return out


def document(phases: list[Phase], args: argparse.Namespace, *, interrupted: bool, complete: bool) -> dict[str, Any]:
    """`bench --json`: the summary table as one document; a latency phase has no seconds or rate (None);
    `complete`: every phase ran and got every message asked for."""

    def latency(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        p50, p99 = (round(percentile(values, q), 3) for q in (50, 99))
        return {"p50": p50, "p99": p99, "max": round(max(values), 3), "mean": round(statistics.fmean(values), 3)}

    return {
        "endpoint": args.endpoint,
        "count": args.count,
        "size": args.size,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "interrupted": interrupted,
        "complete": complete,
        "phases": [
            {
                "phase": p.name,
                "messages": p.messages,
                "seconds": round(p.seconds, 4) if p.timed else None,
                "msg_per_s": round(p.rate, 1) if p.timed else None,
                "latency_ms": latency(p.latencies_ms),
            }
            for p in phases
        ],
    }


def bench_command(args: argparse.Namespace) -> int:
    # each producer's send_many at once
    check_in_memory(args.size, min(args.batch * args.concurrency, args.count), lower="--size, --batch or --concurrency")
    err = error_console()
    check_listening(args.endpoint)
    phases: list[Phase] = []
    code = 0
    topic = args.topic or f"bench-{uuid.uuid4().hex[:8]}"
    with progress(err, quiet=args.quiet) as bar:
        try:
            # Before the event loop: Ctrl-C gives up a blocking call at once, not a thread asyncio.run would wait
            # for — test_cli.py::test_ctrl_c_stops_bench_at_once_while_the_proxy_does_not_answer
            create_topics(args, topic, topic + "-idle")
            asyncio.run(run(args, topic, bar, phases))
        except KeyboardInterrupt:
            code = 130
        except errors.PopgateError as exc:
            err.print(f"popgate bench: {explain(exc)}", style="red")
            code = 1
    short = shortfalls(phases, args) if not code else []
    if args.json:
        print_json(document(phases, args, interrupted=code == 130, complete=not code and not short))
    else:
        print_table(summary(phases, args))
    if code:
        if code == 130:
            err.print(f"popgate bench: interrupted during {phases[-1].name if phases else 'start-up'}")
        return code
    for line in short:
        err.print(f"popgate bench: {line}")
    if len(phases) > 2 and phases[2].latencies_ms and not args.json:
        print(f"idle wake mean {statistics.fmean(phases[2].latencies_ms):.2f} ms")
    return 1 if short else 0
