"""bench.proxy_bench: a call the proxy answers with an error stops the run instead of counting as 0 messages."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from bench.proxy_bench import ProxySteps

OK = v2.Status(code=v2.OK)


class FakeStub:
    """The proxy's v2 service, answering each call with the given status (entries OK)."""

    def __init__(self, send: v2.Status = OK, receive: v2.Status = OK, ack: v2.Status = OK) -> None:
        self.send, self.receive, self.ack = send, receive, ack

    async def SendMessage(self, request: pb.SendMessageRequest, **call: Any) -> pb.SendMessageResponse:
        entries = [pb.SendResultEntry(status=self.send) for _ in request.messages]
        return pb.SendMessageResponse(status=self.send, entries=entries)

    async def ReceiveMessage(self, request: Any, **call: Any) -> AsyncIterator[pb.ReceiveMessageResponse]:
        if self.receive.code == v2.OK:
            message = v2.Message()
            message.system_properties.receipt_handle = "h1"
            yield pb.ReceiveMessageResponse(message=message)
        yield pb.ReceiveMessageResponse(status=self.receive)

    async def AckMessage(self, request: pb.AckMessageRequest, **call: Any) -> pb.AckMessageResponse:
        entries = [pb.AckMessageResultEntry(status=self.ack) for _ in request.entries]
        return pb.AckMessageResponse(status=self.ack, entries=entries)


def run(step: Callable[[], Awaitable[int]]) -> int:
    async def once() -> int:
        return await step()

    return asyncio.run(once())


def steps(stub: FakeStub) -> ProxySteps:
    return ProxySteps(stub, argparse.Namespace(size=8, batch=4))  # type: ignore[arg-type]


def test_ok_answers_count_their_messages_and_an_empty_receive_counts_none() -> None:
    assert run(steps(FakeStub()).produce) == 4
    assert run(steps(FakeStub()).consume) == 1
    assert run(steps(FakeStub(receive=v2.Status(code=v2.MESSAGE_NOT_FOUND))).consume) == 0


@pytest.mark.parametrize(
    ("stub", "phase", "error"),
    [
        (FakeStub(send=v2.Status(code=v2.TOO_MANY_REQUESTS, message="busy")), "produce", "SendMessage answered"),
        (FakeStub(receive=v2.Status(code=v2.TOO_MANY_REQUESTS)), "consume", "ReceiveMessage answered"),
        (FakeStub(ack=v2.Status(code=v2.INVALID_RECEIPT_HANDLE)), "consume", "AckMessage answered"),
    ],
)
def test_an_error_status_raises(stub: FakeStub, phase: str, error: str) -> None:
    with pytest.raises(RuntimeError, match=error):
        run(getattr(steps(stub), phase))
