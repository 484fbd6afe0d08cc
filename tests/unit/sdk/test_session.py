"""The SDK's Session bookkeeping and framing (sdk/_session.py), without a stream: ids, answers, orphans, encoding."""

from __future__ import annotations

import asyncio
import functools
import queue
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import (
    MessageBodyTooLarge,
    ServerError,
    Timeout,
    Unauthorized,
    Unavailable,
    _frames,
    _joining,
    _resend,
    _session,
    _waiting,
)
from popgate._transport import convert
from tests.unit.sdk.fakes import Callers, SessionCall, SessionChannel


def test_a_hand_encoded_request_reads_as_the_generated_message() -> None:
    ack = pb.AckMessageRequest(group=v2.Resource(name="g"), entries=[pb.AckMessageEntry(message_id="m")])
    for request_id, timeout_ms in ((1, 0), (300, 3000), (2**40, 2**31)):
        decoded = ext.SessionRequest.FromString(_frames.encode(request_id, "ack", ack.SerializeToString(), timeout_ms))
        assert decoded == ext.SessionRequest(id=request_id, timeout_ms=timeout_ms, ack=ack)
    cancel = ext.SessionRequest.FromString(_frames.encode_cancel(129))
    assert cancel == ext.SessionRequest(id=129, cancel=True)
    empty = ext.SessionRequest.FromString(_frames.encode(5, "receive", b""))
    assert empty.WhichOneof("body") == "receive"  # an empty body is still a request of its kind
    receive = pb.ReceiveMessageRequest(batch_size=64)
    bounded = ext.SessionRequest.FromString(_frames.encode(6, "receive", receive.SerializeToString(), 5, max_fifo=32))
    assert bounded == ext.SessionRequest(id=6, timeout_ms=5, receive=receive, max_fifo=32)


def test_requests_joined_in_one_message_read_as_each_in_order() -> None:
    ack = pb.AckMessageRequest(group=v2.Resource(name="g"))
    encoded = [_frames.encode(7, "ack", ack.SerializeToString(), 100), _frames.encode_cancel(3)]
    encoded.append(_frames.encode(8, "receive", b""))
    joined = ext.SessionRequest.FromString(_frames.join(encoded[0], encoded[1:]))
    assert [(r.id, r.WhichOneof("body")) for r in (joined, *joined.more)] == [(7, "ack"), (3, "cancel"), (8, "receive")]
    assert joined.ack == ack and not joined.more[0].more


def messages_frame(*ids: str) -> ext.SessionResponse:
    messages = [v2.Message(system_properties=v2.SystemProperties(message_id=i)) for i in ids]
    return ext.SessionResponse(receive=ext.ReceiveMessagesResponse(messages=ext.Messages(messages=messages)))


def with_id(response: ext.SessionResponse, request_id: int) -> ext.SessionResponse:
    response.id = request_id
    return response


async def test_answers_reach_their_requests_by_id_and_a_receive_ends_at_its_status() -> None:
    loop = asyncio.get_running_loop()
    waiting = _waiting.Waiting()
    receive, ack = loop.create_future(), loop.create_future()
    receive_id, ack_id = waiting.add("receive", receive), waiting.add("ack", ack)
    waiting.answer(with_id(messages_frame("a", "b"), receive_id))
    waiting.answer(ext.SessionResponse(id=ack_id, ack=pb.AckMessageResponse(status=v2.Status(code=v2.OK))))
    assert ack.done() and not receive.done()
    waiting.answer(ext.SessionResponse(id=receive_id, receive=ext.ReceiveMessagesResponse(status=v2.Status(code=0))))
    frames = receive.result()
    assert [f.WhichOneof("content") for f in frames] == ["messages", "status"]
    assert ack.result().status.code == v2.OK and len(waiting) == 0


async def test_a_bare_status_answers_as_the_requests_own_kind() -> None:
    loop = asyncio.get_running_loop()
    waiting = _waiting.Waiting()
    send, receive = loop.create_future(), loop.create_future()
    send_id, receive_id = waiting.add("send", send), waiting.add("receive", receive)
    for request_id in (send_id, receive_id):
        waiting.answer(ext.SessionResponse(id=request_id, status=v2.Status(code=v2.TOO_MANY_REQUESTS)))
    assert isinstance(send.result(), pb.SendMessageResponse)
    assert send.result().status.code == v2.TOO_MANY_REQUESTS
    [frame] = receive.result()
    assert frame.status.code == v2.TOO_MANY_REQUESTS


async def test_an_answer_of_another_kind_fails_its_request_alone() -> None:
    loop = asyncio.get_running_loop()
    waiting = _waiting.Waiting()
    receive, ack = loop.create_future(), loop.create_future()
    receive_id, ack_id = waiting.add("receive", receive), waiting.add("ack", ack)
    waiting.answer(ext.SessionResponse(id=receive_id, send=pb.SendMessageResponse()))
    waiting.answer(ext.SessionResponse(id=ack_id))  # no body at all
    assert isinstance(receive.exception(), ServerError) and isinstance(ack.exception(), ServerError)
    assert len(waiting) == 0


async def test_messages_nobody_waits_for_are_handed_to_be_given_back() -> None:
    orphans: list[str] = []
    waiting = _waiting.Waiting(lambda messages: orphans.extend(m.system_properties.message_id for m in messages))
    loop = asyncio.get_running_loop()
    dropped, lost = loop.create_future(), loop.create_future()
    dropped_id, lost_id = waiting.add("receive", dropped), waiting.add("receive", lost)
    waiting.answer(with_id(messages_frame("a"), dropped_id))
    waiting.answer(with_id(messages_frame("b"), lost_id))
    assert waiting.drop(dropped_id)  # cancelled: what it read so far
    waiting.answer(with_id(messages_frame("c"), dropped_id))  # frames already on their way
    waiting.fail_all(Unavailable("lost"))  # the stream lost before its status
    assert orphans == ["a", "c", "b"]
    assert not dropped.done() and isinstance(lost.exception(), Unavailable)
    assert not waiting.drop(dropped_id)


async def test_an_answer_completed_after_its_caller_was_cancelled_is_given_back() -> None:
    orphans: list[str] = []
    waiting = _waiting.Waiting(lambda messages: orphans.extend(m.system_properties.message_id for m in messages))
    future = asyncio.get_running_loop().create_future()
    request_id = waiting.add("receive", future)
    waiting.answer(with_id(messages_frame("a"), request_id))
    future.cancel()  # the caller's task was cancelled; the stream's reader runs before its handler drops it
    waiting.answer(ext.SessionResponse(id=request_id, receive=ext.ReceiveMessagesResponse(status=v2.Status(code=0))))
    assert (orphans, waiting.drop(request_id)) == (["a"], False)


class StreamEnd(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details or f"ended {code.name}")


@pytest.mark.parametrize(
    ("code", "expected", "retriable"),
    [
        (None, _session.Ended, True),  # the proxy ended it: not served, asked again
        (grpc.StatusCode.UNAVAILABLE, Unavailable, True),
        (grpc.StatusCode.CANCELLED, Unavailable, True),  # a proxy shutting down
        (grpc.StatusCode.INTERNAL, Unavailable, True),
        (grpc.StatusCode.UNAUTHENTICATED, Unauthorized, False),
        (grpc.StatusCode.UNIMPLEMENTED, _session.Unimplemented, False),
    ],
)
def test_how_a_stream_ended_is_what_its_requests_fail_with(code: Any, expected: type, retriable: bool) -> None:
    error = _session.stream_error(None if code is None else StreamEnd(code), lambda e: convert(e, tls=False))
    assert isinstance(error, expected)
    assert getattr(error, "retriable", None) is retriable
    if expected is Unauthorized:  # as the unary call's v2 answer would say
        assert getattr(error, "code", None) == v2.UNAUTHORIZED


class FailingCall(SessionCall):
    """A Session call that fails with `end` once asked for its first answer, after headers `headers` (grpc.aio gives
    a call that failed before the proxy's headers empty ones)."""

    def __init__(self, headers: tuple[tuple[str, str], ...], end: grpc.aio.AioRpcError) -> None:
        super().__init__()
        self.headers, self.end = headers, end

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata(*self.headers)

    async def read(self) -> Any:
        raise self.end


REFUSED_AWAY = "Stream removed (GOAWAY received; Error code: 0; Debug Text: )"
CUT_AWAY = "Stream removed (Socket closed (GOAWAY received; Error code: 0; Debug Text: ))"
POPGATE_HEADERS = (("popgate-receive-batch", "128"), ("popgate-max-message-bytes", "4194304"))


@pytest.mark.parametrize(
    ("headers", "details", "refused"),
    [
        ((), REFUSED_AWAY, True),  # opened on the connection as its GOAWAY came: refused, nothing reached the proxy
        (POPGATE_HEADERS, REFUSED_AWAY, False),  # the proxy had the stream: maybe applied
        ((), CUT_AWAY, False),  # a stream the server had, cut as the connection closed
        ((), "ended UNAVAILABLE", False),
    ],
)
async def test_a_stream_refused_by_goaway_before_it_opened_served_nothing(
    headers: tuple[tuple[str, str], ...], details: str, refused: bool
) -> None:
    """A request on a stream refused as its connection went away fails `Ended`, "nothing was sent" (a receive asks
    again, not counted; a send is sent again freely); any other loss stays a lost stream (maybe applied)."""
    channel = SessionChannel(FailingCall(headers, StreamEnd(grpc.StatusCode.UNAVAILABLE, details)))
    session = _session.Session(channel, (), lambda e: convert(e, tls=False))  # type: ignore[arg-type]
    [error] = await asyncio.gather(session.request("send", pb.SendMessageRequest(), 5.0), return_exceptions=True)
    await session.close()
    assert isinstance(error, Unavailable) and isinstance(error, _session.Ended) is refused
    assert _resend.maybe_applied(error) is not refused


def test_requests_queued_together_are_joined_up_to_the_write_limit() -> None:
    outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    big = b"x" * (_frames.MAX_WRITE_BYTES // 2)
    for item in (b"small", big, None):
        outbox.put(item)
    first, carried = _frames.with_queued(big, outbox, _waiting.Waiting())
    assert (first, carried) == (_frames.join(big, [b"small"]), big)  # the second big one did not fit
    second, carried = _frames.with_queued(carried, outbox, _waiting.Waiting())
    assert (second, carried, outbox.get()) == (big, None, None)  # the end marker queued again


def test_a_request_over_the_grpc_limit_is_too_large_and_never_sent() -> None:
    huge = pb.SendMessageRequest(messages=[v2.Message(body=b"x" * (64 * 1024 * 1024))])
    with pytest.raises(MessageBodyTooLarge) as caught:
        _frames.encoded(1, "send", huge, 3.0)
    assert not caught.value.retriable


async def test_a_receive_cancelled_after_its_answer_gives_the_messages_back() -> None:
    # The answer completes the request's future, then the caller's task is cancelled before it resumes: nobody
    # gets those messages, so they are handed to be given back rather than left invisible.
    orphans: list[str] = []
    channel = SessionChannel()
    session = _session.Session(
        channel,  # type: ignore[arg-type]
        (),
        convert,  # type: ignore[arg-type]
        lambda messages: orphans.extend(m.system_properties.message_id for m in messages),
    )
    caller = asyncio.ensure_future(session.request("receive", pb.ReceiveMessageRequest(), 5.0))
    await asyncio.sleep(0)  # the request is queued and its id taken (the first: 1)
    channel.call.answers.put_nowait(with_id(messages_frame("a", "b"), 1))
    status = ext.SessionResponse(id=1, receive=ext.ReceiveMessagesResponse(status=v2.Status(code=v2.OK)))
    channel.call.answers.put_nowait(status)
    await asyncio.sleep(0)  # the reader takes both answers: the caller's future is resolved, the caller not resumed
    assert not session._waiting and not caller.done()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await session.close()
    assert orphans == ["a", "b"]


async def test_a_receive_cancelled_after_it_failed_stays_cancelled() -> None:
    # The stream is lost (the receive's future holds a retriable Unavailable), then the caller's task is cancelled
    # before it resumes: the caller sees its cancellation, which a retry must not swallow, and nothing is orphaned.
    orphans: list[object] = []
    channel = SessionChannel()
    session = _session.Session(channel, (), convert, orphans.extend)  # type: ignore[arg-type]
    caller = asyncio.ensure_future(session.request("receive", pb.ReceiveMessageRequest(), 5.0))
    await asyncio.sleep(0)
    session._end(Unavailable("stream lost", retriable=True))
    assert not caller.done()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await session.close()
    assert orphans == []


async def test_requests_failed_by_a_lost_stream_each_get_their_own_error() -> None:
    """Every request pending when the stream is lost fails, and with an error of its own: `send_many` sets the
    receipts of its messages on the error it raises, so two sends failing together must not share one (the later
    would overwrite the earlier's receipts, misaligned with its messages). So must requests made after the loss."""
    session = _session.Session(SessionChannel(), (), convert)  # type: ignore[arg-type]
    first = asyncio.ensure_future(session.request("send", pb.SendMessageRequest(), 5.0))
    second = asyncio.ensure_future(session.request("send", pb.SendMessageRequest(), 5.0))
    await asyncio.sleep(0)
    session._end(Unavailable("stream lost", retriable=True))
    errors_raised = [await asyncio.gather(call, return_exceptions=True) for call in (first, second)]
    later = await asyncio.gather(session.request("send", pb.SendMessageRequest(), 5.0), return_exceptions=True)
    raised = [e for [e] in [*errors_raised, later]]
    assert all(isinstance(e, Unavailable) and e.retriable for e in raised)
    assert len({id(e) for e in raised}) == 3
    await session.close()


class StalledCall(SessionCall):
    """A Session call whose writes complete only as it is cancelled (a proxy that stopped reading: its socket
    alive)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = asyncio.Event()

    async def write(self, message: bytes) -> None:
        self.written.append(message)
        await self.cancelled.wait()
        raise asyncio.InvalidStateError("the call was cancelled")

    def cancel(self) -> None:
        self.cancelled.set()
        super().cancel()


async def test_a_stalled_stream_queues_at_most_its_bound_and_drops_what_timed_out() -> None:
    """Sends of 1 MiB each while the stream's write is stalled: past MAX_OUTBOX_BYTES queued they wait for room and
    time out (retriable, nothing sent) without being queued; those queued time out and are then no longer held, so
    later sends queue again."""
    channel = SessionChannel()
    channel.call = StalledCall()
    session = _session.Session(channel, (), convert)  # type: ignore[arg-type]
    body = pb.SendMessageRequest(messages=[v2.Message(body=b"x" * (1 << 20))])
    sends = [asyncio.ensure_future(session.request("send", body, 0.2)) for _ in range(40)]  # 32 MiB the bound
    await asyncio.sleep(0.1)
    assert session._outbox.size <= _session.MAX_OUTBOX_BYTES  # the rest wait outside it
    results = await asyncio.gather(*sends, return_exceptions=True)
    assert all(isinstance(e, Timeout) and e.retriable for e in results)
    assert session._outbox.size < 1024  # the timed-out ones taken out (left: cancels of the two the writer took)
    later = await asyncio.gather(session.request("send", body, 0.05), return_exceptions=True)
    assert isinstance(later[0], Timeout)  # queued again, not refused
    assert len(channel.call.written) == 1  # nothing queued behind the stalled write was written
    await session.close()


async def test_a_request_that_timed_out_unwritten_says_nothing_was_sent() -> None:
    """Behind a stalled write: the request written first times out as one that may have been applied, the one the
    writer took to write next and those still queued or waiting for room as never sent — an ack among them is not
    reported "outcome unknown"."""
    channel = SessionChannel()
    channel.call = StalledCall()
    session = _session.Session(channel, (), convert)  # type: ignore[arg-type]
    body = pb.SendMessageRequest(messages=[v2.Message(body=b"x" * (1 << 20))])
    results = await asyncio.gather(*(session.request("send", body, 0.2) for _ in range(40)), return_exceptions=True)
    await session.close()
    written, unwritten = results[:1], results[1:]
    assert all(isinstance(e, Timeout) and _resend.maybe_applied(e) for e in written)
    assert all(isinstance(e, Timeout) and not _resend.maybe_applied(e) for e in unwritten)
    assert all("nothing was sent" in e.message for e in unwritten)  # type: ignore[union-attr]


class HeldWrites(SessionCall):
    """A Session call whose writes wait until the test lets them go (`go`): a proxy slow to read, then reading."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.wrote = asyncio.Event()  # set at each write

    async def write(self, message: bytes) -> None:
        await self.go.wait()
        await super().write(message)
        self.wrote.set()

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait (at most 5 s a write) until `done()` holds."""
        while not done():
            self.wrote.clear()
            await asyncio.wait_for(self.wrote.wait(), 5)


def written_ids(call: SessionCall) -> list[int]:
    requests = [ext.SessionRequest.FromString(message) for message in call.written]
    return [one.id for request in requests for one in (request, *request.more) if not one.cancel]


async def test_a_request_carried_to_the_next_write_that_times_out_is_never_sent() -> None:
    """Two large sends: the first is being written (held up), the second taken to go first in the next message.
    The second times out meanwhile: it says nothing was sent, and once the write goes on it is never written (the
    proxy would apply a request whose caller was told it was not sent)."""
    channel = SessionChannel()
    channel.call = HeldWrites()
    session = _session.Session(channel, (), convert)  # type: ignore[arg-type]
    body = pb.SendMessageRequest(messages=[v2.Message(body=b"x" * (40 * 1024))])
    first = asyncio.ensure_future(session.request("send", body, 10.0))
    second = asyncio.ensure_future(session.request("send", body, 0.1))
    [error] = await asyncio.gather(second, return_exceptions=True)
    assert isinstance(error, Timeout) and not _resend.maybe_applied(error) and "nothing was sent" in error.message
    third = asyncio.ensure_future(session.request("send", pb.SendMessageRequest(), 10.0))
    channel.call.go.set()
    await channel.call.until(lambda: len(written_ids(channel.call)) >= 2)
    assert written_ids(channel.call) == [1, 3]  # the first and the third, never the second
    first.cancel()
    third.cancel()
    await session.close()


LARGE = pb.SendMessageRequest(messages=[v2.Message(body=b"x" * (1 << 20))])


async def outbox_full() -> tuple[SessionChannel, _session.Session, list[asyncio.Future[Any]]]:
    """A Session whose writes are held up (`HeldWrites`), and sends of 1 MiB filling its outbox past its bound."""
    channel = SessionChannel()
    channel.call = HeldWrites()
    session = _session.Session(channel, (), convert)  # type: ignore[arg-type]
    held = [asyncio.ensure_future(session.request("send", LARGE, 10.0)) for _ in range(34)]
    await asyncio.sleep(0)
    return channel, session, held


async def test_a_request_that_waited_for_room_gives_the_proxy_only_the_time_left() -> None:
    """A send that waited 0.3 s of its 2 s for room in a full outbox carries the ~1.7 s left as its timeout, so the
    proxy does not hold it past the moment its caller stops waiting."""
    channel, session, held = await outbox_full()
    late = asyncio.ensure_future(session.request("send", pb.SendMessageRequest(), 2.0))
    await asyncio.sleep(0.3)
    channel.call.go.set()
    await channel.call.until(lambda: 35 in written_ids(channel.call))
    [timeout_ms] = [
        one.timeout_ms
        for request in map(ext.SessionRequest.FromString, channel.call.written)
        for one in (request, *request.more)
        if one.id == 35
    ]
    assert 0 < timeout_ms <= 1750
    for call in (*held, late):
        call.cancel()
    await session.close()


async def test_a_request_past_a_limit_lowered_while_it_waited_for_room_fails_and_is_not_kept() -> None:
    """A large send waits for room in a full outbox while the proxy's headers lower its message limit below it: it
    fails MessageBodyTooLarge, nothing sent, and the stream keeps nothing of it (no answer awaited for ever)."""
    channel, session, held = await outbox_full()
    late = asyncio.ensure_future(session.request("send", LARGE, 10.0))
    await asyncio.sleep(0.05)
    session.max_bytes = 512 * 1024  # as the proxy's headers set it
    for call in held:
        call.cancel()  # room frees: the late one goes on
    [error] = await asyncio.gather(late, return_exceptions=True)
    assert isinstance(error, MessageBodyTooLarge)
    assert len(session._waiting) == 0
    channel.call.go.set()
    await session.close()


class SlowCall(SessionCall):
    """A Session call whose every write takes a moment (a proxy reading large requests)."""

    async def write(self, message: bytes) -> None:
        await asyncio.sleep(0.005)
        await super().write(message)


async def test_requests_past_the_outbox_bound_wait_for_room_and_go() -> None:
    """40 sends of 1 MiB at once from one client (tasks each sending a large batch): more than MAX_OUTBOX_BYTES
    would wait to be written, so the later ones wait for room in the client, and every one is sent and answered
    in its time, none refused."""
    channel = SessionChannel()
    channel.call = SlowCall()
    session = _session.Session(channel, (), convert)  # type: ignore[arg-type]
    body = pb.SendMessageRequest(messages=[v2.Message(body=b"x" * (1 << 20))])
    sends = [asyncio.ensure_future(session.request("send", body, 10.0)) for _ in range(40)]
    peak = 0
    while len(channel.call.written) < 40:
        peak = max(peak, session._outbox.size)
        await asyncio.sleep(0.001)
    for message in channel.call.written:
        request = ext.SessionRequest.FromString(message)
        for one in (request, *request.more):
            channel.call.answers.put_nowait(
                ext.SessionResponse(id=one.id, send=pb.SendMessageResponse(status=v2.Status(code=v2.OK)))
            )
    results = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 10)
    assert not [r for r in results if isinstance(r, Exception)]
    assert peak <= _session.MAX_OUTBOX_BYTES
    await session.close()


class Cancellable(SessionCall):
    def __init__(self) -> None:
        super().__init__()
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        super().cancel()


@pytest.mark.parametrize("frame", [None, object()], ids=["undecodable", "unreadable"])
async def test_an_undecodable_frame_ends_the_stream_with_a_typed_error_and_no_task_error(frame: object) -> None:
    """grpc.aio reads a frame that does not decode as None (and logs why); any other frame the reader fails on ends
    the stream alike: its call cancelled, its pending requests failed with a retriable Unavailable (sent again on a
    new stream), its reader task ended without an error."""
    channel = SessionChannel()
    channel.call = Cancellable()
    session = _session.Session(channel, (), convert)  # type: ignore[arg-type]
    pending = asyncio.ensure_future(session.request("send", pb.SendMessageRequest(), 5.0))
    await asyncio.sleep(0)
    channel.call.answers.put_nowait(frame)
    [error] = await asyncio.wait_for(asyncio.gather(pending, return_exceptions=True), 2)
    assert isinstance(error, Unavailable) and error.retriable
    await asyncio.wait_for(asyncio.wait(session._tasks), 2)
    assert [task.exception() for task in session._tasks] == [None, None]
    assert channel.call.cancelled and session.broken is not None
    await session.close()


def ids_of(orphans: list[str]) -> Any:
    return lambda messages: orphans.extend(m.system_properties.message_id for m in messages)


async def test_an_answer_past_its_batch_is_cut_given_back_and_cancelled() -> None:
    """A receive of 4 answered 3 messages, then 3 more: the caller gets a ServerError naming the counts, the six
    read are given back, the request is cancelled at the proxy, and what still comes of it is not given back."""
    orphans: list[str] = []
    cancels: list[int] = []
    waiting = _waiting.Waiting(ids_of(orphans), cancels.append)
    future = asyncio.get_running_loop().create_future()
    request_id = waiting.add("receive", future, most=4)
    waiting.answer(with_id(messages_frame("a", "b", "c"), request_id))
    assert not future.done()
    waiting.answer(with_id(messages_frame("d", "e", "f"), request_id))
    assert isinstance(future.exception(), ServerError) and not future.exception().retriable
    assert "6 messages" in str(future.exception()) and "receive of 4" in str(future.exception())
    assert (orphans, cancels, len(waiting)) == (list("abcdef"), [request_id], 0)
    waiting.answer(with_id(messages_frame("g"), request_id))  # on its way before the cancel: past the bound
    assert orphans == list("abcdef")


async def test_a_joined_answer_past_its_joined_batch_is_cut_for_every_part() -> None:
    orphans: list[str] = []
    cancels: list[int] = []
    waiting = _waiting.Waiting(ids_of(orphans), cancels.append)
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(2)]
    parts = [
        _joining.part(waiting.add("receive", f, most=2), "receive", pb.ReceiveMessageRequest(batch_size=2), b"", 0, 64)
        for f in futures
    ]
    joined_id = waiting.join(parts)
    waiting.answer(with_id(messages_frame("a", "b", "c"), joined_id))
    waiting.answer(with_id(messages_frame("d", "e"), joined_id))  # 5 to a joined receive of 4
    assert all(isinstance(f.exception(), ServerError) for f in futures)
    assert (orphans, cancels, len(waiting)) == (list("abcde"), [joined_id], 0)


async def test_frames_of_an_id_never_issued_are_dropped_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Messages under an id this stream never issued (another client's, misrouted) are not this client's to give
    back: dropped, and logged at WARNING once, then at 10, 100, ... of them. Those of a dropped request are given
    back, up to its batch."""
    orphans: list[str] = []
    waiting = _waiting.Waiting(ids_of(orphans))
    for _ in range(100):
        waiting.answer(with_id(messages_frame("x"), 99))
    assert orphans == []
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 3
    future = asyncio.get_running_loop().create_future()
    request_id = waiting.add("receive", future, most=2)
    waiting.answer(with_id(messages_frame("a"), request_id))
    waiting.drop(request_id)
    waiting.answer(with_id(messages_frame("b"), request_id))  # on its way before the cancel
    waiting.answer(with_id(messages_frame("c"), request_id))  # past its batch
    assert orphans == ["a", "b"]


async def test_a_bare_bad_request_to_a_newer_kind_is_kind_unknown() -> None:
    """A proxy older than a request kind answers it as a request without a body (a bare BAD_REQUEST): the caller
    learns the kind is not served (and makes the v2 call), not that its request was refused (`send_shared`'s:
    tests/unit/sdk/test_joining.py)."""
    callers = Callers()
    request_id = callers.request("end_transaction", pb.EndTransactionRequest(transaction_id="tid"))
    callers.written()
    status = v2.Status(code=v2.BAD_REQUEST, message="session: a request without a body")
    callers.waiting.answer(ext.SessionResponse(id=request_id, status=status))
    with pytest.raises(_waiting.KindUnknown):
        callers.futures[request_id].result()


class Reading(SessionCall):
    """A proxy reading steadily: each stream message takes a moment to write, and is answered at once."""

    async def write(self, message: bytes) -> None:
        await asyncio.sleep(0.005)
        request = ext.SessionRequest.FromString(message)
        for one in (request, *request.more):
            answer = pb.SendMessageResponse(status=v2.Status(code=v2.OK))
            self.answers.put_nowait(ext.SessionResponse(id=one.id, send=answer))


async def test_a_large_request_waiting_for_room_is_not_passed_by_small_ones() -> None:
    """48 tasks keep the outbox near its bound with 1 MiB sends; a 12 MiB one sent among them waits its turn and
    goes, rather than timing out while later small ones pass it."""
    session = _session.Session(SessionChannel(Reading()), (), convert)  # type: ignore[arg-type]
    small = pb.SendMessageRequest(messages=[v2.Message(body=b"s" * (1 << 20))])
    large = pb.SendMessageRequest(messages=[v2.Message(body=b"L" * (12 << 20))])
    stop = False

    async def feeder() -> None:
        while not stop:
            await session.request("send", small, 10.0)

    feeders = [asyncio.ensure_future(feeder()) for _ in range(48)]
    await asyncio.sleep(0.3)
    try:
        answer = await session.request("send", large, 10.0)  # starved, it would wait all of it
    finally:
        stop = True
        await asyncio.wait_for(asyncio.gather(*feeders, return_exceptions=True), 20)
        await session.close()
    assert answer.status.code == v2.OK


class Limited(SessionCall):
    """A proxy whose headers (said a moment after the stream opens) put its message limit at LIMIT bytes, which ends
    the stream on a larger message, as a proxy does, and answers each send stored."""

    LIMIT = 100_000

    async def initial_metadata(self) -> grpc.aio.Metadata:
        await asyncio.sleep(0.05)
        return grpc.aio.Metadata(("popgate-max-message-bytes", str(self.LIMIT)))

    async def write(self, message: bytes) -> None:
        await super().write(message)
        if len(message) > self.LIMIT:
            self.answers.put_nowait(StreamEnd(grpc.StatusCode.RESOURCE_EXHAUSTED))
            return
        if self.answers.qsize() and isinstance(self.answers._queue[-1], StreamEnd):  # type: ignore[attr-defined]
            return  # the stream has ended
        first = ext.SessionRequest.FromString(message)
        for request in [first, *first.more]:
            ok = pb.SendMessageResponse(status=v2.Status(code=v2.OK))
            self.answers.put_nowait(ext.SessionResponse(id=request.id, send=ok))

    async def read(self) -> Any:
        answer = await super().read()
        if isinstance(answer, StreamEnd):
            raise answer
        return answer


async def test_a_request_past_the_proxys_message_limit_fails_alone_and_the_stream_goes_on() -> None:
    """Its first request before the proxy's headers came, and one after: each larger than the proxy reads fails
    alone, not retriable and never written; the requests beside them are answered on the same stream."""
    call = Limited()
    session = _session.Session(SessionChannel(call), (), functools.partial(convert, tls=False))  # type: ignore[arg-type]
    big = pb.SendMessageRequest(messages=[v2.Message(body=b"x" * (2 * Limited.LIMIT))])
    small = pb.SendMessageRequest(messages=[v2.Message(body=b"y")])
    try:
        for _ in range(2):
            outcome = await asyncio.gather(
                session.request("send", big, 3.0), session.request("send", small, 3.0), return_exceptions=True
            )
            assert isinstance(outcome[0], MessageBodyTooLarge) and not outcome[0].retriable
            assert "the proxy's message limit (100000)" in str(outcome[0])
            assert outcome[1].status.code == v2.OK
        assert session.broken is None and max(len(m) for m in call.written) <= Limited.LIMIT
    finally:
        await session.close()


class Small(Limited):
    LIMIT = 20_000


async def test_requests_are_joined_only_up_to_what_the_proxy_reads() -> None:
    """A proxy reading messages of 20,000 bytes at most: 40 sends of 1,000 bytes at once go in messages it reads,
    all stored, the stream serving on."""
    call = Small()
    session = _session.Session(SessionChannel(call), (), functools.partial(convert, tls=False))  # type: ignore[arg-type]
    body = pb.SendMessageRequest(messages=[v2.Message(body=b"z" * 1000)])
    try:
        await session.request("send", body, 3.0)  # the proxy's headers are in
        answers = await asyncio.gather(*(session.request("send", body, 3.0) for _ in range(40)))
        assert all(a.status.code == v2.OK for a in answers) and session.broken is None
        assert max(len(m) for m in call.written) <= Small.LIMIT and len(call.written) > 2
    finally:
        await session.close()


class FailingWrite(SessionCall):
    async def write(self, message: bytes) -> None:
        raise RuntimeError("a writer's bug")


async def test_a_writer_that_fails_ends_the_stream_as_a_lost_one(caplog: pytest.LogCaptureFixture) -> None:
    """Its request fails at once with a retriable Unavailable (the retry goes on a new stream), not after its whole
    time on a stream nobody writes to, and later requests fail so too."""
    channel = SessionChannel(FailingWrite())
    session = _session.Session(channel, (), convert)  # type: ignore[arg-type]
    ack = pb.AckMessageRequest()
    with pytest.raises(Unavailable) as caught:
        await asyncio.wait_for(session.request("ack", ack, 30.0), 5)
    assert caught.value.retriable and session.broken is not None
    with pytest.raises(Unavailable):
        await session.request("ack", ack, 30.0)
    await session.close()
    assert "writing to the proxy failed" in caplog.text
