"""Producer.send_many's calls in flight, its retries and the options it refuses (no server: a fake stub)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import grpc
import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Message, Producer, Unavailable, _waiting, _wire, aio, errors
from popgate.retry import RetryPolicy
from tests.unit.sdk.fakes import FakeChannel, FakeRpcError, closed_then_forked

MANY = 1500  # two SendMessage calls (1024 messages each at most)
NO_RETRY = RetryPolicy(max_attempts=1)


def answer(request: pb.SendMessageRequest | _wire.SharedSend) -> pb.SendMessageResponse:
    if isinstance(request, _wire.SharedSend):
        ids = request.message_ids
    else:
        ids = [m.system_properties.message_id for m in request.messages]
    ok = v2.Status(code=v2.OK)
    return pb.SendMessageResponse(status=ok, entries=[pb.SendResultEntry(status=ok, message_id=i) for i in ids])


class SendStub:
    """SendMessage as the sync client calls it (`future` for send_many's window, a plain call for retries)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.events: list[str] = []

    def __call__(self, request: pb.SendMessageRequest, **_: Any) -> pb.SendMessageResponse:
        self.events.append("call")
        if self.fail:
            raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)
        return answer(request)

    def future(self, request: pb.SendMessageRequest, **_: Any) -> Any:
        n = sum(e.startswith("sent") for e in self.events)
        self.events.append(f"sent {n}")
        stub = self

        class Call(Future):  # type: ignore[type-arg]
            def result(self, timeout: float | None = None) -> Any:
                stub.events.append(f"read {n}")
                if stub.fail:
                    raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)
                return answer(request)

        return Call()


def producer_with(stub: SendStub, shared: SendStub | None = None, **kw: Any) -> Producer:
    """A Producer whose SendMessage is `stub` and whose SendShared is `shared` (`stub` too unless given)."""
    producer = Producer("127.0.0.1:1", **kw)
    producer._stub = type("Stub", (), {"SendMessage": stub})()  # type: ignore[assignment]
    producer._send_shared = stub if shared is None else shared
    return producer


class Unimplemented(SendStub):
    """A proxy without popgate's SendShared RPC."""

    def __call__(self, request: Any, **_: Any) -> pb.SendMessageResponse:
        self.events.append("call")
        raise FakeRpcError(grpc.StatusCode.UNIMPLEMENTED)

    def future(self, request: Any, **_: Any) -> Any:
        self.events.append("sent")
        call: Future[Any] = Future()
        call.set_exception(FakeRpcError(grpc.StatusCode.UNIMPLEMENTED))
        return call


def test_the_producer_sends_as_send_message_to_a_proxy_without_shared_sends() -> None:
    """SendShared answered UNIMPLEMENTED (nothing served): that send goes again as the SendMessage of the same
    messages (their ids too), and every later one goes as SendMessage from the start."""
    stub, shared = SendStub(), Unimplemented()
    with producer_with(stub, shared) as producer:
        first = producer.send_many("t", [b"a", b"b"])
        later = producer.send_many("t", [b"x"] * MANY)
    assert shared.events == ["call"]
    assert stub.events == ["call", "sent 0", "sent 1", "read 0", "read 1"]
    assert len(first) == 2 and len(later) == MANY and len({r.message_id for r in [*first, *later]}) == MANY + 2


def test_a_message_groups_batches_are_sent_one_after_another() -> None:
    stub = SendStub()
    with producer_with(stub) as producer:
        receipts = producer.send_many("t", [b"x"] * MANY, message_group="customer-7")
    assert len(receipts) == MANY
    assert stub.events == ["sent 0", "read 0", "sent 1", "read 1"]


def test_without_a_message_group_several_batches_are_in_flight() -> None:
    stub = SendStub()
    with producer_with(stub) as producer:
        producer.send_many("t", [b"x"] * MANY)
    assert stub.events == ["sent 0", "sent 1", "read 0", "read 1"]


def test_a_failed_batch_in_the_window_counts_as_the_first_attempt() -> None:
    stub = SendStub(fail=True)
    with producer_with(stub, retry=NO_RETRY) as producer, pytest.raises(Unavailable):
        producer.send_many("t", [b"x"] * MANY, message_group="g")
    assert stub.events == ["sent 0", "read 0"]  # NO_RETRY: no second call


def aio_producer_with(send: Any) -> aio.Producer:
    """An asyncio Producer whose SendMessage is `send` (a coroutine function), without a channel."""
    producer = aio.Producer("127.0.0.1:1")
    producer._channel = FakeChannel()  # type: ignore[assignment]
    producer._stub_ = type("Stub", (), {"SendMessage": staticmethod(send)})()
    return producer


async def test_the_asyncio_producer_sends_a_groups_batches_one_after_another() -> None:
    in_flight, most = 0, 0

    async def send(request: pb.SendMessageRequest, **_: Any) -> pb.SendMessageResponse:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return answer(request)

    async with aio_producer_with(send) as producer:
        await producer.send_many("t", [b"x"] * (4 * 1024 + 1), message_group="g")
    assert most == 1


def before_shared_sends(kinds: list[str]) -> aio.Producer:
    """An asyncio producer whose Session answers every request, SendShared with KindUnknown (a proxy older than it);
    each request's kind goes to `kinds`."""

    class BeforeSharedSends(aio.Producer):
        async def _over_session(self, kind: str, request: Any, within_s: float) -> Any:
            kinds.append(kind)
            if kind == "send_shared":
                raise _waiting.KindUnknown("session: a request without a body")
            return answer(request)

    producer = BeforeSharedSends("127.0.0.1:1")
    producer._channel = FakeChannel()  # type: ignore[assignment]
    return producer


async def test_the_asyncio_producer_sends_as_send_message_once_its_proxy_does_not_know_shared_sends() -> None:
    """A proxy older than SendShared (KindUnknown): the send goes again as the SendMessage of the same messages
    (their ids too), and so does every later one."""
    kinds: list[str] = []
    producer = before_shared_sends(kinds)
    async with producer:
        first = await producer.send_many("t", [b"a", b"b"])
        later = await producer.send("t", b"c")
    assert kinds == ["send_shared", "send", "send"]
    assert len({r.message_id for r in [*first, later]}) == 3


@pytest.mark.parametrize("one", ["hello", b"abc", bytearray(b"abc"), memoryview(b"abc"), Message(b"abc")])
def test_one_body_or_message_is_not_taken_for_many(one: Any) -> None:
    stub = SendStub()
    with producer_with(stub) as producer, pytest.raises(TypeError, match=r"use send\(\) for one"):
        producer.send_many("t", one)  # "hello" was 5 one-letter messages, b"abc" a TypeError about int
    assert stub.events == []

    async def send(request: pb.SendMessageRequest, **_: Any) -> pb.SendMessageResponse:
        return answer(request)

    async def main() -> None:
        async with aio_producer_with(send) as producer:
            await producer.send_many("t", one)

    with pytest.raises(TypeError, match="an iterable of bodies or Messages"):
        asyncio.run(main())


@pytest.mark.parametrize("option", [{"delay": 5.0}, {"deliver_at": 2e9}])
def test_a_fifo_message_cannot_also_be_scheduled(option: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="message_group"):
        _wire.outgoing(b"x", message_group="g", **option)
    with Producer("127.0.0.1:1") as producer, pytest.raises(ValueError, match="message_group"):
        producer.send("t", b"x", message_group="g", **option)


async def test_the_asyncio_producer_sends_nothing_after_a_groups_failed_batch() -> None:
    calls: list[int] = []

    async def send(request: pb.SendMessageRequest, **_: Any) -> pb.SendMessageResponse:
        calls.append(len(calls))
        await asyncio.sleep(0.01)
        if len(calls) == 1:
            return pb.SendMessageResponse(status=v2.Status(code=v2.BAD_REQUEST, message="refused"))
        return answer(request)

    async with aio_producer_with(send) as producer:
        with pytest.raises(errors.BadRequest):
            await producer.send_many("t", [b"x"] * (4 * 1024), message_group="g")
        await asyncio.sleep(0.1)  # nothing goes on in the background either
    assert calls == [0]


def partly(request: pb.SendMessageRequest | _wire.SharedSend) -> pb.SendMessageResponse:
    """A popgate proxy's answer when the brokers stored the even messages and one timed out on the others."""
    timeout = v2.Status(code=v2.PROXY_TIMEOUT, message="broker b2 did not answer in time")
    ids = [e.message_id for e in answer(request).entries]
    entries = [
        pb.SendResultEntry(status=v2.Status(code=v2.OK), message_id=message_id, offset=i)
        if i % 2 == 0
        else pb.SendResultEntry(status=timeout, message_id=message_id)
        for i, message_id in enumerate(ids)
    ]
    summary = f"{(len(entries) + 1) // 2} of {len(entries)} stored (see entries): {timeout.message}"
    return pb.SendMessageResponse(status=v2.Status(code=v2.PROXY_TIMEOUT, message=summary), entries=entries)


def test_a_partly_stored_request_says_which_messages_are_stored_and_is_not_sent_again_whole() -> None:
    """Sent again whole (a timeout is retriable), the stored half would be stored twice; told nothing, the
    caller resent every message (a review's probe: 30 told failed, 18 of them stored)."""
    calls = 0

    class Partly(SendStub):
        def __call__(self, request: pb.SendMessageRequest, **_: Any) -> pb.SendMessageResponse:
            nonlocal calls
            calls += 1
            return partly(request)

    with producer_with(Partly()) as producer, pytest.raises(errors.Timeout) as failed:
        producer.send_many("t", [b"x"] * 6)
    assert calls == 1 and not failed.value.retriable
    assert failed.value.receipts is not None
    assert [r is not None for r in failed.value.receipts] == [True, False] * 3
    assert [r.offset for r in failed.value.receipts if r is not None] == [0, 2, 4]

    async def send(request: pb.SendMessageRequest, **_: Any) -> pb.SendMessageResponse:
        nonlocal calls
        calls += 1
        return partly(request)

    async def main() -> list[bool]:
        async with aio_producer_with(send) as producer:
            with pytest.raises(errors.Timeout) as failed:
                await producer.send_many("t", [b"x"] * 4)
            assert failed.value.receipts is not None
            return [r is not None for r in failed.value.receipts]

    calls = 0
    assert asyncio.run(main()) == [True, False, True, False]
    assert calls == 1


def refused_or_stored(refused: set[int]) -> Any:
    """A SendMessage answer per call: BAD_REQUEST for the calls numbered in `refused`, else every message stored."""
    count = 0

    def respond(request: pb.SendMessageRequest | _wire.SharedSend) -> pb.SendMessageResponse:
        nonlocal count
        count += 1
        if count - 1 in refused:
            return pb.SendMessageResponse(status=v2.Status(code=v2.BAD_REQUEST, message="a bad tag"))
        return answer(request)

    return respond


def stored_per_call(receipts: list[Any] | None) -> list[int]:
    assert receipts is not None
    return [sum(r is not None for r in receipts[i : i + 1024]) for i in range(0, len(receipts), 1024)]


def test_a_refused_call_leaves_the_calls_on_their_way_stored_and_reported() -> None:
    """Cancelled, the calls on their way were reported not stored though the proxy stored them: resending the
    None entries duplicated them."""
    respond = refused_or_stored({0, 3})

    class Stub(SendStub):
        def future(self, request: pb.SendMessageRequest, **_: Any) -> Any:
            self.events.append("sent")
            call: Future[Any] = Future()  # still on its way: answered when read

            def result(timeout: float | None = None) -> Any:
                return respond(request)

            call.result = result  # type: ignore[method-assign]
            return call

    stub = Stub()
    with producer_with(stub, retry=NO_RETRY) as producer, pytest.raises(errors.BadRequest) as failed:
        producer.send_many("t", [b"x"] * (6 * 1024))
    assert stub.events == ["sent"] * 4  # the two calls not yet made are not made
    assert stored_per_call(failed.value.receipts) == [0, 1024, 1024, 0, 0, 0]


async def test_the_asyncio_producer_reports_what_its_calls_on_their_way_stored_after_one_is_refused() -> None:
    sent: list[int] = []

    async def send(request: pb.SendMessageRequest, **_: Any) -> pb.SendMessageResponse:
        call = len(sent)
        sent.append(call)
        if call in (1, 3):  # bad input: refused at once, while the others are on their way
            return pb.SendMessageResponse(status=v2.Status(code=v2.BAD_REQUEST, message="a bad tag"))
        await asyncio.sleep(0.05)
        return answer(request)

    async with aio_producer_with(send) as producer:
        with pytest.raises(errors.BadRequest) as failed:
            await producer.send_many("t", [b"x"] * (6 * 1024))
        await asyncio.sleep(0.1)  # nothing more goes on in the background
    assert len(sent) == 4  # the two calls not yet made are not made
    assert stored_per_call(failed.value.receipts) == [1024, 0, 1024, 0, 0, 0]


async def test_the_asyncio_producer_does_not_retry_its_calls_on_their_way_after_one_is_refused() -> None:
    sent: list[int] = []

    async def send(request: pb.SendMessageRequest, **_: Any) -> pb.SendMessageResponse:
        sent.append(len(sent))
        if len(sent) == 1:
            return pb.SendMessageResponse(status=v2.Status(code=v2.BAD_REQUEST, message="a bad tag"))
        await asyncio.sleep(0.05)
        return pb.SendMessageResponse(status=v2.Status(code=v2.INTERNAL_SERVER_ERROR, message="retriable"))

    async with aio_producer_with(send) as producer:
        with pytest.raises(errors.BadRequest) as failed:
            await producer.send_many("t", [b"x"] * (4 * 1024))
    assert len(sent) == 4 and stored_per_call(failed.value.receipts) == [0, 0, 0, 0]


def test_ctrl_c_while_waiting_cancels_the_calls_left() -> None:
    """One call refused, then Ctrl-C while send_many waits for a call on its way: the calls left are cancelled, as a
    Ctrl-C cancels them, not left to store messages nobody gets receipts for."""
    respond = refused_or_stored({0})
    futures: list[Future[Any]] = []

    class Stub(SendStub):
        def future(self, request: Any, **_: Any) -> Any:
            call: Future[Any] = Future()
            n = len(futures)
            futures.append(call)

            def result(timeout: float | None = None) -> Any:
                if n == 1:
                    raise KeyboardInterrupt  # the user's Ctrl-C while send_many waits for this call
                return respond(request)

            call.result = result  # type: ignore[method-assign]
            return call

    with producer_with(Stub(), retry=NO_RETRY) as producer, pytest.raises(KeyboardInterrupt):
        producer.send_many("t", [b"x"] * (6 * 1024))
    assert all(f.cancelled() for f in futures[2:])


def test_send_many_whose_calls_went_out_before_another_threads_close_reports_them() -> None:
    """send_many's two SendMessage calls are both on their way when another thread closes the producer: their
    answers are read and returned, not reported "nothing was sent" (a resend of those would store them twice)."""
    stub = SendStub()
    producer = producer_with(stub)
    future = stub.future

    def then_close(request: Any, **kwargs: Any) -> Any:
        call = future(request, **kwargs)
        if stub.events[-1] == "sent 1":  # both calls sent: another thread closes the producer
            closer = threading.Thread(target=producer.close)
            closer.start()
            closer.join(10)
        return call

    stub.future = then_close  # type: ignore[method-assign]
    assert len(producer.send_many("t", [b"x"] * MANY)) == MANY


def test_a_closed_producers_send_many_in_a_forked_child_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer closed, then the process forked: send_many in the child raises Unavailable, opening no channel and
    sending nothing."""
    stub = SendStub()
    producer = producer_with(stub)
    connected = closed_then_forked(producer, monkeypatch)
    with pytest.raises(Unavailable):
        producer.send_many("t", [b"x"] * MANY)
    assert connected == [] and not any(e.startswith("sent") for e in stub.events)
