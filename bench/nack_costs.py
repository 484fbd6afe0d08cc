"""What nacking costs the server: consumers that give every first delivery back, against plain consume+ack.

    .venv/bin/python -m bench.nack_costs [--messages 20000] [--pairs 3] [--json]

Run from the repository's root (the broker and proxy children start as `python -m broker|proxy` in this process's
cwd and environment; the run stops when this process's own popgate, broker or proxy code is from elsewhere).
Starts one broker (--flush async) and one proxy as real processes (popgate.cli.cluster, loopback, a temporary data
dir). Each round produces --messages messages (256 B; `popgate.aio.Producer.send_many` of 32 from 8 workers) to a
fresh topic, then consumes them with a fresh group: 8 workers on one `popgate.aio.SimpleConsumer`, each
`receive(max=32, wait=1)` followed by, per kind:

- base: `ack_many` of every message;
- nack: each first delivery (attempt 1) given back with `await nack(m, 0)`, one at a time;
- gathered: the same nacks, one receive's `asyncio.gather`ed;
- many: one `nack_many(first deliveries, 0)`;

and, in the nack kinds, `ack_many` of the redeliveries. A pair is one round of each kind, in the order base, nack,
gathered, many, reversed on odd pairs (against the host's drift and the store's growth); a warm-up round of each
kind (1,000 messages, unmeasured) comes first. The consume phase ends when the last message is acked; around it the
CPU time (utime + stime, /proc/<pid>/stat) of the broker and the proxy is read. Per kind: the medians over pairs of
that server CPU in µs per produced message, of its ratio to the same pair's base round, and of messages acked a
second. A round that takes over 120 s stops the run. Prints a table, then one JSON line (--json: only the JSON
line). Not a test: the client, the proxy and the broker share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import popgate_pb
from rich.console import Console
from rich.table import Table

import broker
import popgate
import proxy
from bench.common import machine
from bench.ratios import Claims, Meter, Sdk, log, run_phase
from bench.ratios_report import ROOT, commit
from popgate.aio import Producer, SimpleConsumer
from popgate.cli.cluster import Cluster, ClusterConfig
from popgate.message import Message

KINDS = ("base", "nack", "gathered", "many")
WORKERS, BATCH, WAIT_S, INVISIBLE_S = 8, 32, 1.0, 60.0
PRODUCE = argparse.Namespace(size=256, send_chunk=32)  # bench.ratios.Sdk's body size and send_many chunk
WARMUP = 1_000
ROUND_TIMEOUT_S = 120.0

Nack = Callable[[SimpleConsumer, list[Message]], Awaitable[object]]


async def nack_each(consumer: SimpleConsumer, messages: list[Message]) -> None:
    for m in messages:
        await consumer.nack(m, 0)


async def nack_gathered(consumer: SimpleConsumer, messages: list[Message]) -> None:
    await asyncio.gather(*(consumer.nack(m, 0) for m in messages))


async def nack_many(consumer: SimpleConsumer, messages: list[Message]) -> None:
    await consumer.nack_many(messages, 0)


NACKS: dict[str, Nack | None] = {"base": None, "nack": nack_each, "gathered": nack_gathered, "many": nack_many}


def order(pair: int) -> tuple[str, ...]:
    """The kinds' rounds of a pair: each kind first in some pair, last in another — test_nack_costs.py."""
    return KINDS if pair % 2 == 0 else KINDS[::-1]


@dataclass
class Settle:
    """One receive of a kind's consume phase: first deliveries given back with `nack` (none without one), the rest
    acked; answers how many were acked (bench.ratios.run_phase counts those)."""

    consumer: SimpleConsumer
    nack: Nack | None
    deliveries: int = 0
    acked: int = 0

    async def __call__(self) -> int:
        messages = await self.consumer.receive(max=BATCH, invisible=INVISIBLE_S, wait=WAIT_S)
        self.deliveries += len(messages)
        first = [m for m in messages if self.nack and m.attempt == 1]
        again = [m for m in messages if not (self.nack and m.attempt == 1)]
        if first and self.nack:
            await self.nack(self.consumer, first)
        if again:
            await self.consumer.ack_many(again)
        self.acked += len(again)
        return len(again)


@dataclass
class Result:
    """One measured round: its messages, the consume phase's seconds and the server's (broker + proxy) CPU."""

    kind: str
    pair: int
    messages: int
    seconds: float
    server_cpu_s: float
    deliveries: int

    @property
    def us_per_msg(self) -> float:
        return self.server_cpu_s / self.messages * 1e6

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def figures(results: list[Result]) -> dict[str, dict[str, float]]:
    """Per kind, medians over pairs: server CPU µs per produced message, its ratio to the base round of the same
    pair (neighbours in time, not medians of all base rounds), and messages acked a second — test_nack_costs.py."""
    base = {r.pair: r for r in results if r.kind == "base"}
    out = {}
    for kind in dict.fromkeys(r.kind for r in results):
        mine = [r for r in results if r.kind == kind]
        out[kind] = {
            "server_cpu_us_per_msg": statistics.median(r.us_per_msg for r in mine),
            "ratio_to_base": statistics.median(r.us_per_msg / base[r.pair].us_per_msg for r in mine),
            "msg_s": statistics.median(r.rate for r in mine),
            "deliveries_per_msg": statistics.median(r.deliveries / r.messages for r in mine),
        }
    return out


async def one_round(endpoint: str, kind: str, pair: int, n: int, meter: Meter) -> Result:
    """Produce `n` messages to a fresh topic and consume them as `kind` does, in ROUND_TIMEOUT_S at the most."""
    topic = f"nack-costs-{kind}-{pair if pair >= 0 else 'warm'}"
    timeout = asyncio.timeout(ROUND_TIMEOUT_S)
    settle: Settle | None = None
    try:
        async with timeout, Producer(endpoint) as producer, SimpleConsumer(endpoint, topic, topic) as consumer:
            await run_phase(n, WORKERS, Sdk(producer, consumer, PRODUCE).produce(topic, Claims(n)))
            settle = Settle(consumer, NACKS[kind])
            run = await run_phase(n, WORKERS, settle, meter)
    except TimeoutError:
        if not timeout.expired():
            raise
        where = f"{settle.acked} of {n} acked" if settle else "still producing"
        raise SystemExit(
            f"nack_costs: the {kind} round of pair {pair} took over {ROUND_TIMEOUT_S:g} s: {where}"
        ) from None
    return Result(kind, pair, n, run.seconds, sum(run.cpu.values()), settle.deliveries)


async def run(endpoint: str, meter: Meter, args: argparse.Namespace) -> list[Result]:
    for kind in KINDS:
        await one_round(endpoint, kind, -1, min(WARMUP, args.messages), meter)
    results = []
    for pair in range(args.pairs):
        for kind in order(pair):
            r = await one_round(endpoint, kind, pair, args.messages, meter)
            log(args, f"pair {pair} {kind}: {r.us_per_msg:.1f} µs/msg, {r.rate:,.0f} msg/s, {r.deliveries} deliveries")
            results.append(r)
    return results


def foreign_code() -> list[str]:
    """This process's popgate, broker, proxy or popgate_pb from outside its bench's tree, or a cwd elsewhere: the
    children, started in this cwd with this environment, would run other code than the commit reported."""
    modules: tuple[ModuleType, ...] = (popgate, broker, proxy, popgate_pb)
    found = [
        f"{m.__name__} from {m.__file__}" for m in modules if not Path(m.__file__ or "/").resolve().is_relative_to(ROOT)
    ]
    if Path.cwd().resolve() != ROOT:
        found.append(f"cwd {Path.cwd()}, not {ROOT}")
    return found


def report(values: dict[str, dict[str, float]], record: dict[str, object], args: argparse.Namespace) -> None:
    if not args.json:
        console = Console()
        if not console.is_terminal:
            console.width = 132
        dirty = " + uncommitted changes" if record["dirty"] else ""
        console.print(f"nack_costs on {machine()}; commit {record['commit']}{dirty}; load {record['load_avg']}")
        title = (f"1 broker + 1 proxy, {args.messages:,} x 256 B a round, {WORKERS} workers, receive(max={BATCH},"
                 f" wait={WAIT_S:g}); medians of {args.pairs} pair(s)")  # fmt: skip
        table = Table(title=title)
        for column in ("kind", "server CPU µs/msg", "x base", "msg/s", "deliveries/msg"):
            table.add_column(column, justify="left" if column == "kind" else "right")
        for kind, v in values.items():
            table.add_row(kind, f"{v['server_cpu_us_per_msg']:.1f}", f"{v['ratio_to_base']:.2f}x",
                          f"{v['msg_s']:,.0f}", f"{v['deliveries_per_msg']:.2f}")  # fmt: skip
        console.print(table)
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000, help="messages a measured round")
    parser.add_argument("--pairs", type=int, default=3, help="rounds of each kind")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    if foreign := foreign_code():
        raise SystemExit(f"nack_costs: not {ROOT}'s code: {'; '.join(foreign)} (run it from {ROOT})")
    started, t0, load = datetime.now(UTC), time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="popgate-nack-costs-") as tmp:
        config = ClusterConfig(brokers=1, listen="127.0.0.1:0", data_dir=Path(tmp), flush="async")
        with Cluster(config) as cluster:
            children = {"proxy": cluster.proxies[0], **cluster.brokers}
            meter = Meter({name: c.process.pid for name, c in children.items() if c.process})
            results = asyncio.run(run(cluster.endpoint, meter, args))
    values, (head, dirty) = figures(results), commit()
    record = {
        "benchmark": "nack_costs",
        "date": f"{started:%Y-%m-%d}",
        "time_utc": f"{started:%H:%M}",
        "commit": head,
        "dirty": dirty,
        "messages": args.messages,
        "pairs": args.pairs,
        "load_avg": f"{load[0]:.2f} -> {os.getloadavg()[0]:.2f}",
        **{f"{kind}.{k}": round(v, 3 if "ratio" in k else 1) for kind, vs in values.items() for k, v in vs.items()},
        "rounds": [[r.pair, r.kind, round(r.us_per_msg, 1), round(r.rate)] for r in results],
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    report(values, record, args)


if __name__ == "__main__":
    main()
