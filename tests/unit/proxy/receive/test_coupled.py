"""Coupled long polling, plain and covered, over in-memory brokers (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any

from popgate_pb import broker_pb2 as bpb
from prometheus_client import CollectorRegistry

from popgate_contract import errors
from popgate_contract.errors import BrokerTimeout
from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.seam import ReceiveRequest, ReceiveResult
from proxy.routing import BrokerPool
from tests.unit.proxy.fakes import FakeBroker, popped
from tests.unit.proxy.receive.support import NAMES, answered_as_the_client_leaves, held, held_becomes, ids, request


async def test_long_poll_metrics_count_a_receive_answered_at_once_as_a_hit_and_only_a_held_one_as_long_polling() -> (
    None
):
    """is_long_polling is RocketMQ's "suspended": a Pop the broker held. A long-poll receive on a backlog is
    answered at once: a first-Pop hit, as notify's would be (it counted as long polling, and never as a hit, so the
    hit ratio fell whenever adaptive switched to long polling — a review's probe)."""
    metrics = ProxyMetrics(CollectorRegistry())
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics)
    for b in brokers.values():
        b.ready.append(popped(b.name, "backlog-" + b.name))
    for _ in brokers:
        assert ids(await proxy.receive(request(5.0, batch=1))), "a message was waiting at every broker"
    assert ids(await proxy.receive(request(0.2))) == []  # held until its poll time ended
    receive = asyncio.create_task(proxy.receive(request(5.0)))
    await held_becomes(brokers, 1)
    next(b for b in brokers.values() if b.held).put(popped("b1", "later"))
    assert ids(await receive) == ["later"]  # held, then answered
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_receive_first_pop_hits_total", {"group": "g"}) == len(brokers)
    assert value("popgate_proxy_long_polling_receives_total", {"group": "g"}) == 2


async def test_a_groups_long_polls_spread_evenly_over_the_brokers_whatever_other_groups_do() -> None:
    """Each long poll of a group goes where the group has the fewest held: 6 receives of g on 3 brokers are 2
    on each, also when two receives of another group come between each (a turn shared by all groups put
    every receive of g on one broker: a message on the others waited for a consumer)."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0)
    closing = asyncio.Event()

    def mine(broker: FakeBroker) -> int:
        return sum(p.group == "g" for p in broker.pops)

    loop = asyncio.get_running_loop()
    receives = []
    for group in ["g", "x", "x"] * 6:
        held_before = held(brokers)
        receive = ReceiveRequest("t", group, "*", 1, 30_000, 5.0, loop.time() + 5.5)
        receives.append(asyncio.create_task(strategy.receive(receive, closing)))
        await held_becomes(brokers, held_before + 1)
    assert [mine(b) for b in brokers.values()] == [2, 2, 2]
    for b in brokers.values():
        b.put(*(popped(b.name, f"{b.name}-{j}") for j in range(6)))
    await asyncio.wait_for(asyncio.gather(*receives), 2)


async def test_a_groups_long_polls_spread_over_the_brokers_per_filter() -> None:
    """A Pop takes only what its filter accepts: a group's long polls with filter a spread over the brokers
    whatever its Pops with filter b do (consumers of a group with different filters: a subscription being
    changed), so a second Pop with a does not join the first while a broker holds none with a."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0)
    closing = asyncio.Event()
    loop = asyncio.get_running_loop()
    receives = []
    for tag_filter in ("a", "b", "b", "a"):
        receive = ReceiveRequest("t", "g", tag_filter, 1, 30_000, 5.0, loop.time() + 5.5)
        receives.append(asyncio.create_task(strategy.receive(receive, closing)))
        await held_becomes(brokers, len(receives))
    with_a = [name for name, b in brokers.items() for p in b.pops if p.filter == "a"]
    assert len(set(with_a)) == 2, with_a
    for b in brokers.values():
        b.put(*(popped(b.name, f"{b.name}-{j}") for j in range(2)))
    await asyncio.wait_for(asyncio.gather(*receives), 2)


def test_covered_long_polls_move_to_a_broker_where_a_message_has_no_taker() -> None:
    """2 of the group's Pops on each broker, 3 messages on b1 and 3 on b2: the Pops on b3 waited on nothing
    while a message on b1 and one on b2 had no taker (a review's probe: 11.9 s, and empty answers meanwhile).
    Covered (adaptive), a broker where none of the group's Pops is held is watched, and one held elsewhere moves
    there when a message comes."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    metrics = ProxyMetrics(CollectorRegistry())
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0, metrics=metrics, cover=True)
    closing = asyncio.Event()

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        receives = []
        for _ in range(6):
            receive = ReceiveRequest("t", "g", "*", 1, 30_000, 5.0, loop.time() + 5.5)
            receives.append(asyncio.create_task(strategy.receive(receive, closing)))
            n = len(receives)  # the Pops spread 1 per broker, then 2; a broker without one is watched meanwhile
            await held_becomes(brokers, n + 3 - min(n, 3))
        for name in ("b1", "b2"):
            brokers[name].put(*(popped(name, f"{name}-{j}") for j in range(3)))
        results = await asyncio.wait_for(asyncio.gather(*receives), 2)  # not the 5 s poll
        return sorted(m for r in results for m in ids(r))

    assert asyncio.run(scenario()) == ["b1-0", "b1-1", "b1-2", "b2-0", "b2-1", "b2-2"]
    moved = metrics.registry.get_sample_value("popgate_proxy_long_polls_moved_total", {"group": "g"})
    assert moved == 2  # both from b3
    assert held(brokers) == 0  # every watch ended with the last Pop


async def test_plain_longpoll_does_not_watch_or_move() -> None:
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0)
    closing = asyncio.Event()
    loop = asyncio.get_running_loop()
    receive = ReceiveRequest("t", "g", "*", 1, 30_000, 0.3, loop.time() + 0.8)
    assert (await strategy.receive(receive, closing)).messages == []
    assert [len(b.notifications) for b in brokers.values()] == [0, 0, 0]


async def test_a_broker_whose_pop_just_failed_for_the_topic_is_tried_last() -> None:
    """b1 does not have the topic (--no-auto-create): holding none of the group's Pops, it would sort first for
    every long poll and cost each a round trip; after its first refusal the others go first."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    brokers["b1"].fail = errors.TopicNotFound("topic t does not exist on broker b1")
    tried = []
    real_pop = brokers["b1"].pop

    async def counted(request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        tried.append(request)
        return await real_pop(request, timeout_s=timeout_s)

    brokers["b1"].pop = counted  # type: ignore[method-assign]
    pool = BrokerPool(brokers, first_turn=0)
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0)
    closing = asyncio.Event()
    loop = asyncio.get_running_loop()
    receives = []
    for _ in range(12):
        held_before = held(brokers)
        receive = ReceiveRequest("t", "g", "*", 1, 30_000, 5.0, loop.time() + 5.5)
        receives.append(asyncio.create_task(strategy.receive(receive, closing)))
        await held_becomes(brokers, held_before + 1)
    closing.set()
    await asyncio.gather(*receives)
    assert len(tried) == 1
    assert [len(b.pops) for b in brokers.values()] == [0, 6, 6]


async def test_a_broker_that_failed_is_tried_first_again_once_its_health_checks_see_it_back() -> None:
    """Hung (a Pop timed out), it goes last; back up (its health checks pass again), it is no longer passed over
    for the rest of the 5 s: a resumed broker's backlog waited for consumers held elsewhere (a review's probe)."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    brokers["b1"].fail = BrokerTimeout("broker b1 did not answer in time")
    pool = BrokerPool(brokers, first_turn=0)
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0)
    closing = asyncio.Event()

    def request() -> ReceiveRequest:
        return ReceiveRequest("t", "g", "*", 1, 30_000, 5.0, asyncio.get_running_loop().time() + 5.5)

    async def held_at() -> str:
        """Where the next receive's Pop is held (the one broker whose Pops grew)."""
        before = {name: len(b.pops) for name, b in brokers.items()}
        receives.append(asyncio.create_task(strategy.receive(request(), closing)))
        await held_becomes(brokers, len(receives))
        return next(name for name, b in brokers.items() if len(b.pops) > before[name])

    receives: list[asyncio.Task[ReceiveResult]] = []
    loop = asyncio.get_running_loop()
    await strategy.receive(ReceiveRequest("t", "g", "*", 1, 30_000, 0.0, loop.time() + 1.0), closing)  # b1 fails
    brokers["b1"].fail = None
    places = [await held_at() for _ in range(3)]  # b1, holding none, still comes after b2 and b3
    brokers["b1"].healthy = False  # the health checks saw it down, then up again
    brokers["b1"].healthy = True
    places.append(await held_at())  # b1 holds the fewest of the group's Pops: its turn now
    closing.set()
    await asyncio.gather(*receives)
    assert sorted(places[:2]) == ["b2", "b3"] and places[2] != "b1" and places[3] == "b1", places


async def test_a_long_poll_answered_as_its_client_leaves_gives_the_messages_back() -> None:
    m1 = bpb.PopResponse(messages=[popped("b1", "m1")])
    assert await answered_as_the_client_leaves(LongPollStrategy, m1) == ["m1"]


async def test_a_pop_that_does_not_wait_passes_a_hung_broker_over_in_its_short_timeout() -> None:
    """A receive that does not wait asks the brokers in turn: one hung but not yet failed by its health checks
    gets the short timeout of a call that does not wait, as in notify mode, not the whole broker timeout, so the
    next broker's message still comes within the client's deadline."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    for name in ("b2", "b3"):
        brokers[name].put(popped(name, f"m-{name}"))
    asked: list[float] = []

    def hung(request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        async def times_out() -> bpb.PopResponse:
            await asyncio.sleep(timeout_s)
            raise BrokerTimeout("broker b1 did not answer in time")

        asked.append(timeout_s)
        return asyncio.ensure_future(times_out())

    brokers["b1"].begin_pop = hung  # type: ignore[method-assign]
    strategy = LongPollStrategy(BrokerPool(brokers, first_turn=0), broker_timeout_s=3.0)
    loop = asyncio.get_running_loop()
    result = await strategy.receive(ReceiveRequest("t", "g", "*", 1, 30_000, 0.0, loop.time() + 3.0), asyncio.Event())
    assert asked == [0.5] and ids(result) in (["m-b2"], ["m-b3"])


async def test_a_long_poll_a_stopping_broker_ends_at_once_goes_on_at_the_next_broker() -> None:
    """A broker stopping answers the Pops it holds at once, empty and not held: the receive goes on at the next
    broker for its poll time left (a message sent there meanwhile is delivered), not an empty answer at once."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    stopping = {"b1"}
    for name in NAMES:
        real_pop = brokers[name].pop

        async def pop(request: bpb.PopRequest, *, timeout_s: float, name: str = name, real: Any = real_pop) -> Any:
            if name in stopping:
                await asyncio.sleep(0.05)
                return bpb.PopResponse(closing=True)  # what a stopping broker answers its held Pops
            return await real(request, timeout_s=timeout_s)

        brokers[name].pop = pop  # type: ignore[method-assign]
    strategy = LongPollStrategy(BrokerPool(brokers, first_turn=0), broker_timeout_s=1.0)
    loop = asyncio.get_running_loop()
    receive = asyncio.create_task(
        strategy.receive(ReceiveRequest("t", "g", "*", 1, 30_000, 5.0, loop.time() + 5.5), asyncio.Event())
    )
    await held_becomes(brokers, 1)  # held at the next broker
    for broker in brokers.values():
        if broker.held:
            broker.put(popped(broker.name, "after"))
    result = await asyncio.wait_for(receive, 5)
    assert ids(result) == ["after"]


async def test_a_groups_receives_rotate_over_the_brokers_whatever_others_do() -> None:
    """Three brokers, a backlog on b1 only, and each receive of group a followed by two of group b: with one turn
    for every receive of the proxy, a's receives would land on the same broker each time (never b1, here). Each
    group's receives have their own turn, so a's reach b1 every third time."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    brokers["b1"].put(*(popped("b1", f"m{i}") for i in range(30)))
    strategy = LongPollStrategy(BrokerPool(brokers, first_turn=1), broker_timeout_s=1.0)
    loop = asyncio.get_running_loop()
    got = 0
    for _ in range(9):
        a = ReceiveRequest("t", "a", "*", 1, 30_000, 0.01, loop.time() + 1.0)
        got += bool((await strategy.receive(a, asyncio.Event())).messages)
        for _ in range(2):
            b = ReceiveRequest("other", "b", "*", 1, 30_000, 0.0, loop.time() + 1.0)
            await strategy.receive(b, asyncio.Event())
    assert got >= 3
