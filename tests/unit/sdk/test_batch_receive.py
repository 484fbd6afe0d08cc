"""The SDK receives with popgate's ReceiveMessages (many messages per frame) where the proxy serves it, and with
v2's ReceiveMessage from the first UNIMPLEMENTED on (a RocketMQ proxy). Fake stubs, no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from typing import Any

import grpc
import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import RetryPolicy, ServerError, SimpleConsumer, Unavailable, _served, aio
from tests.unit.sdk.fakes import AsyncStub, FakeChannel, FakeRpcError, FakeStub

ONE_TRY = RetryPolicy(max_attempts=1)


def v2_message(message_id: str) -> v2.Message:
    props = v2.SystemProperties(message_id=message_id, receipt_handle=f"h-{message_id}", delivery_attempt=1)
    return v2.Message(topic=v2.Resource(name="t"), body=message_id.encode(), system_properties=props)


def batch_answer(*ids: str) -> list[ext.ReceiveMessagesResponse]:
    """Two frames of messages, then the status: the proxy splits a large answer so."""
    half = len(ids) // 2
    return [
        ext.ReceiveMessagesResponse(messages=ext.Messages(messages=[v2_message(i) for i in ids[:half]])),
        ext.ReceiveMessagesResponse(messages=ext.Messages(messages=[v2_message(i) for i in ids[half:]])),
        ext.ReceiveMessagesResponse(status=v2.Status(code=v2.OK)),
    ]


def v2_answer(*ids: str) -> list[pb.ReceiveMessageResponse]:
    frames = [pb.ReceiveMessageResponse(message=v2_message(i)) for i in ids]
    return [*frames, pb.ReceiveMessageResponse(status=v2.Status(code=v2.OK))]


class Stubs:
    """The two RPCs' stubs: each call answers the next scripted answer (a list of frames, or a code to fail with)."""

    def __init__(self, batch: list[Any], plain: list[Any]) -> None:
        self.batch, self.plain = batch, plain
        self.calls: list[str] = []

    def frames(self, script: list[Any], method: str) -> Iterator[Any]:
        self.calls.append(method)
        answer = script.pop(0)
        if isinstance(answer, grpc.StatusCode):
            raise FakeRpcError(answer)
        yield from answer

    def ext(self) -> Any:
        return type("Ext", (), {"ReceiveMessages": lambda _, request, **kw: self.frames(self.batch, "batch")})()

    def v2(self) -> Any:
        return type("V2", (), {"ReceiveMessage": lambda _, request, **kw: self.frames(self.plain, "v2")})()


def sync_consumer(stubs: Stubs) -> SimpleConsumer:
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=ONE_TRY)
    consumer._ext, consumer._stub = stubs.ext(), stubs.v2()
    return consumer


def test_a_proxy_that_serves_batches_is_read_many_messages_a_frame() -> None:
    stubs = Stubs(batch=[batch_answer("a", "b", "c"), batch_answer("d", "e")], plain=[])
    with sync_consumer(stubs) as consumer:
        assert [m.message_id for m in consumer.receive()] == ["a", "b", "c"]
        assert [m.receipt_handle for m in consumer.receive()] == ["h-d", "h-e"]
        assert consumer._batch_receive is True
    assert stubs.calls == ["batch", "batch"]


def test_unimplemented_falls_back_to_v2_for_this_receive_and_the_next() -> None:
    stubs = Stubs(batch=[grpc.StatusCode.UNIMPLEMENTED], plain=[v2_answer("a"), v2_answer("b", "c")])
    with sync_consumer(stubs) as consumer:
        assert [m.message_id for m in consumer.receive()] == ["a"]
        assert [m.message_id for m in consumer.receive()] == ["b", "c"]
        assert consumer._batch_receive is False
    assert stubs.calls == ["batch", "v2", "v2"]


def test_a_proxy_that_served_no_batches_is_asked_again_after_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its proxies upgraded behind the same address, a consumer takes the batches up without a restart."""
    now = [0.0]
    monkeypatch.setattr(_served, "clock", lambda: now[0])
    stubs = Stubs(batch=[grpc.StatusCode.UNIMPLEMENTED, batch_answer("c", "d")], plain=[v2_answer("a"), v2_answer("b")])
    with sync_consumer(stubs) as consumer:
        assert [m.message_id for m in consumer.receive()] == ["a"]
        now[0] += _served.RECHECK_S - 1
        assert [m.message_id for m in consumer.receive()] == ["b"]
        now[0] += 1
        assert [m.message_id for m in consumer.receive()] == ["c", "d"]
        assert consumer._batch_receive is True
    assert stubs.calls == ["batch", "v2", "v2", "batch"]


def test_a_receive_refused_batches_as_close_begins_sends_no_v2_receive() -> None:
    """None is sent once close() has begun (test_close_interleavings.py): the proxy's "not served" coming after it
    does not make the v2 receive go."""
    stubs = Stubs(batch=[grpc.StatusCode.UNIMPLEMENTED], plain=[v2_answer("a")])
    consumer = sync_consumer(stubs)
    refuse = stubs.frames

    def closing_meanwhile(script: list[Any], method: str) -> Iterator[Any]:
        consumer._closed = True  # close() begins while the batch receive is under way
        yield from refuse(script, method)

    stubs.frames = closing_meanwhile  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        consumer.receive()
    assert stubs.calls == ["batch"] and stubs.plain
    consumer.close()


def test_a_proxy_that_stops_serving_batches_is_read_with_v2_at_once() -> None:
    """Behind a balancer, one proxy of several may not serve it: that receive is not lost to the switch."""
    stubs = Stubs(batch=[batch_answer("a"), grpc.StatusCode.UNIMPLEMENTED], plain=[v2_answer("b")])
    with sync_consumer(stubs) as consumer:
        assert [m.message_id for m in consumer.receive()] == ["a"]
        assert [m.message_id for m in consumer.receive()] == ["b"]
    assert stubs.calls == ["batch", "batch", "v2"]


def test_other_failures_of_a_batch_receive_are_the_receives_own() -> None:
    stubs = Stubs(batch=[grpc.StatusCode.UNAVAILABLE], plain=[v2_answer("a")])
    with sync_consumer(stubs) as consumer, pytest.raises(Unavailable):
        consumer.receive()
    assert stubs.calls == ["batch"] and consumer._batch_receive is None


async def test_the_asyncio_consumer_falls_back_the_same_way() -> None:
    stubs = Stubs(batch=[grpc.StatusCode.UNIMPLEMENTED], plain=[v2_answer("a"), v2_answer("b")])

    def async_frames(frames: Iterator[Any]) -> AsyncIterator[Any]:
        async def read() -> AsyncIterator[Any]:
            for frame in frames:  # raises as a grpc.aio call does, while it is read
                yield frame

        return read()

    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=ONE_TRY)
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    sync_ext, sync_v2 = stubs.ext(), stubs.v2()
    ext_call = lambda _, r, **kw: async_frames(sync_ext.ReceiveMessages(r))  # noqa: E731
    v2_call = lambda _, r, **kw: async_frames(sync_v2.ReceiveMessage(r))  # noqa: E731
    consumer._ext_stub_ = type("Ext", (), {"ReceiveMessages": ext_call})()
    consumer._stub_ = type("V2", (), {"ReceiveMessage": v2_call})()
    async with consumer:
        assert [m.message_id for m in await consumer.receive()] == ["a"]
        assert [m.message_id for m in await consumer.receive()] == ["b"]
    assert stubs.calls == ["batch", "v2", "v2"] and consumer._batch_receive is False


async def test_the_asyncio_consumer_reads_batches() -> None:
    stubs = Stubs(batch=[batch_answer("a", "b")], plain=[])

    async def frames(request: Any, **_: Any) -> AsyncIterator[Any]:
        for frame in stubs.frames(stubs.batch, "batch"):
            yield frame

    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=ONE_TRY)
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._ext_stub_ = type("Ext", (), {"ReceiveMessages": staticmethod(frames)})()
    consumer._stub_ = object()
    async with consumer:
        assert [m.body for m in await consumer.receive()] == [b"a", b"b"]
    assert consumer._batch_receive is True


class Endless:
    """A ReceiveMessages answer as of a proxy looping on a Pop: frames of three messages each (their handles live in
    `fake`) as long as it is read and not cancelled, up to `FRAMES` (a test that fails ends)."""

    FRAMES = 1000

    def __init__(self, fake: FakeStub) -> None:
        self.fake = fake
        self.frames = 0
        self.cancelled = False

    def _next(self) -> ext.ReceiveMessagesResponse:
        messages = []
        for i in range(3):
            message = v2_message(f"m{self.frames * 3 + i}")
            self.fake.live.add(message.system_properties.receipt_handle)
            messages.append(message)
        self.frames += 1
        return ext.ReceiveMessagesResponse(messages=ext.Messages(messages=messages))

    def __iter__(self) -> Iterator[ext.ReceiveMessagesResponse]:
        while not self.cancelled and self.frames < self.FRAMES:
            yield self._next()

    async def __aiter__(self) -> AsyncIterator[ext.ReceiveMessagesResponse]:
        while not self.cancelled and self.frames < self.FRAMES:
            yield self._next()
            await asyncio.sleep(0)

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def cut(answer: Endless, fake: FakeStub, caught: pytest.ExceptionInfo[ServerError]) -> None:
    assert "6 messages" in str(caught.value) and "receive of 4" in str(caught.value) and not caught.value.retriable
    assert answer.cancelled and answer.frames == 2  # max + one frame read, no more
    assert sorted(r.message_id for r in fake.sent("ChangeInvisibleDuration")) == [f"m{i}" for i in range(6)]


def test_an_answer_with_more_messages_than_asked_is_cut_and_the_excess_given_back() -> None:
    """A receive of 4 answered without end: cut at the frame that passes 4 (the call cancelled), every message read
    given back, and a ServerError naming the counts — for the blocking client here, the asyncio one below."""
    fake = FakeStub()
    answer = Endless(fake)
    with SimpleConsumer("127.0.0.1:1", "g", "t", retry=ONE_TRY) as consumer:
        consumer._ext = type("Ext", (), {"ReceiveMessages": lambda _, request, **kw: answer})()
        consumer._stub = type("V2", (), {"ChangeInvisibleDuration": SyncFuture(fake)})()
        with pytest.raises(ServerError) as caught:
            consumer.receive(max=4)
    cut(answer, fake, caught)


async def test_an_async_answer_with_more_messages_than_asked_is_cut_and_the_excess_given_back() -> None:
    fake = FakeStub()
    answer = Endless(fake)
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=ONE_TRY)
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._ext_stub_ = type("Ext", (), {"ReceiveMessages": lambda _, request, **kw: answer})()
    consumer._stub_ = AsyncStub(fake)
    async with consumer:
        with pytest.raises(ServerError) as caught:
            await asyncio.wait_for(consumer.receive(max=4), 2)
    cut(answer, fake, caught)


class SyncFuture:
    """A blocking stub's `ChangeInvisibleDuration`: its `future` answered by `fake` at once."""

    def __init__(self, fake: FakeStub) -> None:
        self.fake = fake

    def future(self, request: pb.ChangeInvisibleDurationRequest, **_: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(self.fake.ChangeInvisibleDuration(request))
        return done
