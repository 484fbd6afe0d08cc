"""Real-time receive: the three receive modes side by side, 4 brokers behind one proxy per mode.

    .venv/bin/python bench/realtime_bench.py [--messages 300] [--poll-s 2] [--consumers 64]
        [--dense-seconds 8] [--dense-rate 1000] [--modes notify,adaptive,longpoll]
        [--plot docs/img/realtime_latency.png] [--json out.json]

One run starts 4 brokers and one proxy per mode (`--receive-mode notify|adaptive|longpoll`,
all over the same brokers), then for each mode, one after the other:

(a) sparse: 1 consumer (raw v2 ReceiveMessage, batch 32, long polling --poll-s) while a
    producer stores one message every 50-250 ms on a random broker (broker Send, so the
    broker is known). Idle-wake latency = consumer got it - producer started its Send
    (the Send itself is in it: its median is printed as a floor). A false empty is an
    empty answer while a message stored before the receive started was still unserved
    after it ended.
(b) dense: --consumers concurrent v2 consumers (batch 16, acking) on a steady stream of
    --dense-rate msg/s spread over the brokers: delivered msg/s, broker RPCs (Pop +
    Notification sent, cancelled ones included, from the proxy's /metrics) per delivered message, proxy CPU.

Not a test: numbers depend on the machine. Starts and stops its own processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import tempfile
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc

from bench.common import cpu_seconds, machine, summary
from popgate import _wire as wire
from popgate.cli.cluster import Cluster, ClusterConfig

MODES = ("notify", "adaptive", "longpoll")
# Proxy flags per mode name; the adaptive-* variants keep one criterion only (docs/RECEIVE.md).
MODE_ARGS = {
    "notify": ["--receive-mode", "notify"],
    "adaptive": ["--receive-mode", "adaptive"],
    "longpoll": ["--receive-mode", "longpoll"],
    "adaptive-rate": [
        *("--receive-mode", "adaptive", "--adaptive-concurrency-per-broker", "0"),
        *("--adaptive-rate-threshold", "100", "--adaptive-window-s", "1"),
    ],
    "adaptive-conc": ["--receive-mode", "adaptive", "--adaptive-rate-threshold", "0"],
}


@dataclass
class Sparse:
    latencies_ms: list[float] = field(default_factory=list)  # from the producer starting its Send
    wake_ms: list[float] = field(default_factory=list)  # from the Send's acknowledgement (message durable)
    send_ms: list[float] = field(default_factory=list)
    receives: int = 0
    empties: int = 0
    false_empties: int = 0
    broker_rpcs: float = 0.0


@dataclass
class Dense:
    delivered: int = 0
    seconds: float = 0.0
    broker_rpcs: float = 0.0
    proxy_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds else 0.0


def receive_request(topic: str, group: str, batch: int, poll_s: float) -> pb.ReceiveMessageRequest:
    return wire.receive_request(group, wire.Subscription(topic), max=batch, invisible=300, wait=poll_s)


async def receive_once(
    stub: service_pb2_grpc.MessagingServiceStub, request: pb.ReceiveMessageRequest, poll_s: float
) -> list[v2.Message]:
    messages = []
    async for frame in stub.ReceiveMessage(request, timeout=poll_s + 3):
        if frame.HasField("message"):
            messages.append(frame.message)
    return messages


def broker_rpcs(metrics_url: str) -> float:
    """Pops and Notifications this proxy sent to brokers so far (from its /metrics)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(r'^popgate_proxy_broker_rpcs_total\{[^}]*method="(Pop|Notification)"[^}]*\} (\S+)$', re.M)
    return sum(float(m.group(2)) for m in pattern.finditer(text))


async def sparse(
    endpoint: str, brokers: list[broker_pb2_grpc.BrokerStub], metrics_url: str, args: argparse.Namespace
) -> Sparse:
    topic, group = f"sparse-{uuid.uuid4().hex[:8]}", "g-sparse"
    out = Sparse()
    sent_at: dict[str, tuple[float, float]] = {}  # message id -> (send started, send acknowledged)
    got_at: dict[str, float] = {}
    empties: list[tuple[float, float]] = []
    done = asyncio.Event()
    rpcs = broker_rpcs(metrics_url)
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        request = receive_request(topic, group, 32, args.poll_s)
        # Warm up: the group exists and the consumer is in a long poll before the first message.
        await receive_once(stub, receive_request(topic, group, 32, 0), 0)

        async def consume() -> None:
            while not done.is_set():
                started = time.perf_counter()
                messages = await receive_once(stub, request, args.poll_s)
                now = time.perf_counter()
                out.receives += 1
                if not messages:
                    empties.append((started, now))
                for m in messages:
                    got_at.setdefault(m.system_properties.message_id, now)
                if len(got_at) >= args.messages:
                    done.set()

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.3)  # let the first receive reach its brokers
        await produce_sparse(topic, brokers, args.messages, sent_at)
        try:
            await asyncio.wait_for(done.wait(), args.poll_s * 4 + 10)
        except TimeoutError:
            print(f"  sparse: only {len(got_at)} of {args.messages} messages received")
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
    tally(out, sent_at, got_at, empties)
    out.broker_rpcs = broker_rpcs(metrics_url) - rpcs
    return out


def tally(
    out: Sparse, sent_at: dict[str, tuple[float, float]], got_at: dict[str, float], empties: list[tuple[float, float]]
) -> None:
    """Latencies, and false empties: an empty answer while a message acknowledged before it started stayed unserved."""
    for mid, (t0, t1) in sent_at.items():
        if mid in got_at:
            out.latencies_ms.append((got_at[mid] - t0) * 1000)
            out.wake_ms.append((got_at[mid] - t1) * 1000)
        out.send_ms.append((t1 - t0) * 1000)
    out.empties = len(empties)
    out.false_empties = sum(
        any(t1 < start and got_at.get(mid, float("inf")) > end for mid, (_, t1) in sent_at.items())
        for start, end in empties
    )


async def produce_sparse(
    topic: str, brokers: list[broker_pb2_grpc.BrokerStub], count: int, sent_at: dict[str, tuple[float, float]]
) -> None:
    """One message every 50-250 ms to a random broker; records (Send started, Send acknowledged)."""
    for i in range(count):
        await asyncio.sleep(random.uniform(0.05, 0.25))
        mid = f"S{i:05d}{uuid.uuid4().hex[:8]}".upper()
        message = bpb.Message(topic=topic, message_id=mid, body=b"x" * 64, born_ms=int(time.time() * 1000))
        t0 = time.perf_counter()
        await random.choice(brokers).Send(bpb.SendRequest(messages=[message]), timeout=5)
        sent_at[mid] = (t0, time.perf_counter())


async def produce_steady(
    topic: str, brokers: list[broker_pb2_grpc.BrokerStub], rate: float, stop: asyncio.Event
) -> None:
    """`rate` messages per second, each to a random broker, sent every 20 ms (fractional rates add up)."""
    tick, owed, i = 0.02, 0.0, 0
    next_at = time.perf_counter()
    while not stop.is_set():
        owed += rate * tick
        by_broker: dict[int, list[bpb.Message]] = {}
        while owed >= 1:
            owed -= 1
            i += 1
            message = bpb.Message(topic=topic, message_id=f"D{i}-{uuid.uuid4().hex[:6]}", body=b"y" * 64)
            by_broker.setdefault(random.randrange(len(brokers)), []).append(message)
        for b, share in by_broker.items():
            await brokers[b].Send(bpb.SendRequest(messages=share), timeout=5)
        next_at += tick
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))


def ack_request(topic: str, group: str, messages: list[v2.Message]) -> pb.AckMessageRequest:
    ack = pb.AckMessageRequest(group=v2.Resource(name=group), topic=v2.Resource(name=topic))
    for m in messages:
        ack.entries.add(message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle)
    return ack


async def dense(
    endpoint: str, brokers: list[broker_pb2_grpc.BrokerStub], metrics_url: str, proxy_pid: int, args: argparse.Namespace
) -> Dense:
    topic, group = f"dense-{uuid.uuid4().hex[:8]}", "g-dense"
    out = Dense()
    stop = asyncio.Event()
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        request = receive_request(topic, group, 16, args.poll_s)
        await receive_once(stub, receive_request(topic, group, 16, 0), 0)

        async def consume() -> None:
            while not stop.is_set():
                messages = await receive_once(stub, request, args.poll_s)
                out.delivered += len(messages)
                if messages:
                    await stub.AckMessage(ack_request(topic, group, messages), timeout=5)

        consumers = [asyncio.create_task(consume()) for _ in range(args.consumers)]
        producer = asyncio.create_task(produce_steady(topic, brokers, args.dense_rate, stop))
        await asyncio.sleep(1.0)  # warm-up: consumers in their steady state
        delivered, rpcs, cpu, t0 = out.delivered, broker_rpcs(metrics_url), cpu_seconds(proxy_pid), time.perf_counter()
        await asyncio.sleep(args.dense_seconds)
        out.seconds = time.perf_counter() - t0
        out.delivered -= delivered
        out.broker_rpcs = broker_rpcs(metrics_url) - rpcs
        out.proxy_cpu_s = cpu_seconds(proxy_pid) - cpu
        stop.set()
        producer.cancel()
        for task in consumers:
            task.cancel()
        await asyncio.gather(producer, *consumers, return_exceptions=True)
    return out


def print_tables(results: dict[str, tuple[Sparse, Dense]], args: argparse.Namespace) -> None:
    print(f"\n{machine()}; 4 brokers, one proxy per mode, poll {args.poll_s:g} s")
    print(f"\n(a) sparse: 1 consumer, {args.messages} messages, one every 50-250 ms to a random broker")
    print("| mode | from | p50 ms | p90 ms | p99 ms | max ms | received | false empties | empties | broker RPCs/msg |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, (s, _) in results.items():
        per = s.broker_rpcs / max(1, len(s.latencies_ms))
        for label, values in (("Send ack", s.wake_ms), ("Send start", s.latencies_ms)):
            q = summary(values)
            print(
                f"| {mode} | {label} | {q['p50']:.2f} | {q['p90']:.2f} | {q['p99']:.2f} | {q['max']:.1f} "
                f"| {len(values)} | {s.false_empties} | {s.empties} | {per:.2f} |"
            )
    send = [ms for s, _ in results.values() for ms in s.send_ms]
    if send:
        print(f"(the broker Send inside every latency: median {statistics.median(send):.2f} ms)")
    print(f"\n(b) dense: {args.consumers} consumers (batch 16, acking), {args.dense_rate:g} msg/s offered")
    print("| mode | msg/s | broker RPCs/msg | proxy CPU % |")
    print("|---|---:|---:|---:|")
    for mode, (_, d) in results.items():
        per = d.broker_rpcs / max(1, d.delivered)
        print(f"| {mode} | {d.rate:.0f} | {per:.3f} | {100 * d.proxy_cpu_s / max(d.seconds, 1e-9):.0f} |")


def plot(results: dict[str, tuple[Sparse, Dense]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, (s, _) in results.items():
        values = sorted(s.latencies_ms)
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=mode)
    ax.set_xscale("log")
    ax.set_xlabel("latency from the producer's Send start to the consumer (ms, log scale)")
    ax.set_ylabel("fraction of messages")
    ax.set_title("Sparse stream, 1 consumer, 4 brokers: latency CDF per receive mode")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


async def run_modes(
    cluster: Cluster, endpoints: dict[str, str], args: argparse.Namespace
) -> dict[str, tuple[Sparse, Dense]]:
    channels = [grpc.aio.insecure_channel(c.address) for c in cluster.brokers.values()]
    brokers = [broker_pb2_grpc.BrokerStub(ch) for ch in channels]  # type: ignore[no-untyped-call]
    proxies = dict(zip(args.modes, cluster.proxies[1:], strict=True))  # proxies[0] is the cluster's own
    results = {}
    try:
        for mode in args.modes:
            proxy = proxies[mode]
            assert proxy.process is not None
            print(f"mode {mode}: sparse ...", flush=True)
            s = await sparse(endpoints[mode], brokers, proxy.metrics_url, args)
            print(f"mode {mode}: dense ...", flush=True)
            d = await dense(endpoints[mode], brokers, proxy.metrics_url, proxy.process.pid, args)
            results[mode] = (s, d)
    finally:
        for ch in channels:
            await ch.close()
    return results


async def sweep(cluster: Cluster, endpoints: dict[str, str], args: argparse.Namespace) -> None:
    """Dense runs only, for each consumer count in --sweep: where does notify start to cost more?"""
    channels = [grpc.aio.insecure_channel(c.address) for c in cluster.brokers.values()]
    brokers = [broker_pb2_grpc.BrokerStub(ch) for ch in channels]  # type: ignore[no-untyped-call]
    proxies = dict(zip(args.modes, cluster.proxies[1:], strict=True))
    rows = []
    for consumers in args.sweep:
        args.consumers = consumers
        for mode in args.modes:
            proxy = proxies[mode]
            assert proxy.process is not None
            d = await dense(endpoints[mode], brokers, proxy.metrics_url, proxy.process.pid, args)
            rows.append((consumers, mode, d))
            print(f"  {consumers} consumers, {mode}: {d.rate:.0f} msg/s", flush=True)
    for ch in channels:
        await ch.close()
    print(f"\n{machine()}; sweep at {args.dense_rate:g} msg/s offered, {args.dense_seconds:g} s each")
    print("| consumers | mode | msg/s | broker RPCs/msg | proxy CPU % |")
    print("|---:|---|---:|---:|---:|")
    for consumers, mode, d in rows:
        per = d.broker_rpcs / max(1, d.delivered)
        print(f"| {consumers} | {mode} | {d.rate:.0f} | {per:.3f} | {100 * d.proxy_cpu_s / max(d.seconds, 1e-9):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--poll-s", type=float, default=2.0)
    parser.add_argument("--consumers", type=int, default=64)
    parser.add_argument("--dense-seconds", type=float, default=8.0)
    parser.add_argument("--dense-rate", type=float, default=1000.0)
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--proxy-arg", action="append", default=[], help="extra proxy flag (repeat)")
    parser.add_argument("--sweep", type=lambda s: [int(n) for n in s.split(",")], default=None, help="consumer counts")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="realtime-bench-") as tmp:
        config = ClusterConfig(brokers=4, listen="127.0.0.1:0", data_dir=Path(tmp), metrics=True)
        with Cluster(config) as cluster:
            endpoints = {mode: cluster.add_proxy(extra=[*MODE_ARGS[mode], *args.proxy_arg]) for mode in args.modes}
            if args.sweep:
                asyncio.run(sweep(cluster, endpoints, args))
                return
            results = asyncio.run(run_modes(cluster, endpoints, args))
    print_tables(results, args)
    if args.plot:
        plot(results, args.plot)
    if args.json:
        data = {m: {"sparse": asdict(s), "dense": asdict(d)} for m, (s, d) in results.items()}
        args.json.write_text(json.dumps(data))


if __name__ == "__main__":
    main()
