"""The multiplexed Session stream: Sends, Pops, Acks, invisibility changes and held long polls on one call."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

from popgate_contract.session_client import BrokerSession
from popgate_contract.trailer import unsent
from tests.conftest import BrokerHandle


async def held(stub: pb_grpc.BrokerStub) -> int:
    stats = await stub.Stats(pb.StatsRequest(topic="none"))
    return int(stats.held_pops + stats.held_notifications)


async def wait_for(predicate: object, within: float = 5) -> None:
    """Poll state that lives in the broker process, bounded by ``within`` seconds."""

    async def loop() -> None:
        while not await predicate():  # type: ignore[operator]  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    await asyncio.wait_for(loop(), within)


async def test_many_held_requests_on_one_stream_are_woken_and_cancelled(broker_without_sweep: BrokerHandle) -> None:
    broker = broker_without_sweep  # no safety sweep: only the Send wakes the held Pop and Notification

    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        session = BrokerSession(channel=channel).open()
        pops = [
            asyncio.ensure_future(
                session.pop(pb.PopRequest(topic="s", group="g", max_messages=1, invisible_ms=5000, poll_ms=20000))
            )
            for _ in range(50)
        ]
        note = asyncio.ensure_future(
            session.notification(pb.NotificationRequest(topic="s", group="other", poll_ms=20000))
        )
        await wait_for(lambda: _eq(held(stub), 51))
        await stub.Send(pb.SendRequest(messages=[pb.Message(topic="s", body=b"one")]))
        assert (await asyncio.wait_for(note, 5)).has_message
        done, _ = await asyncio.wait(pops, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert [m.stored.message.body for m in done.pop().result().messages] == [b"one"]
        # Cancelling one caller sends a cancel frame: the broker drops that held request at once.
        pending = [p for p in pops if not p.done()]
        pending[0].cancel()
        await wait_for(lambda: _eq(held(stub), 48))
        # Closing the stream drops everything still held on it.
        await session.close()
        await wait_for(lambda: _eq(held(stub), 0))
        for p in pending[1:]:
            with pytest.raises(grpc.aio.AioRpcError):
                await p


async def test_session_errors_look_like_unary_errors(broker: BrokerHandle) -> None:
    async with grpc.aio.insecure_channel(broker.address) as channel:
        session = BrokerSession(channel=channel).open()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await session.pop(pb.PopRequest(topic="s", group="g", max_messages=0, invisible_ms=5000))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(info.value.trailing_metadata())["popgate-error"] == "IllegalBatchSize"
        ok = await session.pop(pb.PopRequest(topic="s", group="g", max_messages=1, invisible_ms=5000))
        assert list(ok.messages) == []
        await session.close()


async def test_send_ack_and_change_invisible_on_the_stream_do_what_the_unary_calls_do(broker: BrokerHandle) -> None:
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        session = BrokerSession(channel=channel).open()
        # Tags SQLite's JSON must carry faithfully: quotes, escapes, non-BMP characters.
        tags = ["plain", 'q"uote\\', "naïve 😀"]
        sent = await asyncio.gather(
            *(
                session.send(pb.SendRequest(messages=[pb.Message(topic="ss", body=b"%d" % i, tag=t)]))
                for i, t in enumerate(tags)
            )
        )
        assert all(len(r.results) == 1 and r.results[0].message_id for r in sent)
        popped = await session.pop(pb.PopRequest(topic="ss", group="g", max_messages=32, invisible_ms=60000))
        assert sorted(m.stored.message.tag for m in popped.messages) == sorted(tags)
        first, *rest = popped.messages
        changed = await session.change_invisible(
            pb.ChangeInvisibleTimeRequest(topic="ss", group="g", receipt_handle=first.receipt_handle, invisible_ms=0)
        )
        assert changed.receipt_handle != first.receipt_handle
        acked = await session.ack(
            pb.AckRequest(topic="ss", group="g", receipt_handles=[m.receipt_handle for m in rest] + ["garbage"])
        )
        assert [r.ok for r in acked.results] == [True] * len(rest) + [False]
        again = await session.pop(pb.PopRequest(topic="ss", group="g", max_messages=32, invisible_ms=60000))
        assert [(m.stored.message.body, m.delivery_attempt) for m in again.messages] == [(first.stored.message.body, 2)]
        # What the stream stored is what a unary read sees.
        listed = await stub.ListMessages(pb.ListMessagesRequest(topic="ss", queue_id=0, limit=100))
        stats = await stub.Stats(pb.StatsRequest(topic="ss"))
        assert sum(q.max_offset - q.min_offset for q in stats.queues) == len(tags)
        assert all(m.message.topic == "ss" for m in listed.messages)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await session.send(pb.SendRequest(messages=[pb.Message(topic="ss", body=b"")]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await session.close()
    # After kill -9 the broker rebuilds its tag index from the store: each tag still selects its message.
    broker.restart(kill=True)
    for i, tag in enumerate(["plain", 'q"uote\\', "naïve 😀"]):
        got = broker.stub.Pop(pb.PopRequest(topic="ss", group=f"f{i}", filter=tag, max_messages=32, invisible_ms=60000))
        assert [m.stored.message.body for m in got.messages] == [b"%d" % i], tag


async def _eq(value: object, expected: int) -> bool:
    return await value == expected  # type: ignore[misc]


async def test_sigterm_ends_an_open_session_at_once_with_its_held_pop_answered(make_broker: object) -> None:
    """A proxy keeps its Session stream open for good: a stopping broker answers what is pending on it and ends
    it, instead of waiting out the whole shutdown grace (30 s here) with the stream still taking requests. Its held
    Pop and Notification say `closing`, so the proxy watches the other brokers rather than asking it again."""
    broker: BrokerHandle = make_broker("b1", "--shutdown-grace-s", "30")  # type: ignore[operator]

    async with grpc.aio.insecure_channel(broker.address) as channel:
        session = BrokerSession(channel=channel).open()
        await session.send(pb.SendRequest(messages=[pb.Message(topic="s", body=b"kept")]))
        held_pop = asyncio.ensure_future(
            session.pop(pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=5000, poll_ms=30000))
        )
        held_note = asyncio.ensure_future(
            session.notification(pb.NotificationRequest(topic="t", group="n", filter="*", poll_ms=30000))
        )
        stub = pb_grpc.BrokerStub(channel)

        async def holding() -> bool:
            return await held(stub) == 2

        await wait_for(holding, within=5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        stopping = loop.run_in_executor(None, broker.proc.stop)
        answered = await asyncio.wait_for(held_pop, 10)
        assert answered.messages == [] and answered.closing  # answered, not cut off, and said to be stopping
        noted = await asyncio.wait_for(held_note, 10)
        assert not noted.has_message and noted.closing
        with pytest.raises(grpc.aio.AioRpcError) as info:  # the stream ended: a new request is refused
            await asyncio.wait_for(session.send(pb.SendRequest(messages=[pb.Message(topic="s", body=b"late")])), 10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await asyncio.wait_for(stopping, 20) == 0
        assert loop.time() - started < 10  # well inside the 30 s grace
        await session.close()


async def test_a_lost_stream_says_which_requests_never_left(make_broker: object) -> None:
    """A request that was never written may be sent again (it cannot apply twice); one that was written may have
    been applied, and its error does not say it never left."""
    broker: BrokerHandle = make_broker("b1")  # type: ignore[operator]

    async with grpc.aio.insecure_channel("127.0.0.1:1") as nowhere:  # nothing listens: never connects
        session = BrokerSession(channel=nowhere).open()
        with pytest.raises(grpc.aio.AioRpcError) as never_left:
            await session.ack(pb.AckRequest(topic="t", group="g", receipt_handles=["h"]))
        await session.close()
    async with grpc.aio.insecure_channel(broker.address) as channel:
        session = BrokerSession(channel=channel).open()
        held_pop = asyncio.ensure_future(
            session.pop(pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=5000, poll_ms=30000))
        )
        stub = pb_grpc.BrokerStub(channel)

        async def holding() -> bool:
            return await held(stub) == 1

        await wait_for(holding, within=5)  # written: the broker holds it
        broker.proc.kill()
        with pytest.raises(grpc.aio.AioRpcError) as lost:
            await asyncio.wait_for(held_pop, 10)
        await session.close()
    assert (unsent(never_left.value), unsent(lost.value)) == (True, False)


async def test_a_request_reusing_a_pending_id_ends_the_stream(make_broker: object) -> None:
    """Answers name their request by id alone, so a second request under the id of one still pending would be taken
    for its answer: the broker ends the stream with INVALID_ARGUMENT instead, serving neither, keeping nothing."""
    broker: BrokerHandle = make_broker("b1")  # type: ignore[operator]
    held_pop = pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=5000, poll_ms=30000)
    send = pb.SendRequest(messages=[pb.Message(topic="t", body=b"under a reused id")])
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        call = stub.Session()
        await call.write(pb.SessionRequest(id=7, pop=held_pop))
        await wait_for(lambda: _eq(held(stub), 1))
        await call.write(pb.SessionRequest(id=7, send=send))
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call.read(), 10)
        assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request id 7 is already pending" in (ended.value.details() or "")
        await wait_for(lambda: _eq(held(stub), 0))
        assert (await stub.Pop(pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=5000))).messages == []


async def test_a_request_larger_than_the_broker_takes_fails_alone(make_broker: object) -> None:
    """A Send over the broker's --max-grpc-message-bytes (a proxy whose --max-body-bytes is above it) is refused
    alone, as its unary call would be: the stream and the other requests on it go on (a stream message over the
    limit would end the stream, every request on it failed and the broker taken for down)."""
    limits = ("--max-grpc-message-bytes", "1088KiB", "--max-pop-bytes", "1MiB", "--max-body-bytes", "1MiB")
    broker: BrokerHandle = make_broker("b1", *limits)  # type: ignore[operator]
    async with grpc.aio.insecure_channel(broker.address) as channel:
        session = BrokerSession(channel=channel).open()
        held_pop = asyncio.ensure_future(
            session.pop(pb.PopRequest(topic="t", group="g", max_messages=1, invisible_ms=5000, poll_ms=30000))
        )
        await wait_for(lambda: _eq(held(pb_grpc.BrokerStub(channel)), 1))
        big = pb.SendRequest(messages=[pb.Message(topic="t", body=bytes(1_600_000))])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(session.send(big), 10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (refused.value.details() or "")
        assert not held_pop.done() and not session.broken
        await session.send(pb.SendRequest(messages=[pb.Message(topic="t", body=b"small")]))
        got = await asyncio.wait_for(held_pop, 10)
        assert [m.stored.message.body for m in got.messages] == [b"small"]
        await session.close()


async def test_a_first_request_larger_than_the_broker_takes_fails_alone(make_broker: object) -> None:
    """The broker's size limit comes with the stream's initial metadata: a new stream writes nothing before it,
    so a first request over it is refused alone too, the stream going on for the next."""
    limits = ("--max-grpc-message-bytes", "1088KiB", "--max-pop-bytes", "1MiB", "--max-body-bytes", "1MiB")
    broker: BrokerHandle = make_broker("b1", *limits)  # type: ignore[operator]
    async with grpc.aio.insecure_channel(broker.address) as channel:
        session = BrokerSession(channel=channel).open()
        big = pb.SendRequest(messages=[pb.Message(topic="t", body=bytes(1_600_000))])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(session.send(big), 10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and not session.broken
        await session.send(pb.SendRequest(messages=[pb.Message(topic="t", body=b"small")]))
        await session.close()
