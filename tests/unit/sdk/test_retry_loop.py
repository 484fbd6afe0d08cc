"""The clients' retry loops (no server: the operations are fakes)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Producer, RetryPolicy, SimpleConsumer, TooManyRequests, Unavailable, aio, errors
from tests.unit.sdk.fakes import FakeRpcError, UnimplementedCall

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.002)


def failing(times: int, error: errors.PopgateError) -> tuple[list[int], object]:
    calls: list[int] = []

    def op() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "done"

    return calls, op


def test_retriable_errors_are_retried_until_success() -> None:
    with Producer("127.0.0.1:1", retry=FAST) as producer:
        calls, op = failing(3, TooManyRequests("busy", code=42900))
        assert producer._retrying(op) == "done"  # type: ignore[arg-type]
    assert len(calls) == 4


def test_attempts_are_bounded() -> None:
    with Producer("127.0.0.1:1", retry=FAST) as producer:
        calls, op = failing(10, Unavailable("down"))
        with pytest.raises(Unavailable):
            producer._retrying(op)  # type: ignore[arg-type]
    assert len(calls) == 4


def test_other_errors_are_raised_at_once() -> None:
    with Producer("127.0.0.1:1", retry=FAST) as producer:
        calls, op = failing(10, errors.BadRequest("bad", code=40000))
        with pytest.raises(errors.BadRequest):
            producer._retrying(op)  # type: ignore[arg-type]
    assert len(calls) == 1


def test_asyncio_loop_retries_the_same_way() -> None:
    async def run() -> int:
        calls = 0

        async def op() -> str:
            nonlocal calls
            calls += 1
            if calls < 3:
                raise Unavailable("down")
            return "done"

        async with aio.Producer("127.0.0.1:1", retry=FAST) as producer:
            assert await producer._retrying(op) == "done"
        return calls

    assert asyncio.run(run()) == 3


def test_options_are_checked_at_construction() -> None:
    with pytest.raises(ValueError):
        Producer("no-port")
    with pytest.raises(ValueError):
        Producer("127.0.0.1:1", access_key="only the access key")
    with pytest.raises(ValueError):
        aio.SimpleConsumer("127.0.0.1:1", "g", {}, batch=1)
    with pytest.raises(ValueError):
        aio.SimpleConsumer("127.0.0.1:1", "g", "t", batch=33)


def test_a_consumer_refusing_its_arguments_opens_no_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    from popgate import SimpleConsumer, _sync_client

    opened: list[str] = []
    monkeypatch.setattr(_sync_client.grpc, "insecure_channel", lambda target, **kw: opened.append(target))
    for bad in ({"batch": 33}, {"invisible": 0}, {"wait": -1.0}, {"group": ""}, {"subscriptions": {}}):
        arguments = {"group": "g", "subscriptions": "t", **bad}
        with pytest.raises(ValueError):
            SimpleConsumer("127.0.0.1:1", **arguments)  # type: ignore[arg-type]
    assert opened == []


class RocketMQ:
    """ReceiveMessage as a proxy that serves only v2 answers it (RocketMQ's raises a poll to its 5 s minimum and
    refuses one whose deadline leaves less, ILLEGAL_POLLING_TIME): its first answer fails (the connection goes: a
    proxy restarting), the others are empty."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def _answer(self) -> Iterator[pb.ReceiveMessageResponse]:
        if len(self.asked) == 1:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)
        yield pb.ReceiveMessageResponse(status=v2.Status(code=v2.MESSAGE_NOT_FOUND))

    def ReceiveMessages(self, request: Any, **_: Any) -> Any:
        raise FakeRpcError(grpc.StatusCode.UNIMPLEMENTED)

    def ReceiveMessage(self, request: pb.ReceiveMessageRequest, **_: Any) -> Iterator[pb.ReceiveMessageResponse]:
        self.asked.append(request.long_polling_timeout.ToTimedelta().total_seconds())
        return self._answer()

    def Heartbeat(self, request: Any, **_: Any) -> pb.HeartbeatResponse:  # the back-off's, after Unavailable
        return pb.HeartbeatResponse(status=v2.Status(code=v2.OK))


def test_a_receive_retried_asks_its_whole_wait_again() -> None:
    """A receive whose first attempt failed asks its whole wait again, never what is left of it: a proxy serving only
    v2 (RocketMQ's) would refuse that."""
    proxy = RocketMQ()
    with SimpleConsumer("127.0.0.1:1", "g", "t", retry=FAST) as consumer:
        consumer._stub = consumer._ext = proxy
        assert consumer.receive(wait=2) == []
    assert proxy.asked == [2, 2]


class EndingProxy:
    """A channel to a proxy that ends each Session stream cleanly, unanswered, once a request comes on it (as one
    aging its connections faster than anything can be served); it records each receive's wait."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def stream_stream(self, method: str, **_: Any) -> Any:
        return lambda metadata: EndingStream(self)

    async def close(self) -> None:
        return None


class EndingStream:
    def __init__(self, proxy: EndingProxy) -> None:
        self.proxy = proxy
        self.ended = asyncio.Event()

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()

    async def write(self, message: bytes) -> None:
        request = ext.SessionRequest.FromString(message)
        self.proxy.asked.append(request.receive.long_polling_timeout.ToTimedelta().total_seconds())
        self.ended.set()

    async def read(self) -> Any:
        await self.ended.wait()
        return grpc.aio.EOF

    def cancel(self) -> None:
        self.ended.set()


async def test_a_receive_asks_again_for_the_rest_of_its_wait_when_its_stream_ends_and_backs_off() -> None:
    """A receive whose Session stream the proxy ends before answering asks again on a new stream for what is left of
    its wait, not counted as an attempt; streams ending one after another are asked again with the retry policy's
    back-off, not in a busy loop, and once the wait is over (and one more ask, not waiting, ended too) the receive
    fails retriably, its spent wait not asked again."""
    proxy = EndingProxy()
    policy = RetryPolicy(initial_backoff=0.05, max_backoff=0.4)  # retries allowed: the spent wait is not asked again
    async with aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=policy) as consumer:
        consumer._channel = proxy  # type: ignore[assignment]
        consumer._stub_ = proxy
        with pytest.raises(Unavailable) as caught:
            await consumer.receive(wait=1.5)
    assert caught.value.retriable
    assert proxy.asked[0] == 1.5
    assert all(later < earlier for earlier, later in itertools.pairwise(proxy.asked))  # the rest each time
    assert 3 <= len(proxy.asked) <= 20  # backing off from 0.05 s to 0.4 s within 1.5 s: about 10, not thousands


class AsyncRocketMQ:
    """A proxy serving only v2 (as the aio stubs call it): it records each ReceiveMessage's wait, answers none."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def ReceiveMessages(self, request: Any, **_: Any) -> Any:
        raise FakeRpcError(grpc.StatusCode.UNIMPLEMENTED)

    def ReceiveMessage(self, request: pb.ReceiveMessageRequest, **_: Any) -> Any:
        self.asked.append(request.long_polling_timeout.ToTimedelta().total_seconds())

        async def answer() -> Any:
            yield pb.ReceiveMessageResponse(status=v2.Status(code=v2.MESSAGE_NOT_FOUND))

        return answer()


class EndingThenRocketMQ(EndingProxy):
    """The first Session stream ends unanswered (its connection aging); the next connection reaches a proxy that
    serves no Session."""

    def stream_stream(self, method: str, **_: Any) -> Any:
        if not self.asked:
            return super().stream_stream(method)
        return lambda metadata: UnimplementedCall()


async def test_a_receive_whose_next_stream_is_unimplemented_asks_its_whole_wait() -> None:
    """A receive's stream ends and the next one is not served (another proxy now answers the address): the unary
    receive asks the whole wait, as a retry does, never what was left of it (RocketMQ's proxy refuses a poll under
    its 5 s minimum)."""
    channel, rocketmq = EndingThenRocketMQ(), AsyncRocketMQ()
    async with aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1)) as consumer:
        consumer._channel = channel  # type: ignore[assignment]
        consumer._stub_, consumer._ext_stub_ = rocketmq, rocketmq
        assert await consumer.receive(wait=7) == []
    assert (channel.asked, rocketmq.asked) == ([7.0], [7.0])
