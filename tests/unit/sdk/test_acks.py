"""ack / nack / forward_to_dlq retries, against a fake stub that keeps live receipt handles (no sockets)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc
import pytest
from popgate_pb.v2 import definition_pb2 as v2

from popgate import RetryPolicy, SimpleConsumer, aio, errors
from tests.unit.sdk.fakes import AsyncStub, FakeChannel, FakeRpcError, FakeStub

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.002)
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED
T = TypeVar("T")


@pytest.fixture
def fake() -> FakeStub:
    return FakeStub()


@pytest.fixture
def consumer(fake: FakeStub) -> Iterator[SimpleConsumer]:
    with SimpleConsumer("127.0.0.1:1", "g", "t", retry=FAST) as c:
        c._stub = c._ext = fake
        yield c


def run_aio(fake: FakeStub, body: Callable[[aio.SimpleConsumer], Awaitable[T]]) -> T:
    async def main() -> T:
        consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=FAST)
        consumer._channel = FakeChannel()  # type: ignore[assignment]
        consumer._stub_ = AsyncStub(fake)
        consumer._ext_stub_ = AsyncStub(fake)
        async with consumer:
            return await body(consumer)

    return asyncio.run(main())


def acked_entries(fake: FakeStub) -> list[list[str]]:
    return [[e.message_id for e in request.entries] for request in fake.sent("AckMessage")]


# -- entries that fail retriably are re-sent ----------------------------------------------------


def test_ack_many_resends_only_the_entries_that_failed_retriably(fake: FakeStub, consumer: SimpleConsumer) -> None:
    a, b, c = fake.message("a"), fake.message("b"), fake.message("c")
    fake.entry_faults[b.receipt_handle] = [v2.HA_NOT_AVAILABLE]  # b's broker is failing over
    fake.live.discard(c.receipt_handle)  # c was redelivered meanwhile: its handle is stale

    with pytest.raises(errors.AckError) as info:
        consumer.ack_many([a, b, c])

    assert [(message_id, type(e)) for message_id, e in info.value.failures] == [("c", errors.InvalidReceiptHandle)]
    assert fake.acked == ["a", "b"]
    assert acked_entries(fake) == [["a", "b", "c"], ["b"]]


def test_entries_are_still_reported_when_their_re_send_keeps_failing_as_a_whole(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    a, b, c = fake.message("a"), fake.message("b"), fake.message("c")
    fake.entry_faults[b.receipt_handle] = [v2.HA_NOT_AVAILABLE]  # b's broker is failing over
    fake.live.discard(c.receipt_handle)  # c is stale
    # The first call answers per entry; every re-send of b then fails as a whole (proxy unreachable).
    fake.call_faults = [("ok", None)] + [("refused", grpc.StatusCode.UNAVAILABLE)] * 10  # type: ignore[list-item]

    with pytest.raises(errors.AckError) as info:
        consumer.ack_many([a, b, c])

    assert sorted(message_id for message_id, _ in info.value.failures) == ["b", "c"]  # a was acked
    assert fake.acked == ["a"]


def test_an_entry_failing_on_every_attempt_is_reported_after_the_policys_attempts(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    m = fake.message("a")
    fake.entry_faults[m.receipt_handle] = [v2.TOO_MANY_REQUESTS] * 10

    with pytest.raises(errors.TooManyRequests):
        consumer.ack(m)

    assert len(fake.sent("AckMessage")) == FAST.max_attempts
    assert fake.acked == []


def test_asyncio_ack_rides_out_a_broker_failover(fake: FakeStub) -> None:
    a, b = fake.message("a"), fake.message("b")
    fake.entry_faults[a.receipt_handle] = [v2.HA_NOT_AVAILABLE, v2.PROXY_TIMEOUT]

    async def ack(consumer: aio.SimpleConsumer) -> None:
        await consumer.ack(a)
        await consumer.ack_many([b])

    run_aio(fake, ack)
    assert fake.acked == ["a", "b"]
    assert acked_entries(fake) == [["a"], ["a"], ["a"], ["b"]]


# -- a re-send after a lost answer ----------------------------------------------------------------


def test_an_ack_whose_answer_was_lost_is_not_reported_stale_on_the_retry(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    m = fake.message("a")
    fake.call_faults = [("lost", DEADLINE)]  # the broker acked, the answer never came

    consumer.ack(m)  # the retry is answered INVALID_RECEIPT_HANDLE: done by the first attempt

    assert fake.acked == ["a"] and len(fake.sent("AckMessage")) == 2
    with pytest.raises(errors.InvalidReceiptHandle):  # on a first attempt a stale handle is still an error
        consumer.ack(m)
    assert len(fake.sent("AckMessage")) == 3


def test_a_nack_whose_answer_was_lost_raises_outcome_unknown(fake: FakeStub, consumer: SimpleConsumer) -> None:
    m = fake.message("a")
    old = m.receipt_handle
    fake.call_faults = [("lost", DEADLINE)]  # the broker applied it; the new handle is lost with the answer

    with pytest.raises(errors.Timeout) as info:
        consumer.nack(m, 5.0)

    assert not isinstance(info.value, errors.InvalidReceiptHandle)
    assert info.value.retriable is False and "outcome unknown" in str(info.value)
    assert m.receipt_handle == old and fake.renewals == 1  # applied once, by the first attempt
    assert len(fake.sent("ChangeInvisibleDuration")) == 2


def test_a_nack_refused_before_reaching_the_broker_is_retried_and_returns_the_new_handle(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    m = fake.message("a")
    fake.call_faults = [("refused", grpc.StatusCode.UNAVAILABLE)]
    assert consumer.nack(m, 5.0).receipt_handle in fake.live
    stale = fake.message("b")
    fake.live.discard(stale.receipt_handle)
    with pytest.raises(errors.InvalidReceiptHandle):  # only a re-send reads a stale handle as "outcome unknown"
        consumer.nack(stale, 5.0)


def test_a_dlq_forward_whose_answer_was_lost_counts_as_forwarded(fake: FakeStub, consumer: SimpleConsumer) -> None:
    m = fake.message("a")
    fake.call_faults = [("lost", grpc.StatusCode.UNAVAILABLE)]  # connection dropped after the broker forwarded

    consumer.forward_to_dlq(m)

    assert fake.dead_lettered == ["a"] and len(fake.sent("ForwardMessageToDeadLetterQueue")) == 2


def test_asyncio_lost_answers_read_as_the_sync_client_reads_them(fake: FakeStub) -> None:
    a, n = fake.message("a"), fake.message("n")

    async def calls(consumer: aio.SimpleConsumer) -> errors.PopgateError:
        fake.call_faults = [("lost", DEADLINE)]
        await consumer.ack(a)
        fake.call_faults = [("lost", DEADLINE)]
        with pytest.raises(errors.Timeout) as info:
            await consumer.nack(n, 5.0)
        return info.value

    error = run_aio(fake, calls)
    assert fake.acked == ["a"]
    assert error.retriable is False and not isinstance(error, errors.InvalidReceiptHandle)


# -- acks not waited for (wait=False): retried and logged in the background ---------------------------------


def test_a_blocking_ack_not_waited_for_is_retried_while_the_consumer_closes(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    m = fake.message("a")
    fake.entry_faults[m.receipt_handle] = [v2.HA_NOT_AVAILABLE]  # its broker fails over: retried
    consumer.ack(m, wait=False)
    consumer.close()
    assert fake.acked == ["a"] and len(fake.sent("AckMessage")) == 2


def test_an_asyncio_ack_not_waited_for_is_retried_while_the_consumer_closes(fake: FakeStub) -> None:
    m = fake.message("a")
    fake.call_faults = [("refused", grpc.StatusCode.UNAVAILABLE)]  # the proxy restarts: retried

    async def ack_and_close(consumer: aio.SimpleConsumer) -> None:
        await consumer.ack(m, wait=False)
        await consumer.close()

    run_aio(fake, ack_and_close)
    assert fake.acked == ["a"] and len(fake.sent("AckMessage")) == 2


def test_a_failed_ack_not_waited_for_is_logged(
    fake: FakeStub, consumer: SimpleConsumer, caplog: pytest.LogCaptureFixture
) -> None:
    m = fake.message("a")
    fake.live.discard(m.receipt_handle)  # stale: refused, not retried
    with caplog.at_level(logging.WARNING, logger="popgate.client"):
        consumer.ack(m, wait=False)
        consumer.close()
    assert "1 of 1 message(s) acked without waiting were not acked" in caplog.text
    assert "first: a: INVALID_RECEIPT_HANDLE" in caplog.text


def test_a_nack_many_whose_answer_was_lost_reports_outcome_unknown_not_stale(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    a, b = fake.message("a"), fake.message("b")
    fake.call_faults = [("lost", DEADLINE)]  # both changed, the new handles lost with the answer

    with pytest.raises(errors.NackError) as info:
        consumer.nack_many([a, b], 5.0)  # the retry is answered INVALID_RECEIPT_HANDLE for both

    assert info.value.outcome_unknown == ["a", "b"] and info.value.retriable is False
    assert fake.renewals == 2 and len(fake.sent("ChangeInvisibleMany")) == 2


def test_a_nack_many_timing_out_on_every_attempt_is_outcome_unknown_and_not_retriable(fake: FakeStub) -> None:
    a = fake.message("a")
    fake.call_faults = [("lost", DEADLINE)] * 10  # each attempt may have changed it; none is answered

    async def nack(consumer: aio.SimpleConsumer) -> errors.NackError:
        with pytest.raises(errors.NackError) as info:
            await consumer.nack_many([a])
        return info.value

    error = run_aio(fake, nack)
    [(_, failure)] = error.failures
    assert isinstance(failure, errors.Timeout) and not failure.retriable and not error.retriable
    assert error.outcome_unknown == ["a"] and len(fake.sent("ChangeInvisibleMany")) == FAST.max_attempts


# -- an ack whose outcome is unknown is not reported "not acked" ----------------------------------------------


def test_an_ack_applied_then_refused_on_every_retry_is_reported_outcome_unknown(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    a, b = fake.message("a"), fake.message("b")
    # The broker acks both, the answer is lost; every retry is then refused before it is sent (broker marked down).
    fake.call_faults = [("lost", DEADLINE)] + [("refused", grpc.StatusCode.UNAVAILABLE)] * 10  # type: ignore[list-item]

    with pytest.raises(errors.AckError) as info:
        consumer.ack_many([a, b])

    assert fake.acked == ["a", "b"]  # they will never come again
    assert info.value.outcome_unknown == ["a", "b"]
    assert all(isinstance(e, errors.Timeout) and not e.retriable for _, e in info.value.failures)
    assert "not known to be acked" in str(info.value) and "outcome unknown" in str(info.value.failures[0][1])
    assert info.value.retriable is False


def test_an_entry_answered_unavailable_then_refused_is_outcome_unknown_beside_one_not_acked(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    a, b, c = fake.message("a"), fake.message("b"), fake.message("c")
    fake.live.discard(c.receipt_handle)  # stale at the first attempt: certainly not acked by this call
    fake.entry_faults[b.receipt_handle] = [v2.HA_NOT_AVAILABLE] * 10  # the proxy lost b's answer, then refuses b

    with pytest.raises(errors.AckError) as info:
        consumer.ack_many([a, b, c])

    assert info.value.outcome_unknown == ["b"]
    assert sorted((m, type(e)) for m, e in info.value.failures) == [
        ("b", errors.Timeout),
        ("c", errors.InvalidReceiptHandle),
    ]
    assert "2 message(s) not acked or not known to be (1 outcome unknown)" in str(info.value)


def test_an_ack_that_never_left_is_still_reported_not_acked(fake: FakeStub, consumer: SimpleConsumer) -> None:
    m = fake.message("a")
    fake.call_faults = [("unconnected", grpc.StatusCode.UNAVAILABLE)] * 10  # type: ignore[list-item]

    with pytest.raises(errors.Unavailable) as info:
        consumer.ack(m)

    assert not isinstance(info.value, errors.Timeout) and fake.acked == []


def test_a_single_ack_of_unknown_outcome_raises_timeout_as_a_nack_does(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    m = fake.message("a")
    fake.call_faults = [("lost", grpc.StatusCode.UNAVAILABLE)] + [("refused", DEADLINE)] * 10  # type: ignore[list-item]

    with pytest.raises(errors.Timeout) as info:
        consumer.ack(m)

    assert info.value.retriable is False and "ack outcome unknown" in str(info.value)


def test_asyncio_ack_many_reports_an_unknown_outcome_as_the_sync_client_does(fake: FakeStub) -> None:
    a = fake.message("a")
    fake.call_faults = [("lost", DEADLINE)] + [("refused", grpc.StatusCode.UNAVAILABLE)] * 10  # type: ignore[list-item]

    async def ack(consumer: aio.SimpleConsumer) -> errors.AckError:
        with pytest.raises(errors.AckError) as info:
            await consumer.ack_many([a])
        return info.value

    error = run_aio(fake, ack)
    assert fake.acked == ["a"] and error.outcome_unknown == ["a"]


def test_an_ack_not_waited_for_of_unknown_outcome_is_logged_so(
    fake: FakeStub, consumer: SimpleConsumer, caplog: pytest.LogCaptureFixture
) -> None:
    m = fake.message("a")
    fake.call_faults = [("lost", DEADLINE)] + [("refused", grpc.StatusCode.UNAVAILABLE)] * 10  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING, logger="popgate.client"):
        consumer.ack(m, wait=False)
        consumer.close()
    assert "1 of them not known to be acked" in caplog.text


def test_an_ack_after_close_is_unavailable_and_not_outcome_unknown(fake: FakeStub) -> None:
    """A shutdown thread closed the consumer just before a worker acked: nothing was sent, so the messages surely
    come again — Unavailable, not the Timeout "outcome unknown" of an ack that may have been applied."""
    a, b = fake.message("a"), fake.message("b")
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=FAST)
    consumer._stub = consumer._ext = fake
    consumer.close()
    consumer._stub = consumer._ext = ClosedStub()
    with pytest.raises(errors.Unavailable) as one:
        consumer.ack(a)
    with pytest.raises(errors.AckError) as many:
        consumer.ack_many([a, b])
    with pytest.raises(errors.NackError) as nacks:
        consumer.nack_many([a, b], 1.0)
    assert not isinstance(one.value, errors.Timeout) and "nothing was sent" in one.value.message
    assert many.value.outcome_unknown == [] and nacks.value.outcome_unknown == []


def test_an_asyncio_ack_after_close_is_unavailable_and_not_outcome_unknown(fake: FakeStub) -> None:
    a = fake.message("a")

    async def after_close(consumer: aio.SimpleConsumer) -> tuple[BaseException, errors.AckError]:
        await consumer.close()
        with pytest.raises(errors.Unavailable) as one:
            await consumer.ack(a)
        with pytest.raises(errors.AckError) as many:
            await consumer.ack_many([a])
        return one.value, many.value

    one, many = run_aio(fake, after_close)
    assert not isinstance(one, errors.Timeout) and many.outcome_unknown == []


class ClosedStub:
    """A stub of a closed channel: each call fails as grpc fails it, with ValueError, before anything is sent."""

    def __getattr__(self, method: str) -> Any:
        def call(*_: Any, **__: Any) -> Any:
            raise ValueError("Cannot invoke RPC on closed channel!")

        return call


class ClosedAfter:
    """`fake`'s ChangeInvisibleDuration (also as futures, the fallback of nack_many) for `calls` calls, then the
    channel is closed (close() from another thread): each later call fails with ValueError, as grpc fails it."""

    def __init__(self, fake: FakeStub, consumer: SimpleConsumer, calls: int) -> None:
        self.fake, self.consumer, self.calls = fake, consumer, calls
        self.ChangeInvisibleDuration = self

    def _left(self) -> None:
        if self.calls == 0:
            self.consumer._closed = True
            raise ValueError("Cannot invoke RPC on closed channel!")
        self.calls -= 1

    def __call__(self, request: Any, **_: Any) -> Any:
        self._left()
        return self.fake.ChangeInvisibleDuration(request)

    def future(self, request: Any, **_: Any) -> Future[Any]:
        self._left()
        done: Future[Any] = Future()
        done.set_result(self.fake.ChangeInvisibleDuration(request))
        return done

    def Heartbeat(self, request: Any, **_: Any) -> Any:
        return self.fake.Heartbeat(request)


def test_a_nack_applied_then_refused_by_the_closed_channel_is_not_said_to_have_sent_nothing(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    """The first attempt changed the handle and its answer was lost; the consumer was closed before the retry, which
    the closed channel refused: the call may have been applied, and its error does not say that nothing was sent."""
    m = fake.message("a")
    fake.call_faults = [("lost", DEADLINE)]
    consumer._stub = ClosedAfter(fake, consumer, 1)
    with pytest.raises(errors.Unavailable) as raised:
        consumer.nack(m, 5.0)
    assert fake.renewals == 1 and "nothing was sent" not in raised.value.message
    assert "may have been applied" in raised.value.message


def test_a_nack_many_by_calls_cut_by_close_keeps_what_the_calls_sent_did(
    fake: FakeStub, consumer: SimpleConsumer
) -> None:
    """A proxy without ChangeInvisibleMany: a call per message, 64 at a time; the consumer is closed after the 64th:
    those 64 have their new handles, and only the 36 never sent are reported, as not sent (not outcome unknown)."""
    messages = [fake.message(f"m{i}") for i in range(100)]
    consumer._stub = ClosedAfter(fake, consumer, 64)
    consumer._many_served = False
    with pytest.raises(errors.NackError) as raised:
        consumer.nack_many(messages, 1.0)
    assert fake.renewals == 64 and all(m.receipt_handle.endswith(f"@{i + 1}") for i, m in enumerate(messages[:64]))
    assert [message_id for message_id, _ in raised.value.failures] == [f"m{i}" for i in range(64, 100)]
    assert raised.value.outcome_unknown == []


SLOW = RetryPolicy(max_attempts=100, initial_backoff=30.0, max_backoff=30.0)


class Down:
    """A proxy that answers every receive UNAVAILABLE (`failed` set at the first)."""

    def __init__(self, fake: FakeStub, failed: threading.Event) -> None:
        self.fake = fake
        self.failed = failed

    def ReceiveMessage(self, request: Any, **_: Any) -> Any:
        self.failed.set()
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)

    def Heartbeat(self, request: Any, **_: Any) -> Any:
        return self.fake.Heartbeat(request)


def test_close_ends_a_retrys_back_off_at_once(fake: FakeStub) -> None:
    """An iteration backing off (30 s) after its proxy went away: close() from another thread ends it at once, not
    after the back-off."""
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=SLOW)
    failed = threading.Event()
    consumer._stub = Down(fake, failed)
    consumer._batch_receive = False
    iteration = threading.Thread(target=lambda: list(consumer))
    iteration.start()
    assert failed.wait(10)
    consumer.close()
    iteration.join(10)
    assert not iteration.is_alive()


class DownCall:
    """An asyncio receive call whose answer fails UNAVAILABLE at once (`failed` set)."""

    def __init__(self, failed: asyncio.Event) -> None:
        self.failed = failed

    def __aiter__(self) -> DownCall:
        return self

    async def __anext__(self) -> Any:
        self.failed.set()
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)

    def cancel(self) -> None:
        return None


def test_close_ends_an_asyncio_retrys_back_off_at_once(fake: FakeStub) -> None:
    async def main() -> None:
        consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=SLOW)
        consumer._channel = FakeChannel()  # type: ignore[assignment]
        failed = asyncio.Event()
        stub = AsyncStub(fake)
        stub.ReceiveMessage = lambda request, **_: DownCall(failed)  # type: ignore[attr-defined]
        consumer._stub_ = stub
        consumer._batch_receive = False
        iteration = asyncio.ensure_future(anext(aiter(consumer), None))
        await asyncio.wait_for(failed.wait(), 10)
        await consumer.close()
        assert await asyncio.wait_for(iteration, 10) is None

    asyncio.run(main())


def test_a_second_close_returns_once_the_first_has_closed_the_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads close one consumer: the second close() returns only once the first has closed the channel (a
    caller may then take every call as ended); a close() on the closing thread itself (a signal handler's) returns
    at once rather than wait for itself."""
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    events: list[str] = []
    closing, go_on = threading.Event(), threading.Event()
    real_closing, real_close = consumer._closing, consumer._channel_.close
    monkeypatch.setattr(consumer._channel_, "close", lambda: events.append("channel closed") or real_close())

    def slow_closing() -> None:
        consumer.close()  # as a signal handler of the closing thread would: must not wait for itself
        events.append("nested close returned")
        closing.set()
        go_on.wait(10)
        real_closing()

    consumer._closing = slow_closing  # type: ignore[method-assign]
    first = threading.Thread(target=consumer.close)
    first.start()
    assert closing.wait(10)
    second = threading.Thread(target=lambda: consumer.close() or events.append("second returned"))
    second.start()
    second.join(0.3)
    go_on.set()
    first.join(10)
    second.join(10)
    assert events == ["nested close returned", "channel closed", "second returned"]


def test_a_close_in_a_signal_handler_never_waits_for_good_for_another_threads_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another thread's close() is under way and needs a lock this thread holds for a moment (a read's bookkeeping),
    when a signal handler here calls close(): that close() returns within its bound rather than wait for a close that
    waits for it; then the first one ends."""
    from popgate import _sync_client

    monkeypatch.setattr(_sync_client, "SECOND_CLOSE_WAIT_S", 0.5)
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    stopping, go_on = threading.Event(), threading.Event()
    real_stop = consumer._unwaited.stop
    consumer._unwaited.stop = lambda: (stopping.set(), go_on.wait(10), real_stop()) and None  # type: ignore[method-assign]
    first = threading.Thread(target=consumer.close)
    first.start()
    assert stopping.wait(10)
    with consumer._reads._calls.changed:  # held as `Reads.add` holds it when the handler interrupts it
        go_on.set()  # the first close() goes on, to wait for the reads: for this lock
        consumer.close()  # the handler's
    first.join(10)
    assert not first.is_alive() and consumer._closed_fully.is_set()


@pytest.mark.parametrize("lock", ["unyielded", "unwaited acks"])
def test_a_close_in_a_signal_handler_of_a_thread_holding_a_lock_of_the_client_returns(lock: str) -> None:
    """A signal handler's close() runs on a thread that holds one of the consumer's locks for a moment (an iteration
    taking its batch into its hold, an ack being queued): it closes the consumer rather than wait for good for a
    lock its own thread holds."""
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    held = consumer._unyielded._lock if lock == "unyielded" else consumer._unwaited._lock

    def handler_on_the_holding_thread() -> None:
        with held:
            consumer.close()

    thread = threading.Thread(target=handler_on_the_holding_thread, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and consumer._closed_fully.is_set()
