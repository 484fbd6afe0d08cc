"""One message at a time: where a single send's round trip and an idle wake's time go, layer by layer.

    .venv/bin/python -m bench.one_at_a_time [--sends 2000] [--wakes 200] [--flush async] [--brokers 1]

Starts brokers and a proxy (popgate.cli.cluster, loopback), then, each in turn and sequentially (one request
in flight, the next sent when the answer is back), measures the round trip of a 256 B send:

- `broker session`: a Send on the broker's own Session stream (popgate_contract.session_client), as the
  proxy calls it;
- `broker unary`: the broker's unary Send RPC;
- `proxy v2`: a v2 SendMessage on the proxy with the generated stub (no SDK);
- `sdk`: `popgate.aio.Producer.send` through the proxy (bench/peers_run.py's `seq_send_msg_s`).

Then the idle wake: a consumer holds a receive (`SimpleConsumer.receive(max=32, wait=20)`), a producer in
another process sends one message 50-100 ms after the previous one was received, and the wake is the time from
the producer's send call to the receive returning (as the peers' harness measures it, over loopback clocks of one
machine). A receive that comes back empty while the producer is still sending is counted and printed (`empty
receives`); the run fails if the producer process exits with an error, or exits and a receive after that comes
back empty (wakes missing), or the wakes take longer than their sends could (0.1 s each) plus a receive's wait and
a minute. Prints median / p90 / p99 in ms and sends a second. Not a
test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as v2s
from popgate_pb.v2 import service_pb2_grpc as v2g

from bench.common import cpu_seconds
from popgate.aio import Producer, SimpleConsumer
from popgate.cli.cluster import Cluster, ClusterConfig
from popgate_contract.session_client import BrokerSession

BODY = b"x" * 256
PY_SPY = Path(__file__).resolve().parents[1] / ".venv/bin/py-spy"
SPY_DIR = ""
TOPIC = "one"
WAKE_WAIT_S = 20.0  # the held receive's long poll


def pct(values: list[float], p: float) -> float:
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    f = int(k)
    return xs[f] + (xs[min(f + 1, len(xs) - 1)] - xs[f]) * (k - f)


def row(name: str, ms: list[float]) -> str:
    return f"{name:<16}{pct(ms, 50):>8.3f}{pct(ms, 90):>8.3f}{pct(ms, 99):>8.3f}{len(ms) / (sum(ms) / 1000):>10,.0f}"


CPU_US: dict[str, dict[str, float]] = {}  # phase -> process -> CPU µs per send
PIDS: dict[str, int] = {}


async def timed(n: int, call: Callable[[], Awaitable[object]], name: str = "") -> list[float]:
    for _ in range(min(200, n)):
        await call()
    out = []
    before = {who: cpu_seconds(pid) for who, pid in PIDS.items()}
    spies = start_spies(name)
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    CPU_US[name] = {who: (cpu_seconds(pid) - before[who]) / n * 1e6 for who, pid in PIDS.items()}
    stop_spies(spies)
    return out


def start_spies(name: str) -> list[subprocess.Popen[bytes]]:
    """py-spy on the proxy and broker b1 while a phase runs (with --py-spy)."""
    if not SPY_DIR or not name:
        return []
    return [
        subprocess.Popen(
            [str(PY_SPY), "record", "--gil", "-r", "500", "-p", str(PIDS[who]), "-f", "raw",
             "-o", f"{SPY_DIR}/{name.replace(' ', '-')}-{who}.txt"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for who in ("proxy", "b1")
    ]  # fmt: skip


def stop_spies(spies: list[subprocess.Popen[bytes]]) -> None:
    for spy in spies:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)


async def sends(cluster: Cluster, n: int) -> list[tuple[str, list[float]]]:
    broker = next(iter(cluster.brokers.values())).address
    results = []
    async with grpc.aio.insecure_channel(broker) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
        session = BrokerSession(channel=channel).open()
        request = bpb.SendRequest(messages=[bpb.Message(topic=TOPIC, body=BODY)])
        results.append(("broker session", await timed(n, lambda: session.send(request), "broker session")))
        await session.close()
        results.append(("broker unary", await timed(n, lambda: stub.Send(request), "broker unary")))
    async with grpc.aio.insecure_channel(cluster.endpoint) as channel:
        v2stub = v2g.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        message = v2.Message(topic=v2.Resource(name=TOPIC), body=BODY)
        message.system_properties.message_id = "01"
        message.system_properties.body_encoding = v2.IDENTITY
        message.system_properties.message_type = v2.NORMAL
        v2request = v2s.SendMessageRequest(messages=[message])
        results.append(("proxy v2", await timed(n, lambda: v2stub.SendMessage(v2request), "proxy v2")))
    async with Producer(cluster.endpoint) as producer:
        results.append(("sdk", await timed(n, lambda: producer.send(TOPIC, BODY), "sdk")))
    return results


@dataclass
class Woke:
    """What the wake loop saw: each wake's time (ms) and the receives that came back empty meanwhile."""

    ms: list[float]
    empties: int


def wake_deadline_s(n: int) -> float:
    """Longest the wake loop waits: n sends at most 0.1 s apart, each woken within a receive's wait, and a minute."""
    return n * 0.1 + WAKE_WAIT_S + 60


async def wake_loop(consumer: Any, producer: Any, n: int, deadline_s: float) -> Woke:
    """Receives until `n` timed messages came, counting empty receives; raises when the producer process ended with
    an error, or ended and a receive begun after that came back empty (it sent all it will), or `deadline_s` passed
    first — tests/unit/bench/test_one_at_a_time.py."""
    out: list[float] = []
    empties, deadline = 0, time.monotonic() + deadline_s
    while len(out) < n:
        left, exited = deadline - time.monotonic(), producer.returncode
        if exited not in (None, 0):
            raise RuntimeError(f"the producer exited with status {exited} after {len(out)} of {n} wakes")
        if left <= 0:
            raise TimeoutError(f"{len(out)} of {n} wakes in {deadline_s:g} s ({empties} empty receives)")
        messages = await consumer.receive(max=32, wait=min(WAKE_WAIT_S, left))
        now = time.monotonic_ns()
        out += [(now - int(m.body.split(b" ")[0])) / 1e6 for m in messages if not m.body.startswith(b"0 ")]
        if messages:
            await consumer.ack_many(messages)
        elif exited is not None:
            raise RuntimeError(f"the producer exited and a receive after that came back empty: {len(out)} of {n} wakes")
        else:
            empties += 1
    return Woke(out, empties)


async def wakes(cluster: Cluster, n: int) -> Woke:
    """Idle wakes: a producer process sends one message at a time, the receive here is held meanwhile."""
    topic = f"wake-{random.randrange(1 << 30)}"
    async with SimpleConsumer(cluster.endpoint, "wake", topic) as consumer:
        await consumer.receive(max=32, wait=0.1)  # the group exists before the first send
        argv = [sys.executable, "-m", "bench.one_at_a_time", "--producer", cluster.endpoint, topic, str(n)]
        producer = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        try:
            woke = await wake_loop(consumer, producer, n, wake_deadline_s(n))
        except BaseException:
            if producer.returncode is None:
                producer.kill()
            raise
        finally:
            await producer.wait()
    return woke


async def produce_slowly(endpoint: str, topic: str, n: int) -> None:
    async with Producer(endpoint) as producer:
        await producer.send(topic, b"0 warm-up")  # the channel is connected before the first measured send
        for _ in range(n):
            await asyncio.sleep(random.uniform(0.05, 0.10))
            await producer.send(topic, b"%d " % time.monotonic_ns() + BODY)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--producer":
        asyncio.run(produce_slowly(sys.argv[2], sys.argv[3], int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--flush", default="async")
    parser.add_argument("--receive-mode", default="")
    parser.add_argument("--json", action="store_true", help="print only one JSON line")
    parser.add_argument("--py-spy", default="", help="record the proxy and b1 (py-spy --gil) per send phase here")
    args = parser.parse_args()
    global SPY_DIR
    SPY_DIR = args.py_spy
    if SPY_DIR:
        os.makedirs(SPY_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="popgate-one-") as tmp:
        config = ClusterConfig(
            brokers=args.brokers,
            listen="127.0.0.1:0",
            data_dir=Path(tmp),
            flush=args.flush,
            receive_mode=args.receive_mode,
        )
        with Cluster(config) as cluster:
            children = {"proxy": cluster.proxies[0], **cluster.brokers}
            PIDS.update({"client": os.getpid()} | {k: c.process.pid for k, c in children.items() if c.process})
            results = asyncio.run(sends(cluster, args.sends)) if args.sends else []
            woke = asyncio.run(wakes(cluster, args.wakes)) if args.wakes else Woke([], 0)
    record: dict[str, dict[str, float]] = {
        name: {"p50_ms": round(pct(ms, 50), 3), "per_s": round(len(ms) / (sum(ms) / 1000))} for name, ms in results
    }
    if woke.ms:
        record["wake"] = {"p50_ms": round(pct(woke.ms, 50), 3), "p90_ms": round(pct(woke.ms, 90), 3)}
        record["wake"]["empty_receives"] = woke.empties
    if args.json:
        print(json.dumps(record))
        return
    print(f"{'round trip ms':<16}{'p50':>8}{'p90':>8}{'p99':>8}{'per s':>10}   CPU µs per send")
    for name, ms in results:
        print(row(name, ms) + "   " + "  ".join(f"{who} {us:.0f}" for who, us in CPU_US[name].items()))
    if woke.ms:
        ms = woke.ms
        print(f"{'idle wake':<16}{pct(ms, 50):>8.3f}{pct(ms, 90):>8.3f}{pct(ms, 99):>8.3f}"
              f"  (mean {statistics.fmean(ms):.3f}, {len(ms)} wakes, {woke.empties} empty receives)")  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
