"""The live consumers proxies report (broker.consumers): a report's names are checked as the proxy checks them, and
the reports kept are bounded in bytes, so a ListConsumers answer of every one of them fits one gRPC message."""

from __future__ import annotations

import pytest
from popgate_pb import broker_pb2 as pb

from broker import consumers
from broker.consumers import ConsumerRegistry, Seen
from popgate_contract.errors import BadRequest, TooManyRequests
from popgate_contract.validation import MAX_CLIENT_ID_CHARS, MAX_NAME_LEN
from proxy.consumers import MAX_CONSUMERS

GRPC_LIMIT = 16 * 1024 * 1024  # the broker's default --max-grpc-message-bytes: the largest answer it sends
NOW = 1_000_000


def long_name(proxy: str) -> str:
    return proxy.ljust(255, "-")  # the longest a broker takes


def largest_report() -> list[Seen]:
    """What one proxy's own limits let it report: its most consumers, each with the longest names it accepts."""
    group = "g" * MAX_NAME_LEN
    return [Seen(group, f"{i}-".ljust(MAX_CLIENT_ID_CHARS, "c"), "", NOW) for i in range(MAX_CONSUMERS)]


def answer(registry: ConsumerRegistry) -> pb.ListConsumersResponse:
    out = pb.ListConsumersResponse(broker="b" * 255)
    for s in registry.of_group("", NOW):
        out.consumers.add(group=s.group, client_id=s.client_id, proxy=s.proxy, last_seen_ms=s.last_seen_ms)
    return out


def test_the_broker_takes_whatever_a_proxy_may_report() -> None:
    assert MAX_CONSUMERS <= consumers.MAX_REPORTED  # the client ids: one bound, popgate_contract.validation
    registry = ConsumerRegistry()
    registry.report(long_name("p"), largest_report(), 600_000, NOW)
    assert len(registry.of_group("", NOW)) == MAX_CONSUMERS


@pytest.mark.parametrize(
    "seen",
    [Seen("g", "c" * (MAX_CLIENT_ID_CHARS + 1), "", NOW), Seen("g" * (MAX_NAME_LEN + 1), "c", "", NOW)]
    + [Seen("g", "", "", NOW), Seen("", "c", "", NOW), Seen("g x", "c", "", NOW)],
)
def test_a_report_with_a_name_no_proxy_sends_is_refused(seen: Seen) -> None:
    registry = ConsumerRegistry()
    with pytest.raises(BadRequest):
        registry.report("p1", [Seen("g", "c", "", NOW), seen], 600_000, NOW)
    assert registry.of_group("", NOW) == []


def test_reports_are_kept_up_to_a_byte_bound_that_one_answer_holds() -> None:
    registry = ConsumerRegistry()
    registry.report(long_name("p0"), largest_report(), 600_000, NOW)
    with pytest.raises(TooManyRequests):
        registry.report(long_name("p1"), largest_report(), 600_000, NOW)
    small = [Seen("g" * MAX_NAME_LEN, f"{i}-".ljust(MAX_CLIENT_ID_CHARS, "c"), "", -1) for i in range(100)]
    with pytest.raises(TooManyRequests):
        for i in range(2, consumers.MAX_PROXIES):
            registry.report(long_name(f"s{i}"), small, 600_000, NOW)  # filled up to the bound
    assert 2 < i < consumers.MAX_PROXIES and answer(registry).ByteSize() < GRPC_LIMIT
    assert long_name("p1") not in {s.proxy for s in registry.of_group("", NOW)}  # the refused report is not kept
    registry.report(long_name("p0"), largest_report(), 600_000, NOW)  # a new report replaces its last one's bytes
    registry.report(long_name("p0"), [], 600_000, NOW)  # and one listing fewer consumers makes room
    registry.report(long_name("p1"), largest_report(), 600_000, NOW)
    registry.expire(NOW + 600_001)  # as do reports past their time
    registry.report(long_name("q"), largest_report(), 600_000, NOW + 600_001)
