"""Acks not waited for (``wait=False``) are bounded per consumer: with MAX_UNWAITED_ACKS under way, one more waits
until one of them ends (no sockets: each ack is held on an event the test sets)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from popgate import Message, SimpleConsumer, aio, errors
from popgate._base import MAX_UNWAITED_ACKS


def message(i: int) -> Message:
    return Message(body=b"x", topic="t", message_id=f"id{i}", receipt_handle=f"rh{i}")


async def test_acks_not_waited_for_are_bounded_in_the_asyncio_client() -> None:
    release = asyncio.Event()
    acked: list[str] = []

    async def held_ack(messages: Any) -> list[tuple[str, errors.PopgateError]]:
        await release.wait()
        acked.extend(m.message_id for m in messages)
        return []

    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = held_ack  # type: ignore[method-assign]
    for i in range(MAX_UNWAITED_ACKS):
        await asyncio.wait_for(consumer.ack(message(i), wait=False), 1)  # each returns at once
    one_more = asyncio.ensure_future(consumer.ack(message(MAX_UNWAITED_ACKS), wait=False))
    await asyncio.sleep(0.05)
    assert not one_more.done()  # waits for a slot
    release.set()
    await asyncio.wait_for(one_more, 1)
    await consumer.close()  # waits for every ack under way
    assert sorted(acked) == sorted(f"id{i}" for i in range(MAX_UNWAITED_ACKS + 1))


def test_acks_not_waited_for_are_bounded_in_the_blocking_client() -> None:
    release = threading.Event()
    acked: list[str] = []

    def held_ack(messages: Any) -> list[tuple[str, errors.PopgateError]]:
        release.wait(10)
        acked.extend(m.message_id for m in messages)
        return []

    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = held_ack  # type: ignore[method-assign]
    for i in range(MAX_UNWAITED_ACKS):
        consumer.ack(message(i), wait=False)  # queued or under way: returns at once
    one_more = threading.Thread(target=consumer.ack, args=(message(MAX_UNWAITED_ACKS),), kwargs={"wait": False})
    one_more.start()
    one_more.join(0.05)
    assert one_more.is_alive()  # waits for a slot
    release.set()
    one_more.join(5)
    assert not one_more.is_alive()
    consumer.close()  # waits for every ack queued or under way
    assert sorted(acked) == sorted(f"id{i}" for i in range(MAX_UNWAITED_ACKS + 1))
