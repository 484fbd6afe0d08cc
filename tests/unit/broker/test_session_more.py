"""Requests and answers queued together on a Session stream share one stream message (`more`, one level), each
read as if it came alone, in order; each side joins only towards one that said it reads them (old brokers and
old proxies during a rolling upgrade see no `more`)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from popgate_pb import broker_pb2 as pb

from broker import server
from broker import session as session_stream
from broker.longpoll import Kind
from broker.metrics import BrokerMetrics
from popgate_contract import session_client
from popgate_contract.session_client import MORE_KEY, RUNS_KEY, TRANSACTIONS_KEY, BrokerSession, encode_cancel, join
from popgate_contract.trailer import unsent as is_unsent
from tests.unit.broker.cores import broker
from tests.unit.broker.test_schedule import until
from tests.unit.broker.test_session_stream import Channel, FakeCall, Records


def send_frame(request_id: int, body: bytes = b"x") -> pb.SessionRequest:
    return pb.SessionRequest(id=request_id, send=pb.SendRequest(messages=[pb.Message(topic="t", body=body)]))


def joined(frames: list[pb.SessionRequest]) -> pb.SessionRequest:
    encoded = [frame.SerializeToString() for frame in frames]
    return pb.SessionRequest.FromString(join(encoded[0], encoded[1:]))


def test_joined_bytes_decode_as_the_first_with_the_others_in_more_in_order() -> None:
    frames = [send_frame(1, b"a" * 300), pb.SessionRequest(id=2, cancel=True), send_frame(3, b"c")]
    message = joined(frames)
    assert message.id == 1 and message.send == frames[0].send
    assert list(message.more) == frames[1:]
    assert pb.SessionRequest.FromString(encode_cancel(300)) == pb.SessionRequest(id=300, cancel=True)
    answers = [pb.SessionResponse(id=i, ack=pb.AckResponse()) for i in (5, 6)]
    both = pb.SessionResponse.FromString(join(answers[0].SerializeToString(), [answers[1].SerializeToString()]))
    assert both.id == 5 and list(both.more) == answers[1:]


async def serve(tmp_path: Path, frames: list[pb.SessionRequest], context: Records, count: int) -> None:
    """`frames` through a Session stream of a new broker until `count` answers were written."""

    async def requests() -> AsyncIterator[pb.SessionRequest]:
        for frame in frames:
            yield frame
        await asyncio.Event().wait()

    async with broker(tmp_path) as (core, _):
        session = asyncio.create_task(
            server.BrokerServicer(core, BrokerMetrics()).Session(requests(), context)  # type: ignore[arg-type]
        )
        while len(context.answers) < count:
            context.arrived.clear()
            await asyncio.wait_for(context.arrived.wait(), 10)
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)


@pytest.mark.parametrize("caller_joins", [False, True])
async def test_a_joined_request_message_is_served_entry_by_entry_and_answered_as_the_caller_reads(
    caller_joins: bool, tmp_path: Path
) -> None:
    """A broker serves every entry of a joined message; it joins its answers only for a caller that said it reads
    them (an old proxy would drop the `more` it does not know), and always says it reads joined requests."""
    frames = [send_frame(i, f"m{i}".encode()) for i in range(1, 41)]
    nested = pb.SessionRequest(id=41, ack=pb.AckRequest(topic="t", group="g"))
    nested.more.append(send_frame(42))  # one level only: refused, and 42 is not served
    context = Records(joined=caller_joins)
    await serve(tmp_path, [joined([*frames, nested])], context, 41)
    assert context.sent is not None and context.sent[:2] == ((MORE_KEY, "1"), (RUNS_KEY, "1"))  # and Send's runs
    assert (TRANSACTIONS_KEY, "1") in context.sent  # and EndTransaction
    answers = sorted(context.answers, key=lambda a: a.id)  # each answered when done, not in order
    assert [a.id for a in answers] == list(range(1, 42))
    assert all(a.WhichOneof("body") == "send" and len(a.send.results) == 1 for a in answers[:40])
    assert answers[40].error.error == "BadRequest"
    offsets = [a.send.results[0].offset for a in answers[:40]]
    assert offsets == sorted(offsets)  # stored in the order they were joined
    if caller_joins:
        assert len(context.messages) < len(context.answers)
    else:
        assert all(not message.more for message in context.messages)


def test_the_broker_writer_joins_queued_answers_within_its_bound_and_leaves_the_end_marker_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session_stream, "MAX_WRITE_BYTES", 30)
    sizes = [4, 4, 4, 40, 4, 4, 4, 4, 4, 4]  # the 4th alone is over the bound: it goes alone
    answers = [pb.SessionResponse(id=i, ack=pb.AckResponse()).SerializeToString() for i in range(1, 11)]
    answers[3] = pb.SessionResponse(id=4, error=pb.SessionError(message="x" * 34)).SerializeToString()
    assert [len(a) for a in answers] == sizes
    outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
    for answer in answers[1:]:
        outbox.put_nowait(answer)
    outbox.put_nowait(None)
    assert session_stream.gather(outbox, answers[0], joined=False) == (answers[0], 4, None)
    assert outbox.qsize() == 10
    written: list[list[int]] = []
    first: bytes | None = answers[0]
    while first is not None:
        message, size, carry = session_stream.gather(outbox, first, joined=True)
        decoded = pb.SessionResponse.FromString(message)
        ids = [r.id for r in [decoded, *decoded.more]]
        assert size == len(message) - 2 * (len(ids) - 1) == sum(sizes[i - 1] for i in ids)  # 2: each entry's head
        written.append(ids)
        first = carry if carry is not None else outbox.get_nowait()
    assert written == [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10]]  # in order, none over 30 bytes but the one larger alone
    assert outbox.empty()


class Call(FakeCall):
    """The client's side of a Session call against a broker that answers each request at once; `joins`: the
    broker said it reads joined requests. Records each stream message written (decoded when written as bytes)."""

    def __init__(self, *, joins: bool, stall: asyncio.Event | None = None) -> None:
        super().__init__(joins=joins)
        self.stall = stall  # while unset, a write does not return
        self.messages: list[pb.SessionRequest] = []
        self.metadata: Any = None
        self.answers: asyncio.Queue[pb.SessionResponse] = asyncio.Queue()
        self.answer_joined = False

    async def write(self, message: pb.SessionRequest | bytes) -> None:
        if isinstance(message, bytes):
            message = pb.SessionRequest.FromString(message)
        self.messages.append(message)
        if self.stall is not None:
            await self.stall.wait()
        answers = [pb.SessionResponse(id=r.id, ack=pb.AckResponse()) for r in [message, *message.more] if not r.cancel]
        if answers and self.answer_joined:
            answers[0].more.extend(answers[1:])
            answers = answers[:1]
        for answer in answers:
            self.answers.put_nowait(answer)

    async def __anext__(self) -> pb.SessionResponse:
        return await self.answers.get()


def ack(request_id: int = 0) -> pb.SessionRequest:
    return pb.SessionRequest(ack=pb.AckRequest(topic="t", group="g"))


async def test_the_client_joins_requests_within_its_bound_and_sends_a_larger_one_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session_client, "MAX_WRITE_BYTES", 100)
    call = Call(joins=True)
    session = BrokerSession(channel=Channel(call)).open()  # type: ignore[arg-type]
    await session.ack(ack().ack)  # the reader has seen the broker's initial metadata
    topics = [24, 24, 24, 145, 24, 24]
    requests = [pb.SessionRequest(ack=pb.AckRequest(topic="t" * n, group="g")) for n in topics]
    await asyncio.gather(*(session.call(request) for request in requests))
    joined_ids = [[r.id for r in [m, *m.more]] for m in call.messages[1:]]
    assert [len(r.SerializeToString()) for r in requests] == [33, 33, 33, 156, 33, 33]  # 3 fit in 100 bytes
    assert joined_ids == [[2, 3, 4], [5], [6, 7]]
    await session.close()


@pytest.mark.parametrize("broker_joins", [False, True])
async def test_the_client_joins_requests_only_once_the_broker_said_it_reads_them(broker_joins: bool) -> None:
    call = Call(joins=broker_joins)
    session = BrokerSession(channel=Channel(call)).open()  # type: ignore[arg-type]
    await session.ack(ack().ack)  # the reader has seen the broker's initial metadata
    answers = await asyncio.gather(*(session.ack(ack().ack) for _ in range(20)))
    assert len(answers) == 20
    assert call.metadata == ((MORE_KEY, "1"),)  # the broker is told this client reads joined answers
    entries = [r.id for m in call.messages for r in [m, *m.more]]
    assert entries == list(range(1, 22))  # every request once, in order
    if broker_joins:
        assert len(call.messages) < 21
    else:
        assert all(not m.more for m in call.messages)
    await session.close()


async def test_the_client_reads_joined_answers_each_as_if_it_came_alone() -> None:
    call = Call(joins=True)
    call.answer_joined = True
    session = BrokerSession(channel=Channel(call)).open()  # type: ignore[arg-type]
    answers = await asyncio.wait_for(asyncio.gather(*(session.ack(ack().ack) for _ in range(10))), 5)
    assert len(answers) == 10 and session.pending == 0
    assert any(m.more for m in call.messages)
    await session.close()


async def test_requests_of_a_joined_message_are_sent_once_its_write_returned_and_cancels_follow_it() -> None:
    """A request is unsent until the write of the message carrying it returns: the stream lost meanwhile fails
    those queued behind it as never sent (safe to send again), and not the ones in that message; cancelling
    one of those sends a cancel frame after it."""
    stall = asyncio.Event()
    call = Call(joins=True, stall=stall)
    session = BrokerSession(channel=Channel(call)).open()  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the reader saw the initial metadata
    results: dict[int, Any] = {}
    ids = [session.submit(ack(), lambda r, i=i: results.__setitem__(i, r)) for i in range(3)]
    await asyncio.sleep(0.01)  # all three in the message being written, which has not returned
    assert [r.id for r in [call.messages[0], *call.messages[0].more]] == ids
    session.cancel(ids[1])
    later = [session.submit(ack(), lambda r, i=i: results.__setitem__(i, r)) for i in range(3, 5)]
    session.cancel(later[0])  # not written: no cancel frame
    stall.set()
    await asyncio.sleep(0.01)
    second = call.messages[1]
    assert [(r.id, r.cancel) for r in [second, *second.more]] == [(ids[1], True), (later[1], False)]
    await session.close()


async def test_a_lost_stream_fails_requests_behind_the_message_being_written_as_never_sent() -> None:
    stall = asyncio.Event()
    lost = asyncio.Event()

    class Lost(Call):
        async def __anext__(self) -> pb.SessionResponse:
            await lost.wait()
            raise StopAsyncIteration

    call = Lost(joins=True, stall=stall)
    session = BrokerSession(channel=Channel(call)).open()  # type: ignore[arg-type]
    await asyncio.sleep(0)
    results: dict[int, Any] = {}
    for i in range(2):
        session.submit(ack(), lambda r, i=i: results.__setitem__(i, r))
    await asyncio.sleep(0.01)  # both in the message being written
    session.submit(ack(), lambda r: results.__setitem__(2, r))  # queued behind it
    lost.set()
    await asyncio.sleep(0.01)
    assert all(isinstance(r, grpc.aio.AioRpcError) for r in results.values()) and len(results) == 3
    unsent = [i for i, r in results.items() if is_unsent(r)]
    assert unsent == [2]
    await session.close()


def awaiting(task: asyncio.Task[None]) -> list[str]:
    """The coroutines a task is suspended in, outermost first."""
    chain, awaited = [], task.get_coro()
    while inspect.iscoroutine(awaited):
        chain.append(awaited.cr_code.co_qualname)
        awaited = awaited.cr_await
    return chain


async def test_a_held_pop_or_notification_is_two_coroutines_and_holds_no_protobuf(tmp_path: Path) -> None:
    """A held long poll is the broker's unit of memory: while held, its task is the Session's coroutine and the one
    of the Pop path (or the core's Notification), which awaits its waiter itself; neither keeps a protobuf (each one
    an arena of its own): not the request, nor the stream message it came in with others (up to a MiB of Sends),
    nor its answer, made once there is something. Then the answers are as before."""
    async with broker(tmp_path) as (core, _):
        session = session_stream.Session(core, BrokerMetrics(), max_pending=10)
        pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000, poll_ms=5_000)
        note = pb.NotificationRequest(topic="t", group="g2", filter="*", poll_ms=5_000)
        session.take(joined([pb.SessionRequest(id=1, pop=pop), pb.SessionRequest(id=2, notification=note)]))
        await until(lambda: core.hold.held[Kind.POP] == 1 and core.hold.held[Kind.NOTIFICATION] == 1)
        assert awaiting(session.pending[1]) == ["Session._serve", "Pops.pop"]
        assert awaiting(session.pending[2]) == ["Session._serve", "BrokerCore.notification"]
        for request_id in (1, 2):
            coroutine: Any = session.pending[request_id].get_coro()
            while inspect.iscoroutine(coroutine):
                kept = [v for v in coroutine.cr_frame.f_locals.values() if isinstance(v, Message)]
                assert not kept, (coroutine.cr_code.co_qualname, kept)
                coroutine = coroutine.cr_await
        await core.send([pb.Message(topic="t", body=b"m")])
        answers = {}
        for _ in range(2):
            answer = pb.SessionResponse.FromString(await asyncio.wait_for(session.outbox.get(), 5))
            answers[answer.id] = answer
        assert [m.stored.message.body for m in answers[1].pop.messages] == [b"m"]
        assert answers[2].notification.has_message
        await session.close()
