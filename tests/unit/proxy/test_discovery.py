"""Broker discovery without DNS: what successive lookups change, and what the pool does with it."""

from __future__ import annotations

from typing import Any

from popgate_contract.receipt import encode_handle
from proxy.brokers import GrpcBrokerClient
from proxy.discovery import Changes, Discovery, LookupFailed, Membership, PoolEdits
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress
from tests.unit.proxy.fakes import FakeBroker


def at(name: str, ip: str = "10.0.0.1", port: int = 9001) -> BrokerAddress:
    return BrokerAddress(name, f"{ip}:{port}", host_name=f"{name}.popgate-broker.ns.svc.cluster.local")


def test_new_names_are_added_and_a_known_name_at_a_new_address_is_moved() -> None:
    members = Membership(forget_s=60)
    first = members.update([at("b0"), at("b1", "10.0.0.2")], now=0)
    assert [a.name for a in first.added] == ["b0", "b1"] and not first.moved and not first.retired
    assert not members.update([at("b0"), at("b1", "10.0.0.2")], now=5)  # the same answer changes nothing
    second = members.update([at("b0"), at("b1", "10.0.0.9"), at("b2", "10.0.0.3")], now=10)
    assert second.added == [at("b2", "10.0.0.3")] and second.moved == [at("b1", "10.0.0.9")]
    assert [a.name for a in members.known] == ["b0", "b1", "b2"]


def test_a_missing_broker_is_kept_until_it_has_been_missing_forget_s() -> None:
    members = Membership(forget_s=60)
    members.update([at("b0"), at("b1")], now=0)
    assert not members.update([at("b0")], now=10)  # a pod restarting, a DNS hiccup: nothing changes yet
    assert not members.update([at("b0")], now=69)
    assert members.update([at("b0")], now=70).retired == ["b1"]
    assert [a.name for a in members.known] == ["b0"]
    assert members.update([at("b0"), at("b1")], now=80).added == [at("b1")]  # scaled up again: a new broker


def test_a_broker_back_within_forget_s_starts_its_count_again() -> None:
    members = Membership(forget_s=60)
    members.update([at("b0"), at("b1")], now=0)
    members.update([at("b0")], now=10)
    assert not members.update([at("b0"), at("b1")], now=50)
    assert not members.update([at("b0")], now=100)  # missing since 100, not since 10
    assert members.update([at("b0")], now=160).retired == ["b1"]


def test_a_retired_broker_leaves_routing_but_its_handles_still_resolve() -> None:
    b0, b1 = FakeBroker("b0"), FakeBroker("b1")
    pool = BrokerPool({"b0": b0, "b1": b1})
    assert pool.retire("b1") is b1
    assert pool.names == ["b0"] and pool.live() == [b0]
    assert [c.name for c in pool.candidates("a-group")] == ["b0"]
    handle = encode_handle("b1", "t", queue_id=0, offset=7, attempt=1, token=1, until_ms=1)
    assert pool.for_handle(handle) is b1  # answered as a down broker's, not as a garbled handle
    b1_again = FakeBroker("b1")
    assert pool.put(b1_again) is b1 and pool.names == ["b0", "b1"] and pool.get("b1") is b1_again


async def test_a_replaced_or_retired_client_wakes_whoever_waits_for_it_to_be_up() -> None:
    """Waiters for a broker to be up wait for it by name: when discovery replaces its client (moved) or retires it,
    they are woken to look at the pool's client again, not left on one that will never be up."""
    client = GrpcBrokerClient(BrokerAddress("b3", "127.0.0.1:1"))  # no call made: no socket
    try:
        client._set_health(False, "health check: UNAVAILABLE")
        up = client.when_up()
        assert not up.done()
        client.retire("moved")
        assert up.done() and not client.healthy
        assert not client.when_up().done()  # a later wait waits (for good: it stays down)
    finally:
        await client.close()


async def test_discovery_applies_each_lookup_and_a_failed_lookup_changes_nothing() -> None:
    answers: list[list[BrokerAddress] | Exception] = [
        [at("b0"), at("b1")],
        LookupFailed("timeout"),
        [at("b0")],
        [at("b0")],
    ]
    added: list[BrokerAddress] = []
    retired: list[str] = []

    async def lookup() -> list[BrokerAddress]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    now = [0.0]
    discovery = Discovery(
        lookup, PoolEdits(add=added.append, retire=retired.append), interval_s=1, forget_s=5, clock=lambda: now[0]
    )
    assert (await discovery.refresh()).added == [at("b0"), at("b1")]
    now[0] = 10
    assert await discovery.refresh() == Changes()  # DNS did not answer: b1 is not missing
    now[0] = 11
    assert not await discovery.refresh()
    now[0] = 16
    assert (await discovery.refresh()).retired == ["b1"]
    assert added == [at("b0"), at("b1")] and retired == ["b1"]


async def test_a_client_replaced_by_a_move_is_closed_after_its_grace() -> None:
    """A broker pod rescheduled to a new address: its old channel goes once the calls it had could have ended, so
    a long-lived proxy does not gather channels (proxy.broker_clients.BrokerClients)."""
    import asyncio

    from proxy.broker_clients import BrokerClients
    from proxy.metrics import ProxyMetrics
    from proxy.settings import Settings

    clients = BrokerClients(Settings(broker_srv="_grpc._tcp.b"), ProxyMetrics())
    clients.replaced_grace_s = 0.01
    clients.add(at("b0", "10.0.0.1"))
    old = clients.current["b0"]
    clients.add(at("b0", "10.0.0.2"))
    assert clients.pool.get("b0") is clients.current["b0"] is not old and not old.healthy
    async with asyncio.timeout(5):
        while not old.closed:  # noqa: ASYNC110  # closing is a task of its own, polled here
            await asyncio.sleep(0.01)
    await clients.close()


async def test_a_retired_client_is_closed_after_its_grace_and_its_handles_are_still_answered_as_down() -> None:
    """A broker gone from DNS: its channel and Session stream go once the calls it had could have ended, and an ack
    of one of its receipt handles is still answered as a down broker's (HA_NOT_AVAILABLE), at once."""
    import asyncio

    import pytest
    from popgate_pb import broker_pb2 as bpb

    from popgate_contract import errors
    from proxy.broker_clients import BrokerClients
    from proxy.metrics import ProxyMetrics
    from proxy.settings import Settings

    clients = BrokerClients(Settings(broker_srv="_grpc._tcp.b"), ProxyMetrics())
    clients.replaced_grace_s = 0.01
    clients.add(at("b1"))
    retired = clients.current["b1"]
    clients.retire("b1")
    try:
        async with asyncio.timeout(5):
            while not retired.closed:  # noqa: ASYNC110  # closing is a task of its own, polled here
                await asyncio.sleep(0.01)
        handle = encode_handle("b1", "t", queue_id=0, offset=7, attempt=1, token=1, until_ms=1)
        assert clients.pool.for_handle(handle) is retired
        request = bpb.AckRequest(topic="t", group="g", receipt_handles=[handle])
        with pytest.raises(errors.BrokerUnavailable):
            await retired.ack(request, timeout_s=1)
    finally:
        await clients.close()


async def test_a_broker_discovery_adds_is_routed_only_once_a_health_check_passed_which_runs_at_once() -> None:
    """A new name (or a known one at a new address) starts down, out of QueryRoute's brokers, and is checked at
    once (`added`: the health monitor's `check_now`), not at the next round."""
    from proxy.broker_clients import BrokerClients
    from proxy.metrics import ProxyMetrics
    from proxy.settings import Settings

    clients = BrokerClients(Settings(broker_srv="_grpc._tcp.b"), ProxyMetrics())
    checked: list[str] = []
    clients.added = lambda client: checked.append(client.address.target)
    try:
        clients.add(at("b1", "10.0.0.1"))
        clients.add(at("b1", "10.0.0.2"))  # moved
        assert clients.pool.live() == [] and not clients.current["b1"].healthy
        assert checked == ["10.0.0.1:9001", "10.0.0.2:9001"]
    finally:
        await clients.close()


def test_under_discovery_a_handle_naming_a_broker_not_found_yet_is_retriable_and_asks_for_a_lookup() -> None:
    """Each proxy looks brokers up on its own: a handle another proxy gave out may name a broker this one has not
    found yet. Under discovery it is answered as a down broker's (HA_NOT_AVAILABLE, retriable) and a lookup is
    asked for; with a --broker list, a name not listed is the client's error."""
    import pytest

    from popgate_contract import errors

    b1: Any = FakeBroker("b1")
    handle = encode_handle("b2", "t", queue_id=0, offset=7, attempt=1, token=1, until_ms=1)
    listed = BrokerPool({"b1": b1})
    with pytest.raises(errors.InvalidReceiptHandle):
        listed.for_handle(handle)
    assert [type(e) for _, e in listed.by_broker([handle])[1]] == [errors.InvalidReceiptHandle]

    asked: list[str] = []
    found = BrokerPool({"b1": b1})
    found.unknown_broker = asked.append
    with pytest.raises(errors.BrokerUnavailable) as refused:
        found.for_handle(handle)
    assert refused.value.retriable and asked == ["b2"]
    groups, errors_ = found.by_broker([handle, encode_handle("b1", "t", 0, 1, 1, 1, 1), handle])
    assert list(groups) == ["b1"]
    assert [(i, type(e)) for i, e in errors_] == [(0, errors.BrokerNotReached), (2, errors.BrokerNotReached)]
    assert asked == ["b2", "b2"]  # once per ack call and broker
    not_a_name = encode_handle("b.2", "t", queue_id=0, offset=7, attempt=1, token=1, until_ms=1)
    with pytest.raises(errors.InvalidReceiptHandle):  # no broker discovery could find goes by it
        found.for_handle(not_a_name)


async def test_a_lookup_asked_for_runs_at_once_one_at_a_time_and_no_sooner_than_the_gap_after_the_last() -> None:
    import asyncio

    began: list[float] = []
    loop = asyncio.get_running_loop()

    async def lookup() -> list[BrokerAddress]:
        began.append(loop.time())
        await asyncio.sleep(0.05)
        return [at("b0")]

    edits = PoolEdits(add=lambda address: None, retire=lambda name: None)
    async with Discovery(lookup, edits, interval_s=60, forget_s=300, asked_gap_s=0.2) as discovery:
        assert len(began) == 1  # at start
        for _ in range(10):
            discovery.ask()
        async with asyncio.timeout(5):
            while len(began) < 2:  # noqa: ASYNC110  # the lookup is the discovery task's, polled here
                await asyncio.sleep(0.01)
        assert began[1] - began[0] < 1  # not the 60 s interval
        await asyncio.sleep(0.01)
        for _ in range(10):
            discovery.ask()  # while that one runs, and right after it
        async with asyncio.timeout(5):
            while len(began) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
    assert len(began) == 3 and began[2] - began[1] >= 0.2 - 0.01
