"""Receives of concurrent tasks on one popgate.aio SimpleConsumer, joined into one on the Session stream through a
real proxy (sdk/_joining.py): each task gets its share, and none answers empty while its wait lasts."""

from __future__ import annotations

import asyncio

from popgate import aio
from tests.integration.sdk.conftest import name


async def test_concurrent_receives_join_and_each_gets_a_share_of_the_messages(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end; the stream has the header
        assert consumer._session is not None and consumer._session.receive_batch > 32  # the proxy takes joined ones
        sent = {r.message_id for r in await producer.send_many(topic, [f"m{i}".encode() for i in range(40)])}
        got: list[str] = []
        async with asyncio.timeout(15):
            while len(got) < len(sent):
                a, b = await asyncio.gather(consumer.receive(max=32, wait=2), consumer.receive(max=32, wait=2))
                assert len(a) <= 32 and len(b) <= 32
                await consumer.ack_many([*a, *b])
                got += [m.message_id for m in (*a, *b)]
    assert sorted(got) == sorted(sent)


async def test_a_receive_cut_short_waits_out_the_rest_of_its_wait(endpoint: str) -> None:
    """Two receives joined, one message: the receive that got none of it waits on for the next, not answers empty."""
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)

        async def send_two() -> list[str]:
            await asyncio.sleep(0.3)
            first = await producer.send(topic, b"first")
            await asyncio.sleep(0.5)
            return [first.message_id, (await producer.send(topic, b"second")).message_id]

        a, b, sent = await asyncio.gather(
            consumer.receive(max=32, wait=10), consumer.receive(max=32, wait=10), send_two()
        )
    assert sorted(m.message_id for m in (*a, *b)) == sorted(sent) and len(a) == len(b) == 1


async def test_joined_receives_never_share_out_one_message_groups_run(endpoint: str) -> None:
    """FIFO order: while one caller holds messages of a message group, no other caller gets any of that group's."""
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)
        sent = [
            r.message_id
            for r in await producer.send_many(topic, [f"m{i}".encode() for i in range(40)], message_group="order-1")
        ]
        got: list[str] = []
        async with asyncio.timeout(30):
            while len(got) < len(sent):
                a, b = await asyncio.gather(consumer.receive(max=32, wait=1), consumer.receive(max=32, wait=1))
                assert not (a and b), "two callers held one message group's messages at once"
                await consumer.ack_many([*a, *b])
                got += [m.message_id for m in (*a, *b)]
    assert got == sent


async def test_joined_receives_that_do_not_wait_each_get_a_ready_message(endpoint: str) -> None:
    """Two receives that do not wait, joined, and a message of each of two message groups ready (a joined answer
    holds one group's run): each receive gets one, rather than one of them nothing while a message is ready."""
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end
        sent = [(await producer.send(topic, g.encode(), message_group=g)).message_id for g in ("g1", "g2")]
        a, b = await asyncio.gather(consumer.receive(max=1, wait=0), consumer.receive(max=1, wait=0))
        await consumer.ack_many([*a, *b])
    assert sorted(m.message_id for m in (*a, *b)) == sorted(sent)
