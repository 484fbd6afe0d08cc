"""Scheduled-delivery benchmark against one broker process.

100,000 messages whose due times are spread over 10 s, while the broker also
serves 5,000 msg/s of normal traffic (sent, popped and acked by a separate client
process). How late each scheduled message became visible is read per message
after the run: its store time in the topic (set when the delivery transaction is
built, just before its commit) minus its due time (carried in its body), via
ListMessages over every queue; and from the broker's own histogram of commit
time - due time (`popgate_broker_scheduled_lateness_seconds`), which also counts
the commit itself.

    .venv/bin/python -m bench.schedule_bench [--messages 100000] [--spread 10] [--normal-rate 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import machine, summary, table  # noqa: E402
from tests.procs import ServerProcess, broker_args  # noqa: E402


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def produce_scheduled(stub: pb_grpc.BrokerStub, dues: list[int]) -> None:
    for i in range(0, len(dues), 256):
        chunk = dues[i : i + 256]
        await stub.Send(
            pb.SendRequest(messages=[pb.Message(topic="sched", body=b"%d" % due, deliver_at_ms=due) for due in chunk])
        )


async def normal_traffic(stub: pb_grpc.BrokerStub, rate: int, until: float) -> int:
    """Send ``rate`` msg/s in batches of 32 and pop+ack them, until the loop time ``until``."""
    loop = asyncio.get_running_loop()
    interval = 32 / rate
    sent = 0
    request = pb.SendRequest(messages=[pb.Message(topic="normal", body=b"n" * 256) for _ in range(32)])

    async def consume() -> None:
        while loop.time() < until:
            got = await stub.Pop(
                pb.PopRequest(topic="normal", group="n", max_messages=32, invisible_ms=30000, poll_ms=200)
            )
            if got.messages:
                await stub.Ack(
                    pb.AckRequest(topic="normal", group="n", receipt_handles=[m.receipt_handle for m in got.messages])
                )

    consumer = asyncio.ensure_future(consume())
    next_at = loop.time()
    while loop.time() < until:
        await stub.Send(request)
        sent += 32
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - loop.time()))
    await consumer
    return sent


async def visible_lateness(address: str, expected: int) -> list[float]:
    """Store time - due time of every delivered scheduled message (ms), read back with ListMessages."""
    out: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        deadline = time.monotonic() + 30
        while True:  # the last due messages may still be on their way into the topic
            stats = await stub.Stats(pb.StatsRequest(topic="sched"))
            if sum(q.max_offset for q in stats.queues) >= expected or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        for queue in stats.queues:
            offset = queue.min_offset
            while offset < queue.max_offset:
                page = await stub.ListMessages(
                    pb.ListMessagesRequest(topic="sched", queue_id=queue.queue_id, from_offset=offset, limit=1000)
                )
                out.extend(m.store_ms - int(m.message.body) for m in page.messages)
                offset = page.messages[-1].offset + 1
    return out


def broker_lateness(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    buckets = [
        (float(le), float(v))
        for le, v in re.findall(r'popgate_broker_scheduled_lateness_seconds_bucket\{le="([^"]+)"\} (\S+)', text)
        if le != "+Inf"
    ]
    count = float(re.search(r"popgate_broker_scheduled_lateness_seconds_count (\S+)", text).group(1))  # type: ignore[union-attr]
    total = float(re.search(r"popgate_broker_scheduled_lateness_seconds_sum (\S+)", text).group(1))  # type: ignore[union-attr]
    p99 = next((le for le, v in buckets if v >= 0.99 * count), float("inf"))
    within_50ms = next((v for le, v in buckets if le == 0.05), 0.0)
    return {
        "count": count,
        "mean_ms": total / max(count, 1) * 1000,
        "p99_bucket_ms": p99 * 1000,
        "within_50ms": within_50ms,
    }


def _in_process(target: str, address: str, *params: float) -> multiprocessing.Process:
    """Run a client role in its own process so client CPU does not slow the others down."""
    proc = multiprocessing.Process(target=_role, args=(target, address, *params), daemon=True)
    proc.start()
    return proc


def _role(target: str, address: str, *params: float) -> None:
    async def main() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            loop = asyncio.get_running_loop()
            sent = await normal_traffic(stub, int(params[0]), loop.time() + params[1])
            RESULTS.put((target, sent))

    asyncio.run(main())


RESULTS: multiprocessing.Queue[tuple[str, object]] = multiprocessing.Queue()


async def produce(args: argparse.Namespace, address: str, dues: list[int]) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        started = time.monotonic()
        await produce_scheduled(pb_grpc.BrokerStub(channel), dues)
        return time.monotonic() - started


def run(args: argparse.Namespace, address: str) -> tuple[list[float], int, float]:
    start = now_ms() + args.lead * 1000
    dues = [start + random.randrange(args.spread * 1000) for _ in range(args.messages)]
    duration = args.lead + args.spread + 1
    roles = [_in_process("normal", address, args.normal_rate, duration)]
    send_s = asyncio.run(produce(args, address, dues))
    results = dict(RESULTS.get(timeout=duration + 60) for _ in roles)
    for proc in roles:
        proc.join(10)
    lateness = asyncio.run(visible_lateness(address, args.messages))
    return lateness, results["normal"], send_s  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--spread", type=int, default=10, help="seconds over which due times are spread")
    parser.add_argument("--lead", type=int, default=6, help="seconds before the first due time (to send them all)")
    parser.add_argument("--normal-rate", type=int, default=5000)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="popgate-sched-"))
    broker = ServerProcess("broker", broker_args("b1", data, "--metrics-listen", "127.0.0.1:0")).start()
    try:
        lateness, normal_sent, send_s = run(args, broker.address)
        url = next(line for line in broker.lines if "metrics on" in line).split("metrics on ")[1].strip()
        inside = broker_lateness(url)
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
    s = summary(lateness)
    early = sum(1 for x in lateness if x < 0)
    print(f"schedule_bench on {machine()}")
    print(
        table(
            [
                ("metric", "value", "target"),
                ("---", "---:", "---"),
                ("scheduled messages delivered", f"{len(lateness):,} of {args.messages:,}", "all"),
                ("scheduled sends took (s)", f"{send_s:.1f}", "-"),
                (
                    "normal traffic (msg/s sent, popped, acked)",
                    f"{normal_sent / (args.lead + args.spread + 1):,.0f}",
                    "5,000",
                ),
                (
                    "visible late (store time) p50 / p99 / max (ms)",
                    f"{s['p50']:.0f} / {s['p99']:.0f} / {s['max']:.0f}",
                    "p99 <= 50",
                ),
                ("early (stored before due)", f"{early}", "0"),
                ("visible late after commit (histogram), mean (ms)", f"{inside['mean_ms']:.1f}", "-"),
                (
                    "visible within 50 ms after commit (histogram)",
                    f"{inside['within_50ms'] / max(inside['count'], 1):.2%}",
                    ">= 99 %",
                ),
            ]
        )
    )


if __name__ == "__main__":
    main()
