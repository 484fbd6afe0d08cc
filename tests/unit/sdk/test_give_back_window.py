"""A give-back of many messages (an answer cut past its batch, a Session's orphans): at most GIVE_BACK_IN_FLIGHT
calls at once, as a window (each call that ends lets the next go), all of it within its time (GIVE_BACK_TIMEOUT_S)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from popgate_pb.v2 import service_pb2 as pb

import popgate._base
import popgate._wire
from popgate import Message, SimpleConsumer, aio
from popgate._base import GIVE_BACK_IN_FLIGHT
from tests.unit.sdk.fakes import FakeChannel, FakeRpcError, FakeStub


def many_messages(fake: FakeStub, count: int) -> list[Message]:
    return [fake.message(f"m{i}") for i in range(count)]


class SlowCalls:
    """ChangeInvisibleDuration taking `latency` s each (the first one `first` s; failing with DEADLINE_EXCEEDED past
    its timeout), answered by `fake`; counts the calls in flight at once, as a blocking stub's futures and as an
    asyncio stub's coroutines."""

    def __init__(self, fake: FakeStub, latency: float, first: float | None = None) -> None:
        self.fake, self.latency, self.first = fake, latency, latency if first is None else first
        self.in_flight = self.most_in_flight = self.started = 0
        self.lock = threading.Lock()

    def _start(self) -> float:
        with self.lock:
            self.in_flight += 1
            self.started += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            return self.first if self.started == 1 else self.latency

    def _end(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def future(self, request: pb.ChangeInvisibleDurationRequest, *, timeout: float, **_: Any) -> Any:
        return _SlowFuture(self, request, self._start(), timeout)

    async def __call__(self, request: pb.ChangeInvisibleDurationRequest, **kwargs: Any) -> Any:
        timeout = kwargs["timeout"]  # a grpc.aio stub's keyword
        latency = self._start()
        try:
            await asyncio.sleep(min(latency, timeout))
            if latency > timeout:
                raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED)
            return self.fake.ChangeInvisibleDuration(request)
        finally:
            self._end()


class _SlowFuture:
    """A blocking stub's call future: done after its latency (or its timeout), its done callbacks run then."""

    def __init__(self, calls: SlowCalls, request: pb.ChangeInvisibleDurationRequest, latency: float, timeout: float):
        late = latency > timeout
        self.answer: Any = FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED) if late else None
        self.calls, self.request, self.done = calls, request, threading.Event()
        self.callbacks: list[Callable[[Any], None]] = []
        threading.Timer(min(latency, timeout), self._finish).start()

    def _finish(self) -> None:
        if self.answer is None:
            self.answer = self.calls.fake.ChangeInvisibleDuration(self.request)
        self.calls._end()
        self.done.set()
        for callback in self.callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self.callbacks.append(callback)  # the timer is far off for any call the tests add a callback to

    def exception(self) -> BaseException | None:
        self.done.wait()
        return self.answer if isinstance(self.answer, BaseException) else None

    def result(self) -> Any:
        return self.answer


def sync_consumer(calls: SlowCalls) -> SimpleConsumer:
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._stub = type("V2", (), {"ChangeInvisibleDuration": calls})()
    return consumer


def aio_consumer(calls: SlowCalls) -> aio.SimpleConsumer:
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._stub_ = type("V2", (), {"ChangeInvisibleDuration": calls})()
    consumer._session_served = False  # the fake proxy serves the unary calls alone
    return consumer


def test_a_give_back_of_many_messages_ends_within_its_second(caplog: pytest.LogCaptureFixture) -> None:
    """3,000 messages to give back against a proxy taking 0.1 s a call: a bounded number of calls at once, all of it
    within about its 1 s, the rest logged as not given back (it comes back after `invisible`). Without the second's
    bound the window alone would take ~4.7 s (3,000 calls of 0.1 s, GIVE_BACK_IN_FLIGHT at a time): under 3 s, with
    room for a loaded machine, tells the two apart."""
    fake = FakeStub()
    calls = SlowCalls(fake, latency=0.1)
    caplog.set_level(logging.DEBUG, logger="popgate.client")
    with sync_consumer(calls) as consumer:
        started = time.monotonic()
        consumer._give_back(many_messages(fake, 3000))
        took = time.monotonic() - started
    assert took < 3.0 and calls.most_in_flight <= GIVE_BACK_IN_FLIGHT
    assert 0 < len(fake.sent("ChangeInvisibleDuration")) < 3000
    assert "unhandled message(s) failed" in caplog.text


async def test_an_async_give_back_of_many_messages_ends_within_its_second(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeStub()
    calls = SlowCalls(fake, latency=0.1)
    caplog.set_level(logging.DEBUG, logger="popgate.aio")
    consumer = aio_consumer(calls)
    started = time.monotonic()
    await consumer._give_back(many_messages(fake, 3000))
    took = time.monotonic() - started
    await consumer.close()
    assert took < 3.0 and calls.most_in_flight <= GIVE_BACK_IN_FLIGHT
    assert 0 < len(fake.sent("ChangeInvisibleDuration")) < 3000
    assert "unhandled message(s) failed" in caplog.text


async def test_an_async_give_back_sends_its_first_calls_before_building_every_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3,000 messages whose requests take 1 ms each to build (a loaded host): the first calls go at once, not after
    every request was built (3 s, past the give-back's second, when none went)."""
    fake = FakeStub()
    calls = SlowCalls(fake, latency=0.01)
    build = popgate._wire.change_invisible_request

    def slow_build(*args: Any, **kwargs: Any) -> pb.ChangeInvisibleDurationRequest:
        time.sleep(0.001)
        return build(*args, **kwargs)

    monkeypatch.setattr(popgate._wire, "change_invisible_request", slow_build)
    consumer = aio_consumer(calls)
    await consumer._give_back(many_messages(fake, 3000))
    await consumer.close()
    assert len(fake.sent("ChangeInvisibleDuration")) >= 100


def test_a_hung_give_back_call_holds_up_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """100 messages, the first call held until its deadline (a hung broker): the 99 others are all given back. The
    give-back has 3 s rather than 1, so that a loaded host holding the test up for a moment does not take it all."""
    monkeypatch.setattr(popgate._base, "GIVE_BACK_TIMEOUT_S", 3.0)
    fake = FakeStub()
    with sync_consumer(SlowCalls(fake, latency=0.01, first=10.0)) as consumer:
        consumer._give_back(many_messages(fake, 100))
    assert len(fake.sent("ChangeInvisibleDuration")) == 99


async def test_a_hung_async_give_back_call_holds_up_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(popgate._base, "GIVE_BACK_TIMEOUT_S", 3.0)  # as above
    fake = FakeStub()
    consumer = aio_consumer(SlowCalls(fake, latency=0.01, first=10.0))
    await consumer._give_back(many_messages(fake, 100))
    await consumer.close()
    assert len(fake.sent("ChangeInvisibleDuration")) == 99
