"""`nack_many` through real proxies and two brokers: every message given back at once gets its new handle and
comes again after the delay with its next attempt, in one ChangeInvisibleMany a topic where the proxy serves it
and a ChangeInvisibleDuration each where it does not (`--no-batch-receive`, as a RocketMQ proxy); a message that
could not be nacked is named in the NackError and the others are nacked all the same."""

from __future__ import annotations

import asyncio

import pytest

from popgate import InvalidReceiptHandle, Message, NackError, Producer, SimpleConsumer, aio
from tests.integration.sdk.conftest import drain, name

COUNT = 40  # spread over both brokers' queues


async def receive_all(consumer: aio.SimpleConsumer, count: int) -> list[Message]:
    got: list[Message] = []
    async with asyncio.timeout(15):
        while len(got) < count:
            got += await consumer.receive(max=32, wait=0.4)
    return got


@pytest.mark.parametrize("proxy", ["popgate", "v2 only"])
async def test_nack_many_gives_every_message_back_with_a_new_handle(proxy: str, endpoint: str, v2_only: str) -> None:
    target = endpoint if proxy == "popgate" else v2_only
    topic, group = name("t"), name("g")
    async with aio.Producer(target) as producer, aio.SimpleConsumer(target, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        await producer.send_many(topic, [f"m{i}".encode() for i in range(COUNT)])
        first = await receive_all(consumer, COUNT)
        old = {m.message_id: m.receipt_handle for m in first}
        assert await consumer.nack_many(first, delay=0) == first
        assert all(m.receipt_handle != old[m.message_id] for m in first)
        again = await receive_all(consumer, COUNT)
        await consumer.ack_many(again)
        served = consumer._many_served
    assert sorted(m.message_id for m in again) == sorted(old)
    assert {m.attempt for m in again} == {2}
    assert served is (proxy == "popgate")


@pytest.mark.parametrize("proxy", ["popgate", "v2 only"])
def test_nack_many_against_a_proxy_without_it_nacks_each_message(proxy: str, endpoint: str, v2_only: str) -> None:
    """The blocking consumer: one call, or a ChangeInvisibleDuration per message where the proxy has no
    ChangeInvisibleMany; a stale message fails alone."""
    target = endpoint if proxy == "popgate" else v2_only
    topic, group = name("t"), name("g")
    with Producer(target) as producer, SimpleConsumer(target, group, topic) as consumer:
        consumer.receive(max=1, wait=0.2)
        producer.send_many(topic, [f"m{i}".encode() for i in range(COUNT)])
        first = drain(consumer, COUNT, ack=False)
        acked = first[0]
        consumer.ack(acked)
        with pytest.raises(NackError) as raised:
            consumer.nack_many(first, delay=0.5)
        again = drain(consumer, COUNT - 1)
        served = consumer._many_served
    [(message_id, error)] = raised.value.failures
    assert (message_id, type(error)) == (acked.message_id, InvalidReceiptHandle)
    assert sorted(m.message_id for m in again) == sorted(m.message_id for m in first[1:])
    assert {m.attempt for m in again} == {2}
    assert served is (proxy == "popgate")
