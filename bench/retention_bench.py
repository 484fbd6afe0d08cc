"""Retention pass benchmark, in-process (a broker core on a real SQLite store, no sockets, 256 B bodies).

Stores N messages in one queue (1,024 a Send: rows of 256), makes them all older than --retention-s, then
times one retention pass while a sender keeps sending 32-message batches: the pass's duration, its deletion
transactions (count, longest), the longest event-loop stall and the sender's slowest Send during the pass.
With --delete-topic the same around a DeleteTopic of that topic (broker.admin), the sender sending to another.

    .venv/bin/python -m bench.retention_bench [--messages 1000000] [--flush async|sync] [--delete-topic]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from popgate_pb import broker_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import machine, table  # noqa: E402
from broker import admin  # noqa: E402
from tests.unit.broker.cores import broker  # noqa: E402

BODY = b"x" * 256


async def main(messages: int, flush: str, delete_topic: bool = False) -> list[tuple[str, str, str]]:
    data = Path(tempfile.mkdtemp(prefix="popgate-retention-"))
    try:
        async with broker(data, flush=flush, queues_per_topic=1, retention_s=60.0) as (core, store):
            batch = [pb.Message(topic="t", body=BODY) for _ in range(1024)]
            started = time.perf_counter()
            for _ in range(messages // 1024):
                await core.send(batch)
            fill_s = time.perf_counter() - started
            commits: list[float] = []
            store._on_commit = commits.append  # noqa: SLF001 - time every transaction during the pass
            stalls: list[float] = []
            sends: list[float] = []
            done = asyncio.Event()

            async def ticker() -> None:
                while not done.is_set():
                    t = time.perf_counter()
                    await asyncio.sleep(0.001)
                    stalls.append(time.perf_counter() - t - 0.001)

            async def sender() -> None:
                small = [pb.Message(topic="other" if delete_topic else "t", body=BODY) for _ in range(32)]
                while not done.is_set():
                    t = time.perf_counter()
                    await core.send(small)
                    sends.append(time.perf_counter() - t)

            tasks = [asyncio.create_task(ticker()), asyncio.create_task(sender())]
            await asyncio.sleep(1.0)
            sends.sort()
            before = f"{sends[len(sends) // 2] * 1000:.1f} / {sends[-1] * 1000:.1f} ms"
            sends.clear()
            stalls.clear()
            commits.clear()
            started = time.perf_counter()
            if delete_topic:
                out = pb.DeleteTopicResponse()
                await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), out)
                deleted = out.messages
            else:
                deleted = await core.retention.run(int(time.time() * 1000) + 3_600_000)
            pass_s = time.perf_counter() - started
            done.set()
            await asyncio.gather(*tasks)
            sends.sort()
            return [
                ("messages stored", f"{messages:,}", f"{fill_s:.1f} s to send"),
                ("deleted by the pass", f"{deleted:,}", "a DeleteTopic" if delete_topic else "retention"),
                ("pass duration", f"{pass_s:.2f} s", ""),
                ("transactions during the pass", f"{len(commits):,}", "deletions and the sender's commits"),
                ("longest transaction", f"{max(commits) * 1000:.1f} ms", ""),
                ("longest event-loop stall", f"{max(stalls) * 1000:.1f} ms", ""),
                ("Send of 32, p50 / max", before, "the second before the pass"),
                (
                    "Send of 32, p50 / max",
                    f"{sends[len(sends) // 2] * 1000:.1f} / {sends[-1] * 1000:.1f} ms",
                    "during the pass",
                ),
            ]
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--flush", choices=["async", "sync"], default="async")
    parser.add_argument("--delete-topic", action="store_true", help="a DeleteTopic of the topic instead of retention")
    args = parser.parse_args()
    rows = asyncio.run(main(args.messages, args.flush, args.delete_topic))
    print(machine())
    print(table([("retention pass", "value", ""), ("---", "---", "---"), *rows]))
