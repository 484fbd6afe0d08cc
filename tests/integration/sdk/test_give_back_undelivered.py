"""Messages an application never saw come again with the attempt they had, through real proxies and brokers: the
asyncio consumer gives them back undelivered (popgate's ChangeInvisibleMany), so receives cancelled by short
`asyncio.wait_for` timeouts while messages flow send nothing to the DLQ; a proxy without popgate's extension
(--no-batch-receive, as a RocketMQ proxy) gets them one ChangeInvisibleDuration each, counted."""

from __future__ import annotations

import asyncio
import random

import pytest

from popgate import Message, aio
from tests.integration.sdk.conftest import name


async def test_receives_cancelled_as_messages_come_leave_their_attempts_as_they_were(endpoint: str) -> None:
    topic, group, count = name("t"), name("g"), 300
    got: dict[str, int] = {}
    async with aio.SimpleConsumer(endpoint, group, topic) as consumer, aio.Producer(endpoint) as producer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        await producer.send_many(topic, [b"%d" % i for i in range(count)])
        done = asyncio.Event()

        async def impatient(steady: bool) -> None:
            while not done.is_set():
                try:  # most of the cancelled ones are cut as their answer comes
                    timeout = 5.0 if steady else random.uniform(0.001, 0.02)
                    batch = await asyncio.wait_for(consumer.receive(max=8, wait=0.5), timeout)
                except TimeoutError:
                    continue
                for message in batch:
                    got[message.message_id] = max(got.get(message.message_id, 0), message.attempt)
                if batch:
                    await consumer.ack_many(batch)
                if len(got) >= count:
                    done.set()

        tasks = [asyncio.ensure_future(impatient(steady=i == 0)) for i in range(8)]
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert len(got) == count and set(got.values()) == {1}


@pytest.mark.parametrize("path", ["ext", "v2"])
async def test_a_give_back_counts_only_where_the_proxy_lacks_the_extension(
    path: str, endpoint: str, v2_only: str
) -> None:
    target = endpoint if path == "ext" else v2_only
    topic, group = name("t"), name("g")
    async with aio.SimpleConsumer(target, group, topic) as consumer, aio.Producer(endpoint) as producer:
        await consumer.receive(max=1, wait=0.2)
        await producer.send_many(topic, [b"a", b"b", b"c"])
        first: list[Message] = []
        while len(first) < 3:
            first += await consumer.receive(max=3, wait=2)
        await consumer._give_back(first)  # as a receive cancelled as they came
        again: list[Message] = []
        while len(again) < 3:
            again += await consumer.receive(max=3, wait=2)
        await consumer.ack_many(again)
    assert {m.attempt for m in first} == {1}
    assert {m.attempt for m in again} == ({1} if path == "ext" else {2})
