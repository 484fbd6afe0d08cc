"""The live consumers proxies report (broker.consumers): a report's names are checked as the proxy checks them, and
the reports kept are bounded in bytes, so a ListConsumers answer of every one of them fits one gRPC message; a
listing of every group is cut, a group's listing never."""

from __future__ import annotations

import gc

import pytest
from popgate_pb import broker_pb2 as pb

from broker import consumers
from broker.consumers import ConsumerRegistry, Seen
from popgate_contract.consumers import EVERY_GROUP_LIMIT
from popgate_contract.errors import BadRequest, TooManyRequests
from popgate_contract.validation import MAX_CLIENT_ID_CHARS, MAX_NAME_LEN
from proxy.consumers import MAX_CONSUMERS

GRPC_LIMIT = 16 * 1024 * 1024  # the broker's default --max-grpc-message-bytes: the largest answer it sends
NOW = 1_000_000


def long_name(proxy: str) -> str:
    return proxy.ljust(255, "-")  # the longest a broker takes


LONGEST_GROUP = "g" * MAX_NAME_LEN


def largest_report() -> list[Seen]:
    """What one proxy's own limits let it report: its most consumers, each with the longest names it accepts."""
    return [Seen(LONGEST_GROUP, f"{i}-".ljust(MAX_CLIENT_ID_CHARS, "c"), "", NOW) for i in range(MAX_CONSUMERS)]


def answer(registry: ConsumerRegistry) -> pb.ListConsumersResponse:
    """The largest a ListConsumers answer gets: a group every consumer kept is of."""
    out = pb.ListConsumersResponse(broker="b" * 255)
    for s in registry.of_group(LONGEST_GROUP, NOW):
        out.consumers.add(group=s.group, client_id=s.client_id, proxy=s.proxy, last_seen_ms=s.last_seen_ms)
    return out


def test_the_broker_takes_whatever_a_proxy_may_report() -> None:
    assert MAX_CONSUMERS <= consumers.MAX_REPORTED  # the client ids: one bound, popgate_contract.validation
    registry = ConsumerRegistry()
    registry.report(long_name("p"), largest_report(), 600_000, NOW)
    assert len(registry.of_group(LONGEST_GROUP, NOW)) == MAX_CONSUMERS


@pytest.mark.parametrize(
    "seen",
    [Seen("g", "c" * (MAX_CLIENT_ID_CHARS + 1), "", NOW), Seen("g" * (MAX_NAME_LEN + 1), "c", "", NOW)]
    + [Seen("g", "", "", NOW), Seen("", "c", "", NOW), Seen("g x", "c", "", NOW)],
)
def test_a_report_with_a_name_no_proxy_sends_is_refused(seen: Seen) -> None:
    registry = ConsumerRegistry()
    with pytest.raises(BadRequest):
        registry.report("p1", [Seen("g", "c", "", NOW), seen], 600_000, NOW)
    assert registry.every_group(NOW) == ([], False)


def test_reports_are_kept_up_to_a_byte_bound_that_one_answer_holds() -> None:
    registry = ConsumerRegistry()
    registry.report(long_name("p0"), largest_report(), 600_000, NOW)
    with pytest.raises(TooManyRequests):
        registry.report(long_name("p1"), largest_report(), 600_000, NOW)
    small = [Seen(LONGEST_GROUP, f"{i}-".ljust(MAX_CLIENT_ID_CHARS, "c"), "", -1) for i in range(100)]
    with pytest.raises(TooManyRequests):
        for i in range(2, consumers.MAX_PROXIES):
            registry.report(long_name(f"s{i}"), small, 600_000, NOW)  # filled up to the bound
    assert 2 < i < consumers.MAX_PROXIES and answer(registry).ByteSize() < GRPC_LIMIT
    assert long_name("p1") not in {
        s.proxy for s in registry.of_group(LONGEST_GROUP, NOW)
    }  # the refused report is not kept
    registry.report(long_name("p0"), largest_report(), 600_000, NOW)  # a new report replaces its last one's bytes
    registry.report(long_name("p0"), [], 600_000, NOW)  # and one listing fewer consumers makes room
    registry.report(long_name("p1"), largest_report(), 600_000, NOW)
    registry.expire(NOW + 600_001)  # as do reports past their time
    registry.report(long_name("q"), largest_report(), 600_000, NOW + 600_001)


def many_reports(registry: ConsumerRegistry, proxies: int, per_proxy: int, groups: int) -> list[Seen]:
    """`proxies` reports of `per_proxy` consumers over `groups` groups; every consumer kept, as a listing shows it."""
    kept = []
    for p in range(proxies):
        seen = [Seen(f"g{i % groups:03d}", f"c{p}-{i:05d}", "", NOW - i) for i in range(per_proxy)]
        registry.report(f"p{p}", seen, 600_000, NOW)
        kept += [Seen(s.group, s.client_id, f"p{p}", s.last_seen_ms) for s in seen]
    return sorted(kept, key=lambda s: (s.group, s.client_id, s.proxy))


def test_the_every_group_listing_is_bounded_and_says_it_was_cut() -> None:
    registry = ConsumerRegistry()
    kept = many_reports(registry, 3, 1_000, 50)
    listed, cut = registry.every_group(NOW)
    assert listed == kept[:EVERY_GROUP_LIMIT] and cut  # the first by group, client id and proxy; more are kept
    registry.report("p1", [], 600_000, NOW)
    registry.report("p2", [], 600_000, NOW)
    assert registry.every_group(NOW) == ([s for s in kept if s.proxy == "p0"], False)  # exactly the limit: all
    assert registry.every_group(NOW, limit=10) == ([s for s in kept if s.proxy == "p0"][:10], True)


def test_a_one_group_listing_is_every_consumer_of_that_group_and_never_cut() -> None:
    registry = ConsumerRegistry()
    kept = many_reports(registry, 3, 4_000, 2)
    assert registry.of_group("g001", NOW) == [s for s in kept if s.group == "g001"]  # 6,000: past the every-group cut
    registry.report("p1", [Seen("g001", "moved", "", NOW)], 600_000, NOW)  # a new report replaces p1's last
    assert [s for s in registry.of_group("g001", NOW) if s.proxy == "p1"] == [Seen("g001", "moved", "p1", NOW)]
    assert registry.of_group("g009", NOW) == []


def test_a_kept_report_gives_the_garbage_collector_nothing_to_walk_per_consumer() -> None:
    """A proxy re-sends its whole list every few seconds: what the broker keeps of it must not make the garbage
    collector's full passes, which stop the event loop, grow with the consumers reported."""
    registry = ConsumerRegistry()
    many_reports(registry, 1, 10, 10)
    gc.collect()
    before = len(gc.get_objects())
    many_reports(registry, 3, MAX_CONSUMERS, 100)
    gc.collect()
    assert len(gc.get_objects()) - before < 1_000  # per group, not per consumer
