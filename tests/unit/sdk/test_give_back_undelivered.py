"""Messages no caller saw (a receive cancelled or failed as they came, an iteration's batch left unread) are given
back with popgate's ChangeInvisibleMany marked `undelivered`: one request per topic, ready at once and not counted
as a delivery. A body found corrupt is given back counted (a nack), and a proxy without ChangeInvisibleMany gets one
ChangeInvisibleDuration a message, counted, as before. Fake stubs, no sockets."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import grpc
import pytest

from popgate import Message, SimpleConsumer, aio
from tests.unit.sdk.fakes import AsyncStub, FakeChannel, FakeRpcError, FakeStub

pytestmark = pytest.mark.undelivered


class Futures:
    """A fake's method as a blocking stub's (`.future`)."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self.method = method

    def future(self, request: Any, **_: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(self.method(request))
        except grpc.RpcError as exc:
            done.set_exception(exc)
        return done


class Refusing(FakeStub):
    """A proxy older than ChangeInvisibleMany."""

    def ChangeInvisibleMany(self, request: Any, **_: Any) -> Any:
        self.calls.append(("ChangeInvisibleMany", request))
        raise FakeRpcError(grpc.StatusCode.UNIMPLEMENTED)


def sync_consumer(fake: FakeStub) -> SimpleConsumer:
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ext = type("Ext", (), {"ChangeInvisibleMany": Futures(fake.ChangeInvisibleMany)})()
    consumer._stub = type("V2", (), {"ChangeInvisibleDuration": Futures(fake.ChangeInvisibleDuration)})()
    return consumer


def received(fake: FakeStub, count: int) -> list[Message]:
    return [fake.message(f"m{i}") for i in range(count)]


def test_messages_no_caller_saw_go_back_in_one_request_not_counted() -> None:
    fake = FakeStub()
    with sync_consumer(fake) as consumer:
        assert consumer._give_back(received(fake, 3))
    [request] = fake.sent("ChangeInvisibleMany")
    assert request.undelivered and len(request.entries) == 3 and not request.invisible_duration.seconds
    assert not fake.sent("ChangeInvisibleDuration") and consumer._many_served is True


def test_corrupt_messages_go_back_counted_one_by_one() -> None:
    fake = FakeStub()
    with sync_consumer(fake) as consumer:
        assert consumer._give_back(received(fake, 2), counted=True)
    assert len(fake.sent("ChangeInvisibleDuration")) == 2 and not fake.sent("ChangeInvisibleMany")


def test_a_proxy_without_change_invisible_many_gets_them_one_by_one() -> None:
    fake = Refusing()
    with sync_consumer(fake) as consumer:
        assert consumer._give_back(received(fake, 2))
        assert consumer._many_served is False
    assert len(fake.sent("ChangeInvisibleMany")) == 1 and len(fake.sent("ChangeInvisibleDuration")) == 2


@pytest.mark.parametrize("proxy", [FakeStub, Refusing])
async def test_the_asyncio_consumer_gives_back_alike(proxy: type[FakeStub]) -> None:
    fake = proxy()
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._session_served = False  # the fake proxy serves the unary calls alone
    consumer._ext_stub_ = consumer._stub_ = AsyncStub(fake)
    async with consumer:
        await consumer._give_back(received(fake, 3))
        await consumer._give_back(received(fake, 1), counted=True)
    many, single = fake.sent("ChangeInvisibleMany"), fake.sent("ChangeInvisibleDuration")
    assert len(many) == 1 and many[0].undelivered
    assert len(single) == (1 if proxy is FakeStub else 4)


def test_a_message_never_received_is_left_out_and_the_rest_go_back() -> None:
    fake = FakeStub()
    with sync_consumer(fake) as consumer:
        assert consumer._give_back([Message(b"never received"), *received(fake, 2)])
    [request] = fake.sent("ChangeInvisibleMany")
    assert len(request.entries) == 2
