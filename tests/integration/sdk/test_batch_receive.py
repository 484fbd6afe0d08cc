"""The SDK's two ways to receive, through real proxies over the same brokers: popgate's ReceiveMessages (many
messages per frame) where the proxy serves it, v2's ReceiveMessage where it does not (--no-batch-receive, as a
RocketMQ proxy): the same messages, fields, acks and redeliveries either way."""

from __future__ import annotations

import asyncio

import pytest

from popgate import Message, Producer, SimpleConsumer, _served, aio
from tests.forwarder import Forwarder
from tests.integration.sdk.conftest import drain, name


@pytest.mark.parametrize("path", ["batch", "v2"])
def test_both_paths_deliver_the_same_messages_and_take_their_acks(path: str, endpoint: str, v2_only: str) -> None:
    target = endpoint if path == "batch" else v2_only
    topic, group = name("t"), name("g")
    with SimpleConsumer(target, group, {topic: "keep"}) as consumer, Producer(endpoint) as producer:
        consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        sent = producer.send_many(topic, [f"m{i}".encode() for i in range(70)], tag="keep", keys=["k"])
        producer.send(topic, b"filtered out", tag="other")
        got = drain(consumer, len(sent))
        assert consumer._batch_receive is (path == "batch")
        assert sorted(m.message_id for m in got) == sorted(r.message_id for r in sent)
        assert {(m.tag, m.keys, m.attempt, m.topic) for m in got} == {("keep", ("k",), 1, topic)}
        assert consumer.receive(max=32, wait=0.3) == []  # all acked, the other tag never came


async def first_of(consumer: aio.SimpleConsumer) -> Message:
    for _ in range(40):  # 20 s at most
        batch = await consumer.receive(max=1, wait=0.5)
        if batch:
            return batch[0]
    raise AssertionError("no message within 20 s")


@pytest.mark.parametrize("path", ["batch", "v2"])
async def test_a_nacked_message_comes_back_with_its_next_attempt(path: str, endpoint: str, v2_only: str) -> None:
    target = endpoint if path == "batch" else v2_only
    topic, group = name("t"), name("g")
    async with aio.SimpleConsumer(target, group, topic) as consumer, aio.Producer(endpoint) as producer:
        await consumer.receive(max=1, wait=0.2)
        await producer.send(topic, b"again")
        first = await first_of(consumer)
        await consumer.nack(first)
        again = await first_of(consumer)
        await consumer.ack(again)
        assert consumer._batch_receive is (path == "batch")
    assert (again.message_id, first.attempt, again.attempt) == (first.message_id, 1, 2)


@pytest.mark.parametrize("path", ["shared", "v2"])
async def test_both_clients_send_plain_bodies_alike_with_or_without_shared_sends(
    path: str, endpoint: str, v2_only: str
) -> None:
    """A send_many of plain bodies goes as popgate's SendShared where the proxy serves it (a unary call from the
    blocking Producer, a Session request from the asyncio one) and as v2's SendMessage where it does not
    (--no-batch-receive, as a RocketMQ proxy): the same messages are stored, with their options, either way."""
    target = endpoint if path == "shared" else v2_only
    topic, group = name("t"), name("g")
    with SimpleConsumer(endpoint, group, {topic: "*"}) as consumer:
        consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        with Producer(target) as producer:
            sent = producer.send_many(topic, [f"s{i}".encode() for i in range(40)], tag="a", properties={"p": "1"})
            assert producer._shared_served is (path == "shared")
        async with aio.Producer(target) as producer_aio:
            sent += await producer_aio.send_many(topic, [f"a{i}".encode() for i in range(40)], tag="a", keys=["k"])
            assert producer_aio._shared_served is (True if path == "shared" else None)  # v2: no Session at all
        got = drain(consumer, len(sent))
    assert sorted(m.message_id for m in got) == sorted(r.message_id for r in sent)
    assert sorted(m.body for m in got) == sorted(
        [f"s{i}".encode() for i in range(40)] + [f"a{i}".encode() for i in range(40)]
    )
    assert {(m.tag, m.topic) for m in got} == {("a", topic)}
    assert {m.properties.get("p") for m in got if m.body.startswith(b"s")} == {"1"}
    assert {m.keys for m in got if m.body.startswith(b"a")} == {("k",)}


async def test_a_client_takes_the_extensions_up_once_its_proxy_serves_them(
    endpoint: str, v2_only: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its proxy replaced behind the same address by one that serves popgate's extension (a rolling upgrade from a
    RocketMQ proxy, or from a popgate proxy older than the extension), a running client asks again once the proxy's
    "not served" is a minute old (`popgate._served`): its receives come in batches, its sends go shared over the
    Session stream, with no restart."""
    forwarder = await asyncio.to_thread(Forwarder, v2_only)  # its own loop, made outside this one
    topic, group = name("t"), name("g")
    try:
        with SimpleConsumer(forwarder.address, group, topic) as consumer:
            async with aio.Producer(forwarder.address) as producer:

                def verdicts() -> tuple[bool | None, ...]:
                    return consumer._batch_receive, producer._session_served, producer._shared_served

                consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
                await producer.send_many(topic, [b"a", b"b", b"c"])
                before = sorted(m.body for m in drain(consumer, 3))
                assert verdicts() == (False, False, None)
                forwarder.retarget(endpoint)
                monkeypatch.setattr(_served, "RECHECK_S", 0.0)  # the minute is over
                await producer.send_many(topic, [b"d", b"e", b"f"])
                after = sorted(m.body for m in drain(consumer, 3))
                assert verdicts() == (True, True, True)
    finally:
        forwarder.close()
    assert (before, after) == ([b"a", b"b", b"c"], [b"d", b"e", b"f"])
