"""The broker's Session stream against its caller's pace: a caller that asks faster than it reads stops being
read once the answers not yet taken pass a byte bound, and a Pop answered just before its cancel frame is read
is released instead of hiding its messages for the whole invisible time."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from popgate_pb import broker_pb2 as pb

from broker import server
from broker import session as session_stream
from broker.core import BrokerCore
from broker.longpoll import Kind
from broker.metrics import BrokerMetrics
from popgate_contract.session_client import MORE_KEY, BrokerSession
from tests.unit.broker.cores import broker
from tests.unit.broker.test_schedule import until


class ServerContext:
    """What a Session stream asks of its grpc context besides writes: the call's metadata (a caller that reads
    joined answers when `joined`) and the initial metadata it sends."""

    def __init__(self, *, joined: bool = False) -> None:
        self.metadata = ((MORE_KEY, "1"),) if joined else ()
        self.sent: tuple[tuple[str, str], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def send_initial_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.sent = metadata


class NeverReads(ServerContext):
    """A Session context whose writes never complete: the caller takes no answer."""

    async def write(self, response: bytes) -> None:
        await asyncio.Event().wait()


async def test_a_caller_that_does_not_read_stops_being_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_stream, "SESSION_MAX_OUTBOX_BYTES", 64 * 1024)
    monkeypatch.setattr(session_stream, "WRITER_DRAIN_S", 0.1)  # the end of the stream does not wait for this reader
    asked = 0

    async def requests() -> AsyncIterator[pb.SessionRequest]:
        nonlocal asked
        for i in range(200):
            await asyncio.sleep(0.001)  # a read from the network takes a moment; answers go out meanwhile
            asked += 1
            pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000, poll_ms=0)
            yield pb.SessionRequest(id=i + 1, pop=pop)
        await asyncio.Event().wait()  # the stream stays open

    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x" * 16_000) for _ in range(200)])
        servicer = server.BrokerServicer(core, BrokerMetrics())
        session = asyncio.create_task(servicer.Session(requests(), NeverReads()))  # type: ignore[arg-type]
        await asyncio.sleep(1.0)
        # 16 KB answers: past 64 KB not taken, reading stops (a few more may be in flight).
        assert asked < 20
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)


async def test_pops_past_the_outbox_bound_are_refused_and_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pops joined in one stream message are all taken before any is answered: those answered once the caller holds
    the outbox bound of answers it has not taken are refused (TooManyRequests) and their messages are ready again at
    once, attempt unchanged — the outbox stays near its bound however many Pops came together."""
    monkeypatch.setattr(session_stream, "SESSION_MAX_OUTBOX_BYTES", 1 << 20)
    async with broker(tmp_path) as (core, _):
        for _ in range(8):
            await core.send([pb.Message(topic="t", body=b"x" * 64 * 1024) for _ in range(32)])
        session = session_stream.Session(core, BrokerMetrics(), core.settings.max_held)
        pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=16, invisible_ms=60_000, poll_ms=0)
        first = pb.SessionRequest(id=1, pop=pop)
        first.more.extend(pb.SessionRequest(id=i, pop=pop) for i in range(2, 17))
        session.take(first)  # nothing reads the outbox
        await asyncio.gather(*session.pending.values())
        assert session.outbox_bytes < (1 << 20) + 16 * 64 * 1024 + 16 * 1024  # the bound, one answer, the refusals
        answers = []
        while not session.outbox.empty():
            answers.append(pb.SessionResponse.FromString(session.outbox.get_nowait()))
        refused = [a for a in answers if a.WhichOneof("body") == "error"]
        answered = sum(len(a.pop.messages) for a in answers if a.WhichOneof("body") == "pop")
        assert refused and all(a.error.error == "TooManyRequests" for a in refused)
        assert answered + 16 * len(refused) == 16 * 16
        again = []  # the refused Pops' messages, ready at their first attempt (a Pop takes up to --max-pop-bytes)
        while popped := (await core.pop("t", "g", "*", 64, 60_000, 0)).messages:
            again += popped
        assert len(again) == 256 - answered and {m.attempt for m in again} == {1}
        await session.close()


class Records(ServerContext):
    """A Session context that takes every answer at once: `messages` as written, `answers` one by one."""

    def __init__(self, *, joined: bool = False) -> None:
        super().__init__(joined=joined)
        self.messages: list[pb.SessionResponse] = []
        self.answers: list[pb.SessionResponse] = []
        self.arrived = asyncio.Event()

    async def write(self, response: bytes) -> None:
        message = pb.SessionResponse.FromString(response)
        self.messages.append(message)
        self.answers.append(message)
        self.answers.extend(message.more)
        self.arrived.set()


async def test_a_pop_answered_before_its_cancel_was_read_is_released(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"only one")])
        context = Records()

        async def requests() -> AsyncIterator[pb.SessionRequest]:
            pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000, poll_ms=0)
            yield pb.SessionRequest(id=1, pop=pop)
            await context.arrived.wait()  # the answer went out; the caller had given up meanwhile
            yield pb.SessionRequest(id=1, cancel=True)
            await asyncio.Event().wait()

        servicer = server.BrokerServicer(core, BrokerMetrics())
        session = asyncio.create_task(servicer.Session(requests(), context))  # type: ignore[arg-type]
        await context.arrived.wait()
        assert len(context.answers[0].pop.messages) == 1
        again = await core.pop("t", "g", "*", 1, 60_000, 2_000)  # not hidden for the 60 s it was popped for
        assert [(pb.Message.FromString(m.payload).body, m.attempt) for m in again.messages] == [(b"only one", 1)]
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)


async def test_a_notification_answered_and_not_used_passes_its_wake_on_to_the_next_held_request(tmp_path: Path) -> None:
    """One arrival wakes the oldest held request only. When that was a Notification whose receive then took its
    message from another broker, its cancel frame after the answer hands the wake to the next one held here."""
    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"warm")])
        await core.pop("t", "g", "*", 1, 60_000, 0)  # the group exists; nothing ready now
        context = Records()
        cancel = asyncio.Event()

        async def requests() -> AsyncIterator[pb.SessionRequest]:
            note = pb.NotificationRequest(topic="t", group="g", filter="*", poll_ms=10_000)
            yield pb.SessionRequest(id=1, notification=note)
            await cancel.wait()  # answered has_message; its receive was answered elsewhere
            yield pb.SessionRequest(id=1, cancel=True)
            await asyncio.Event().wait()

        servicer = server.BrokerServicer(core, BrokerMetrics())
        session = asyncio.create_task(servicer.Session(requests(), context))  # type: ignore[arg-type]
        await until(lambda: core.hold.held[Kind.NOTIFICATION] == 1)
        other = asyncio.create_task(core.notification("t", "g", "*", 10_000))  # another consumer's, held later
        await until(lambda: core.hold.held[Kind.NOTIFICATION] == 2)
        await core.send([pb.Message(topic="t", body=b"one")])  # wakes the oldest only
        await context.arrived.wait()
        assert context.answers[0].notification.has_message
        await asyncio.sleep(0.05)
        assert not other.done()  # one wake for one message
        cancel.set()
        assert await asyncio.wait_for(other, 2) == (True, False)  # passed on: not the sweep, nor 10 s
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)


class FakeCall:
    """The client's side of a Session call: records what is written, answers nothing. `stalled`: the
    broker stopped reading, so the first write never completes."""

    def __init__(self, *, stalled: bool = False, joins: bool = False) -> None:
        self.written: list[pb.SessionRequest] = []
        self.stalled = stalled
        self.joins = joins  # the broker says it reads joined requests
        self.metadata: tuple[tuple[str, str], ...] = ()

    async def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((MORE_KEY, "1"),) if self.joins else ()

    async def write(self, message: bytes) -> None:
        """As the proxy's session writes: serialized, joined requests in one message's `more`."""
        self.written.append(pb.SessionRequest.FromString(message))
        if self.stalled:
            await asyncio.Event().wait()

    async def done_writing(self) -> None:
        pass

    def cancel(self) -> None:
        pass

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> pb.SessionResponse:
        await asyncio.Event().wait()
        raise StopAsyncIteration


class Channel:
    """A channel whose Session stream is `call` (opened with the caller's metadata)."""

    def __init__(self, call: FakeCall) -> None:
        self.call = call

    def stream_stream(self, method: str, *, response_deserializer: Any) -> Any:
        def open_call(metadata: Any) -> FakeCall:
            self.call.metadata = metadata
            return self.call

        return open_call


def session_on(call: FakeCall) -> BrokerSession:
    return BrokerSession(channel=Channel(call))  # type: ignore[arg-type]


async def test_a_request_cancelled_before_it_was_written_is_never_sent() -> None:
    call = FakeCall()
    session = session_on(call).open()
    pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000, poll_ms=0)
    dropped = session.submit(pb.SessionRequest(pop=pop), lambda _: None)
    session.cancel(dropped)  # before the writer ran: neither the Pop nor a cancel frame goes out
    kept = session.submit(pb.SessionRequest(pop=pop), lambda _: None)
    for _ in range(5):
        await asyncio.sleep(0)
    session.cancel(kept)  # written already: the broker is told
    for _ in range(5):
        await asyncio.sleep(0)
    assert [(r.id, r.cancel) for r in call.written] == [(kept, False), (kept, True)]
    await session.close()


async def test_a_stream_the_broker_ended_under_a_write_closes_without_an_error() -> None:
    """A stopping broker ends its Session streams: grpc refuses a write still queued (InvalidStateError). That
    request counts as never sent, and `close()` does not raise (it did, in one run of the suite)."""

    class Ended(FakeCall):
        ended = asyncio.Event()

        async def write(self, message: bytes) -> None:
            self.ended.set()
            raise asyncio.InvalidStateError("RPC already finished.")

        async def __anext__(self) -> pb.SessionResponse:
            await self.ended.wait()
            raise StopAsyncIteration  # the stream ended with OK

    session = session_on(Ended()).open()
    with pytest.raises(grpc.aio.AioRpcError) as lost:
        await session.send(pb.SendRequest(messages=[pb.Message(topic="s", body=b"late")]))
    assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
    await session.close()


async def test_cancelled_requests_behind_a_stalled_write_are_not_kept() -> None:
    """A stalled broker must not make the proxy keep every timed-out Send (and its bodies) until the writer
    reaches it: once cancelled, the session holds no reference to a request."""
    call = FakeCall(stalled=True)
    session = session_on(call)
    session.open()
    body = b"x" * (1 << 20)
    first = session.submit(pb.SessionRequest(send=pb.SendRequest(messages=[pb.Message(body=body)])), print)
    await asyncio.sleep(0.01)  # the writer is stuck in the first write
    requests = [pb.SessionRequest(send=pb.SendRequest(messages=[pb.Message(body=body)])) for _ in range(32)]
    ids = [session.submit(request, print) for request in requests]
    for request_id in [first, *ids]:
        session.cancel(request_id)  # a Send that timed out: the proxy takes new ones in
    gc.collect()
    counts = [sys.getrefcount(request) for request in requests]
    control = pb.SessionRequest()
    await session.close()
    unshared = sys.getrefcount(control)
    assert set(counts) == {unshared + 1}  # the test's list and the call's argument: nobody else


class AnsweringCall(FakeCall):
    """A Session call whose broker answers every request at once (an empty answer of its kind, of the same id), those
    joined in one stream message (`more`) each in turn."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: asyncio.Queue[pb.SessionResponse] = asyncio.Queue()

    async def write(self, message: bytes) -> None:
        first = pb.SessionRequest.FromString(message)
        more = list(first.more)
        first.ClearField("more")
        for request in [first, *more]:
            self.written.append(request)
            if not request.cancel:
                answer = pb.SessionResponse(id=request.id)
                getattr(answer, request.WhichOneof("body")).SetInParent()
                self.answers.put_nowait(answer)

    async def __anext__(self) -> pb.SessionResponse:
        return await self.answers.get()


async def test_an_answered_pop_nobody_received_is_handed_back_with_a_cancel_frame() -> None:
    call = AnsweringCall()
    session = session_on(call)
    session.open()
    answered = asyncio.Event()
    pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000)
    request_id = session.submit(pb.SessionRequest(pop=pop), lambda _: answered.set())
    await asyncio.wait_for(answered.wait(), 5)
    session.cancel(request_id)  # answered: a no-op
    session.release(request_id)  # the broker puts the Pop's messages back on this frame
    for _ in range(5):
        await asyncio.sleep(0)
    await session.close()
    written = [(r.id, r.cancel) for r in call.written]

    request_id = 1
    assert written == [(request_id, False), (request_id, True)]


async def session_answers(core: BrokerCore, frames: list[pb.SessionRequest], count: int) -> list[pb.SessionResponse]:
    """`frames` through a Session stream of `core`, each after the previous one's answer (a cancel after a
    short pause: it has none); the first `count` answers."""
    context = Records()

    async def requests() -> AsyncIterator[pb.SessionRequest]:
        for frame in frames:
            answered = len(context.answers)
            yield frame
            if frame.cancel:
                await asyncio.sleep(0.05)
                continue
            while len(context.answers) == answered:
                context.arrived.clear()
                await context.arrived.wait()
        await asyncio.Event().wait()

    servicer = server.BrokerServicer(core, BrokerMetrics())
    session = asyncio.create_task(servicer.Session(requests(), context))  # type: ignore[arg-type]
    while len(context.answers) < count:
        context.arrived.clear()
        await asyncio.wait_for(context.arrived.wait(), 10)
    session.cancel()
    await asyncio.gather(session, return_exceptions=True)
    return context.answers[:count]


def pop_frame(request_id: int, poll_ms: int = 0) -> pb.SessionRequest:
    pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000, poll_ms=poll_ms)
    return pb.SessionRequest(id=request_id, pop=pop)


async def test_with_no_long_polls_allowed_a_pop_that_does_not_wait_is_still_served(tmp_path: Path) -> None:
    async with broker(tmp_path, max_held=0) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        [answer] = await session_answers(core, [pop_frame(1)], 1)
    assert answer.WhichOneof("body") == "pop", answer.error.message


async def test_a_cancel_for_a_reused_id_does_not_release_the_pop_answered_under_it_before(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"taken")])
        send = pb.SessionRequest(id=1, send=pb.SendRequest(messages=[pb.Message(topic="t", body=b"other")]))
        cancel = pb.SessionRequest(id=1, cancel=True)
        popped, _ = await session_answers(core, [pop_frame(1), send, cancel], 2)
        assert len(popped.pop.messages) == 1
        left = await core.pop("t", "g", "*", 32, 60_000, 0)
    left_over = [(pb.Message.FromString(m.payload).body, m.attempt) for m in left.messages]
    assert left_over == [(b"other", 1)]  # "taken" stays taken


def serving_pops() -> int:
    """Session requests of this loop still being served (a task per request, `Session._serve`)."""
    serve = session_stream.Session._serve.__code__
    return sum(getattr(task.get_coro(), "cr_code", None) is serve for task in asyncio.all_tasks() if not task.done())


async def test_held_pops_of_a_caller_that_does_not_read_end_empty_instead_of_taking_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_stream, "SESSION_MAX_OUTBOX_BYTES", 64 * 1024)
    monkeypatch.setattr(session_stream, "WRITER_DRAIN_S", 0.1)
    pops = 40

    async def requests() -> AsyncIterator[pb.SessionRequest]:
        for i in range(pops):
            pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000, poll_ms=20_000)
            yield pb.SessionRequest(id=i + 1, pop=pop)
        await asyncio.Event().wait()

    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"first")])
        await core.pop("t", "g", "*", 1, 60_000, 0)  # the topic and the group exist; nothing is ready
        servicer = server.BrokerServicer(core, BrokerMetrics())
        session = asyncio.create_task(servicer.Session(requests(), NeverReads()))  # type: ignore[arg-type]
        await asyncio.wait_for(until(lambda: core.hold.held[Kind.POP] == pops), 5)  # all 40 Pops read and held
        for _ in range(pops):  # each 16 KB message wakes one held Pop, which takes it into the outbox
            await core.send([pb.Message(topic="t", body=b"x" * 16_000)])
        # Every Pop of the stream answered (with messages, or ended empty past the budget): what it took is final.
        await asyncio.wait_for(until(lambda: serving_pops() == 0), 5)
        taken = sum(lag.inflight for lag in (r.lag for r in core.lags("t", "g")))
        assert core.hold.held[Kind.POP] == 0  # past the budget the rest ended (empty answers)
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)
    assert 1 <= taken <= 8  # ~64 KB of 16 KB answers (+ the first), not all 40


async def test_a_cancel_and_a_release_joined_in_one_message_pass_the_wake_on(tmp_path: Path) -> None:
    """The proxy's writer joins the frames queued together: one receive's cancel of its Notification, then another
    receive's release of a has_message it did not use. The wake goes to the request held after them, not to the
    one cancelled in the same message."""
    async with broker(tmp_path) as (core, _):
        await core.send([pb.Message(topic="t", body=b"warm")])
        await core.pop("t", "g", "*", 1, 60_000, 0)
        context = Records(joined=True)
        joined_sent = asyncio.Event()

        async def requests() -> AsyncIterator[pb.SessionRequest]:
            note = pb.NotificationRequest(topic="t", group="g", filter="*", poll_ms=10_000)
            yield pb.SessionRequest(id=1, notification=note)
            await until(lambda: core.hold.held[Kind.NOTIFICATION] == 1)
            yield pb.SessionRequest(id=2, notification=note)
            await joined_sent.wait()
            joined = pb.SessionRequest(id=2, cancel=True)
            joined.more.append(pb.SessionRequest(id=1, cancel=True))  # 1 was answered has_message: a release
            yield joined
            await asyncio.Event().wait()

        servicer = server.BrokerServicer(core, BrokerMetrics())
        session = asyncio.create_task(servicer.Session(requests(), context))  # type: ignore[arg-type]
        try:
            await until(lambda: core.hold.held[Kind.NOTIFICATION] == 2)
            third = asyncio.create_task(core.notification("t", "g", "*", 10_000))  # held last
            await until(lambda: core.hold.held[Kind.NOTIFICATION] == 3)
            await core.send([pb.Message(topic="t", body=b"one")])  # wakes request 1 only
            await context.arrived.wait()
            assert context.answers[0].id == 1 and context.answers[0].notification.has_message
            joined_sent.set()
            assert await asyncio.wait_for(third, 5) == (True, False)
        finally:
            session.cancel()
            await asyncio.gather(session, return_exceptions=True)
