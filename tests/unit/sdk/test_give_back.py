"""Giving back received messages nobody will handle (a nack with delay 0): which ones, and that it never raises
out of an iteration's end nor leaves a task pending when asyncio.run ends. Fake stubs, no sockets."""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import Future
from typing import Any

import grpc
import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Message, RetryPolicy, ServerError, SimpleConsumer, Unavailable, aio
from popgate._unyielded import Unyielded
from tests.unit.sdk.fakes import FakeChannel, FakeRpcError, FakeStub

IDS = ["m0", "m1", "m2", "m3"]


def answer(fake: FakeStub, ids: list[str]) -> list[pb.ReceiveMessageResponse]:
    """A ReceiveMessage answer with these messages (their handles live in `fake`), then its status."""
    frames = []
    for message_id in ids:
        handle = fake.message(message_id).receipt_handle
        props = v2.SystemProperties(message_id=message_id, receipt_handle=handle, delivery_attempt=1)
        frames.append(
            pb.ReceiveMessageResponse(message=v2.Message(topic=v2.Resource(name="t"), system_properties=props))
        )
    return [*frames, pb.ReceiveMessageResponse(status=v2.Status(code=v2.OK))]


def given_back(fake: FakeStub) -> list[str]:
    requests = fake.sent("ChangeInvisibleDuration")
    assert all(r.invisible_duration.seconds == r.invisible_duration.nanos == 0 for r in requests)  # ready at once
    return sorted(r.message_id for r in requests)


def test_each_held_message_is_taken_once() -> None:
    a, b, c = (Message(b"", message_id=i) for i in "abc")
    held = Unyielded()
    first, second = held.start([a, b, c]), held.start([c])
    assert held.next(first) is a
    assert held.take_all() == [b, c, c]  # the consumer closes: every iteration's rest
    assert held.next(first) is None and held.end(first) == [] and held.end(second) == []
    key = held.start([a, b])
    assert held.next(key) is a and held.end(key) == [b] and held.next(key) is None


def failing_after(frames: list[pb.ReceiveMessageResponse]) -> Iterator[pb.ReceiveMessageResponse]:
    """A ReceiveMessage stream that fails with UNAVAILABLE after `frames` (a proxy gone mid-answer)."""
    yield from frames
    raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)


class SyncStub:
    """ReceiveMessage answers `frames` once, then nothing; ChangeInvisibleDuration goes to `fake` as a future."""

    def __init__(self, fake: FakeStub, frames: Iterable[pb.ReceiveMessageResponse]) -> None:
        self.fake = fake
        self.answers = [frames]
        self.ChangeInvisibleDuration = self
        self.closed = False

    def ReceiveMessage(self, request: pb.ReceiveMessageRequest, **_: Any) -> Iterable[pb.ReceiveMessageResponse]:
        return self.answers.pop() if self.answers else [pb.ReceiveMessageResponse(status=v2.Status(code=v2.OK))]

    def future(self, request: pb.ChangeInvisibleDurationRequest, **_: Any) -> Future[Any]:
        if self.closed:
            raise ValueError("Cannot invoke RPC on closed channel!")
        done: Future[Any] = Future()
        try:
            done.set_result(self.fake.ChangeInvisibleDuration(request))
        except grpc.RpcError as exc:
            done.set_exception(exc)
        return done


def test_break_gives_back_the_rest_of_the_batch_and_a_failed_give_back_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeStub(call_faults=[("refused", grpc.StatusCode.UNAVAILABLE)])
    caplog.set_level(logging.DEBUG, logger="popgate.client")
    with SimpleConsumer("127.0.0.1:1", "g", "t") as consumer:
        consumer._stub = SyncStub(fake, answer(fake, IDS))
        consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
        yielded = [message.message_id for message in itertools.islice(consumer, 1)]  # then the generator closes
    assert yielded == ["m0"]
    assert given_back(fake) == ["m1", "m2", "m3"]
    assert "giving back 1 of 3 unhandled message(s) failed: UNAVAILABLE" in caplog.text


def test_a_receive_failed_mid_answer_gives_back_what_it_read() -> None:
    """The answer stream fails (a proxy gone, a deadline) after two message frames: the receive fails, and the two
    messages it read are ready again at once rather than invisible for `invisible`."""
    fake = FakeStub()
    with SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1)) as consumer:
        consumer._stub = SyncStub(fake, failing_after(answer(fake, IDS[:2])[:2]))
        consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
        with pytest.raises(Unavailable):
            consumer.receive()
        assert given_back(fake) == IDS[:2]


class HeldAnswer:
    """A receive's answer that brings `frames`, then waits for more until the call is cancelled (as grpc then fails
    it, CANCELLED)."""

    def __init__(self, frames: list[pb.ReceiveMessageResponse]) -> None:
        self.frames = frames
        self.read = threading.Event()  # the frames were read
        self.cancelled = threading.Event()

    def __iter__(self) -> Iterator[pb.ReceiveMessageResponse]:
        yield from self.frames
        self.read.set()
        self.cancelled.wait(10)
        raise FakeRpcError(grpc.StatusCode.CANCELLED)

    def cancel(self) -> None:
        self.cancelled.set()


class ClosingChannel:
    """The consumer's channel, as its stub sees it: calls on it fail with ValueError once it is closed."""

    def __init__(self, stub: SyncStub) -> None:
        self.stub = stub

    def close(self) -> None:
        self.stub.closed = True


def served_closing(consumer: SimpleConsumer, stub: SyncStub) -> SyncStub:
    """`stub` serves `consumer` (v2 ReceiveMessage only), over a channel whose calls fail once it is closed."""
    consumer._stub = stub
    consumer._batch_receive = False
    consumer._channel_.close()
    consumer._channel_ = ClosingChannel(stub)  # type: ignore[assignment]
    return stub


def test_close_during_a_receives_answer_gives_back_what_it_read() -> None:
    """close() from another thread while a receive's answer is coming, two messages read: they are given back
    before the channel closes, rather than left invisible for `invisible`."""
    fake = FakeStub()
    held = HeldAnswer(answer(fake, IDS[:2])[:2])
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    stub = SyncStub(fake, held)
    consumer._stub = stub
    consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
    consumer._channel_.close()
    consumer._channel_ = ClosingChannel(stub)  # type: ignore[assignment]
    outcome: list[BaseException] = []

    def receive() -> None:
        try:
            consumer.receive()
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=receive)
    reader.start()
    assert held.read.wait(10)
    consumer.close()
    reader.join(10)
    assert given_back(fake) == IDS[:2] and stub.closed
    assert [type(e) for e in outcome] == [Unavailable]


def test_close_just_after_an_iterations_receive_gives_back_its_batch() -> None:
    """close() from another thread as an iteration's receive has just read its batch, before the iteration yields
    any: the batch is given back before the channel closes, rather than left invisible for `invisible`."""
    fake = FakeStub()
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    stub = served_closing(consumer, SyncStub(fake, answer(fake, IDS[:2])))
    start, wait_for_reads = consumer._unyielded.start, consumer._reads.cancel_and_wait
    closer = threading.Thread(target=consumer.close)
    reads_waited = threading.Event()

    def noted(timeout: float) -> bool:
        reads_waited.set()
        return wait_for_reads(timeout)

    def closed_meanwhile(batch: Iterable[Message]) -> int:
        closer.start()
        assert reads_waited.wait(10)  # close() has come to the reads being read: this one among them
        return start(batch)

    consumer._reads.cancel_and_wait = noted  # type: ignore[method-assign]
    consumer._unyielded.start = closed_meanwhile  # type: ignore[method-assign]
    assert list(consumer) == []
    closer.join(10)
    assert given_back(fake) == IDS[:2] and stub.closed


def test_close_waits_for_the_give_back_an_iteration_took_its_batch_for() -> None:
    """close() from another thread as an iteration, its receive just answered, ends: when the iteration takes its
    batch to give back before close() takes what iterations hold, close() keeps the channel open until that
    give-back has gone, rather than closing it under the give-back's calls."""
    fake = FakeStub()
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    stub = served_closing(consumer, SyncStub(fake, answer(fake, IDS[:2])))
    start, end, take_all = consumer._unyielded.start, consumer._unyielded.end, consumer._unyielded.take_all
    wait_for_reads, give_back_call = consumer._reads.cancel_and_wait, stub.future
    closer = threading.Thread(target=consumer.close)
    reads_waited, ended = threading.Event(), threading.Event()

    def noted(timeout: float) -> bool:
        reads_waited.set()
        return wait_for_reads(timeout)

    def closed_meanwhile(batch: Iterable[Message]) -> int:
        closer.start()
        assert reads_waited.wait(10)  # the consumer is closed: the iteration yields nothing
        return start(batch)

    def end_noted(key: int) -> list[Message]:
        rest = end(key)
        ended.set()
        return rest

    def after_the_iterations_end() -> list[Message]:
        assert ended.wait(10)
        return take_all()

    def when_close_is_done(request: pb.ChangeInvisibleDurationRequest, **kwargs: Any) -> Future[Any]:
        if request.message_id == IDS[0]:  # a close() that would not wait for this give-back closes the channel now
            closer.join(0.5)
        return give_back_call(request, **kwargs)

    consumer._reads.cancel_and_wait = noted  # type: ignore[method-assign]
    consumer._unyielded.start = closed_meanwhile  # type: ignore[method-assign]
    consumer._unyielded.end = end_noted  # type: ignore[method-assign]
    consumer._unyielded.take_all = after_the_iterations_end  # type: ignore[method-assign]
    stub.future = when_close_is_done  # type: ignore[method-assign]
    assert list(consumer) == []
    closer.join(10)
    assert given_back(fake) == IDS[:2] and stub.closed


def test_close_in_a_signal_handler_of_the_reading_thread_does_not_wait_for_itself() -> None:
    """close() runs on the thread that is reading a receive's answer (a signal handler's): it cancels that answer
    and returns at once, not after waiting out its give-back time for a read only its own thread can end."""
    fake = FakeStub()
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    ended: list[bool] = []
    real = consumer._reads.cancel_and_wait
    consumer._reads.cancel_and_wait = lambda timeout: ended.append(real(timeout)) or True  # type: ignore[method-assign]

    def frames() -> Iterator[pb.ReceiveMessageResponse]:
        yield from answer(fake, IDS[:1])[:1]
        consumer.close()  # as a signal handler would, between two frames
        raise FakeRpcError(grpc.StatusCode.CANCELLED)

    consumer._stub = SyncStub(fake, frames())
    consumer._batch_receive = False
    with pytest.raises(Unavailable):
        consumer.receive()
    assert ended == [True]  # no read of another thread left: it did not wait for its own


def test_close_in_a_signal_handler_just_after_its_threads_read_gives_back_the_batch() -> None:
    """close() runs on the iterating thread (a signal handler's) as the receive's last frame was read, before the
    batch is held: the channel closes only once that read has ended, after the batch is given back."""
    fake = FakeStub()
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))

    def frames() -> Iterator[pb.ReceiveMessageResponse]:
        yield from answer(fake, IDS[:2])
        consumer.close()  # as a SIGTERM handler would, the whole answer read

    stub = served_closing(consumer, SyncStub(fake, frames()))
    assert list(consumer) == []
    assert given_back(fake) == IDS[:2] and stub.closed


def test_a_ctrl_c_as_a_read_begins_leaves_close_nothing_to_wait_for() -> None:
    """Ctrl-C comes just as a receive has registered its read: the receive ends with KeyboardInterrupt, and the
    close() that follows (a `with` block's end) closes the channel at once, not put off for a read that is over."""
    fake = FakeStub()
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    stub = served_closing(consumer, SyncStub(fake, answer(fake, IDS[:1])))
    register = consumer._reads.add

    def interrupted(call: Any) -> None:
        register(call)
        raise KeyboardInterrupt

    consumer._reads.add = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        consumer.receive()
    consumer.close()
    assert stub.closed and consumer._closed_fully.is_set()


def interrupted_after(frames: list[pb.ReceiveMessageResponse]) -> Iterator[pb.ReceiveMessageResponse]:
    """A ReceiveMessage stream during which Ctrl-C comes after `frames`."""
    yield from frames
    raise KeyboardInterrupt


def test_a_receive_interrupted_mid_answer_gives_back_what_it_read() -> None:
    """Ctrl-C between two frames of a receive's answer: the interrupt goes on, and the messages read so far are
    ready again at once rather than invisible for `invisible`."""
    fake = FakeStub()
    with SimpleConsumer("127.0.0.1:1", "g", "t") as consumer:
        consumer._stub = SyncStub(fake, interrupted_after(answer(fake, IDS[:2])[:2]))
        consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
        with pytest.raises(KeyboardInterrupt):
            consumer.receive()
        assert given_back(fake) == IDS[:2]


class AsyncStub:
    """ReceiveMessage streams `frames` (holding the stream open after them when `hold`, failing with `fail` when
    set); ChangeInvisibleDuration goes to `fake` after a pause, as over a network."""

    def __init__(
        self,
        fake: FakeStub,
        frames: list[pb.ReceiveMessageResponse],
        *,
        hold: bool = False,
        fail: grpc.StatusCode | None = None,
    ) -> None:
        self.fake = fake
        self.frames = frames
        self.hold = hold
        self.fail = fail
        self.streamed = asyncio.Event()

    def ReceiveMessage(self, request: pb.ReceiveMessageRequest, **_: Any) -> AsyncIterator[pb.ReceiveMessageResponse]:
        async def stream() -> AsyncIterator[pb.ReceiveMessageResponse]:
            for frame in self.frames:
                yield frame
            self.streamed.set()
            if self.fail is not None:
                raise FakeRpcError(self.fail)
            if self.hold:
                await asyncio.Event().wait()

        return stream()

    async def ChangeInvisibleDuration(self, request: pb.ChangeInvisibleDurationRequest, **_: Any) -> Any:
        await asyncio.sleep(0.05)
        return self.fake.ChangeInvisibleDuration(request)


def run_unclosed(stub: AsyncStub, body: Any) -> None:
    """asyncio.run of `body(consumer)` with a consumer it never closes, as a program that just ends."""

    async def main() -> None:
        consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
        consumer._channel = FakeChannel()  # type: ignore[assignment]
        consumer._stub_ = stub
        consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
        await body(consumer)

    asyncio.run(main())
    gc.collect()  # a task left pending would be destroyed now


def test_a_receive_that_asyncio_run_cancels_mid_answer_is_given_back_before_the_loop_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The receive has read one message frame of its answer when the program's main coroutine returns:
    asyncio.run cancels it, and its give-back (a task started then) still runs to its end."""
    fake = FakeStub()
    stub = AsyncStub(fake, answer(fake, IDS[:1])[:1], hold=True)

    async def body(consumer: aio.SimpleConsumer) -> None:
        asyncio.ensure_future(consumer.receive())
        await stub.streamed.wait()  # the receive has read the frame and waits for more

    run_unclosed(stub, body)
    assert given_back(fake) == ["m0"]
    assert "Task was destroyed but it is pending" not in caplog.text


def test_a_second_asyncio_run_gives_back_a_receive_cancelled_mid_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One consumer used in two asyncio.run calls (its first loop closed, as docs/SDK.md allows), each ending with a
    receive cancelled mid-answer: each run's give-back runs to its end before its loop closes."""
    fake = FakeStub()
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")

    async def main(stub: AsyncStub) -> None:
        consumer._channel = FakeChannel()  # type: ignore[assignment]
        consumer._stub_ = stub
        consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
        asyncio.ensure_future(consumer.receive())
        await stub.streamed.wait()  # the receive has read the frame and waits for more

    for run in range(2):
        asyncio.run(main(AsyncStub(fake, answer(fake, IDS[run : run + 1])[:1], hold=True)))
        gc.collect()  # a task left pending would be destroyed now
    assert given_back(fake) == IDS[:2]
    assert "Task was destroyed but it is pending" not in caplog.text


async def test_an_async_receive_failed_mid_answer_gives_back_what_it_read() -> None:
    """As for the blocking consumer: the messages read before the answer failed are given back, before close ends."""
    fake = FakeStub()
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._stub_ = AsyncStub(fake, answer(fake, IDS[:2])[:2], fail=grpc.StatusCode.UNAVAILABLE)
    consumer._batch_receive = False  # the stub serves v2 ReceiveMessage only
    with pytest.raises(Unavailable):
        await consumer.receive()
    await asyncio.wait_for(consumer.close(), 2)
    assert given_back(fake) == IDS[:2]


def test_an_async_iteration_left_open_is_given_back_when_asyncio_run_ends(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeStub()
    stub = AsyncStub(fake, answer(fake, IDS))
    iterations = []

    async def body(consumer: aio.SimpleConsumer) -> None:
        iterations.append(aiter(consumer))
        assert (await anext(iterations[0])).message_id == "m0"

    run_unclosed(stub, body)  # asyncio.run closes the iteration (loop.shutdown_asyncgens)
    assert given_back(fake) == ["m1", "m2", "m3"]
    assert "Task was destroyed but it is pending" not in caplog.text


class SessionChannel:
    """A channel to a proxy serving the Session stream: the test answers its requests (`answers`); `on_status` runs
    as the reader takes a receive's status, before the receive's caller resumes. Unary calls (`stub`) fail once the
    channel closed, as grpc cancels them."""

    def __init__(self, fake: FakeStub) -> None:
        self.fake = fake
        self.opened = 0
        self.closed = False
        self.answers: asyncio.Queue[Any] = asyncio.Queue()
        self.written: list[ext.SessionRequest] = []
        self.wrote = asyncio.Event()
        self.on_status: Any = None
        self.release = asyncio.Event()  # held until set: the answers to give-backs over the stream
        self.held: list[asyncio.Future[None]] = []

    def stream_stream(self, method: str, **_: Any) -> Any:
        self.opened += 1
        return lambda metadata: self

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()

    async def write(self, message: bytes) -> None:
        request = ext.SessionRequest.FromString(message)
        self.written.extend([request, *request.more])
        self.wrote.set()
        for one in (request, *request.more):
            if one.WhichOneof("body") == "change_invisible":
                self.held.append(asyncio.ensure_future(self._answer_give_back(one)))

    async def _answer_give_back(self, request: ext.SessionRequest) -> None:
        await self.release.wait()
        answer = self.fake.ChangeInvisibleDuration(request.change_invisible)
        self.answers.put_nowait(ext.SessionResponse(id=request.id, change_invisible=answer))

    async def read(self) -> Any:
        response = await self.answers.get()
        if response is not grpc.aio.EOF and response.receive.HasField("status") and self.on_status is not None:
            self.on_status()
        return response

    def cancel(self) -> None:
        self.answers.put_nowait(grpc.aio.EOF)

    async def close(self) -> None:
        self.closed = True

    async def ChangeInvisibleDuration(self, request: pb.ChangeInvisibleDurationRequest, **_: Any) -> Any:
        await asyncio.sleep(0.05)  # as over a network: the channel may close meanwhile
        if self.closed:
            raise FakeRpcError(grpc.StatusCode.CANCELLED)
        return self.fake.ChangeInvisibleDuration(request)


def session_answer(fake: FakeStub, request_id: int, ids: list[str]) -> list[ext.SessionResponse]:
    messages = [
        v2.Message(
            topic=v2.Resource(name="t"),
            system_properties=v2.SystemProperties(
                message_id=i, receipt_handle=fake.message(i).receipt_handle, delivery_attempt=1
            ),
        )
        for i in ids
    ]
    return [
        ext.SessionResponse(
            id=request_id, receive=ext.ReceiveMessagesResponse(messages=ext.Messages(messages=messages))
        ),
        ext.SessionResponse(id=request_id, receive=ext.ReceiveMessagesResponse(status=v2.Status(code=v2.OK))),
    ]


async def test_a_batch_answered_as_close_begins_is_given_back_on_one_stream() -> None:
    """close() (twice, at once) begins as an iteration's receive is answered, before the iteration resumes: the
    iteration yields nothing and its batch is given back before the channel closes, with no second stream."""
    fake = FakeStub()
    channel = SessionChannel(fake)
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = channel  # type: ignore[assignment]
    consumer._stub_ = channel
    closes: list[asyncio.Future[None]] = []
    channel.on_status = lambda: closes.extend(asyncio.ensure_future(consumer.close()) for _ in range(2))
    yielded: list[Message] = []

    async def iterate() -> None:
        async for message in consumer:
            yielded.append(message)

    iteration = asyncio.ensure_future(iterate())
    await asyncio.wait_for(channel.wrote.wait(), 2)
    for response in session_answer(fake, channel.written[0].id, IDS):
        channel.answers.put_nowait(response)
    await asyncio.wait_for(iteration, 2)
    await asyncio.wait_for(asyncio.gather(*closes), 2)
    assert yielded == [] and channel.opened == 1
    assert given_back(fake) == IDS


async def test_a_receive_answered_after_its_cancel_as_close_gives_back_is_given_back() -> None:
    """A receive is cancelled before its answer; close() begins, giving back what an iteration had not yielded over
    the stream; the cancelled receive's answer comes meanwhile: its messages are given back too, before the close
    ends."""
    fake = FakeStub()
    channel = SessionChannel(fake)
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = channel  # type: ignore[assignment]
    consumer._stub_ = channel
    iteration = aiter(consumer)
    first = asyncio.ensure_future(anext(iteration))
    await asyncio.wait_for(channel.wrote.wait(), 2)
    for response in session_answer(fake, channel.written[0].id, IDS):
        channel.answers.put_nowait(response)
    assert (await asyncio.wait_for(first, 2)).message_id == "m0"  # m1..m3 not yielded yet
    channel.wrote.clear()
    receive = asyncio.ensure_future(consumer.receive())
    await asyncio.wait_for(channel.wrote.wait(), 2)
    [receive_id] = [r.id for r in channel.written[1:] if r.WhichOneof("body") == "receive"]
    receive.cancel()
    with pytest.raises(asyncio.CancelledError):
        await receive
    closing = asyncio.ensure_future(consumer.close())
    while len(channel.held) < 3:  # the iteration's rest, given back over the stream: answers held
        await asyncio.wait_for(channel.wrote.wait(), 2)
        channel.wrote.clear()
    for response in session_answer(fake, receive_id, ["m4", "m5"]):  # the cancelled receive's answer
        channel.answers.put_nowait(response)
    channel.release.set()  # read after that answer
    await asyncio.wait_for(closing, 2)
    await iteration.aclose()
    assert given_back(fake) == [*IDS[1:], "m4", "m5"]


def session_consumer(fake: FakeStub) -> tuple[aio.SimpleConsumer, SessionChannel]:
    channel = SessionChannel(fake)
    channel.release.set()  # give-backs over the stream answered at once
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    consumer._channel = channel  # type: ignore[assignment]
    consumer._stub_ = channel
    return consumer, channel


async def test_a_session_answer_with_more_messages_than_asked_is_cut_and_given_back() -> None:
    """Over the Session stream: a receive of 4 answered 3 messages, then 3 more, then more without end: a ServerError,
    the request cancelled at the proxy, and the six read given back."""
    fake = FakeStub()
    consumer, channel = session_consumer(fake)
    receive = asyncio.ensure_future(consumer.receive(max=4))
    await asyncio.wait_for(channel.wrote.wait(), 2)
    request_id = channel.written[0].id
    for ids in (IDS[:3], ["m3", "m4", "m5"], ["m6"]):
        channel.answers.put_nowait(session_answer(fake, request_id, ids)[0])
    with pytest.raises(ServerError, match="6 messages"):
        await asyncio.wait_for(receive, 2)
    await asyncio.wait_for(consumer.close(), 2)
    assert ext.SessionRequest(id=request_id, cancel=True) in channel.written
    assert given_back(fake) == [*IDS, "m4", "m5"]


async def test_close_returns_while_the_stream_keeps_sending_frames_of_unknown_ids() -> None:
    """The Session also streams, without end, receive frames under an id this client never issued (another client's
    answer misrouted, a proxy ignoring cancels): a receive and close() still end in time, and none of those
    messages is given back (they were never this client's)."""
    fake = FakeStub()
    consumer, channel = session_consumer(fake)

    async def strays() -> None:
        for n in itertools.count():
            channel.answers.put_nowait(session_answer(fake, 10_000 + n % 7, [f"stray{n}"])[0])
            await asyncio.sleep(0.001)

    stray = asyncio.ensure_future(strays())
    try:
        receive = asyncio.ensure_future(consumer.receive(max=4))
        await asyncio.wait_for(channel.wrote.wait(), 2)
        for response in session_answer(fake, channel.written[0].id, IDS):
            channel.answers.put_nowait(response)
        assert [m.message_id for m in await asyncio.wait_for(receive, 2)] == IDS
        await asyncio.wait_for(consumer.close(), 2)
    finally:
        stray.cancel()
    assert given_back(fake) == []


async def test_close_waits_only_for_the_give_backs_under_way_when_it_began() -> None:
    """Messages to give back keep being handed in (a stream's answers nobody waits for) while close() waits for the
    give-backs: it waits for those under way when it began, not for each new one, and returns."""
    fake = FakeStub()
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._stub_ = AsyncStub(fake, [])  # each give-back takes 0.05 s

    async def handed_in() -> None:
        for n in itertools.count():
            handle = fake.message(f"o{n}").receipt_handle
            props = v2.SystemProperties(message_id=f"o{n}", receipt_handle=handle, delivery_attempt=1)
            consumer._orphaned([v2.Message(topic=v2.Resource(name="t"), system_properties=props)])
            await asyncio.sleep(0.005)

    orphans = asyncio.ensure_future(handed_in())
    try:
        await asyncio.sleep(0.02)
        await asyncio.wait_for(consumer.close(), 2)
    finally:
        orphans.cancel()
    assert given_back(fake)  # those handed in before close() began


class Gated(SessionChannel):
    """Each give-back over the stream is answered once its message's gate opens (`gates`)."""

    def __init__(self, fake: FakeStub) -> None:
        super().__init__(fake)
        self.gates: collections.defaultdict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)

    async def _answer_give_back(self, request: ext.SessionRequest) -> None:
        await self.gates[request.change_invisible.message_id].wait()
        answer = self.fake.ChangeInvisibleDuration(request.change_invisible)
        self.answers.put_nowait(ext.SessionResponse(id=request.id, change_invisible=answer))


async def test_a_give_back_the_closing_stream_left_unanswered_goes_as_a_call() -> None:
    """close() closes the Session stream (as it does once the give-backs under way when it began have ended) under a
    give-back that began after those, unanswered there: it goes as a call, which close() waits for before the
    channel closes."""
    fake = FakeStub()
    channel = Gated(fake)
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = channel  # type: ignore[assignment]
    consumer._stub_ = channel
    message = Message(b"", topic="t", message_id="m4", receipt_handle=fake.message("m4").receipt_handle)
    consumer._giving_back_task([message])
    await asyncio.wait_for(channel.wrote.wait(), 2)  # on the stream, unanswered (its gate stays shut)
    consumer._closed = True  # close() has begun: the stream goes first, then the channel
    session, consumer._session = consumer._session, None
    assert session is not None
    await session.close()
    await asyncio.wait_for(consumer._given_back(), 2)
    await consumer.close()
    assert given_back(fake) == ["m4"] and channel.closed
