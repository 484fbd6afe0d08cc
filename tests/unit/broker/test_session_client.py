"""The proxy's side of a broker Session stream (broker.client.BrokerSession) over a stalled fake call."""

from __future__ import annotations

import asyncio
import gc
import sys
from typing import Any

from popgate_pb import broker_pb2 as pb

from broker.client import BrokerSession


class StalledCall:
    """A Session call whose broker stopped reading: the first write never completes, nothing is answered."""

    def __init__(self) -> None:
        self.written: list[pb.SessionRequest] = []
        self._never = asyncio.Event()

    async def write(self, request: pb.SessionRequest) -> None:
        self.written.append(request)
        await self._never.wait()

    async def done_writing(self) -> None:
        return None

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> pb.SessionResponse:
        await self._never.wait()
        raise StopAsyncIteration

    def cancel(self) -> None:
        return None


def test_cancelled_requests_behind_a_stalled_write_are_not_kept() -> None:
    """A stalled broker must not make the proxy keep every timed-out Send (and its bodies) until the writer
    reaches it: once cancelled, the session holds no reference to a request."""

    async def scenario() -> tuple[list[int], int]:
        call = StalledCall()
        session = BrokerSession(type("Stub", (), {"Session": staticmethod(lambda: call)})())  # type: ignore[arg-type]
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
        return counts, sys.getrefcount(control)

    counts, unshared = asyncio.run(scenario())
    assert set(counts) == {unshared + 1}  # the test's list and the call's argument: nobody else


class AnsweringCall(StalledCall):
    """A Session call whose broker answers every request at once (an empty answer of the same id)."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: asyncio.Queue[pb.SessionResponse] = asyncio.Queue()

    async def write(self, request: pb.SessionRequest) -> None:
        self.written.append(request)
        if not request.cancel:
            self.answers.put_nowait(pb.SessionResponse(id=request.id))

    async def __anext__(self) -> pb.SessionResponse:
        return await self.answers.get()


def test_an_answered_pop_nobody_received_is_handed_back_with_a_cancel_frame() -> None:
    async def scenario() -> list[tuple[int, bool]]:
        call = AnsweringCall()
        session = BrokerSession(type("Stub", (), {"Session": staticmethod(lambda: call)})())  # type: ignore[arg-type]
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
        return [(r.id, r.cancel) for r in call.written]

    request_id = 1
    assert asyncio.run(scenario()) == [(request_id, False), (request_id, True)]
