"""The proxy's Session stream against clients that push it: requests cancelled as they come, a stream message that
does not decode, and receives cut (the connection's age) while their answer is being written."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2

from proxy.settings import BrokerAddress, Settings
from proxy.v2 import session
from tests.unit.proxy.fakes import FakeBroker, popped
from tests.unit.proxy.test_session import Aborted, StreamContext, receive_request, service_over, stream


async def test_requests_cancelled_as_they_come_still_count_until_they_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "Receive, cancel" pairs in one stream message: each receive's task lives on until its cancellation ends it,
    so they count against the stream's bound, and past it receives are refused, not made without end."""
    monkeypatch.setattr(session, "MAX_PENDING", 100)
    service, _ = service_over(FakeBroker("b1"))
    context = StreamContext()
    flood = ext.SessionRequest(id=1, timeout_ms=20_000, receive=receive_request(poll_s=10))
    for i in range(1, 1001):
        if i > 1:
            flood.more.append(ext.SessionRequest(id=i, timeout_ms=20_000, receive=receive_request(poll_s=10)))
        flood.more.append(ext.SessionRequest(id=i, cancel=True))
    done = asyncio.Event()
    task = asyncio.ensure_future(session.serve(service, stream(flood, until=done), context))
    async with asyncio.timeout(10):
        while not any(a.receive.status.code == v2.TOO_MANY_REQUESTS for a in context.answers):  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # the context's writes, bounded
    done.set()
    await asyncio.wait_for(task, 10)


async def test_a_stream_message_that_does_not_decode_ends_the_stream_as_a_bad_request() -> None:
    async def undecodable() -> AsyncIterator[ext.SessionRequest]:
        yield ext.SessionRequest(id=1, timeout_ms=3000, receive=receive_request())
        raise DecodeError("Error parsing message")

    service, _ = service_over(FakeBroker("b1"))
    context = StreamContext()
    with pytest.raises(Aborted):
        await asyncio.wait_for(session.serve(service, undecodable(), context), 5)
    code, details = context.aborted
    assert code.name == "INVALID_ARGUMENT" and "does not decode" in details


class SlowDrainingContext(StreamContext):
    """grpc takes `write_s` to take a message (a large answer under flow control); the connection ages meanwhile."""

    def __init__(self, write_s: float = 0.3) -> None:
        super().__init__()
        self.event = asyncio.Event()
        self.writing = asyncio.Event()
        self.write_s = write_s

    def draining(self) -> asyncio.Event:
        return self.event

    async def write(self, message: bytes) -> None:
        self.writing.set()
        await asyncio.sleep(self.write_s)
        self.written.append(ext.SessionResponse.FromString(message))  # the client got it whole


async def test_a_receive_cut_as_its_answer_is_written_is_delivered_not_given_back() -> None:
    """Its last messages and OK status taken by the writer, a receive cut by the connection's age is written all
    the same: the client has the messages, so they are not also given back to their broker (received twice)."""
    broker = FakeBroker("b1")
    broker.ready = [popped("b1", "m1"), popped("b1", "m2")]
    service, _ = service_over(broker)
    context = SlowDrainingContext()
    request = ext.SessionRequest(id=7, timeout_ms=3000, receive=receive_request())
    task = asyncio.ensure_future(session.serve(service, stream(request, until=asyncio.Event()), context))
    await asyncio.wait_for(context.writing.wait(), 5)
    context.event.set()  # the connection reaches its age while the answer is being written
    await asyncio.wait_for(task, 5)
    answers: list[Any] = context.answers
    got = [m.system_properties.message_id for a in answers for m in a.receive.messages.messages]
    assert got == ["m1", "m2"] and answers[-1].receive.status.code == v2.OK
    assert broker.ready == []  # not given back


async def test_a_receive_cut_again_by_the_streams_close_while_written_still_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write longer than the stream's settling: its close cuts the receive a second time while the write goes
    on; the write's outcome still decides (written: delivered, not given back)."""
    monkeypatch.setattr(session, "SETTLE_S", 0.2)
    monkeypatch.setattr(session, "WRITER_DRAIN_S", 0.2)

    broker = FakeBroker("b1")
    broker.ready = [popped("b1", "m1"), popped("b1", "m2")]
    service, _ = service_over(broker)
    context = SlowDrainingContext(write_s=0.3)  # longer than SETTLE_S
    request = ext.SessionRequest(id=7, timeout_ms=30_000, receive=receive_request())
    task = asyncio.ensure_future(session.serve(service, stream(request, until=asyncio.Event()), context))
    await asyncio.wait_for(context.writing.wait(), 5)
    context.event.set()
    await asyncio.wait_for(task, 10)
    got = [m.system_properties.message_id for a in context.answers for m in a.receive.messages.messages]
    assert got == ["m1", "m2"] and broker.ready == []


class WindowClosedContext(StreamContext):
    """popgate's HTTP/2 server's context (`flushed`), whose client's flow-control window is 0 and stays so: what is
    written is queued, never taken."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[asyncio.Future[None]] = []

    def flushed(self) -> asyncio.Future[None]:
        self.taken.append(asyncio.get_running_loop().create_future())
        return self.taken[-1]


async def test_a_receive_frame_is_written_once_the_clients_window_took_it() -> None:
    """A receive's answer queued to a client whose window never opens is not written: it stays counted in the
    proxy's answer bytes, and at its write deadline its messages go back to their broker. Before, it counted as
    written once queued, its messages invisible for their whole invisible time."""
    broker = FakeBroker("b1")
    broker.ready = [popped("b1", "m1"), popped("b1", "m2")]
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),), max_answer_write_s=0.2)
    service, _ = service_over(broker, settings)
    context = WindowClosedContext()
    request = ext.SessionRequest(id=7, timeout_ms=30_000, receive=receive_request())
    task = asyncio.ensure_future(session.serve(service, stream(request, until=asyncio.Event()), context))
    async with asyncio.timeout(5):
        while not context.written:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert broker.ready == [] and service._proxy._answer_bytes > 0  # queued, not taken: still the proxy's
    await asyncio.sleep(0.4)  # past the write deadline
    assert sorted(m.stored.message.message_id for m in broker.ready) == ["m1", "m2"]
    for taken in context.taken:  # the stream is lost: what was queued never will be taken
        taken.cancel()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
