"""The proxy's Session stream (proxy/v2/session.py) driven without a gRPC server: a real servicer over fake brokers,
requests fed as the stream's iterator, answers taken from the context's writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from prometheus_client import CollectorRegistry

from popgate_contract.session_headers import receive_batch_of
from proxy.auth import Account, authorization
from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.receive.notify_driver import NotifyStrategy
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.v2 import session
from proxy.v2.context import endpoints_for
from proxy.v2.receive import JOINED_RECEIVES
from proxy.v2.service import MessagingService
from tests.unit.proxy.fakes import FakeBroker, handle, popped


class Aborted(Exception):
    pass


class StreamContext:
    """What the Session reads of a grpc.aio context, and what it writes to it."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.metadata = metadata
        self.written: list[ext.SessionResponse] = []
        self.aborted: Any = None
        self.headers: tuple[tuple[str, str], ...] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def send_initial_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.headers = metadata

    @property
    def answers(self) -> list[ext.SessionResponse]:
        """Every answer written, in order: several may share one stream message (`more`)."""
        return [answer for message in self.written for answer in (message, *message.more)]

    async def write(self, message: bytes) -> None:
        """As grpc writes it: bytes as they are (proxy/server.py's PassBytes)."""
        self.written.append(ext.SessionResponse.FromString(message))

    async def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise Aborted(details)


def service_over(broker: FakeBroker, settings: Settings | None = None) -> tuple[MessagingService, ProxyMetrics]:
    metrics = ProxyMetrics(CollectorRegistry())
    pool = BrokerPool({broker.name: broker}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics)
    settings = settings or Settings(brokers=(BrokerAddress(broker.name, "127.0.0.1:1"),))
    return MessagingService(proxy, settings, endpoints_for("127.0.0.1:8081"), metrics), metrics


def receive_request(poll_s: int = 0) -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=8)
    request.message_queue.topic.name = "t"
    request.long_polling_timeout.seconds = poll_s
    return request


def send_request() -> pb.SendMessageRequest:
    message = v2.Message(topic=v2.Resource(name="t"), body=b"x")
    message.system_properties.message_id = "01AB"
    message.system_properties.message_type = v2.NORMAL
    return pb.SendMessageRequest(messages=[message])


async def stream(*requests: ext.SessionRequest, until: asyncio.Event) -> AsyncIterator[ext.SessionRequest]:
    for request in requests:
        yield request
    await until.wait()  # the client keeps its side open until told


async def serve_until(
    context: StreamContext, service: MessagingService, requests: list[ext.SessionRequest], answers: int
) -> None:
    """Serve a stream of `requests` until `answers` frames were written (bounded), then end it."""
    done = asyncio.Event()
    task = asyncio.ensure_future(session.serve(service, stream(*requests, until=done), context))
    for _ in range(200):
        if len(context.answers) >= answers:
            break
        await asyncio.sleep(0.01)
    done.set()
    await asyncio.wait_for(task, 5)


async def test_a_request_without_a_body_is_answered_with_a_status_and_the_stream_serves_the_others() -> None:
    service, metrics = service_over(FakeBroker("b1"))
    context = StreamContext()
    requests = [ext.SessionRequest(id=1), ext.SessionRequest(id=2, timeout_ms=3000, send=send_request())]
    await serve_until(context, service, requests, answers=2)
    by_id = {r.id: r for r in context.answers}
    assert by_id[1].status.code == v2.BAD_REQUEST
    assert (by_id[2].WhichOneof("body"), by_id[2].send.status.code) == ("send", v2.OK)
    labels = {"method": "SendMessage", "code": "OK"}  # the unary RPC's metric
    assert metrics.registry.get_sample_value("popgate_proxy_rpc_duration_seconds_count", labels) == 1.0


async def test_a_receive_is_answered_with_its_messages_then_its_status() -> None:
    broker = FakeBroker("b1")
    broker.ready = [popped("b1", "m1"), popped("b1", "m2")]
    service, _ = service_over(broker)
    context = StreamContext()
    await serve_until(context, service, [ext.SessionRequest(id=7, timeout_ms=3000, receive=receive_request())], 2)
    kinds = [(r.id, r.receive.WhichOneof("content")) for r in context.answers]
    assert kinds == [(7, "messages"), (7, "status")]
    assert [m.system_properties.message_id for m in context.answers[0].receive.messages.messages] == ["m1", "m2"]
    assert context.answers[1].receive.status.code == v2.OK


async def test_a_receive_standing_for_several_asks_its_broker_one_receives_worth_of_fifo_messages() -> None:
    """The stream's headers say how many messages a joined receive may ask; one saying one receive's batch
    (`max_fifo`) may ask that many, and its broker's Pop takes at most `max_fifo` FIFO messages."""
    broker = FakeBroker("b1")
    broker.ready = [popped("b1", "m1")]
    service, _ = service_over(broker)
    context = StreamContext()
    joined = receive_request()
    joined.batch_size = 64
    await serve_until(context, service, [ext.SessionRequest(id=4, timeout_ms=3000, receive=joined, max_fifo=32)], 2)
    assert receive_batch_of(context.headers) == 32 * JOINED_RECEIVES
    assert context.answers[-1].receive.status.code == v2.OK
    assert [(p.max_messages, p.max_fifo) for p in broker.pops] == [(64, 32)]


async def test_a_bad_receive_is_answered_with_its_v2_status() -> None:
    service, _ = service_over(FakeBroker("b1"))
    context = StreamContext()
    bad = receive_request()
    bad.batch_size = 0
    await serve_until(context, service, [ext.SessionRequest(id=3, receive=bad)], 1)
    [answer] = context.answers
    assert (answer.id, answer.receive.status.code) == (3, v2.BAD_REQUEST)


def ack_request(*tokens: str) -> pb.AckMessageRequest:
    entries = [pb.AckMessageEntry(message_id=f"m-{t}", receipt_handle=handle("b1", token=t)) for t in tokens]
    return pb.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="t"), entries=entries)


async def test_an_ack_on_the_stream_answers_ok_without_its_entries_and_a_failure_with_them() -> None:
    # The SDK reads an ack answer's entries only when its status is not OK (popgate._wire.ack_failures); the v2
    # AckMessage call keeps them always, as the official clients read them.
    broker = FakeBroker("b1")
    service, _ = service_over(broker)
    context = StreamContext()
    acked = ext.SessionRequest(id=1, timeout_ms=3000, ack=ack_request("ab", "cd"))
    partly = ext.SessionRequest(id=2, timeout_ms=3000, ack=ack_request("ef", "5a1e"))  # 5a1e: a stale handle
    await serve_until(context, service, [acked, partly], 2)
    by_id = {r.id: r.ack for r in context.answers}
    assert by_id[1] == pb.AckMessageResponse(status=v2.Status(code=v2.OK, message="OK"))
    assert by_id[2].status.code == v2.MULTIPLE_RESULTS
    assert [(e.message_id, e.status.code) for e in by_id[2].entries] == [
        ("m-ef", v2.OK),
        ("m-5a1e", v2.INVALID_RECEIPT_HANDLE),
    ]
    call = SimpleNamespace(invocation_metadata=lambda: (), time_remaining=lambda: 3.0)  # a unary call's context
    unary = await service.AckMessage(ack_request("12"), call)
    assert [(e.message_id, e.status.code) for e in unary.entries] == [("m-12", v2.OK)]
    assert [len(r.receipt_handles) for r in broker.acks] == [2, 2, 1]


async def test_a_wrong_signature_refuses_the_stream_before_any_request() -> None:
    account = Account("ak", "sk", publish=("*",))
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),), accounts=(account,))
    service, _ = service_over(FakeBroker("b1"), settings)
    date = "20261129T020000Z"
    context = StreamContext((("x-mq-date-time", date), ("authorization", authorization("ak", "wrong", date))))
    try:
        await serve_until(context, service, [ext.SessionRequest(id=1, send=send_request())], 1)
    except Aborted:
        pass
    assert context.aborted is not None and context.aborted[0].name == "UNAUTHENTICATED"
    assert context.written == []


def test_hand_encoded_answers_read_as_the_generated_message() -> None:
    frames = ext.ReceiveMessagesResponse(messages=ext.Messages(messages=[v2.Message(body=b"x" * 300)]))
    first = session.encoded(2**33, "receive", frames.SerializeToString())
    message = ext.SessionResponse.FromString(session.joined(first, [session.encoded(0, "send", b""), first]))
    assert message.id == 2**33 and message.receive == frames
    assert [(a.id, a.WhichOneof("body")) for a in message.more] == [(0, "send"), (2**33, "receive")]
    assert message.more[0].send == pb.SendMessageResponse()  # an empty answer is still one of its kind


def test_a_refusal_is_its_kinds_answer_or_a_bare_status() -> None:
    from popgate_contract import errors

    busy = ext.SessionResponse.FromString(session.refusal(4, "ack", errors.TooManyRequests("full")))
    unknown = ext.SessionResponse.FromString(session.refusal(5, None, errors.BadRequest("what")))
    assert (busy.id, busy.ack.status.code) == (4, v2.TOO_MANY_REQUESTS)
    assert (unknown.id, unknown.status.code) == (5, v2.BAD_REQUEST)


async def test_requests_in_one_message_are_each_answered_and_answers_queued_together_share_one() -> None:
    service, _ = service_over(FakeBroker("b1"))
    context = StreamContext()
    first = ext.SessionRequest(id=1, timeout_ms=3000, send=send_request())
    first.more.extend([ext.SessionRequest(id=2), ext.SessionRequest(id=3, timeout_ms=3000, send=send_request())])
    nested = first.more.add(id=4)
    nested.more.add(id=5)
    await serve_until(context, service, [first], answers=4)
    assert sorted(a.id for a in context.answers) == [1, 2, 3, 4]
    assert {a.id: a.WhichOneof("body") for a in context.answers} == {1: "send", 2: "status", 3: "send", 4: "status"}
    assert len(context.written) < len(context.answers)  # the refusals, queued at once, went out in one message


def test_answers_queued_together_share_a_message_up_to_the_write_limit() -> None:
    """What is queued goes in one message up to MAX_WRITE_BYTES, the rest in the next; an answer glued to the next
    (a receive's last messages and its status) is never split from it, whatever the size."""
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    half = b"x" * (session.MAX_WRITE_BYTES // 2)
    for item in ((half, None, False), (half, None, True), (b"status", None, False), (b"next", None, False), None):
        outbox.put_nowait(item)
    stream = cast(Any, SimpleNamespace(outbox=outbox))
    first = session._gather(stream, outbox.get_nowait())
    assert first.message == session.joined(half, [half, b"status"])  # past the limit only to keep the glued pair
    second = session._gather(stream, outbox.get_nowait())
    assert (second.message, outbox.get_nowait()) == (b"next", None)  # the end marker queued again


async def holding(
    context: StreamContext,
) -> tuple[FakeBroker, MessagingService, asyncio.Future[None]]:
    """A stream serving one receive (id 1), held at its broker (nothing to receive); the client keeps its side open."""
    broker = FakeBroker("b1")
    service, _ = service_over(broker)
    held = ext.SessionRequest(id=1, timeout_ms=20_000, receive=receive_request(poll_s=10))
    stream_task = asyncio.ensure_future(session.serve(service, stream(held, until=asyncio.Event()), context))
    async with asyncio.timeout(5):
        while not broker.held:
            await broker.changed.wait()
    return broker, service, stream_task


async def test_a_stopping_proxy_ends_its_streams() -> None:
    """Its held receives answered (empty) first; the client's next requests go to a new stream."""
    context = StreamContext()
    _, service, stream_task = await holding(context)
    assert not stream_task.done()
    service.closing.set()  # what Proxy.close() does
    await asyncio.wait_for(stream_task, 5)
    [answer] = context.answers
    assert (answer.id, answer.receive.status.code) == (1, v2.MESSAGE_NOT_FOUND)


class DrainingContext(StreamContext):
    """As popgate's own server gives it: the connection's draining event (its age)."""

    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    def draining(self) -> asyncio.Event:
        return self.event


async def test_a_stream_whose_connection_drains_cuts_its_receives_and_ends() -> None:
    """A held receive is cut, not answered (the client sends it again on its next stream), and its broker's Pop
    ends with it; the stream then ends, as the client's next requests go to a new connection."""
    context = DrainingContext()
    broker, _, stream_task = await holding(context)
    context.event.set()
    await asyncio.wait_for(stream_task, 5)
    assert context.answers == []
    assert not broker.held


async def test_requests_past_the_streams_bound_are_answered_too_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "MAX_PENDING", 1)
    service, _ = service_over(FakeBroker("b1"))
    context = StreamContext()
    held = ext.SessionRequest(id=1, timeout_ms=20_000, receive=receive_request(poll_s=10))
    over = ext.SessionRequest(id=2, timeout_ms=3000, send=send_request())
    task = asyncio.ensure_future(session.serve(service, stream(held, over, until=asyncio.Event()), context))
    for _ in range(500):  # the refusal is answered at once (bounded wait, as serve_until)
        if context.answers:
            break
        await asyncio.sleep(0.01)
    task.cancel()  # the client goes away
    with pytest.raises(asyncio.CancelledError):
        await task
    [answer] = context.answers  # the held receive ended with the stream, unanswered
    assert (answer.id, answer.send.status.code) == (2, v2.TOO_MANY_REQUESTS)


class StalledContext(StreamContext):
    """A client that does not read: the first write never completes."""

    async def write(self, message: bytes) -> None:
        await asyncio.Event().wait()


async def test_a_message_of_many_refused_requests_stops_the_reading_at_the_outbox_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session, "MAX_OUTBOX_BYTES", 20_000)
    made: list[session.Session] = []

    class Recorded(session.Session):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(session, "Session", Recorded)
    service, _ = service_over(FakeBroker("b1"))
    flood = ext.SessionRequest(id=1)
    flood.more.extend(ext.SessionRequest(id=i) for i in range(2, 5002))  # 5,000 requests without a body
    done = asyncio.Event()
    task = asyncio.ensure_future(session.serve(service, stream(flood, until=done), StalledContext()))
    for _ in range(50):
        await asyncio.sleep(0.01)
    [stream_session] = made
    held = stream_session.outbox_bytes  # answers queued or being written, with their overhead
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Each refusal is ~20 bytes and counted with its overhead: the reading stopped at the bound (5,000 refusals
    # would count ~900 KB).
    assert 20_000 < held <= 20_000 + 2 * session.ANSWER_OVERHEAD
