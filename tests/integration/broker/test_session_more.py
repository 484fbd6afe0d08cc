"""A real broker and the proxy's Session client join what they have queued into one stream message both ways
(`more`), and an older caller, which does not say it reads joined answers, gets each answer alone."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

from popgate_contract.session_client import METHOD, BrokerSession
from tests.conftest import BrokerHandle


class Counted:
    """A Session call that counts the stream messages and the entries going each way."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.written = self.written_entries = self.read = self.read_entries = 0

    async def write(self, message: bytes) -> None:
        self.written += 1
        self.written_entries += len(pb.SessionRequest.FromString(message).more) + 1
        await self.call.write(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.call, name)

    def __aiter__(self) -> Counted:
        self.reading = self.call.__aiter__()
        return self

    async def __anext__(self) -> pb.SessionResponse:
        response: pb.SessionResponse = await self.reading.__anext__()
        self.read += 1
        self.read_entries += len(response.more) + 1
        return response


class CountingChannel:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.call: Counted | None = None

    def stream_stream(self, method: str, **kwargs: Any) -> Any:
        open_call = self.channel.stream_stream(method, **kwargs)

        def counted(**call_kwargs: Any) -> Counted:
            self.call = Counted(open_call(**call_kwargs))
            return self.call

        return counted


async def test_many_concurrent_sends_pops_and_acks_are_joined_both_ways_and_all_answered(broker: BrokerHandle) -> None:
    async with grpc.aio.insecure_channel(broker.address) as channel:
        counting = CountingChannel(channel)
        session = BrokerSession(channel=counting).open()  # type: ignore[arg-type]
        await session.send(pb.SendRequest(messages=[pb.Message(topic="j", body=b"first")]))  # metadata seen
        bodies = [f"m{i}".encode() for i in range(400)]
        sent = await asyncio.gather(
            *(session.send(pb.SendRequest(messages=[pb.Message(topic="j", body=body)])) for body in bodies)
        )
        assert all(len(s.results) == 1 for s in sent)
        popped = await asyncio.gather(
            *(session.pop(pb.PopRequest(topic="j", group="g", max_messages=8, invisible_ms=60_000)) for _ in range(60))
        )
        messages = [m for p in popped for m in p.messages]
        assert sorted(m.stored.message.body for m in messages) == sorted([b"first", *bodies])
        acked = await asyncio.gather(
            *(session.ack(pb.AckRequest(topic="j", group="g", receipt_handles=[m.receipt_handle])) for m in messages)
        )
        results = [(r.receipt_handle, r.ok) for a in acked for r in a.results]
        assert results == [(m.receipt_handle, True) for m in messages]
        left = await session.pop(pb.PopRequest(topic="j", group="g", max_messages=32, invisible_ms=1_000))
        assert list(left.messages) == []  # every one acked
        call = counting.call
        assert call is not None
        assert call.written < call.written_entries  # requests joined
        assert call.read < call.read_entries  # answers joined
        await session.close()


async def test_a_caller_that_does_not_say_it_reads_joined_answers_gets_each_alone(broker: BrokerHandle) -> None:
    async with grpc.aio.insecure_channel(broker.address) as channel:
        call = pb_grpc.BrokerStub(channel).Session()  # an older proxy: no metadata
        assert METHOD.endswith("/Session")
        for i in range(1, 101):
            await call.write(pb.SessionRequest(id=i, send=pb.SendRequest(messages=[pb.Message(topic="o", body=b"x")])))
        answers: list[pb.SessionResponse] = []
        async for response in call:
            answers.append(response)
            if len(answers) == 100:
                break
        assert sorted(a.id for a in answers) == list(range(1, 101))
        assert all(not a.more for a in answers)
        call.cancel()
