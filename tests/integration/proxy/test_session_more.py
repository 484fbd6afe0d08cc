"""Through a real proxy and broker, with many requests in flight on the proxy's one Session stream to the broker
(joined into shared stream messages both ways: tests/integration/broker/test_session_more.py shows the joining),
every message sent is delivered once and every ack is answered."""

from __future__ import annotations

import asyncio

from popgate.aio import Producer, SimpleConsumer
from tests.integration.proxy.conftest import MakeCluster


async def test_concurrent_sends_receives_and_acks_through_the_proxy_all_arrive_once(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(brokers=1)
    bodies = [f"m{i}".encode() for i in range(2000)]
    async with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, "g", "joined") as consumer:
        await producer.send("joined", b"create")  # the topic exists before the consumers poll it
        await asyncio.gather(*(producer.send_many("joined", bodies[i : i + 16]) for i in range(0, len(bodies), 16)))
        received: list[bytes] = []

        async def consume() -> None:
            while len(received) < len(bodies) + 1:
                messages = await consumer.receive(max=32, invisible=60, wait=1)
                received.extend(m.body for m in messages)
                await asyncio.gather(*(consumer.ack(m) for m in messages))  # acks one by one: many in flight

        await asyncio.wait_for(asyncio.gather(*(consume() for _ in range(8))), 60)
        assert sorted(received) == sorted([b"create", *bodies])
        assert await consumer.receive(max=32, invisible=60, wait=0.5) == []  # all acked: nothing comes back
