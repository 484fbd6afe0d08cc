"""Overload: a flood of receives and sends beyond the bounds gets TOO_MANY_REQUESTS, and memory stays bounded.

Real processes (2 brokers, 1 proxy) with small bounds: the proxy holds at most
MAX_HELD receives and MAX_SEND_BYTES of sends in flight, each broker at most
BROKER_HELD long polls. Two identical rounds of RECEIVES concurrent receives and
SENDS concurrent 1 MiB sends: every answer is a v2 status (no gRPC error, no crash),
the surplus is 42900, the proxy serves afterwards, and RSS after round 2 is close to
RSS after round 1 (no growth per round). Prints a table; docs/BENCHMARKS.md "Overload".
Run with ``-s`` to see it.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from sdk import _wire as wire
from sdk.cluster import Cluster, ClusterConfig
from tests.procs import wait_until

MAX_HELD, BROKER_HELD, MAX_SEND_BYTES = 600, 200, 16 * 1024 * 1024
RECEIVES, SENDS, BODY = 2000, 96, 1024 * 1024
# Long enough that every receive of a round arrives while the first held ones still wait: the count of
# refusals below assumes one wave (a 3 s poll failed when a loaded machine spread 2,000 arrivals over > 3 s,
# freeing slots for a second wave: 800 empty / 1,200 refused, the bound itself kept).
POLL_S = 10
MiB = 1024 * 1024


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(
        brokers=2,
        listen="127.0.0.1:0",
        data_dir=tmp_path_factory.mktemp("overload"),
        receive_mode="longpoll",  # one broker Pop per receive: the broker's bound is reached too
        broker_args=("--max-held", str(BROKER_HELD)),
        proxy_args=("--max-held-receives", str(MAX_HELD), "--max-send-bytes", str(MAX_SEND_BYTES)),
    )
    with Cluster(config) as started:
        yield started


async def receive(stub: pb_grpc.MessagingServiceStub, topic: str, group: str) -> int:
    request = wire.receive_request(group, wire.Subscription(topic), max=32, invisible=30, wait=POLL_S)
    code = 0
    async for frame in stub.ReceiveMessage(request, timeout=POLL_S + 10):
        if frame.HasField("status"):
            code = frame.status.code
    return code


async def send(stub: pb_grpc.MessagingServiceStub, topic: str) -> int:
    message = v2.Message(
        topic=v2.Resource(name=topic),
        body=b"x" * BODY,
        system_properties=v2.SystemProperties(message_id=uuid.uuid4().hex, body_encoding=v2.IDENTITY),
    )
    reply = await stub.SendMessage(pb.SendMessageRequest(messages=[message]), timeout=20)
    return int(reply.status.code)


async def flood(
    endpoint: str, pids: dict[str, int]
) -> tuple[collections.Counter[int], collections.Counter[int], dict[str, int]]:
    peak = dict.fromkeys(pids, 0)
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            for name, pid in pids.items():
                peak[name] = max(peak[name], rss(pid))
            try:
                await asyncio.wait_for(stop.wait(), 0.05)
            except TimeoutError:
                pass

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    async with grpc.aio.insecure_channel(endpoint, options=options) as channel:
        stub = pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        sampler = asyncio.create_task(sample())
        topic = f"flood-{uuid.uuid4().hex[:6]}"
        receives = [receive(stub, f"{topic}-idle", "g_flood") for _ in range(RECEIVES)]
        sends = [send(stub, topic) for _ in range(SENDS)]
        codes = await asyncio.gather(*receives, *sends)
        stop.set()
        await sampler
    return collections.Counter(codes[:RECEIVES]), collections.Counter(codes[RECEIVES:]), peak


def test_a_flood_beyond_the_bounds_is_refused_with_42900_and_memory_stays_bounded(cluster: Cluster) -> None:
    pids = {"proxy": cluster.proxies[0].process.pid} | {n: c.process.pid for n, c in cluster.brokers.items()}
    before = {name: rss(pid) for name, pid in pids.items()}
    rows = []
    for round_ in (1, 2):
        received, sent, peak = asyncio.run(flood(cluster.endpoint, pids))
        after = {name: rss(pid) for name, pid in pids.items()}
        rows.append((round_, received, sent, peak, after))
        assert set(received) <= {v2.MESSAGE_NOT_FOUND, v2.TOO_MANY_REQUESTS}, received
        assert received[v2.TOO_MANY_REQUESTS] >= RECEIVES - MAX_HELD, received
        assert received[v2.MESSAGE_NOT_FOUND] >= 1, received
        assert set(sent) <= {v2.OK, v2.TOO_MANY_REQUESTS}, sent
        assert sent[v2.OK] >= MAX_SEND_BYTES // (BODY + 1024) // 2, sent
    print(f"\nbounds: proxy held {MAX_HELD}, broker held {BROKER_HELD}, proxy send bytes {MAX_SEND_BYTES // MiB} MiB")
    print(f"flood per round: {RECEIVES} receives ({POLL_S} s poll) + {SENDS} sends of {BODY // MiB} MiB, concurrently")
    print("round | receives empty / 42900 | sends ok / 42900 | RSS MiB before -> peak -> after (proxy, b1, b2)")
    for round_, received, sent, peak, after in rows:
        mem = ", ".join(f"{before[n] / MiB:.0f}->{peak[n] / MiB:.0f}->{after[n] / MiB:.0f}" for n in pids)
        print(
            f"{round_} | {received[v2.MESSAGE_NOT_FOUND]} / {received[v2.TOO_MANY_REQUESTS]} | "
            f"{sent[v2.OK]} / {sent[v2.TOO_MANY_REQUESTS]} | {mem}"
        )
    first, second = rows[0][4], rows[1][4]
    # The proxy keeps nothing per request: a second identical flood does not leave it bigger than the first did
    # (polled for a few seconds: right after a flood the allocator may not have handed memory back yet).
    proxy_pid = pids["proxy"]
    settled = wait_until(lambda: rss(proxy_pid) - first["proxy"] < 64 * MiB, timeout=5.0, interval=0.1)
    assert settled, (first["proxy"] / MiB, second["proxy"] / MiB, rss(proxy_pid) / MiB)
    for name in pids:  # brokers keep what they stored in bounded caches (payload cache 64 MiB, SQLite pages)
        assert second[name] < before[name] + 256 * MiB, (name, second[name] / MiB)
        assert max(r[3][name] for r in rows) < before[name] + 512 * MiB, name
