"""What `for message in consumer` asks the proxy for, against a fake stub that never has a message (no sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import SimpleConsumer, aio
from popgate._base import ITERATION_MIN_WAIT_S
from tests.unit.sdk.fakes import FakeChannel

EMPTY = [pb.ReceiveMessageResponse(status=v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message"))]
POLLS = 5


class EmptyReceives:
    """ReceiveMessage that finds nothing; records each call's long-polling time and closes the consumer after POLLS."""

    def __init__(self, close: Any) -> None:
        self.close = close
        self.waits: list[float] = []

    def record(self, request: pb.ReceiveMessageRequest) -> None:
        wait = request.long_polling_timeout
        self.waits.append(wait.seconds + wait.nanos / 1e9)
        if len(self.waits) == POLLS:
            self.close()


@pytest.mark.parametrize("wait", [0.0, 0.01])
def test_iteration_long_polls_even_when_wait_is_zero(wait: float) -> None:
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", wait=wait)
    receives = EmptyReceives(consumer.close)

    def receive(request: pb.ReceiveMessageRequest, **_: Any) -> list[pb.ReceiveMessageResponse]:
        receives.record(request)
        return EMPTY

    consumer._stub = type("Stub", (), {"ReceiveMessage": staticmethod(receive)})()
    consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
    assert list(consumer) == []
    assert receives.waits == [ITERATION_MIN_WAIT_S] * POLLS  # not a busy loop of ReceiveMessage calls


def test_asyncio_iteration_long_polls_even_when_wait_is_zero() -> None:
    async def main() -> list[float]:
        consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", wait=0)
        receives = EmptyReceives(lambda: setattr(consumer, "_closed", True))

        async def frames() -> AsyncIterator[pb.ReceiveMessageResponse]:
            for frame in EMPTY:
                yield frame

        def receive(request: pb.ReceiveMessageRequest, **_: Any) -> AsyncIterator[pb.ReceiveMessageResponse]:
            receives.record(request)
            return frames()

        consumer._channel = FakeChannel()  # type: ignore[assignment]
        consumer._stub_ = type("Stub", (), {"ReceiveMessage": staticmethod(receive)})()
        consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
        async with consumer:
            assert [m async for m in consumer] == []
        return receives.waits

    assert asyncio.run(main()) == [ITERATION_MIN_WAIT_S] * POLLS


def test_receive_with_wait_zero_answers_at_once() -> None:
    with SimpleConsumer("127.0.0.1:1", "g", "t", wait=0) as consumer:
        request, timeout = consumer._receive_plan(None, None, None)
    assert request.long_polling_timeout.seconds == request.long_polling_timeout.nanos == 0
    assert timeout == consumer.options.request_timeout
