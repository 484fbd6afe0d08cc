"""A receive's answer that ends without its v2 status: its messages are given back, not delivered, and the receive
fails retriably, as on the Session (proto/ext/messaging.proto: "A client must discard messages whose answer ended
without a status, as with v2"). Fake stubs, no sockets."""

from __future__ import annotations

import asyncio

import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2

from popgate import RetryPolicy, SimpleConsumer, Unavailable, _wire, aio
from tests.unit.sdk.fakes import FakeChannel, FakeStub
from tests.unit.sdk.test_corrupt import AsyncBatchStub, BatchStub, message
from tests.unit.sdk.test_give_back import given_back

IDS = ["m0", "m1", "m2"]


def unfinished(fake: FakeStub) -> list[ext.ReceiveMessagesResponse]:
    """An answer of three messages, then no status."""
    messages = [message(i, b"x", handle=fake.message(i).receipt_handle) for i in IDS]
    return [ext.ReceiveMessagesResponse(messages=ext.Messages(messages=messages))]


def test_an_answer_without_its_status_is_given_back_not_delivered() -> None:
    fake = FakeStub()
    with pytest.raises(Unavailable) as raised:
        _wire.received(unfinished(fake))
    assert raised.value.retriable
    assert [m.message_id for m in _wire.all_messages(unfinished(fake))] == IDS  # what a give-back gives back
    assert _wire.received([]) == []  # no frame at all (a trailers-only answer): an empty receive
    with SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1)) as consumer:
        consumer._stub = consumer._ext = BatchStub(fake, unfinished(fake))
        with pytest.raises(Unavailable):
            consumer.receive()
    assert given_back(fake) == IDS


async def test_an_async_answer_without_its_status_is_given_back_not_delivered() -> None:
    fake = FakeStub()
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._stub_ = consumer._ext_stub_ = AsyncBatchStub(fake, unfinished(fake))
    with pytest.raises(Unavailable) as raised:
        await consumer.receive()
    await asyncio.wait_for(consumer.close(), 2)
    assert raised.value.retriable and given_back(fake) == IDS


def test_an_answer_with_its_status_last_or_first_is_delivered() -> None:
    fake = FakeStub()
    status = ext.ReceiveMessagesResponse(status=v2.Status(code=v2.OK))
    assert len(_wire.received([*unfinished(fake), status])) == len(_wire.received([status, *unfinished(fake)])) == 3
