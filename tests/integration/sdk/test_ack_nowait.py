"""Acks not waited for (`ack` / `ack_many` with ``wait=False``), both clients, against a real 2-broker cluster:
applied in the background, waited for by `close`, their failures logged, not raised."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from popgate import Producer, SimpleConsumer, aio
from tests.integration.sdk.conftest import drain

INVISIBLE = 1.0  # what an ack lost would come back after; the checks below hold a receive well past it
PAST_INVISIBLE = 3.0


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_acks_not_waited_for_are_applied_and_close_waits_for_them(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    bodies = [f"m{i}".encode() for i in range(100)]
    async with aio.Producer(endpoint) as producer:
        await producer.send_many(topic, bodies)
    got: list[bytes] = []
    async with aio.SimpleConsumer(endpoint, group, topic, invisible=INVISIBLE) as consumer:
        async with asyncio.timeout(20):
            while len(got) < len(bodies):
                batch = await consumer.receive(max=32, wait=0.4)
                await consumer.ack_many(batch, wait=False)  # returns before the proxy answers
                got += [m.body for m in batch]
    # Closed: every ack was answered. A lost one would be delivered again once its invisible time passed.
    async with aio.SimpleConsumer(endpoint, group, topic) as again:
        assert await again.receive(max=32, wait=PAST_INVISIBLE) == []
    assert sorted(got) == sorted(bodies)


async def test_a_failed_ack_not_waited_for_is_logged_not_raised(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer:
        await producer.send(topic, b"once")
    with caplog.at_level(logging.WARNING, logger="popgate.aio"):
        async with aio.SimpleConsumer(endpoint, group, topic) as consumer:
            async with asyncio.timeout(20):
                message = None
                while message is None:
                    batch = await consumer.receive(max=1, wait=0.4)
                    message = batch[0] if batch else None
            await consumer.ack(message)
            await consumer.ack(message, wait=False)  # the handle is acked already: refused, and only logged
    assert any("1 of 1 message(s) acked without waiting were not acked" in r.getMessage() for r in caplog.records)


def test_the_blocking_client_acks_without_waiting_too(endpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    topic, group = name("t"), name("g")
    bodies = [f"s{i}".encode() for i in range(40)]
    with Producer(endpoint) as producer:
        producer.send_many(topic, bodies)
    with caplog.at_level(logging.WARNING, logger="popgate.client"):
        with SimpleConsumer(endpoint, group, topic, invisible=INVISIBLE) as consumer:
            got = drain(consumer, len(bodies), ack=False)
            consumer.ack_many(got, wait=False)
            consumer.ack(got[0], wait=False)  # acked twice, both calls sent at once: the second one's failure logged
    with SimpleConsumer(endpoint, group, topic) as again:
        assert again.receive(max=32, wait=PAST_INVISIBLE) == []
    assert sorted(m.body for m in got) == sorted(bodies)
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(("1 of 1 message(s) acked without waiting", "1 of 40 message(s)")) for m in logged)
