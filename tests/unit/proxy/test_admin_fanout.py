"""The admin service's fan-out without sockets (proxy.admin): every broker asked, one that failed named, a
request every broker refused as bad input refused as the call's, matches merged newest first and cut, a consumer
seen through several brokers listed once with its latest sighting, a listing of every group cut; the consumer reporter
asks live brokers only."""

from __future__ import annotations

from typing import Any

import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import admin_pb2 as apb

from popgate_contract import errors
from popgate_contract.admin_headers import broker_timeout_header
from popgate_contract.consumers import EVERY_GROUP_LIMIT
from proxy.admin import AdminService
from proxy.auth import Authenticator
from proxy.consumers import ConsumerBook, ConsumerReporter
from proxy.routing import BrokerPool


class AdminBroker:
    def __init__(self, name: str, answer: Any = None, *, fail: errors.DomainError | None = None) -> None:
        self.name = name
        self.healthy = fail is None or not isinstance(fail, errors.BrokerUnavailable)
        self.answer = answer
        self.fail = fail
        self.asked: list[tuple[str, Any]] = []
        self.waits: list[float] = []

    async def list_messages(self, request: Any, *, timeout_s: float) -> Any:
        self.waits.append(timeout_s)
        return bpb.ListMessagesResponse()

    async def admin(self, method: str, request: Any, *, timeout_s: float) -> Any:
        self.asked.append((method, request))
        self.waits.append(timeout_s)
        if self.fail is not None:
            raise self.fail
        return self.answer


def service(*brokers: AdminBroker) -> AdminService:
    pool = BrokerPool({b.name: b for b in brokers})  # type: ignore[misc]
    return AdminService(pool, list, Authenticator((), skew_s=300), timeout_s=1.0)


def found(broker: str, store_ms: int, message_id: str) -> bpb.FoundMessage:
    stored = bpb.StoredMessage(message=bpb.Message(message_id=message_id), store_ms=store_ms)
    return bpb.FoundMessage(stored=stored, broker=broker)


async def test_matches_are_merged_newest_first_and_a_failed_broker_is_named() -> None:
    b1 = AdminBroker(
        "b1", bpb.QueryMessagesResponse(broker="b1", messages=[found("b1", 30, "c"), found("b1", 10, "a")])
    )
    b2 = AdminBroker("b2", bpb.QueryMessagesResponse(broker="b2", messages=[found("b2", 20, "b")], scan_cut=True))
    b3 = AdminBroker("b3", fail=errors.BrokerUnavailable("b3 is down"))
    answer = await service(b1, b2, b3)._query(bpb.QueryMessagesRequest(topic="t", key="k", max_messages=2))
    assert [m.stored.message.message_id for m in answer.messages] == ["c", "b"] and answer.scan_cut
    assert [(f.broker, f.code) for f in answer.failures] == [("b3", "UNAVAILABLE")]
    assert all(b.asked for b in (b1, b2, b3))  # a down broker is asked too: named, never skipped


async def test_a_request_every_broker_refused_is_refused_and_one_partly_refused_is_answered() -> None:
    bad = errors.IllegalTopic("bad topic")
    with pytest.raises(errors.IllegalTopic):
        await service(AdminBroker("b1", fail=bad), AdminBroker("b2", fail=bad))._fan_out("DeleteTopic", None)
    answers, failures = await service(AdminBroker("b1", "ok"), AdminBroker("b2", fail=bad))._fan_out("X", None)
    assert answers == ["ok"] and [f.broker for f in failures] == ["b2"]


async def test_a_consumer_reported_to_every_broker_is_listed_once_with_its_latest_sighting() -> None:
    def seen(last: int) -> bpb.Consumer:
        return bpb.Consumer(group="g", client_id="c1", proxy="p1", last_seen_ms=last)

    b1 = AdminBroker("b1", bpb.ListConsumersResponse(consumers=[seen(100)]))
    b2 = AdminBroker("b2", bpb.ListConsumersResponse(consumers=[seen(200), bpb.Consumer(group="g", client_id="c0")]))
    answer = await service(b1, b2)._consumers(bpb.ListConsumersRequest(group="g"))
    assert [(c.client_id, c.last_seen_ms) for c in answer.consumers] == [("c0", 0), ("c1", 200)]


async def test_a_client_seen_by_two_proxies_is_one_consumer() -> None:
    """A client that moved to another proxy (a reconnect) is in both proxies' reports for a while: one consumer,
    shown via the proxy that saw it last."""
    before = bpb.Consumer(group="g", client_id="c1", proxy="p1", last_seen_ms=100)
    after = bpb.Consumer(group="g", client_id="c1", proxy="p2", last_seen_ms=200)
    b1 = AdminBroker("b1", bpb.ListConsumersResponse(consumers=[before, after]))
    answer = await service(b1)._consumers(bpb.ListConsumersRequest(group="g"))
    assert [(c.client_id, c.proxy) for c in answer.consumers] == [("c1", "p2")]


async def test_the_every_group_listing_through_the_proxy_is_bounded_and_says_it_was_cut() -> None:
    """Each broker answers the first consumers of every group and whether it had more: the proxy lists at most as
    many, none past the point a broker's answer stopped at (a broker that stopped may not have listed them)."""

    def listed(broker: str, clients: range, *, cut: bool = False) -> AdminBroker:
        consumers = [bpb.Consumer(group="g", client_id=f"c{i:05d}", proxy="p1", last_seen_ms=i) for i in clients]
        return AdminBroker(broker, bpb.ListConsumersResponse(broker=broker, consumers=consumers, cut=cut))

    def client_ids(answer: Any) -> list[str]:
        return [c.client_id for c in answer.consumers]

    every = bpb.ListConsumersRequest(group="")
    more = range(EVERY_GROUP_LIMIT - 5, EVERY_GROUP_LIMIT + 5)  # 5 past what b1 lists
    answer = await service(listed("b1", range(EVERY_GROUP_LIMIT)), listed("b2", more))._consumers(every)
    assert client_ids(answer) == [f"c{i:05d}" for i in range(EVERY_GROUP_LIMIT)] and answer.cut
    answer = await service(listed("b1", range(0, 20, 2), cut=True), listed("b2", range(1, 41, 2)))._consumers(every)
    assert client_ids(answer) == [f"c{i:05d}" for i in range(18)] and answer.cut  # b1 stopped before c00018
    answer = await service(listed("b1", range(10)), listed("b2", range(5)))._consumers(every)
    assert client_ids(answer) == [f"c{i:05d}" for i in range(10)] and not answer.cut


async def test_a_proxy_that_routes_to_no_broker_says_so_and_does_nothing() -> None:
    with pytest.raises(errors.BrokerUnavailable, match="routes to no broker: DeleteTopic was not done anywhere"):
        await service()._fan_out("DeleteTopic", bpb.DeleteTopicRequest(topic="t"))


async def test_a_change_names_the_brokers_discovery_retired_as_not_asked() -> None:
    """A broker scaled down (retired by discovery) may come back with its store: a change made meanwhile is not
    applied to it, so the change names it (the operator runs it again then); a read leaves it out."""
    b1 = AdminBroker("b1", bpb.DeleteTopicResponse(broker="b1"))
    b2 = AdminBroker("b2", bpb.DeleteTopicResponse(broker="b2"))
    admin = service(b1, b2)
    admin._pool.retire("b2")  # noqa: SLF001
    answers, failures = await admin._fan_out("DeleteTopic", bpb.DeleteTopicRequest(topic="t"))
    assert [a.broker for a in answers] == ["b1"] and not b2.asked
    assert [(f.broker, f.code) for f in failures] == [("b2", "UNAVAILABLE")] and "run the change again" in failures[
        0
    ].message
    _, failures = await admin._fan_out("Stats", bpb.StatsRequest())
    assert failures == []


def test_a_termination_naming_a_group_ends_only_that_groups_sighting() -> None:
    book = ConsumerBook()
    book.seen("host@1", "ga", 1_000)
    book.seen("host@1", "gb", 1_000)
    book.gone("host@1", "gb")
    assert [(c.group, c.client_id) for c in book.live()] == [("ga", "host@1")]
    book.gone("host@1")
    assert book.live() == []


async def test_the_reporter_sends_the_whole_book_to_live_brokers() -> None:
    up, down = AdminBroker("b1", bpb.ReportConsumersResponse()), AdminBroker("b2", fail=errors.BrokerUnavailable("x"))
    book = ConsumerBook()
    book.seen("c1", "g", 1_000)
    reporter = ConsumerReporter(book, BrokerPool({"b1": up, "b2": down}), "p1:8081", timeout_s=1)  # type: ignore[dict-item]
    await reporter.report()
    ((method, request),) = up.asked
    assert method == "ReportConsumers" and request.proxy == "p1:8081" and request.ttl_ms == 15_000
    assert [c.client_id for c in request.consumers] == ["c1"] and not down.asked and not book.changed


async def test_the_reporter_says_which_clients_of_a_group_other_proxies_report_live() -> None:
    """Any broker holds every proxy's report (proxy.renewal asks when a client holding renewed handles goes quiet
    here): this proxy's own sightings are not another's; a broker that fails is passed over for the next."""
    seen = [bpb.Consumer(group="g", client_id=c, proxy=p) for c, p in (("moved", "p2:8081"), ("here", "p1:8081"))]
    down = AdminBroker("b1", fail=errors.BrokerTimeout("slow"))
    up = AdminBroker("b2", bpb.ListConsumersResponse(broker="b2", consumers=seen))
    reporter = ConsumerReporter(ConsumerBook(), BrokerPool({"b1": down, "b2": up}), "p1:8081", timeout_s=1)  # type: ignore[dict-item]
    assert await reporter.reported_elsewhere("g") == {"moved"}
    assert [(m, r.group) for m, r in down.asked + up.asked] == [("ListConsumers", "g")] * 2
    up.fail = errors.BrokerTimeout("slow")
    assert await reporter.reported_elsewhere("g") is None  # nobody answered: unknown


class Aborted(Exception):
    pass


class Context:
    """What the admin service reads of a gRPC call's context: its metadata (none), no deadline; an abort raises
    `Aborted`."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> None:
        return None

    def set_trailing_metadata(self, metadata: object) -> None:
        pass

    async def abort(self, code: object, message: str) -> None:
        raise Aborted(message)


async def test_a_group_or_topic_deleted_through_the_proxy_is_forgotten_before_the_brokers_are_asked() -> None:
    """The proxy no longer announces what an admin deleted (proxy.receive.announce): told before the fan-out, so no
    announcement of it can follow the deletion at a broker."""
    told: list[Any] = []
    broker = AdminBroker("b1", bpb.DeleteGroupResponse(broker="b1"))
    svc = AdminService(
        BrokerPool({"b1": broker}),  # type: ignore[dict-item]
        list,
        Authenticator((), skew_s=300),
        timeout_s=1.0,
        deleted=lambda **what: told.append(what) or None,
    )
    svc._fan_out = lambda *a: asked(told)  # type: ignore[method-assign]
    await svc.DeleteGroup(bpb.DeleteGroupRequest(group="g"), Context())  # type: ignore[arg-type]
    await svc.DeleteTopic(bpb.DeleteTopicRequest(topic="t"), Context())  # type: ignore[arg-type]
    assert told == [{"topic": "", "group": "g"}, "asked", {"topic": "t", "group": ""}, "asked"]


async def asked(told: list[Any]) -> tuple[list[Any], list[Any]]:
    told.append("asked")
    return [], []


@pytest.mark.parametrize(
    "call",
    [
        lambda svc: svc.DeleteGroup(bpb.DeleteGroupRequest(topic="orders"), Context()),
        lambda svc: svc.DeleteGroup(bpb.DeleteGroupRequest(), Context()),
        lambda svc: svc.DeleteTopic(bpb.DeleteTopicRequest(), Context()),
    ],
)
async def test_a_refused_deletion_forgets_nothing(call: Any) -> None:
    """An empty name is refused as the brokers refuse it, before the proxy forgets what it would mean ("every")."""
    told: list[Any] = []
    svc = AdminService(
        BrokerPool({}), list, Authenticator((), skew_s=300), timeout_s=1.0, deleted=lambda **what: told.append(what)
    )
    with pytest.raises(Aborted):
        await call(svc)
    assert told == []


class TimedContext(Context):
    """A call with `metadata` and `remaining` seconds to its deadline."""

    def __init__(self, metadata: tuple[tuple[str, str], ...], remaining: float | None) -> None:
        self._metadata, self._remaining = metadata, remaining

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return self._metadata

    def time_remaining(self) -> float | None:  # type: ignore[override]
        return self._remaining


async def test_each_broker_is_waited_for_as_the_caller_asks_within_its_deadline() -> None:
    """`popgate <command> --timeout` sends how long the proxy is to wait for each broker (its own 1 s otherwise):
    every fanned-out call and a ListMessages page wait that, within the call's deadline less 0.5 s."""
    b1 = AdminBroker("b1", bpb.StatsResponse(broker="b1"))
    admin = service(b1)
    asked = (broker_timeout_header(7.0),)
    await admin.Stats(bpb.StatsRequest(), TimedContext(asked, 20.0))  # type: ignore[arg-type]
    await admin.Stats(bpb.StatsRequest(), TimedContext(asked, 3.0))  # type: ignore[arg-type]
    await admin.Stats(bpb.StatsRequest(), TimedContext((), None))  # type: ignore[arg-type]
    page = apb.ListMessagesRequest(broker="b1", request=bpb.ListMessagesRequest(topic="t"))
    await admin.ListMessages(page, TimedContext(asked, 20.0))  # type: ignore[arg-type]
    assert b1.waits == [7.0, 2.5, 1.0, 7.0]
