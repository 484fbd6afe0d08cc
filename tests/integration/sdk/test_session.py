"""The Session stream between popgate.aio and real proxies (proto/ext/messaging.proto, proxy/v2/session.py): the
SDK's requests ride one stream where the proxy serves it and its unary calls where it does not (--no-batch-receive,
as a RocketMQ proxy); the stream answers each request with its v2 status, gives back what a closed stream cut off,
and keeps the proxy's bounds."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import AckError, BadRequest, Message, MessageBodyTooLarge, Unauthorized, aio
from popgate._session import METHOD
from popgate.cli.cluster import Cluster
from tests.integration.sdk.conftest import name
from tests.procs import secured_cluster


async def drain(consumer: aio.SimpleConsumer, count: int, *, within_s: float = 15.0) -> list[Message]:
    got: list[Message] = []
    async with asyncio.timeout(within_s):
        while len(got) < count:
            batch = await consumer.receive(max=32, wait=0.4)
            await consumer.ack_many(batch)
            got += batch
    return got


@pytest.mark.parametrize("path", ["session", "unary"])
async def test_sends_receives_acks_and_nacks_take_the_stream_or_the_unary_calls(
    path: str, endpoint: str, v2_only: str
) -> None:
    target = endpoint if path == "session" else v2_only
    topic, group = name("t"), name("g")
    async with aio.Producer(target) as producer, aio.SimpleConsumer(target, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        sent = await producer.send_many(topic, [f"m{i}".encode() for i in range(70)])
        nacked = (await producer.send(topic, b"again")).message_id
        got = await drain(consumer, 70)  # the nacked one too, acked below once it comes back
        first = next(m for m in got if m.message_id == nacked)
        assert sorted(m.message_id for m in got) == sorted([r.message_id for r in sent] + [nacked])
        await producer.send(topic, b"late")
        async with asyncio.timeout(15):
            while not (late := await consumer.receive(max=1, wait=0.4)):
                pass
        await consumer.nack(late[0])
        async with asyncio.timeout(15):
            while not (again := await consumer.receive(max=1, wait=0.4)):
                pass
        await consumer.ack(again[0])
        served = (producer._session_served, consumer._session_served)
    assert served == ((True, True) if path == "session" else (False, False))
    assert (first.attempt, again[0].message_id, again[0].attempt) == (1, late[0].message_id, 2)


@pytest.mark.parametrize("path", ["session", "unary"])
async def test_transactions_end_over_the_session_stream(path: str, endpoint: str, v2_only: str) -> None:
    """A transaction's commit or rollback is a frame on the Session stream where the proxy serves it, the
    EndTransaction call where it does not: committed messages delivered, rolled-back ones never."""
    target = endpoint if path == "session" else v2_only
    topic, group = name("t"), name("g")
    async with aio.Producer(target) as producer, aio.SimpleConsumer(target, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        async with producer.transaction() as tx:
            await tx.send(topic, b"committed")
        with pytest.raises(RuntimeError):
            async with producer.transaction() as tx:
                await tx.send(topic, b"rolled back")
                raise RuntimeError("the local work failed")
        async with producer.transaction() as tx:
            await tx.send(topic, b"committed too")
        got = await drain(consumer, 2)
        assert sorted(m.body for m in got) == [b"committed", b"committed too"]
        assert await consumer.receive(max=32, wait=0.5) == []  # the rolled-back one never comes
        served = producer._ends_served
    assert served is (True if path == "session" else None)


async def test_a_body_over_the_grpc_limit_is_too_large_and_the_stream_serves_on(endpoint: str) -> None:
    topic = name("t")
    async with aio.Producer(endpoint) as producer:
        await producer.send(topic, b"first")  # the stream is open
        with pytest.raises(MessageBodyTooLarge) as caught:
            await producer.send(topic, b"x" * (64 * 1024 * 1024 + 1))  # as the unary call is refused by gRPC
        await producer.send(topic, b"after")
        served = producer._session_served
    assert (caught.value.code_name, caught.value.retriable, served) == ("RESOURCE_EXHAUSTED", False, True)


async def test_a_body_past_a_proxys_lower_message_limit_fails_alone_on_a_stream_that_serves_on(
    cluster: Cluster,
) -> None:
    """A proxy run with a message limit below gRPC's says it in its Session headers: a send past it fails at once,
    not retriable (as its unary call would), and the stream it would have ended serves the next send."""
    endpoint = cluster.add_proxy(extra=("--max-message-bytes", "1MiB", "--max-body-bytes", "512KiB"))
    topic = name("t")
    try:
        async with aio.Producer(endpoint) as producer:
            await producer.send(topic, b"first")
            stream = producer._session
            with pytest.raises(MessageBodyTooLarge) as caught:
                await producer.send(topic, b"x" * (2 * 1024 * 1024))
            await producer.send(topic, b"after")
            same = producer._session is stream
    finally:
        cluster.proxies.pop().stop()
    assert (caught.value.code_name, caught.value.retriable, same) == ("RESOURCE_EXHAUSTED", False, True)
    assert "the proxy's message limit (1048576)" in caught.value.message


def session_call(
    target: str, metadata: tuple[tuple[str, str], ...] = (), options: tuple[tuple[str, int], ...] = ()
) -> tuple[grpc.aio.Channel, object]:
    channel = grpc.aio.insecure_channel(target, options=options)
    stream = channel.stream_stream(
        METHOD,
        request_serializer=ext.SessionRequest.SerializeToString,
        response_deserializer=ext.SessionResponse.FromString,
    )
    return channel, stream(metadata=metadata)


def receive(
    topic: str, group: str, *, batch: int = 32, invisible_s: int = 60, poll_s: int = 0
) -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=batch,
    )
    request.invisible_duration.seconds = invisible_s
    request.long_polling_timeout.seconds = poll_s
    return request


async def answers(call: object, count: int) -> AsyncIterator[ext.SessionResponse]:
    """The next `count` answers, each alone: answers queued together may share a stream message (`more`)."""
    async with asyncio.timeout(15):
        while count > 0:
            message = await call.read()  # type: ignore[attr-defined]
            for answer in (message, *message.more):
                count -= 1
                yield answer


def send_of_one(topic: str) -> pb.SendMessageRequest:
    message = v2.Message(topic=v2.Resource(name=topic), body=b"x")
    message.system_properties.message_id = "01" + uuid.uuid4().hex.upper()
    return pb.SendMessageRequest(messages=[message])


async def test_bad_input_on_one_request_is_its_v2_status_while_the_stream_serves_the_others(endpoint: str) -> None:
    send = send_of_one(name("t"))
    channel, call = session_call(endpoint)
    async with channel:
        await call.write(ext.SessionRequest(id=1, timeout_ms=5000, ack=pb.AckMessageRequest()))  # no group, no topic
        await call.write(ext.SessionRequest(id=2))  # no body
        await call.write(ext.SessionRequest(id=3, timeout_ms=5000, send=send))
        got = {a.id: a async for a in answers(call, 3)}
    assert got[1].ack.status.code == v2.ILLEGAL_CONSUMER_GROUP  # as AckMessage answers it
    assert got[2].status.code == v2.BAD_REQUEST
    assert got[3].send.status.code == v2.OK


async def test_a_stream_closed_mid_receive_gives_its_messages_back(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as other:
        await other.receive(max=1, wait=0.2)
        # Large enough an answer that HTTP/2 flow control holds it while the client reads no further than its first
        # frame: the stream closes before the answer's status could be written. The client's stream window stays
        # at 64 KiB (no BDP probing), whatever the machine's load lets grpc grow it to otherwise.
        sent = [(await producer.send(topic, bytes(512 * 1024))).message_id for _ in range(24)]
        small_window = (("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 64 * 1024))
        channel, call = session_call(endpoint, options=small_window)
        async with channel:
            await call.write(ext.SessionRequest(id=1, timeout_ms=10_000, receive=receive(topic, group, poll_s=1)))
            first = await asyncio.wait_for(call.read(), 15)  # type: ignore[attr-defined]
            assert first.receive.WhichOneof("content") == "messages"
            call.cancel()  # type: ignore[attr-defined]
        # Invisible for 60 s had they not been given back: received again at once by the other consumer.
        got = await drain(other, len(sent), within_s=20)
    assert sorted(m.message_id for m in got) == sorted(sent)


async def test_a_receive_answer_and_its_status_come_in_one_message(endpoint: str) -> None:
    # One read gets the whole answer: the messages and their OK status are one stream message (`more`), not two
    # writes one after the other, and the stream's other answers are not in between.
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)
        sent = [r.message_id for r in await producer.send_many(topic, [f"m{i}".encode() for i in range(5)])]
    channel, call = session_call(endpoint)
    async with channel:
        await call.write(ext.SessionRequest(id=7, timeout_ms=10_000, receive=receive(topic, group, poll_s=1)))
        got = await asyncio.wait_for(call.read(), 15)  # type: ignore[attr-defined]
    entries = [got, *got.more]
    assert [(e.id, e.receive.WhichOneof("content")) for e in entries] == [(7, "messages"), (7, "status")]
    assert sorted(m.system_properties.message_id for m in got.receive.messages.messages) == sorted(sent)
    assert got.more[0].receive.status.code == v2.OK


async def test_receives_past_the_proxys_bound_are_answered_too_many(cluster: Cluster) -> None:
    target = cluster.add_proxy(extra=("--max-held-receives", "2"))
    try:
        topic, group = name("t"), name("g")
        channel, call = session_call(target)
        async with channel:
            for request_id in (1, 2, 3):  # held: nothing to receive
                request = ext.SessionRequest(id=request_id, timeout_ms=20_000, receive=receive(topic, group, poll_s=10))
                await call.write(request)
            [third] = [a async for a in answers(call, 1)]
            assert (third.id, third.receive.status.code) == (3, v2.TOO_MANY_REQUESTS)
            await call.write(ext.SessionRequest(id=1, cancel=True))  # a held one cancelled: its place is free again
            await call.write(ext.SessionRequest(id=4, timeout_ms=5000, receive=receive(topic, group, poll_s=0)))
            [fourth] = [a async for a in answers(call, 1)]
            assert (fourth.id, fourth.receive.status.code) == (4, v2.MESSAGE_NOT_FOUND)
    finally:
        cluster.proxies.pop().stop()


ACL = """
broker_token = "broker-secret"
min_invisible_s = 1

[[acl]]
access_key = "alice"
secret_key = "alice-secret-0123456"
publish = ["auth-*"]
subscribe = ["auth-*"]
groups = ["billing"]
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with secured_cluster(tmp_path_factory.mktemp("session-auth"), ACL) as started:
        yield started.endpoint


async def test_a_wrong_signature_refuses_the_stream(secured: str) -> None:
    async with aio.Producer(secured, access_key="alice", secret_key="wrong") as producer:
        with pytest.raises(Unauthorized) as caught:
            await producer.send("auth-x", b"x")
    assert caught.value.code == v2.UNAUTHORIZED  # as the unary call answers it


async def test_an_account_is_authorized_per_request_on_its_stream(secured: str) -> None:
    alice = {"access_key": "alice", "secret_key": "alice-secret-0123456"}
    topic = name("auth")
    async with aio.Producer(secured, **alice) as producer, aio.SimpleConsumer(secured, "billing", topic, **alice) as c:
        await c.receive(max=1, wait=0.2)
        await producer.send(topic, b"allowed")
        with pytest.raises(Unauthorized) as caught:
            await producer.send(name("other"), b"not allowed")
        await producer.send(topic, b"allowed too")  # the same stream serves on
        got = await drain(c, 2)
        served = (producer._session_served, c._session_served)
    assert (caught.value.code, served) == (v2.FORBIDDEN, (True, True))
    assert sorted(m.body for m in got) == [b"allowed", b"allowed too"]


async def test_a_client_that_ends_its_side_still_gets_its_answers(endpoint: str) -> None:
    # done_writing() is a half-close: the requests sent before it are served and answered, then the stream ends.
    channel, call = session_call(endpoint)
    async with channel:
        await call.write(ext.SessionRequest(id=1, timeout_ms=5000, send=send_of_one(name("t"))))
        await call.done_writing()  # type: ignore[attr-defined]
        answer = await asyncio.wait_for(call.read(), 15)  # type: ignore[attr-defined]
        end = await asyncio.wait_for(call.read(), 15)  # type: ignore[attr-defined]
    assert (answer.id, answer.send.status.code, end) == (1, v2.OK, grpc.aio.EOF)


async def test_concurrent_sends_each_get_their_own_outcome_when_one_is_refused(endpoint: str) -> None:
    # Sends queued together go as one request (sdk/_joining.py): a message the proxy refuses fails its own send only.
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        too_late = time.time() + 2 * 86400  # the SDK allows 7 days; the proxy's default --max-delay-s is a day
        outcomes = await asyncio.gather(
            producer.send(topic, b"refused", deliver_at=too_late),
            *(producer.send_many(topic, [f"{i}-{j}".encode() for j in range(3)]) for i in range(4)),
            return_exceptions=True,
        )
        got = await drain(consumer, 12)
    refused, *sent = outcomes
    assert isinstance(refused, BadRequest) and "longest delay" in str(refused)
    assert all(isinstance(receipts, list) and len(receipts) == 3 for receipts in sent)
    assert sorted(m.body for m in got) == sorted(f"{i}-{j}".encode() for i in range(4) for j in range(3))


async def test_concurrent_acks_each_get_their_own_outcome(endpoint: str) -> None:
    # Acks of one topic and group queued together go as one request (sdk/_joining.py): a stale handle fails its own
    # ack_many only, and every other message is acked (not delivered again once its invisible time is over).
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: there before the sends
        await producer.send_many(topic, [f"m{i}".encode() for i in range(7)])
        got: list[Message] = []
        async with asyncio.timeout(15):
            while len(got) < 7:
                got += await consumer.receive(max=32, invisible=1.0, wait=0.4)
        stale = got[0]
        await consumer.ack(stale)  # its handle is stale from now on
        outcomes = await asyncio.gather(
            consumer.ack_many([stale]),
            *(consumer.ack_many(got[i : i + 2]) for i in range(1, 7, 2)),
            return_exceptions=True,
        )
        await asyncio.sleep(1.5)  # past the invisible time: what was not acked would come again
        again = await consumer.receive(max=32, wait=0.5)
    failed, *acked = outcomes
    assert isinstance(failed, AckError) and [m for m, _ in failed.failures] == [stale.message_id]
    assert acked == [None, None, None]
    assert again == []


async def test_a_request_reusing_a_pending_id_ends_the_stream(endpoint: str) -> None:
    """Answers name their request by id alone: a second request under the id of a held receive would be taken for
    its answer. The stream ends with INVALID_ARGUMENT instead, and the send under the reused id is not stored."""
    topic, group = name("t"), name("g")
    async with aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await consumer.receive(max=1, wait=0.2)
        channel, call = session_call(endpoint)
        async with channel:
            await call.write(ext.SessionRequest(id=7, timeout_ms=30_000, receive=receive(topic, group, poll_s=20)))
            await call.write(ext.SessionRequest(id=7, timeout_ms=5000, send=send_of_one(topic)))
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await asyncio.wait_for(call.read(), 15)  # type: ignore[attr-defined]
        assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request id 7 is already pending" in (ended.value.details() or "")
        assert await consumer.receive(max=1, wait=0.5) == []
