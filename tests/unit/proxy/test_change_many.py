"""nack_many at the proxy (proxy/v2/ack.py `change_invisible_many`, proxy/core.py, proxy/brokers.py): one broker
request per broker for the handles of a ChangeInvisibleMany, an answer entry per request entry in order, and a
broker that has not said it reads many at once (a rolling upgrade) given one ChangeInvisibleTime per handle."""

from __future__ import annotations

import asyncio

import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from prometheus_client import CollectorRegistry

from popgate_contract import errors
from popgate_contract.session_client import CHANGE_MANY_KEY, MORE_KEY
from proxy.brokers import GrpcBrokerClient
from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.receive.coupled import LongPollStrategy
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.v2.context import endpoints_for
from proxy.v2.service import MessagingService
from tests.unit.broker.test_session_stream import AnsweringCall, session_on
from tests.unit.proxy.fakes import FakeBroker, handle
from tests.unit.proxy.test_core import make
from tests.unit.proxy.test_v2_service import Context


async def test_handles_of_two_brokers_are_changed_one_request_each_in_order() -> None:
    proxy, brokers = make("b1", "b2")
    handles = [handle("b1"), handle("b2"), "garbage", handle("b1", token="cd"), handle("b2", token="5a1e")]
    outcome = await proxy.change_invisible_many("t", "g", handles, 5_000)
    assert outcome[:2] == [handles[0] + "-new", handles[1] + "-new"] and outcome[3] == handles[3] + "-new"
    assert isinstance(outcome[2], errors.InvalidReceiptHandle) and isinstance(outcome[4], errors.InvalidReceiptHandle)
    sent = {name: [(list(c.receipt_handles), c.invisible_ms) for c in b.changes] for name, b in brokers.items()}
    assert sent == {"b1": [([handles[0], handles[3]], 5_000)], "b2": [([handles[1], handles[4]], 5_000)]}


async def test_a_down_broker_fails_its_handles_only() -> None:
    proxy, brokers = make("b1", "b2")
    brokers["b2"].fail = errors.BrokerUnavailable("b2 down")
    outcome = await proxy.change_invisible_many("t", "g", [handle("b2"), handle("b1")], 0)
    assert isinstance(outcome[0], errors.BrokerUnavailable) and outcome[1] == handle("b1") + "-new"


class Broker(AnsweringCall):
    def __init__(self, *, reads_many: bool) -> None:
        super().__init__()
        self.says = ((MORE_KEY, "1"),) + ((CHANGE_MANY_KEY, "1"),) * reads_many

    async def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.says


def service_of(proxy: Proxy) -> MessagingService:
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    return MessagingService(proxy, settings, endpoints_for("127.0.0.1:8081"), ProxyMetrics(CollectorRegistry()))


@pytest.mark.parametrize("reads_many", [True, False])
async def test_a_broker_that_has_not_said_it_reads_many_gets_one_change_a_handle(reads_many: bool) -> None:
    call = Broker(reads_many=reads_many)
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"))
    client._session = session_on(call).open()  # its stream: this call (no socket)
    many = bpb.ChangeInvisibleTimesRequest(topic="t", group="g", receipt_handles=["h1", "h2"], invisible_ms=0)
    try:
        await client.ack(bpb.AckRequest(topic="t", group="g", receipt_handles=["h0"]), timeout_s=1)  # it said by now
        response = await client.change_invisible_times(many, timeout_s=1)
    finally:
        await client.close()
    kinds = [r.WhichOneof("body") for r in call.written]
    assert kinds == (
        ["ack", "change_invisible_many"] if reads_many else ["ack", "change_invisible", "change_invisible"]
    )
    assert len(response) == 2
    if reads_many:  # no result for either handle
        assert [type(r) for r in response] == [errors.BrokerFailure, errors.BrokerFailure]


async def test_a_new_stream_is_waited_for_until_its_broker_said_what_it_reads() -> None:
    """The first request on a stream just opened (a proxy started, a broker reconnected): its broker has not said
    anything yet when the change comes, and the change still goes as one request."""
    call = Broker(reads_many=True)
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"))
    client._session = session_on(call).open()  # its reader has not run yet
    many = bpb.ChangeInvisibleTimesRequest(topic="t", group="g", receipt_handles=["h1", "h2"], invisible_ms=0)
    try:
        await client.change_invisible_times(many, timeout_s=1)
    finally:
        await client.close()
    assert [r.WhichOneof("body") for r in call.written] == ["change_invisible_many"]


class SlowToSay(Broker):
    async def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        await asyncio.sleep(SAYS_AFTER_S)
        return self.says


SAYS_AFTER_S = 0.3


async def test_the_wait_for_a_new_stream_is_taken_out_of_the_calls_time() -> None:
    """The change is sent with what is left of its time once its broker said what it reads, so the whole takes no
    longer than the caller gave it."""
    call = SlowToSay(reads_many=True)
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"))
    client._session = session_on(call).open()
    given: list[float] = []
    begin = client.begin

    def spy(method: str, request: object, *, timeout_s: float) -> asyncio.Future[object]:
        given.append(timeout_s)
        return begin(method, request, timeout_s=timeout_s)

    client.begin = spy  # type: ignore[method-assign]
    many = bpb.ChangeInvisibleTimesRequest(topic="t", group="g", receipt_handles=["h1"], invisible_ms=0)
    try:
        await client.change_invisible_times(many, timeout_s=1)
    finally:
        await client.close()
    [left] = given
    assert left <= 1 - SAYS_AFTER_S
    assert [r.WhichOneof("body") for r in call.written] == ["change_invisible_many"]


async def test_a_broker_failing_its_health_checks_is_refused_at_once_not_waited_for() -> None:
    """A new stream to a broker marked down (hung: its sockets open, nothing said): each handle is refused unsent,
    retriable, without first waiting for the stream to say what it reads."""
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"))
    client._set_health(False, "a test")
    session = client._session = session_on(SlowToSay(reads_many=True)).open()

    async def said(timeout_s: float) -> None:
        raise AssertionError("waited for a broker marked down")

    session.said = said  # type: ignore[method-assign]
    many = bpb.ChangeInvisibleTimesRequest(topic="t", group="g", receipt_handles=["h1", "h2"], invisible_ms=0)
    try:
        outcome = await client.change_invisible_times(many, timeout_s=5)
    finally:
        await client.close()
    assert [type(r) for r in outcome] == [errors.BrokerNotReached] * 2 and all(r.retriable for r in outcome)


async def test_the_v2_handler_answers_each_entry_in_order_with_its_new_or_old_handle() -> None:
    proxy, _ = make("b1")
    service = service_of(proxy)
    request = ext.ChangeInvisibleMany()
    request.group.name, request.topic.name = "g", "t"
    request.invisible_duration.seconds = 2
    for i, h in enumerate([handle("b1"), handle("b1", token="5a1e"), handle("b1", token="cd")]):
        request.entries.add(message_id=f"m{i}", receipt_handle=h)
    response = await service.ChangeInvisibleMany(request, Context())
    answered = [(e.message_id, e.receipt_handle, e.status.code) for e in response.entries]
    assert answered == [
        ("m0", handle("b1") + "-new", v2.OK),
        ("m1", handle("b1", token="5a1e"), v2.INVALID_RECEIPT_HANDLE),
        ("m2", handle("b1", token="cd") + "-new", v2.OK),
    ]
    assert response.status.code == v2.MULTIPLE_RESULTS


@pytest.mark.parametrize("count", [0, 1025])
async def test_a_change_many_of_no_entry_or_too_many_is_a_bad_request_and_changes_nothing(count: int) -> None:
    proxy, brokers = make("b1")
    request = ext.ChangeInvisibleMany()
    request.group.name, request.topic.name = "g", "t"
    for _ in range(count):
        request.entries.add(message_id="m", receipt_handle=handle("b1"))
    response = await service_of(proxy).ChangeInvisibleMany(request, Context())
    assert response.status.code == v2.BAD_REQUEST and "1..1024" in response.status.message
    assert brokers["b1"].changes == []


async def test_a_change_per_handle_keeps_each_calls_error_so_a_broker_not_reached_stays_retriable() -> None:
    """An older broker (or one whose new stream has not said what it reads): a handle whose call never reached the
    broker fails as that call does, retriable, not as a broker failure."""
    client = GrpcBrokerClient(BrokerAddress("b1", "127.0.0.1:1"))
    not_reached = errors.BrokerNotReached("broker b1 restarting")

    async def change_invisible_time(request: bpb.ChangeInvisibleTimeRequest, **_: object) -> object:
        if request.receipt_handle == "h2":
            raise not_reached
        return bpb.ChangeInvisibleTimeResponse(receipt_handle=request.receipt_handle + "-new")

    client.change_invisible_time = change_invisible_time  # type: ignore[method-assign,assignment]
    many = bpb.ChangeInvisibleTimesRequest(topic="t", group="g", receipt_handles=["h1", "h2"], invisible_ms=0)
    try:
        outcome = await client.change_invisible_times(many, timeout_s=1)
    finally:
        await client.close()
    assert outcome == ["h1-new", not_reached] and not_reached.retriable


async def test_changes_are_counted_by_outcome() -> None:
    """popgate_proxy_invisible_changes: each entry of a ChangeInvisibleMany, and a ChangeInvisibleDuration changed
    or refused, under its topic and group."""
    metrics = ProxyMetrics(CollectorRegistry())
    pool = BrokerPool({"b1": FakeBroker("b1")}, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), metrics=metrics)
    service = service_of(proxy)
    many = ext.ChangeInvisibleMany()
    many.group.name, many.topic.name = "g", "t"
    for i, h in enumerate([handle("b1"), handle("b1", token="5a1e"), handle("b1", token="cd")]):
        many.entries.add(message_id=f"m{i}", receipt_handle=h)
    await service.ChangeInvisibleMany(many, Context())
    one = pb.ChangeInvisibleDurationRequest(receipt_handle="garbage", message_id="m")
    one.group.name, one.topic.name = "g", "t"
    await service.ChangeInvisibleDuration(one, Context())

    def counted(outcome: str) -> float | None:
        labels = {"topic": "t", "group": "g", "outcome": outcome}
        return metrics.registry.get_sample_value("popgate_proxy_invisible_changes_total", labels)

    assert (counted("ok"), counted("InvalidReceiptHandle")) == (2, 2)


async def test_an_undelivered_give_back_reaches_its_broker_so_and_takes_no_invisible_time() -> None:
    """The SDK's give-back of messages no caller saw: passed on as ChangeInvisibleTimes.undelivered (the broker
    counts no delivery); an invisible time with it is refused, nothing changed."""
    proxy, brokers = make("b1")
    request = ext.ChangeInvisibleMany(undelivered=True)
    request.group.name, request.topic.name = "g", "t"
    request.entries.add(message_id="m", receipt_handle=handle("b1"))
    response = await service_of(proxy).ChangeInvisibleMany(request, Context())
    assert response.status.code == v2.OK and [c.undelivered for c in brokers["b1"].changes] == [True]
    request.invisible_duration.seconds = 5
    refused = await service_of(proxy).ChangeInvisibleMany(request, Context())
    assert refused.status.code == v2.ILLEGAL_INVISIBLE_TIME and len(brokers["b1"].changes) == 1
