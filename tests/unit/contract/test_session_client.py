"""The client side of a broker's Session stream against a real gRPC server in this process: an answer that does not
decode ends the stream as a lost one, and the next stream serves."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from popgate_pb import broker_pb2 as pb

from popgate_contract.session_client import METHOD, BrokerSession
from tests.unit.broker.test_session_stream import FakeCall, session_on

GARBAGE = b"\xff" * 6  # not a SessionResponse: grpc.aio reads it as None


class Broker:
    """A broker's Session handler: its first `bad` streams answer a request with GARBAGE, then wait to be cancelled;
    later ones answer each request with an empty Ack answer."""

    def __init__(self, bad: int) -> None:
        self.bad = bad
        self.streams = 0
        self.cancelled: asyncio.Queue[None] = asyncio.Queue()  # one entry per stream its client cancelled

    async def session(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self.streams += 1
        bad = self.streams <= self.bad
        await context.send_initial_metadata(())  # said nothing: the client writes at once all the same
        try:
            async for data in requests:
                request = pb.SessionRequest.FromString(data)
                if bad:
                    yield GARBAGE
                elif not request.cancel:
                    yield pb.SessionResponse(id=request.id, ack=pb.AckResponse()).SerializeToString()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.put_nowait(None)
            raise


async def acked(session: BrokerSession) -> pb.AckResponse:
    return await asyncio.wait_for(session.ack(pb.AckRequest(topic="t", group="g")), 5)


async def test_an_undecodable_answer_ends_the_stream_as_lost_with_one_warning_and_a_new_stream_serves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each bad stream: its pending request fails UNAVAILABLE as on a lost stream (the proxy fails it over), its call
    is cancelled, its tasks end without an error; one WARNING for the 1st and the 10th such stream, no traceback (grpc
    logged one per frame); the next stream serves."""
    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unhandled.append(context))
    broker = Broker(bad=12)
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(broker.session)  # bytes both ways
    service, method = METHOD.rsplit("/", 1)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.strip("/"), {method: handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(12):
            session = BrokerSession(channel, name="b-undecodable").open()
            with pytest.raises(grpc.aio.AioRpcError) as lost:
                await acked(session)
            assert lost.value.code() == grpc.StatusCode.UNAVAILABLE and "does not decode" in (
                lost.value.details() or ""
            )
            await asyncio.wait_for(asyncio.wait(session._tasks[:1]), 5)  # the reader ended by itself
            await asyncio.wait_for(broker.cancelled.get(), 5)  # and cancelled the call (before `close()` would)
            await session.close()
            assert [task.exception() for task in session._tasks if not task.cancelled()] in ([None], [None] * 2)
        served = BrokerSession(channel, name="b-undecodable").open()
        assert await acked(served) == pb.AckResponse()
        await served.close()
    finally:
        await channel.close()
        await server.stop(None)
    gc.collect()  # a task dropped with its exception unretrieved is reported now
    assert unhandled == []
    logged = [(r.name, r.levelname, r.exc_info is not None) for r in caplog.records]
    assert logged == [("popgate_contract.session_client", "WARNING", False)] * 2
    assert [r.getMessage().count("does not decode") for r in caplog.records] == [1, 1]


async def test_close_reports_a_task_failure_instead_of_raising_it(caplog: pytest.LogCaptureFixture) -> None:
    """A writer that failed on an unexpected error: `close()` (run as a task by the proxy when it replaces a broken
    session) logs it and returns, leaving no task exception unretrieved."""

    class Failing(FakeCall):
        async def write(self, message: bytes) -> None:
            raise RuntimeError("write failed")

    session = session_on(Failing()).open()
    session.submit(pb.SessionRequest(ack=pb.AckRequest()), lambda _: None)
    await asyncio.wait_for(asyncio.wait(session._tasks[1:]), 5)
    await session.close()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("ERROR", "broker ?: a Session task failed")]
