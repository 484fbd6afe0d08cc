"""The v2 servicer's own bookkeeping, driven without a gRPC server (its handlers are plain coroutines)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import pytest
from google.protobuf.message import Message
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from prometheus_client import CollectorRegistry

from popgate_contract import errors
from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.ports import NoMetrics
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.notify_driver import NotifyStrategy
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.v2.context import endpoints_for
from proxy.v2.service import MessagingService
from tests.unit.proxy.fakes import FakeBroker, Frames, popped


class Context(Frames):
    """What the servicer reads of a grpc.aio context, and its `write` (`Frames`)."""

    def time_remaining(self) -> float:
        return 10.0

    def invocation_metadata(self) -> tuple[()]:
        return ()


async def test_a_receive_its_client_abandons_is_counted_cancelled_not_ok() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    pool = BrokerPool({n: FakeBroker(n) for n in ("b1", "b2")}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics)
    service = MessagingService(
        proxy, Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),)), endpoints_for("127.0.0.1:8081"), metrics
    )
    request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=1)
    request.message_queue.topic.name = "t"
    request.long_polling_timeout.seconds = 5

    task = asyncio.create_task(service.ReceiveMessage(request, Context()))
    await asyncio.sleep(0.1)  # held: nothing to receive
    task.cancel()  # what grpc.aio does when the client goes away
    await asyncio.gather(task, return_exceptions=True)
    sample = metrics.registry.get_sample_value
    name = "popgate_proxy_rpc_duration_seconds_count"
    ok, cancelled = (
        sample(name, {"method": "ReceiveMessage", "code": "OK"}),
        sample(name, {"method": "ReceiveMessage", "code": "CANCELLED"}),
    )
    assert (ok, cancelled) == (None, 1.0)


async def test_a_held_receive_is_three_coroutines_and_no_generator_or_protobuf() -> None:
    """A held receive is the proxy's unit of memory: while it waits, its task holds the servicer's coroutine, the
    core's and the strategy's, which awaits its broker call itself; the answer's coroutine is made once there is
    one (`proxy.v2.receive.answer`); no async generator is held, and no protobuf (each one an arena of its own):
    not the client's request, nor the broker's."""
    pool = BrokerPool({"b1": FakeBroker("b1")}, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0))
    service = MessagingService(
        proxy, Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),)), endpoints_for("127.0.0.1:8081"), NoMetrics()
    )
    request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=1)
    request.message_queue.topic.name = "t"
    request.long_polling_timeout.seconds = 5
    task = asyncio.create_task(service.ReceiveMessage(request, Context()))
    await asyncio.sleep(0.05)  # held: nothing to receive
    chain, kept, awaited = [], [], task.get_coro()
    while inspect.iscoroutine(awaited):
        chain.append(awaited.cr_code.co_qualname)
        kept += [name for name, value in awaited.cr_frame.f_locals.items() if isinstance(value, Message)]
        awaited = awaited.cr_await
    assert chain == ["MessagingService.ReceiveMessage", "Proxy.receive", "LongPollStrategy.receive"]
    assert kept == []
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class LateContext(Context):
    """A call the proxy gets to with less time left than its poll reserve (0.3 s)."""

    def time_remaining(self) -> float:
        return 0.2


async def test_a_receive_with_no_time_left_to_poll_is_refused_and_counted_by_why() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    pool = BrokerPool({"b1": FakeBroker("b1")}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics)
    service = MessagingService(
        proxy, Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),)), endpoints_for("127.0.0.1:8081"), metrics
    )
    out = []
    # 5 s asked, 0.2 s left: the time went before the proxy got to the call. 0 s asked: too short a timeout.
    for poll_s, outcome in ((5, "behind"), (0, "illegal_polling_time")):
        request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=1)
        request.message_queue.topic.name = "t"
        request.long_polling_timeout.seconds = poll_s
        context = LateContext()
        await service.ReceiveMessage(request, context)
        [frame] = context.frames
        # g has no label of its own: no broker has served a request of it (refused ones give none)
        labels = {"group": "_other", "mode": "notify", "outcome": outcome}
        out.append((frame.status.code, metrics.registry.get_sample_value("popgate_proxy_receives_total", labels)))
    assert out == [(v2.TOO_MANY_REQUESTS, 1.0), (v2.ILLEGAL_POLLING_TIME, 1.0)]


async def test_telemetry_streams_beyond_the_limit_get_too_many_requests() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    pool = BrokerPool({"b1": FakeBroker("b1")}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics)
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),), max_telemetry_streams=2)
    service = MessagingService(proxy, settings, endpoints_for("127.0.0.1:8081"), metrics)
    silent = asyncio.Event()

    async def commands() -> AsyncIterator[pb.TelemetryCommand]:
        await silent.wait()  # an idle client: the stream stays open
        yield pb.TelemetryCommand()

    async def first_reply() -> int:
        async for reply in service.Telemetry(commands(), Context()):
            return reply.status.code
        return -1

    open_streams = [asyncio.ensure_future(first_reply()) for _ in range(2)]
    await asyncio.sleep(0.05)
    third = await asyncio.wait_for(first_reply(), 2)
    for stream in open_streams:
        stream.cancel()
    await asyncio.gather(*open_streams, return_exceptions=True)
    fourth = asyncio.ensure_future(first_reply())  # the cancelled ones gave their places back
    await asyncio.sleep(0.05)
    assert not fourth.done()
    fourth.cancel()
    await asyncio.gather(fourth, return_exceptions=True)
    result = [third]
    assert result == [v2.TOO_MANY_REQUESTS]


async def test_a_route_echoes_sane_endpoints_and_refuses_an_endless_list() -> None:
    pool = BrokerPool({"b1": FakeBroker("b1")}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0))
    metrics = ProxyMetrics(CollectorRegistry())
    service = MessagingService(
        proxy, Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),)), endpoints_for("127.0.0.1:8081"), metrics
    )

    def route(*addresses: tuple[str, int]) -> pb.QueryRouteRequest:
        request = pb.QueryRouteRequest(topic=v2.Resource(name="t"))
        request.endpoints.addresses.extend(v2.Address(host=h, port=p) for h, p in addresses)
        return request

    echoed = await service.QueryRoute(route(("proxy.example", 8081)), Context())
    endless = await service.QueryRoute(route(*[("h" * 200, 1)] * 1000), Context())
    no_port = await service.QueryRoute(route(("proxy.example", 0)), Context())
    assert echoed.status.code == v2.OK
    assert {q.broker.endpoints.addresses[0].host for q in echoed.message_queues} == {"proxy.example"}
    assert (endless.status.code, list(endless.message_queues)) == (v2.BAD_REQUEST, [])
    assert "at most 16" in endless.status.message
    assert no_port.status.code == v2.BAD_REQUEST


class ClientContext(Context):
    def __init__(self, client_id: str, *, stall_at: int | None = None) -> None:
        super().__init__(stall_at)
        self.client_id = client_id

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return (("x-mq-language", "PYTHON"), ("x-mq-client-id", self.client_id))


@pytest.mark.timeout(10)
async def test_auto_renew_receives_are_renewed_while_the_clients_telemetry_stream_is_open() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics)
    service = MessagingService(
        proxy, Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),)), endpoints_for("127.0.0.1:8081"), metrics
    )
    tracked = [len(proxy.renewer.book)]

    async def receive(client: str) -> list[str]:
        broker.put(popped("b1", "m1", token=f"{len(broker.pops) + 10:x}"))
        request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=1, auto_renew=True)
        request.message_queue.topic.name = "t"
        context = ClientContext(client)
        await service.ReceiveMessage(request, context)
        return [f.message.system_properties.receipt_handle for f in context.frames if f.HasField("message")]

    await receive("")  # names no client: not renewed
    tracked.append(len(proxy.renewer.book))
    stop = asyncio.Event()

    async def commands() -> AsyncIterator[pb.TelemetryCommand]:
        yield pb.TelemetryCommand(settings=v2.Settings())
        await stop.wait()

    async def telemetry() -> None:
        async for _ in service.Telemetry(commands(), ClientContext("c1")):
            pass

    stream = asyncio.create_task(telemetry())
    await asyncio.sleep(0.05)
    [first] = await receive("c1")
    [second] = await receive("c1")
    tracked.append(len(proxy.renewer.book))
    ack = pb.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="t"))
    ack.entries.add(message_id="m1", receipt_handle=first)
    await service.AckMessage(ack, ClientContext("c1"))
    tracked.append(len(proxy.renewer.book))
    await service.NotifyClientTermination(pb.NotifyClientTerminationRequest(), ClientContext("c1"))
    tracked.append(len(proxy.renewer.book))
    stop.set()
    await stream
    assert not proxy.renewer.book.alive("c1", asyncio.get_running_loop().time()) and second
    assert tracked == [0, 0, 2, 1, 0]


async def test_telemetry_answers_a_consumer_the_max_attempts_its_groups_brokers_have() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    brokers = {n: FakeBroker(n) for n in ("b1", "b2")}
    for broker in brokers.values():
        broker.max_attempts.update({"fast": 2, "tenant%billing": 4})
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics)
    service = MessagingService(
        proxy, Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),)), endpoints_for("127.0.0.1:8081"), metrics
    )

    def consumer(name: str, namespace: str = "") -> pb.TelemetryCommand:
        group = v2.Resource(name=name, resource_namespace=namespace)
        return pb.TelemetryCommand(
            settings=v2.Settings(client_type=v2.PUSH_CONSUMER, subscription=v2.Subscription(group=group))
        )

    async def commands() -> AsyncIterator[pb.TelemetryCommand]:
        for command in (consumer("fast"), consumer("billing", "tenant"), consumer("other")):
            yield command

    result = [r.settings.backoff_policy.max_attempts async for r in service.Telemetry(commands(), Context())]
    assert result == [2, 4, 17]


async def test_a_send_partly_stored_answers_the_failure_and_says_in_its_entries_which_are_stored() -> None:
    """Message groups go to brokers apart: one that timed out fails the request (official clients read only the
    top-level status: they resend it all), and the entries tell a client that reads them which are stored."""
    brokers = {n: FakeBroker(n) for n in ("b1", "b2")}
    brokers["b2"].fail = errors.BrokerTimeout("broker b2 did not answer in time")
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0))
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"), BrokerAddress("b2", "127.0.0.1:2")))
    service = MessagingService(proxy, settings, endpoints_for("127.0.0.1:8081"), ProxyMetrics(CollectorRegistry()))
    request = pb.SendMessageRequest()
    for i in range(12):
        m = request.messages.add(body=b"x")
        m.topic.name = "t"
        m.system_properties.message_id = f"M{i:02d}"
        m.system_properties.message_group = f"group-{i}"
        m.system_properties.body_encoding = v2.IDENTITY
    response, stored = await service.SendMessage(request, Context()), {n: len(b.sent) for n, b in brokers.items()}
    assert stored["b1"] and not stored["b2"]  # the groups spread over both; b2's timed out (no fail-over: unknown)
    assert response.status.code == v2.PROXY_TIMEOUT
    assert response.status.message.startswith(f"{stored['b1']} of 12 stored (see entries): broker b2 did not")
    assert [e.message_id for e in response.entries] == [f"M{i:02d}" for i in range(12)]
    assert sum(e.status.code == v2.OK for e in response.entries) == stored["b1"]
    assert {e.status.code for e in response.entries if e.status.code != v2.OK} == {v2.PROXY_TIMEOUT}


async def test_an_answer_not_read_by_its_deadline_gives_its_messages_back_and_ends_with_proxy_timeout() -> None:
    """A client that stops reading mid-answer (grpc does not ask for the next frame): at the write deadline the
    messages are ready again at their broker, counted as not read; should the client read on, PROXY_TIMEOUT."""
    metrics = ProxyMetrics(CollectorRegistry())
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker}, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), metrics=metrics)
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),), max_answer_write_s=0.05)
    service = MessagingService(proxy, settings, endpoints_for("127.0.0.1:8081"), metrics)
    broker.put(popped("b1", "m1"), popped("b1", "m2"))
    request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=2)
    request.message_queue.topic.name = "t"
    request.invisible_duration.seconds = 30
    context = ClientContext("c1", stall_at=1)  # the message's write does not return: the client reads no further
    answer = asyncio.create_task(service.ReceiveMessage(request, context))
    await asyncio.sleep(0.2)  # its write deadline passes
    ready_again = [m.stored.message.message_id for m in broker.ready]
    context.resume.set()  # the client reads on
    await answer
    kinds = [f.WhichOneof("content") for f in context.frames[:2]]
    kinds += [f.WhichOneof("content") + ":" + v2.Code.Name(f.status.code) for f in context.frames[2:]]
    not_read = metrics.registry.get_sample_value("popgate_proxy_answers_not_read_total", {"group": "g"})
    assert kinds == ["delivery_timestamp", "message", "status:PROXY_TIMEOUT"]  # not m2, not OK
    assert not_read == 1
    assert sorted(ready_again) == ["m1", "m2"]
