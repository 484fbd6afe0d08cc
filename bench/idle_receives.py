"""Idle receives held through one proxy over 4 brokers: memory per receive and idle CPU, beside grpc's floor.

    .venv/bin/python -m bench.idle_receives [--receives 10000] [--mode adaptive] [--hold-s 10] [--channels 20]

Starts 4 brokers and one proxy (`--receive-mode MODE`, adaptive by default as the proxy's), opens --receives
ReceiveMessage calls (nothing to receive; long polling longer than opening them may take plus --hold-s, with the
proxy's and the brokers' long-polling limits raised to match) from this process over --channels separate HTTP/2
connections, waits until the brokers hold them (Stats: held Pops + Notifications), then over --hold-s reads the
RSS growth of the proxy and of the brokers (against their RSS after a warm-up) and the CPU they use while idle.
The figures are per requested receive, so the run fails (exit status 1, saying why, no figures) unless after the
hold every receive is still open, the brokers still hold at least --receives requests and every call of the bare
server below is still held.

In the same run, beside the proxy, a bare grpc.aio server (`bench.grpc_call_floor`: the proxy's server options, a
handler that only sleeps) holds as many server-streaming calls over as many connections, opened at the same time
and read over the same hold: grpc-python's own cost of a held call. The last lines print the proxy's bytes per
receive above it (issue 28's target: at most 5 KB) and the idle CPU of the two side by side (a ratio: the host's
other load moves both). Finally it cancels every call and checks the brokers drop every held request. The client's
own memory is not counted (it is this process). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc

from bench import grpc_call_floor
from bench.common import cpu_seconds, machine, rss_bytes
from popgate import _wire as wire
from popgate.cli.cluster import Cluster, ClusterConfig

OPEN_S = 25.0  # longest wait for the brokers to hold every receive
SETTLE_S = 60.0  # then longest wait for their count to stop growing


def long_poll_s(hold_s: float) -> float:
    """A held receive's long polling: longer than opening every receive, the hold, py-spy's wait and the Stats
    reads after it, so none ends before the hold does — tests/unit/bench/test_idle_receives.py."""
    return OPEN_S + SETTLE_S + hold_s + 60.0


def unheld(n: int, still: int, proxy_ended: int, floor_ended: int) -> str:
    """Why a run's per-receive figures would be wrong ("" when they are not): they divide by the `n` receives
    asked, so all of them must still be held after the hold — tests/unit/bench/test_idle_receives.py."""
    problems = []
    if proxy_ended:
        problems.append(f"{proxy_ended} of {n} receives ended before the hold did (refused or expired)")
    if still < n:
        problems.append(f"the brokers held {still} requests after the hold, fewer than the {n} receives")
    if floor_ended:
        problems.append(f"the bare server did not hold {floor_ended} of its {n} calls")
    return "; ".join(problems)


def request(topic: str, group: str, wait: float) -> pb.ReceiveMessageRequest:
    return wire.receive_request(group, wire.Subscription(topic), max=16, invisible=60, wait=wait)  # as held_request


async def held(stubs: list[broker_pb2_grpc.BrokerStub]) -> int:
    total = 0
    for stub in stubs:
        stats = await stub.Stats(bpb.StatsRequest(), timeout=5)
        total += stats.held_pops + stats.held_notifications
    return total


async def wait_held(stubs: list[broker_pb2_grpc.BrokerStub], condition: str, target: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            n = await held(stubs)
        except grpc.aio.AioRpcError as exc:  # this process busy opening 20,000 calls: its Stats call may time out
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() > deadline:
                raise
            continue
        if (n >= target if condition == ">=" else n <= target) or time.monotonic() > deadline:
            return n
        await asyncio.sleep(0.2)


async def warm_up(proxy_stubs: list[service_pb2_grpc.MessagingServiceStub]) -> None:
    """A short receive on every connection, so connections, buffers, sessions and caches exist before the baseline
    (a connection's own memory is not a receive's)."""
    for stub in proxy_stubs:
        r = request("idle", "g-idle", 0)
        async for _ in stub.ReceiveMessage(r, timeout=5):
            pass
    await asyncio.sleep(1)


async def open_receives(
    proxy_stubs: list[service_pb2_grpc.MessagingServiceStub],
    stubs: list[broker_pb2_grpc.BrokerStub],
    n: int,
    wait: float,
) -> tuple[list[Any], list[asyncio.Future[Any]]]:
    opened, asked = time.monotonic(), request("idle", "g-idle", wait)
    calls = [proxy_stubs[i % len(proxy_stubs)].ReceiveMessage(asked, timeout=wait + 30) for i in range(n)]
    # Start the calls (grpc sends a server-streaming request when its first message is awaited).
    readers = [asyncio.ensure_future(call.read()) for call in calls]
    held_now = await wait_held(stubs, ">=", n, OPEN_S)
    # Notify mode holds a Notification per broker per receive: wait until the count stops growing.
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        previous, held_now = held_now, await held(stubs)
        if held_now == previous:
            break
    print(f"opened {n} receives in {time.monotonic() - opened:.1f} s; brokers hold {held_now} requests")
    return calls, readers


async def profile(pid: int, path: str) -> asyncio.subprocess.Process:
    """py-spy (in the venv) samples the proxy for 4 s."""
    spy = str(Path(sys.executable).parent / "py-spy")
    argv = ["record", "-p", str(pid), "-d", "4", "-f", "raw", "-o", path]
    out = asyncio.subprocess.DEVNULL
    return await asyncio.create_subprocess_exec(spy, *argv, stdout=out, stderr=out)


def report(args: argparse.Namespace, rss: dict[str, int], cpu: dict[str, float], still: int, left: int) -> None:
    n = args.receives
    print(f"\n{machine()}; grpcio {grpc.__version__}; mode {args.mode}, {n} idle receives, {args.channels} connections")
    print("| process | RSS growth MiB | per receive KB | idle CPU % |")
    print("|---|---:|---:|---:|")
    for name in [name for name in rss if name != FLOOR]:
        print(f"| {name} | {rss[name] / 2**20:.1f} | {rss[name] / n / 1024:.2f} | {cpu[name]:.1f} |")
    total = sum(v for name, v in rss.items() if name != FLOOR)
    total_cpu = sum(v for name, v in cpu.items() if name != FLOOR)
    print(f"| **total** | {total / 2**20:.1f} | {total / n / 1024:.2f} | {total_cpu:.1f} |")
    print(f"| {FLOOR} (same run) | {rss[FLOOR] / 2**20:.1f} | {rss[FLOOR] / n / 1024:.2f} | {cpu[FLOOR]:.1f} |")
    above = (rss["proxy"] - rss[FLOOR]) / n / 1024
    print(
        f"proxy above the bare grpc.aio server: {above:.2f} KB per receive (target <= 5); with the brokers' share "
        f"{(total - rss[FLOOR]) / n / 1024:.2f} KB"
    )
    ratio = cpu["proxy"] / cpu[FLOOR] if cpu[FLOOR] > 0 else float("inf")
    print(
        f"idle CPU: proxy {cpu['proxy']:.2f} % against the bare server's {cpu[FLOOR]:.2f} % ({ratio:.1f}x); "
        f"proxy + brokers {total_cpu:.2f} % (target <= 2)"
    )
    print(f"held at the brokers during the hold: {still}; after cancelling every call: {left}")


FLOOR = "bare grpc.aio"


def floor_stubs(port: int, connections: int) -> tuple[list[grpc.aio.Channel], list[Any]]:
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.channel_id", i)]) for i in range(connections)
    ]
    return channels, [service_pb2_grpc.MessagingServiceStub(ch) for ch in channels]  # type: ignore[no-untyped-call]


async def warm_up_floor(stubs: list[Any]) -> None:
    """A call on every connection of the bare server, ended by its deadline there, as `warm_up` does on the
    proxy's: the connections exist before the baseline."""
    calls = [stub.ReceiveMessage(grpc_call_floor.held_request(), timeout=0.5) for stub in stubs]
    await asyncio.gather(*(call.read() for call in calls), return_exceptions=True)


def open_floor_calls(stubs: list[Any], n: int, wait: float) -> tuple[list[Any], list[asyncio.Future[Any]]]:
    """`n` held server-streaming calls on the bare server (the proxy's request), over its connections in turn."""
    held = grpc_call_floor.held_request(wait)
    calls = [stubs[i % len(stubs)].ReceiveMessage(held, timeout=wait + 30) for i in range(n)]
    return calls, [asyncio.ensure_future(call.read()) for call in calls]


async def run(cluster: Cluster, floor: tuple[int, int], args: argparse.Namespace) -> str:
    """Measures and prints the figures; returns why they would be wrong instead ("" when they are not)."""
    pids = {name: c.process.pid for name, c in [("proxy", cluster.proxies[0]), *cluster.brokers.items()] if c.process}
    floor_port, pids[FLOOR] = floor
    broker_channels = [grpc.aio.insecure_channel(c.address) for c in cluster.brokers.values()]
    stubs = [broker_pb2_grpc.BrokerStub(ch) for ch in broker_channels]  # type: ignore[no-untyped-call]
    # Separate connections: grpc shares one per target unless the channel arguments differ.
    channels = [
        grpc.aio.insecure_channel(cluster.endpoint, options=[("grpc.channel_id", i)]) for i in range(args.channels)
    ]
    proxy_stubs = [service_pb2_grpc.MessagingServiceStub(ch) for ch in channels]  # type: ignore[no-untyped-call]
    await warm_up(proxy_stubs)
    floor_channels, bare = floor_stubs(floor_port, args.channels)
    await warm_up_floor(bare)
    await asyncio.sleep(1)
    base_rss = {name: rss_bytes(pid) for name, pid in pids.items()}
    floor_calls, floor_readers = open_floor_calls(bare, args.receives, long_poll_s(args.hold_s))
    calls, readers = await open_receives(proxy_stubs, stubs, args.receives, long_poll_s(args.hold_s))
    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    spy = await profile(pids["proxy"], args.profile) if args.profile else None
    await asyncio.sleep(args.hold_s)
    if spy is not None:
        await asyncio.wait_for(spy.wait(), 30)
    cpu = {name: (cpu_seconds(pid) - cpu0[name]) / args.hold_s * 100 for name, pid in pids.items()}
    rss = {name: rss_bytes(pid) - base_rss[name] for name, pid in pids.items()}
    still = await held(stubs)
    problem = unheld(args.receives, still, sum(r.done() for r in readers), sum(r.done() for r in floor_readers))
    for call in [*calls, *floor_calls]:
        call.cancel()
    await asyncio.gather(*readers, *floor_readers, return_exceptions=True)
    left = await wait_held(stubs, "<=", 0, 10)
    if not problem:
        report(args, rss, cpu, still, left)
    for ch in [*channels, *floor_channels, *broker_channels]:
        await ch.close()
    return problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--receives", type=int, default=10_000)
    parser.add_argument("--mode", default="adaptive")
    parser.add_argument("--hold-s", type=float, default=10.0)
    parser.add_argument("--channels", type=int, default=20)
    parser.add_argument("--proxy-arg", action="append", default=[])
    parser.add_argument("--profile", default="", help="py-spy raw profile of the proxy during the hold")
    args = parser.parse_args()
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    bare = multiprocessing.Process(target=grpc_call_floor.serve, args=(ports, None), daemon=True)
    bare.start()
    with tempfile.TemporaryDirectory(prefix="idle-receives-") as tmp:
        config = ClusterConfig(
            brokers=4,
            listen="127.0.0.1:0",
            data_dir=Path(tmp),
            receive_mode=args.mode,
            proxy_args=(
                *("--max-held-receives", str(args.receives + 100)),
                *("--max-long-polling-s", str(long_poll_s(args.hold_s))),
                *args.proxy_arg,
            ),
            broker_args=("--max-poll-s", str(long_poll_s(args.hold_s))),
        )
        try:
            assert bare.pid is not None
            floor = (ports.get(timeout=30), bare.pid)
            with Cluster(config) as cluster:
                problem = asyncio.run(run(cluster, floor, args))
        finally:
            bare.kill()
            bare.join(10)
    if problem:
        sys.exit(f"bench.idle_receives: no figures: {problem}")


if __name__ == "__main__":
    main()
