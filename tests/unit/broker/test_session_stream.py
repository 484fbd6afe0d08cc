"""The broker's Session stream against its caller's pace: a caller that asks faster than it reads stops being
read once the answers not yet taken pass a byte bound, and a Pop answered just before its cancel frame is read
is released instead of hiding its messages for the whole invisible time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import server
from broker.metrics import BrokerMetrics
from tests.unit.broker.cores import broker


class NeverReads:
    """A Session context whose writes never complete: the caller takes no answer."""

    async def write(self, response: pb.SessionResponse) -> None:
        await asyncio.Event().wait()


def test_a_caller_that_does_not_read_stops_being_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "SESSION_MAX_OUTBOX_BYTES", 64 * 1024, raising=False)
    monkeypatch.setattr(server, "WRITER_DRAIN_S", 0.1)  # the end of the stream does not wait for this reader
    asked = 0

    async def requests() -> AsyncIterator[pb.SessionRequest]:
        nonlocal asked
        for i in range(200):
            await asyncio.sleep(0.001)  # a read from the network takes a moment; answers go out meanwhile
            asked += 1
            pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000, poll_ms=0)
            yield pb.SessionRequest(id=i + 1, pop=pop)
        await asyncio.Event().wait()  # the stream stays open

    async def scenario() -> None:
        async with broker(tmp_path) as (core, _):
            await core.send([pb.Message(topic="t", body=b"x" * 16_000) for _ in range(200)])
            servicer = server.BrokerServicer(core, BrokerMetrics())
            session = asyncio.create_task(servicer.Session(requests(), NeverReads()))  # type: ignore[arg-type]
            await asyncio.sleep(1.0)
            # 16 KB answers: past 64 KB not taken, reading stops (a few more may be in flight).
            assert asked < 20
            session.cancel()
            await asyncio.gather(session, return_exceptions=True)

    asyncio.run(asyncio.wait_for(scenario(), 30))


class Records:
    """A Session context that takes every answer at once."""

    def __init__(self) -> None:
        self.answers: list[pb.SessionResponse] = []
        self.arrived = asyncio.Event()

    async def write(self, response: pb.SessionResponse) -> None:
        self.answers.append(response)
        self.arrived.set()


def test_a_pop_answered_before_its_cancel_was_read_is_released(tmp_path: Path) -> None:
    async def scenario() -> None:
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

    asyncio.run(asyncio.wait_for(scenario(), 30))


class FakeCall:
    """The client's side of a Session call: records what is written, answers nothing."""

    def __init__(self) -> None:
        self.written: list[pb.SessionRequest] = []

    async def write(self, request: pb.SessionRequest) -> None:
        self.written.append(request)

    async def done_writing(self) -> None:
        pass

    def cancel(self) -> None:
        pass

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> pb.SessionResponse:
        await asyncio.Event().wait()
        raise StopAsyncIteration


def test_a_request_cancelled_before_it_was_written_is_never_sent() -> None:
    from broker.client import BrokerSession

    call = FakeCall()

    class Stub:
        def Session(self) -> FakeCall:  # noqa: N802 - the gRPC method's name
            return call

    async def scenario() -> None:
        session = BrokerSession(Stub()).open()  # type: ignore[arg-type]
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

    asyncio.run(asyncio.wait_for(scenario(), 10))
