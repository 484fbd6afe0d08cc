"""The asyncio Producer and SimpleConsumer against a real 2-broker cluster."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from popgate_pb.v2 import service_pb2 as pb

from popgate import AckError, BadRequest, InvalidReceiptHandle, Message, MessageBodyTooLarge
from popgate.aio import Producer, SimpleConsumer
from tests.integration.sdk.conftest import LONG_INVISIBLE, given_back_attempts, record_batches

# Short polls: in longpoll mode the proxy holds a receive on one broker (rotating), so a poll that lands on a
# drained broker while the other still has messages waits its whole time (a "false empty", docs/ARCHITECTURE.md §3).
WAIT = 0.4


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def drain(consumer: SimpleConsumer, count: int, *, limit_s: float = 15.0, ack: bool = True) -> list[Message]:
    got: list[Message] = []
    async with asyncio.timeout(limit_s):
        while len(got) < count:
            batch = await consumer.receive(max=32, wait=WAIT)
            if batch and ack:
                await consumer.ack_many(batch)
            got += batch
    return got


async def test_send_receive_ack_and_fields(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    async with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, {topic: "*"}) as consumer:
        receipt = await producer.send(topic, "text body", tag="a", keys=["k"], properties={"p": "1"})
        [m] = await drain(consumer, 1)
    assert (m.message_id, m.body, m.tag, tuple(m.keys), dict(m.properties)) == (
        receipt.message_id,
        b"text body",
        "a",
        ("k",),
        {"p": "1"},
    )
    assert m.attempt == 1 and m.stored_at > 0


async def test_send_many_concurrently_and_ack_many(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    bodies = [f"a{i}".encode() for i in range(1100)]  # two SendMessage calls
    async with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        receipts = await producer.send_many(topic, bodies)
        got = await drain(consumer, len(bodies), limit_s=60)
    assert len({r.message_id for r in receipts}) == len(bodies)
    assert sorted(m.body for m in got) == sorted(bodies)


async def test_a_failed_send_many_says_which_messages_are_stored(endpoint: str) -> None:
    """A message group: the calls go one after another, so the first (two 3 MiB bodies) is stored before the
    second (over the 4 MiB body limit) is refused; the error's receipts name the stored ones."""
    topic, group = name("t"), name("g")
    mib = 1024 * 1024
    bodies = [b"a" * 3 * mib, b"b" * 3 * mib, b"z" * (4 * mib + 1)]
    async with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        with pytest.raises(MessageBodyTooLarge) as caught:
            await producer.send_many(topic, bodies, message_group="g1")
        receipts = caught.value.receipts
        assert receipts is not None and len(receipts) == 3
        first, second, refused = receipts
        assert first is not None and second is not None and refused is None
        got = await drain(consumer, 2, limit_s=30)
        # Concurrent calls: the refused call's messages are None; a call cancelled on its way may be too.
        with pytest.raises(MessageBodyTooLarge) as caught:
            await producer.send_many(topic, bodies)
        assert caught.value.receipts is not None and len(caught.value.receipts) == 3
        assert caught.value.receipts[2] is None
    assert [m.message_id for m in got] == [first.message_id, second.message_id]


async def test_ack_many_reports_a_refused_call_per_message_and_still_acks_the_other_topics(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    async with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        await producer.send(topic, b"good")
        [good] = await drain(consumer, 1, ack=False)
        bad = Message(b"x", topic="no such topic!", message_id="m-bad", receipt_handle=good.receipt_handle)
        with pytest.raises(AckError) as caught:
            await consumer.ack_many([bad, good])
        assert [(m, type(e)) for m, e in caught.value.failures] == [("m-bad", BadRequest)]
        with pytest.raises(InvalidReceiptHandle):
            await consumer.ack(good)  # acked already by ack_many


async def test_nack_stale_ack_and_dlq(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    async with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        await producer.send_many(topic, [b"nack me", b"dead"])
        got = {m.body: m for m in await drain(consumer, 2, ack=False)}
        first = got[b"nack me"]
        old = Message(first.body, topic=first.topic, message_id=first.message_id, receipt_handle=first.receipt_handle)
        started = time.monotonic()
        await consumer.nack(first, 0.3)
        [again] = await drain(consumer, 1, ack=False)
        assert again.attempt == 2 and time.monotonic() - started >= 0.25
        with pytest.raises(InvalidReceiptHandle):
            await consumer.ack(old)
        with pytest.raises(AckError):
            await consumer.ack_many([old, again])  # `again` is acked, `old` is not
        await consumer.forward_to_dlq(got[b"dead"])
    async with SimpleConsumer(endpoint, name("r"), f"%DLQ%{group}") as dlq:
        [dead] = await drain(dlq, 1)
    assert dead.body == b"dead" and dead.properties["ORIGIN_TOPIC"] == topic


async def test_async_iteration_until_closed(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    consumer = SimpleConsumer(endpoint, group, topic, wait=2.0)
    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def iterate() -> None:
        async for message in consumer:
            await consumer.ack(message)
            seen.put_nowait(message.body)

    task = asyncio.create_task(iterate())
    async with Producer(endpoint) as producer:
        for i in range(3):
            await producer.send(topic, f"n{i}".encode())
            async with asyncio.timeout(10):
                assert await seen.get() == f"n{i}".encode()
    await consumer.close()
    async with asyncio.timeout(10):
        await task  # the iteration ends cleanly when the consumer closes
    assert seen.empty()


@pytest.mark.parametrize("close", [False, True], ids=["used-on", "closed-at-once"])
async def test_leaving_async_for_gives_the_rest_of_the_batch_back_at_once(endpoint: str, close: bool) -> None:
    """`break`, then the consumer is used on (the loop closes the iteration in a task of its own), or closed at
    once by its `async with` as in docs/SDK.md. Before, the rest of the batch stayed invisible for 60 s."""
    topic, group = name("t"), name("g")
    async with Producer(endpoint) as producer:
        sent = await producer.send_many(topic, [b"m%d" % i for i in range(10)])
    async with SimpleConsumer(endpoint, group, topic, invisible=LONG_INVISIBLE, wait=2.0) as consumer:
        batches = record_batches(consumer)
        async for message in consumer:  # batches of up to 16: the first one holds several
            await consumer.ack(message)
            break
        if not close:
            rest = await drain(consumer, len(sent) - 1)  # 15 s at most
    if close:
        async with SimpleConsumer(endpoint, group, topic) as other:
            rest = await drain(other, len(sent) - 1)
    [batch] = batches[:1]
    assert len(batch) > 1 and message is batch[0]
    assert {m.message_id: m.attempt for m in rest} == given_back_attempts(sent, [message], batch[1:])


class CancelledAfterFirstMessage:
    """A consumer's stub whose receive cancels its task once it has read a frame with messages: a receive
    cancelled (a timeout, a task group ending) while its answer comes in. Either framing: v2's ReceiveMessage or
    popgate's ReceiveMessages."""

    def __init__(self, stub: Any) -> None:
        self.stub = stub

    def __getattr__(self, method: str) -> Any:
        return getattr(self.stub, method)

    def _cancelling(self, call: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async def frames() -> AsyncIterator[Any]:
            async for frame in call:
                if frame.WhichOneof("content") in ("message", "messages"):
                    asyncio.current_task().cancel()  # type: ignore[union-attr]
                yield frame

        return frames()

    def ReceiveMessage(self, *args: Any, **kwargs: Any) -> AsyncIterator[pb.ReceiveMessageResponse]:
        return self._cancelling(self.stub.ReceiveMessage(*args, **kwargs))

    def ReceiveMessages(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self._cancelling(self.stub.ReceiveMessages(*args, **kwargs))


class CancellingChannel:
    """A channel whose Session streams cancel the receiving task once they have read a frame with messages: a
    receive on the Session stream cancelled while its answer comes in."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self.channel, name)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        start = self.channel.stream_stream(*args, **kwargs)
        return lambda **options: CancellingCall(start(**options))


class CancellingCall:
    def __init__(self, call: Any) -> None:
        self.call = call
        self.receiving: asyncio.Task[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.call, name)

    async def read(self) -> Any:
        response = await self.call.read()
        if self.receiving is not None and response.receive.WhichOneof("content") == "messages":
            self.receiving.cancel()
            self.receiving = None
        return response


@pytest.mark.parametrize("path", ["session", "batch", "v2"])
async def test_a_receive_cancelled_mid_answer_gives_back_the_messages_it_had_read(endpoint: str, path: str) -> None:
    """A message whose frame a cancelled receive had read does not stay invisible for `invisible` (60 s here)."""
    topic, group = name("t"), name("g")
    async with SimpleConsumer(endpoint, group, topic, invisible=LONG_INVISIBLE) as consumer:
        if path == "session":
            _ = consumer._stub
            consumer._channel = CancellingChannel(consumer._channel)  # type: ignore[assignment]
            await consumer.receive(max=1, wait=0)  # the stream opens
            stream = consumer._session._call  # type: ignore[union-attr]
        else:
            consumer._session_served, consumer._batch_receive = False, path == "batch"
            stub, attribute = (consumer._ext_stub, "_ext_stub_") if path == "batch" else (consumer._stub, "_stub_")
            setattr(consumer, attribute, CancelledAfterFirstMessage(stub))
        async with Producer(endpoint) as producer:
            sent = await producer.send(topic, b"read, then cancelled")
        # The message is there already: a long wait only keeps a slow machine from answering empty first.
        receive = asyncio.create_task(consumer.receive(wait=10.0))
        if path == "session":
            stream.receiving = receive
        with pytest.raises(asyncio.CancelledError):
            await receive
        if path != "session":
            setattr(consumer, attribute, stub)
        [back] = await drain(consumer, 1)  # 15 s at most
    # Given back by whichever comes first: the SDK's nack (attempt 2), or the proxy, which gives back an answer
    # its client left before the end (attempt unchanged; the SDK's nack then finds the handle stale).
    assert back.message_id == sent.message_id and back.attempt in (1, 2)


async def test_bad_request_is_typed(endpoint: str) -> None:
    async with Producer(endpoint) as producer:
        with pytest.raises(BadRequest) as bad:
            await producer.send("bad topic!", b"x")
    assert bad.value.code_name == "ILLEGAL_TOPIC" and not bad.value.retriable


async def test_deliver_at_holds_the_message_back_until_that_time(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    async with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        deliver_at = time.time() + 1.5
        await producer.send(topic, b"at a time", deliver_at=deliver_at)
        early = await consumer.receive(max=1, wait=0.5)
        # Nothing before its time (on a machine so slow that this receive ended after it, anything may come).
        assert early == [] or time.time() >= deliver_at, [m.body for m in early]
        [message] = await drain(consumer, 1, limit_s=20)  # polls past the due time
    assert message.body == b"at a time" and time.time() >= deliver_at - 0.05


def test_a_client_kept_across_event_loops_closes_each_loops_connection(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection left open by a loop's end keeps grpc handing events to the closed loop, which the next loops
    report as errors ('Event loop is closed') on the `asyncio` logger."""
    topic = name("t")
    producer = Producer(endpoint)
    consumer = SimpleConsumer(endpoint, name("g"), topic)

    async def use() -> None:
        await producer.send(topic, b"x")
        await consumer.receive(max=1, wait=0)
        await asyncio.sleep(0.2)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(5):
            asyncio.run(use())
    asyncio.run(producer.close())
    asyncio.run(consumer.close())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_client_carries_on_in_a_new_event_loop_once_its_first_loop_is_closed(endpoint: str) -> None:
    """One client across asyncio.run calls (a module-level client with a loop per test): its channel died with the
    first loop, so the next loop gets a new one (it failed with a raw 'Event loop is closed' RuntimeError)."""
    topic = name("t")
    producer = Producer(endpoint)

    async def send() -> str:
        return (await producer.send(topic, b"x")).message_id

    first, second = asyncio.run(send()), asyncio.run(send())
    assert first and second and first != second

    async def from_another_running_loop() -> None:  # while the first loop still runs: refused, and said why
        with pytest.raises(RuntimeError, match="one client per event loop"):
            await send()

    async def both() -> None:
        await send()  # bound to this loop now
        await asyncio.to_thread(asyncio.run, from_another_running_loop())
        await producer.close()

    asyncio.run(both())
