"""popgate through its proxy with the asyncio SDK, as a `QueueAdapter` for the peers' harness (shared/peers).

    setup       = each client's connection opened and ready, nothing sent (the measured windows start connected)
    send        = Producer.send (one SendMessage, returns after a broker stored it)
    send_batch  = Producer.send_many (SendMessage calls of <= 1024 messages, 4 in flight)
    receive     = SimpleConsumer.receive(max, invisible, wait): one ReceiveMessage long poll, on the first of the
                  consumers with the fewest receives under way (one receiving loop uses one consumer; concurrent
                  long polls spread over all)
    ack(_batch) = SimpleConsumer.ack / ack_many (one AckMessage per topic) on the consumer that received the
                  messages, with wait=False: returns at once, and the ack goes in the same stream message as that
                  consumer's next receive (the NATS adapter's default, nats-py's fire-and-forget msg.ack() on the
                  connection the message came in on); config ack_wait=true waits for each ack's answer (as NATS's
                  ack_sync=true)

Config (JSON): endpoint, topic, group, server_pids (proxy + brokers), channels (gRPC connections the
receives are spread over; many concurrent long polls share each one as HTTP/2 streams), ack_wait.
Run it with `bench/peers_run.py`, or by hand from shared/peers:

    PYTHONPATH=/work/main:/work/main/bench .venv/bin/python bench.py --adapter peers_adapter:PopgateAdapter \
        --config '{"endpoint": "127.0.0.1:8081", "server_pids": [...]}' --scenario latency
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from qadapter import AdapterBase, Received  # type: ignore[import-not-found]

from popgate import Message
from popgate.aio import Producer, SimpleConsumer

CONNECT_S = 30.0


class PopgateAdapter(AdapterBase):  # type: ignore[misc]
    def __init__(
        self,
        endpoint: str = "127.0.0.1:8081",
        topic: str = "bench",
        group: str = "g",
        channels: int = 8,
        server_pids: Sequence[int] = (),
        ack_wait: bool = False,
        **kw: Any,
    ) -> None:
        super().__init__(
            endpoint=endpoint,
            topic=topic,
            group=group,
            channels=channels,
            server_pids=list(server_pids),
            ack_wait=ack_wait,
            **kw,
        )
        self.topic, self.group, self.ack_wait = topic, group, ack_wait
        self._producer = Producer(endpoint)
        # A consumer per connection (SimpleConsumer is safe for concurrent calls), and its receives under way.
        self._consumers = [SimpleConsumer(endpoint, group, topic) for _ in range(max(1, channels))]
        self._receiving = [0] * len(self._consumers)

    async def setup(self) -> None:
        """Connects every client before the measured windows, as the NATS and Redis adapters connect in theirs;
        sends nothing (topics are created on the first send, groups on the first receive) —
        tests/integration/sdk/test_peers_adapter.py."""
        for client in [self._producer, *self._consumers]:
            await connect(client)

    async def close(self) -> None:
        await self._producer.close()
        for consumer in self._consumers:
            await consumer.close()

    async def send(self, body: bytes) -> None:
        await self._producer.send(self.topic, body)

    async def send_batch(self, bodies: Sequence[bytes]) -> None:
        await self._producer.send_many(self.topic, bodies)

    async def receive(self, max_n: int, visibility_s: float, wait_s: float) -> list[Received]:
        index = self._receiving.index(min(self._receiving))
        consumer = self._consumers[index]
        self._receiving[index] += 1
        try:
            messages = await consumer.receive(max=min(max_n, 32), invisible=visibility_s, wait=wait_s)
        finally:
            self._receiving[index] -= 1
        return [Received(m.body, (consumer, m), m.attempt) for m in messages]

    async def ack(self, handle: tuple[SimpleConsumer, Message]) -> None:
        consumer, message = handle
        await consumer.ack(message, wait=self.ack_wait)

    async def ack_batch(self, handles: Sequence[tuple[SimpleConsumer, Message]]) -> None:
        by_consumer: dict[SimpleConsumer, list[Message]] = {}
        for consumer, message in handles:
            by_consumer.setdefault(consumer, []).append(message)
        for consumer, messages in by_consumer.items():
            await consumer.ack_many(messages, wait=self.ack_wait)

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = super().describe() if hasattr(super(), "describe") else dict(self.config)
        d["sdk"] = "popgate.aio"
        return d


async def connect(client: Producer | SimpleConsumer) -> None:
    """The client's connection, open and ready (the SDK makes it on first use: its channel, made in this loop)."""
    _ = client._stub
    assert client._channel is not None
    await asyncio.wait_for(client._channel.channel_ready(), CONNECT_S)
