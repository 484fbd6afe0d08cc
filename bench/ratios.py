"""Issue 28's ratios in one run: our SDK through the proxy against the same brokers called directly.

    .venv/bin/python -m bench.ratios [--brokers 1] [--messages 100000] [--concurrency 8] [--receive-mode MODE]
                                     [--wait 1] [--send-chunk 32] [--warmup 5000] [--direct-runs] [--json]

Starts brokers (--flush async) and one proxy (its default receive mode unless --receive-mode) as real
processes (popgate.cli.cluster, loopback, a temporary data dir), then runs four rounds one after another:
direct, sdk, sdk, direct. That is two pairs, each side first in one: the round that goes first in a pair tends
to be faster, and the brokers' store grows every round. Each round produces --warmup + --messages messages
(256 B) to a fresh topic, then consumes and acks them all; each measured phase (produce, consume+ack) follows a
warm-up of its own kind:

- direct: the brokers' Session streams (popgate_contract.session_client.BrokerSession, one per broker, as the
  proxy calls them): Send of --batch messages (--direct-runs: one SharedRun of --batch bodies, as the proxy sends
  an SDK's send_many); Pop of up to --batch (no poll time; the client itself goes round the brokers) + Ack, from
  --concurrency concurrent workers. A Send not answered a result per message, or an Ack of a handle not ok, stops
  the run (as the SDK's calls raise).
- sdk: `popgate.aio` through the proxy: Producer.send_many of --send-chunk messages; SimpleConsumer.receive(
  max=--batch, wait=--wait) + ack_many, from --concurrency concurrent workers on one Producer / SimpleConsumer.

A consume phase ends when the last message is acked (the clock stops then; workers still long-polling end
after --wait, unmeasured). Around each measured phase the CPU time (utime + stime, /proc/<pid>/stat) of the
proxy, each broker and this client process is read. Each figure is the median of the two rounds of its side
(the host's speed drifts); a ratio is the median of the two rounds' ratios, each sdk round against the direct
round beside it (round 2 against round 1, round 3 against round 4). Prints a table, then one JSON line (--json:
only the JSON line) for bench/results/history.csv.
Not a test: the client, the proxy and the brokers share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
from popgate_pb import broker_pb2 as bpb

from bench.common import cpu_seconds
from bench.ratios_report import Phase, report
from popgate.aio import Producer, SimpleConsumer
from popgate.cli.cluster import Cluster, ClusterConfig
from popgate_contract.session_client import BrokerSession
from proxy.settings import Settings

GROUP = "ratios"
# Two pairs, each side first in one; bench.ratios_report pairs the nth sdk round with the nth direct round, so each
# sdk round is measured against its neighbour — tests/unit/bench/test_ratios.py.
ROUNDS = ("direct", "sdk", "sdk", "direct")
INVISIBLE_S = 60.0
PHASE_TIMEOUT_S = 600.0

Step = Callable[[], Awaitable[int]]  # one request (and its ack): how many messages it handled, 0 when done


@dataclass
class Meter:
    """CPU seconds used so far by each measured process, by name (client, proxy, b1..bN)."""

    pids: dict[str, int]

    def read(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}


@dataclass
class Claims:
    """Hands out exactly `total` messages to concurrent producers (never more: the consume phase expects them all)."""

    total: int
    claimed: int = 0

    def take(self, most: int) -> int:
        n = min(most, self.total - self.claimed)
        self.claimed += n
        return n


@dataclass
class Run:
    """What `run_phase` saw: messages handled, seconds until the last one, CPU used meanwhile (with a meter)."""

    done: int
    seconds: float
    cpu: dict[str, float]


async def run_phase(total: int, concurrency: int, step: Step, meter: Meter | None = None) -> Run:
    """Run `step` from `concurrency` workers until at least `total` messages are handled.

    The clock and the meter stop then; workers still in a request finish it (a consume request can hand back a
    few messages more than `total`: they are counted, never dropped), then stop."""
    done, finished = 0, asyncio.Event()

    async def worker() -> None:
        nonlocal done
        while done < total:
            n = await step()
            done += n
            if done >= total:
                finished.set()
            elif n == 0:
                await asyncio.sleep(0.001)  # nothing right now (a producer with nothing left to claim waits too)

    before = meter.read() if meter else {}
    started = time.perf_counter()
    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    waiter = asyncio.ensure_future(finished.wait())
    try:
        await asyncio.wait([waiter, *workers], timeout=PHASE_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        seconds, after = time.perf_counter() - started, meter.read() if meter else {}
        failed = [w for w in workers if w.done() and not w.cancelled() and w.exception() is not None]
        if failed:
            await failed[0]  # raises the worker's error
        if not finished.is_set():
            raise TimeoutError(f"{done} of {total} messages in {PHASE_TIMEOUT_S:g} s")
        await asyncio.wait_for(asyncio.gather(*workers), PHASE_TIMEOUT_S)
        return Run(done, seconds, {name: after[name] - before[name] for name in after})
    finally:
        for task in [waiter, *workers]:
            task.cancel()
        await asyncio.gather(waiter, *workers, return_exceptions=True)


class Direct:
    """The brokers called directly on their Session streams, one per broker, taken in turn."""

    def __init__(self, sessions: list[BrokerSession], args: argparse.Namespace) -> None:
        self.sessions, self.args, self.turn = sessions, args, 0
        self.body = b"x" * args.size

    def _next(self) -> BrokerSession:
        self.turn += 1
        return self.sessions[self.turn % len(self.sessions)]

    def produce(self, topic: str, claims: Claims) -> Step:
        runs = self.args.direct_runs

        async def step() -> int:
            n = claims.take(self.args.batch)
            if n and runs:
                shared = bpb.Message(topic=topic)
                request = bpb.SendRequest(
                    runs=[bpb.SharedRun(shared=shared, bodies=[self.body] * n, message_ids=[""] * n)]
                )
                stored(await self._next().send(request), n)
            elif n:
                request = bpb.SendRequest(messages=[bpb.Message(topic=topic, body=self.body) for _ in range(n)])
                stored(await self._next().send(request), n)
            return n

        return step

    def consume(self, topic: str) -> Step:
        request = bpb.PopRequest(
            topic=topic, group=GROUP, filter="*", max_messages=self.args.batch, invisible_ms=int(INVISIBLE_S * 1000)
        )

        async def step() -> int:
            session = self._next()
            popped = await session.pop(request)
            handles = [m.receipt_handle for m in popped.messages]
            if handles:
                acked(await session.ack(bpb.AckRequest(topic=topic, group=GROUP, receipt_handles=handles)))
            return len(handles)

        return step


def stored(reply: bpb.SendResponse, n: int) -> None:
    """A direct Send counts only when the broker answered a stored result for each of its `n` messages (the SDK's
    send_many raises otherwise) — tests/unit/bench/test_ratios.py::test_the_direct_floor_raises_on_a_failed_send."""
    if len(reply.results) != n:
        raise RuntimeError(f"direct Send of {n} messages answered {len(reply.results)} stored results")


def acked(reply: bpb.AckResponse) -> None:
    """A direct Ack counts only when every handle was acked (the SDK's ack_many raises otherwise) —
    tests/unit/bench/test_ratios.py::test_the_direct_floor_raises_on_a_refused_ack."""
    refused = [r for r in reply.results if not r.ok]
    if refused:
        raise RuntimeError(f"direct Ack refused {len(refused)} of {len(reply.results)}: {refused[0].error}")


class Sdk:
    """Our asyncio SDK through the proxy: one Producer and one SimpleConsumer shared by the workers."""

    def __init__(self, producer: Producer, consumer: SimpleConsumer, args: argparse.Namespace) -> None:
        self.producer, self.consumer, self.args = producer, consumer, args
        self.body = b"x" * args.size

    def produce(self, topic: str, claims: Claims) -> Step:
        async def step() -> int:
            n = claims.take(self.args.send_chunk)
            if n:
                await self.producer.send_many(topic, [self.body] * n)
            return n

        return step

    def consume(self, topic: str) -> Step:
        async def step() -> int:
            messages = await self.consumer.receive(max=self.args.batch, invisible=INVISIBLE_S, wait=self.args.wait)
            if messages:
                await self.consumer.ack_many(messages)
            return len(messages)

        return step


@asynccontextmanager
async def direct_client(addresses: list[str], args: argparse.Namespace) -> AsyncIterator[Direct]:
    async with AsyncExitStack() as stack:
        sessions = []
        for address in addresses:
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(address))
            session = BrokerSession(channel=channel).open()
            stack.push_async_callback(session.close)
            sessions.append(session)
        yield Direct(sessions, args)


@asynccontextmanager
async def sdk_client(endpoint: str, topic: str, args: argparse.Namespace) -> AsyncIterator[Sdk]:
    async with Producer(endpoint) as producer, SimpleConsumer(endpoint, GROUP, topic) as consumer:
        yield Sdk(producer, consumer, args)


async def one_round(client: Direct | Sdk, side: str, topic: str, meter: Meter, args: argparse.Namespace) -> list[Phase]:
    """Produce warm-up + N messages to a fresh topic, then consume all of them: a warm-up of about the same size,
    then the rest (N, less what the warm-up's last requests took beyond its count), measured."""
    c, w, n = args.concurrency, args.warmup, args.messages
    await run_phase(w, c, client.produce(topic, Claims(w)))
    produced = await run_phase(n, c, client.produce(topic, Claims(n)), meter)
    warm = await run_phase(w, c, client.consume(topic))
    consumed = await run_phase(w + n - warm.done, c, client.consume(topic), meter)
    return [Phase(side, kind, r.done, r.seconds, r.cpu) for kind, r in (("produce", produced), ("consume", consumed))]


async def run(cluster: Cluster, meter: Meter, args: argparse.Namespace) -> list[list[Phase]]:
    addresses = [child.address for child in cluster.brokers.values()]
    rounds = []
    for i, side in enumerate(ROUNDS):
        topic = f"ratios-{side}-{i // 2 + 1}"
        log(args, f"round {i + 1}/4: {side}")
        if side == "direct":
            async with direct_client(addresses, args) as direct:
                rounds.append(await one_round(direct, side, topic, meter, args))
        else:
            async with sdk_client(cluster.endpoint, topic, args) as sdk:
                rounds.append(await one_round(sdk, side, topic, meter, args))
    return rounds


def log(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--messages", type=int, default=100_000, help="messages per measured phase")
    parser.add_argument("--warmup", type=int, default=5_000, help="messages of each phase's warm-up")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent workers of every phase")
    parser.add_argument("--batch", type=int, default=32, help="direct Send size; Pop and receive max")
    parser.add_argument("--send-chunk", type=int, default=32, help="messages per SDK send_many call")
    parser.add_argument("--size", type=int, default=256, help="body bytes")
    parser.add_argument("--wait", type=float, default=1.0, help="SDK receive's long-polling seconds")
    parser.add_argument("--receive-mode", default="", help="the proxy's --receive-mode (default: its own)")
    parser.add_argument(
        "--direct-runs", action="store_true", help="direct Sends as one SharedRun each (as the proxy sends send_many)"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    default_mode = next(f.default for f in dataclasses.fields(Settings) if f.name == "receive_mode")
    mode = args.receive_mode or os.environ.get("POPGATE_RECEIVE_MODE") or str(default_mode)
    started, t0 = datetime.now(UTC), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="popgate-ratios-") as tmp:
        config = ClusterConfig(
            brokers=args.brokers,
            listen="127.0.0.1:0",
            data_dir=Path(tmp),
            flush="async",
            receive_mode=args.receive_mode,
        )
        with Cluster(config) as cluster:
            children = {"proxy": cluster.proxies[0], **cluster.brokers}
            pids = {"client": os.getpid()} | {name: c.process.pid for name, c in children.items() if c.process}
            rounds = asyncio.run(run(cluster, Meter(pids), args))
    run_info = {"date": f"{started:%Y-%m-%d}", "time_utc": f"{started:%H:%M}", "receive_mode": mode}
    report(rounds, list(cluster.brokers), args, {**run_info, "elapsed_s": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    main()
