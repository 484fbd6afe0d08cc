"""An answer that does not decode: grpc.aio hands it back as None (and logs why), where the blocking grpc raises
INTERNAL, which the blocking client raises as a ServerError. The asyncio client raises the same. Fake stubs, no
sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from popgate import Message, ServerError, aio
from tests.unit.sdk.fakes import FakeChannel


class Undecodable:
    """A stub every answer of which does not decode: each unary call answers None, a stream yields None."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, method: str) -> Any:
        if method.startswith("Receive"):
            return self._stream(method)

        async def call(request: Any, **_: Any) -> None:
            self.calls.append(method)
            return None

        return call

    def _stream(self, method: str) -> Callable[..., AsyncIterator[None]]:
        def call(request: Any, **_: Any) -> AsyncIterator[None]:
            self.calls.append(method)

            async def frames() -> AsyncIterator[None]:
                yield None

            return frames()

        return call


RECEIVED = Message(b"x", topic="t", message_id="m", receipt_handle="h")
CONSUMER_CALLS: dict[str, Callable[[aio.SimpleConsumer], Awaitable[Any]]] = {
    "receive": lambda c: c.receive(),
    "ack": lambda c: c.ack(RECEIVED),
    "nack": lambda c: c.nack(RECEIVED),
    "forward_to_dlq": lambda c: c.forward_to_dlq(RECEIVED),
}
PRODUCER_CALLS: dict[str, Callable[[aio.Producer], Awaitable[Any]]] = {
    "send": lambda p: p.send("t", b"x"),
    "recall": lambda p: p.recall("t", "handle"),
    "end_transaction": lambda p: p._end_transaction("t", "m", "tid", True, from_check=False),
}


def assert_server_error(error: BaseException, stub: Undecodable) -> None:
    assert isinstance(error, ServerError), repr(error)
    assert error.code_name == "INTERNAL" and not error.retriable  # as the blocking client's
    assert len(stub.calls) == 1  # not retried


@pytest.mark.parametrize("call", CONSUMER_CALLS)
async def test_an_undecodable_answer_to_an_async_consumer_is_a_server_error(call: str) -> None:
    stub = Undecodable()
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._stub_ = consumer._ext_stub_ = stub
    with pytest.raises(Exception) as raised:
        await asyncio.wait_for(CONSUMER_CALLS[call](consumer), 2)
    await consumer.close()
    assert_server_error(raised.value, stub)


@pytest.mark.parametrize("call", PRODUCER_CALLS)
async def test_an_undecodable_answer_to_an_async_producer_is_a_server_error(call: str) -> None:
    stub = Undecodable()
    producer = aio.Producer("127.0.0.1:1")
    producer._channel = FakeChannel()  # type: ignore[assignment]
    producer._stub_ = stub
    with pytest.raises(Exception) as raised:
        await asyncio.wait_for(PRODUCER_CALLS[call](producer), 2)
    await producer.close()
    assert_server_error(raised.value, stub)
