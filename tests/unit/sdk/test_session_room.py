"""The SDK's Session keeps at most the proxy's bound of requests pending on its stream (sdk/_room.py): callers past
it wait locally, in their order, within their own deadline; sends, acks and nacks never wait behind receives."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Timeout, Unavailable, _room, _session
from popgate._transport import convert
from popgate_contract.session_headers import MAX_PENDING_REQUESTS
from tests.unit.sdk.fakes import SessionCall, SessionChannel


def test_the_clients_bound_is_the_proxys() -> None:
    from proxy.v2 import session

    assert session.MAX_PENDING == MAX_PENDING_REQUESTS


class BoundedProxy(SessionCall):
    """A Session call served as popgate's proxy does: at most `bound` requests pending, TOO_MANY_REQUESTS past it;
    receives held until the test answers them (`answer`), acks answered at once."""

    def __init__(self, bound: int = MAX_PENDING_REQUESTS) -> None:
        super().__init__()
        self.bound = bound
        self.held: list[int] = []  # receives pending, in the order they came
        self.pending: set[int] = set()
        self.refused = 0
        self.cancels = 0

    async def write(self, message: bytes) -> None:
        first = ext.SessionRequest.FromString(message)
        for request in (first, *first.more):
            self._take(request)

    def _take(self, request: ext.SessionRequest) -> None:
        kind = request.WhichOneof("body")
        if kind == "cancel":
            self.cancels += 1
            self.pending.discard(request.id)
            return
        if len(self.pending) >= self.bound:
            self.refused += 1
            self.answers.put_nowait(ext.SessionResponse(id=request.id, status=v2.Status(code=v2.TOO_MANY_REQUESTS)))
            return
        if kind == "ack":
            self.answers.put_nowait(ext.SessionResponse(id=request.id, ack=pb.AckMessageResponse(status=OK)))
            return
        self.pending.add(request.id)
        self.held.append(request.id)

    def answer(self, request_id: int, *message_ids: str) -> None:
        self.pending.discard(request_id)
        if message_ids:
            messages = [v2.Message(system_properties=v2.SystemProperties(message_id=i)) for i in message_ids]
            frame = ext.ReceiveMessagesResponse(messages=ext.Messages(messages=messages))
            self.answers.put_nowait(ext.SessionResponse(id=request_id, receive=frame))
        status = ext.ReceiveMessagesResponse(status=OK if message_ids else v2.Status(code=v2.MESSAGE_NOT_FOUND))
        self.answers.put_nowait(ext.SessionResponse(id=request_id, receive=status))


OK = v2.Status(code=v2.OK)


async def until(condition: Any, within_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not condition():
        assert loop.time() < end, "not within the deadline"
        await asyncio.sleep(0.001)


def receive(session: _session.Session, within_s: float = 30.0) -> asyncio.Future[Any]:
    return asyncio.ensure_future(session.request("receive", pb.ReceiveMessageRequest(batch_size=32), within_s))


async def test_an_ack_completes_promptly_among_far_more_receives_than_the_proxys_bound() -> None:
    proxy = BoundedProxy()
    session = _session.Session(SessionChannel(proxy), (), convert)  # type: ignore[arg-type]
    receives = [receive(session) for _ in range(2 * MAX_PENDING_REQUESTS)]
    await until(lambda: bool(proxy.held) and session._outbox.empty())  # all it sends is written
    proxy.answer(proxy.held[0], "m")
    frames = await asyncio.wait_for(receives[0], 1.0)  # the first receive went first
    assert [m.system_properties.message_id for f in frames for m in f.messages.messages] == ["m"]
    ack = pb.AckMessageRequest(entries=[pb.AckMessageEntry(message_id="m")])
    answer = await asyncio.wait_for(session.request("ack", ack, 3.0), 1.0)
    assert answer.status.code == v2.OK
    assert proxy.refused == 0  # no request sent past the proxy's bound
    sent = len(proxy.held)
    for request_id in proxy.held[1:101]:  # room made: the next callers, in their order, are sent
        proxy.answer(request_id)
    await until(lambda: len(proxy.held) == sent + 100)
    assert proxy.held == sorted(proxy.held) and proxy.refused == 0
    for r in receives:
        r.cancel()
    await asyncio.gather(*receives, return_exceptions=True)
    await session.close()


async def test_a_caller_waiting_for_room_times_out_at_its_deadline_unsent() -> None:
    proxy = BoundedProxy()
    session = _session.Session(SessionChannel(proxy), (), convert)  # type: ignore[arg-type]
    held = [receive(session) for _ in range(MAX_PENDING_REQUESTS)]
    await until(lambda: bool(proxy.held) and session._outbox.empty())
    sent = len(proxy.held)
    late = [receive(session, 0.05) for _ in range(200)]
    for outcome in await asyncio.gather(*late, return_exceptions=True):
        assert isinstance(outcome, Timeout) and outcome.retriable
    cancelled = receive(session)
    await asyncio.sleep(0)
    cancelled.cancel()
    proxy.answer(proxy.held[0])
    later = receive(session)  # the room freed goes to it: nobody before it waits any more
    await until(lambda: len(proxy.held) == sent + 1)
    assert (proxy.cancels, proxy.refused) == (0, 0)  # the ones that gave up were never written
    for r in (*held, later):
        r.cancel()
    await asyncio.gather(*held, later, cancelled, return_exceptions=True)
    await session.close()


async def test_short_requests_take_the_room_receives_leave() -> None:
    loop = asyncio.get_running_loop()
    room = _room.Room(bound=4)
    assert [room.take("receive") for _ in range(4)] == [True, True, True, False]  # three quarters for receives
    assert room.take("ack") and not room.take("send")
    waiting = [loop.create_future() for _ in range(3)]
    room.queue("receive", waiting[0])
    room.queue("send", waiting[1])
    room.queue("ack", waiting[2])
    room.release("receive")
    assert [w.done() for w in waiting] == [False, True, False]  # the send, though the receive waited longer
    room.release("ack")
    assert [w.done() for w in waiting] == [False, True, True]
    room.release("send")
    assert waiting[0].done() and (room.pending, room.receives) == (4, 3)


async def test_a_stream_lost_fails_the_callers_waiting_for_room() -> None:
    proxy = BoundedProxy()
    session = _session.Session(SessionChannel(proxy), (), convert)  # type: ignore[arg-type]
    held = [receive(session) for _ in range(MAX_PENDING_REQUESTS)]
    await until(lambda: bool(proxy.held) and session._outbox.empty())  # all it sends is written
    waiting = receive(session)
    await asyncio.sleep(0)
    proxy.cancel()  # the stream ends
    with pytest.raises(Unavailable) as caught:
        await asyncio.wait_for(waiting, 1.0)
    assert caught.value.retriable
    await asyncio.gather(*held, return_exceptions=True)
    await session.close()
