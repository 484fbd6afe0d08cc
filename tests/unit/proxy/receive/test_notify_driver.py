"""Pop with notify and the adaptive switch through the core, over in-memory brokers (no sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from popgate_pb import broker_pb2 as bpb
from prometheus_client import CollectorRegistry

from popgate_contract import errors
from popgate_contract.errors import BrokerTimeout
from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.receive.adaptive import AdaptivePolicy, AdaptiveSettings
from proxy.receive.adaptive_driver import AdaptiveStrategy
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.notify_driver import NotifyStrategy
from proxy.receive.seam import ReceiveRequest, ReceiveResult
from proxy.routing import BrokerPool
from tests.unit.proxy.fakes import FakeBroker, popped

T = TypeVar("T")
NAMES = ("b1", "b2", "b3")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make(*, metrics: ProxyMetrics | None = None) -> tuple[Proxy, dict[str, FakeBroker]]:
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    return Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics), brokers


def request(poll_s: float, *, batch: int = 32) -> ReceiveRequest:
    loop = asyncio.get_running_loop()
    return ReceiveRequest("t", "g", "*", batch, 30_000, poll_s, loop.time() + poll_s + 0.5)


def held(brokers: dict[str, FakeBroker]) -> int:
    return sum(b.held for b in brokers.values())


async def held_becomes(brokers: dict[str, FakeBroker], count: int, timeout_s: float = 2.0) -> None:
    """Wait (bounded) until the brokers hold `count` requests in all, woken by their `changed` events."""
    async with asyncio.timeout(timeout_s):
        while held(brokers) != count:
            waits = {asyncio.ensure_future(b.changed.wait()) for b in brokers.values()}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


def ids(result: ReceiveResult) -> list[str]:
    return [m.stored.message.message_id for m in result.messages]


def watches(broker: FakeBroker) -> list[bpb.NotificationRequest]:
    """The Notifications a run sent `broker` (poll 0 ones are the group's announcement, proxy.receive.announce)."""
    return [n for n in broker.notifications if n.poll_ms > 0]


def test_backlog_is_served_by_the_first_pop_without_notifications() -> None:
    proxy, brokers = make()
    brokers["b1"].ready.append(popped("b1", "m1"))

    async def scenario() -> ReceiveResult:
        return await proxy.receive(request(2.0))

    assert ids(run(scenario())) == ["m1"]
    assert all(not watches(b) for b in brokers.values())


def test_a_message_on_any_broker_wakes_the_receive_at_once_and_no_hold_is_left() -> None:
    proxy, brokers = make()

    async def scenario() -> tuple[ReceiveResult, float]:
        loop = asyncio.get_running_loop()
        receive = asyncio.create_task(proxy.receive(request(5.0)))
        await held_becomes(brokers, 3)
        sent = loop.time()
        brokers["b3"].put(popped("b3", "m3"))
        result = await receive
        waited = loop.time() - sent
        # The other brokers' Notifications end once the answer is written (the caller releases it).
        assert held(brokers) == 2
        result.release()
        await held_becomes(brokers, 0)
        return result, waited

    result, waited = run(scenario())
    assert ids(result) == ["m3"] and waited < 0.5


def test_with_one_broker_the_receive_waits_in_a_held_pop_and_sends_no_notification() -> None:
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0))

    async def scenario() -> ReceiveResult:
        receive = asyncio.create_task(proxy.receive(request(5.0)))
        await held_becomes({"b1": broker}, 1)
        broker.put(popped("b1", "m1"))
        return await asyncio.wait_for(receive, 2)

    assert ids(run(scenario())) == ["m1"]
    assert not watches(broker) and [p.poll_ms > 0 for p in broker.pops] == [False, True]


def test_two_receives_race_for_one_message_the_loser_waits_for_the_next() -> None:
    proxy, brokers = make()

    async def scenario() -> tuple[list[str], list[str]]:
        first = asyncio.create_task(proxy.receive(request(5.0)))
        second = asyncio.create_task(proxy.receive(request(5.0)))
        await held_becomes(brokers, 6)
        brokers["b2"].put(popped("b2", "m1"))
        winner = await asyncio.wait_for(asyncio.shield(asyncio.wait({first, second}, return_when="FIRST_COMPLETED")), 2)
        done = winner[0].pop()
        loser = second if done is first else first
        assert not loser.done()
        done.result().release()
        await held_becomes(brokers, 3)  # the loser watches all three brokers again
        brokers["b1"].put(popped("b1", "m2"))
        return ids(done.result()), ids(await asyncio.wait_for(loser, 2))

    won, next_one = run(scenario())
    assert won == ["m1"] and next_one == ["m2"]


def test_end_of_poll_time_answers_empty_and_releases_every_broker() -> None:
    proxy, brokers = make()

    async def scenario() -> tuple[ReceiveResult, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await proxy.receive(request(0.2))
        took = loop.time() - started
        await held_becomes(brokers, 0)
        return result, took

    result, took = run(scenario())
    assert result.outcome == "empty" and not result.messages and 0.15 < took < 0.6


def test_a_client_that_goes_away_leaves_no_hold_on_any_broker() -> None:
    proxy, brokers = make()

    async def scenario() -> None:
        receive = asyncio.create_task(proxy.receive(request(5.0)))
        await held_becomes(brokers, 3)
        receive.cancel()
        await asyncio.gather(receive, return_exceptions=True)
        await held_becomes(brokers, 0, 0.5)

    run(scenario())


def test_shutdown_answers_held_receives_at_once() -> None:
    proxy, brokers = make()

    async def scenario() -> ReceiveResult:
        receive = asyncio.create_task(proxy.receive(request(5.0)))
        await held_becomes(brokers, 3)
        proxy.close()
        result = await asyncio.wait_for(receive, 0.5)
        await held_becomes(brokers, 0)
        return result

    assert run(scenario()).outcome == "closing"


def test_notify_metrics_count_runs_notifications_and_first_pop_hits() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    proxy, brokers = make(metrics=metrics)

    async def scenario() -> None:
        brokers["b1"].ready.append(popped("b1", "m1"))
        await proxy.receive(request(1.0))  # first-pop hit
        receive = asyncio.create_task(proxy.receive(request(5.0)))
        await held_becomes(brokers, 3)
        brokers["b2"].put(popped("b2", "m2"))
        await receive

    run(scenario())
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_receive_first_pop_hits_total", {"group": "g"}) == 1
    assert value("popgate_proxy_notify_runs_total", {"group": "g"}) == 2
    assert value("popgate_proxy_notifications_total", {"group": "g", "outcome": "has_message"}) == 1
    assert value("popgate_proxy_notifications_total", {"group": "g", "outcome": "unanswered"}) == 2
    assert value("popgate_proxy_notify_pops_total", {"group": "g", "kind": "consume"}) == 1
    assert value("popgate_proxy_receives_total", {"group": "g", "mode": "notify", "outcome": "messages"}) == 2


def test_notify_metrics_tell_held_until_the_poll_ended_from_a_receive_that_did_not_wait() -> None:
    """A receive held until its poll ended: its Notifications count as empty (not unanswered) and it long-polled;
    one that does not wait (poll 0: a last look at every broker) did not long-poll."""
    metrics = ProxyMetrics(CollectorRegistry())
    proxy, _ = make(metrics=metrics)

    async def scenario() -> None:
        await proxy.receive(request(0.2))
        await proxy.receive(request(0.0))

    run(scenario())
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_notifications_total", {"group": "g", "outcome": "empty"}) == 3 + 2
    assert value("popgate_proxy_notifications_total", {"group": "g", "outcome": "unanswered"}) is None
    assert value("popgate_proxy_long_polling_receives_total", {"group": "g"}) == 1
    assert value("popgate_proxy_receives_total", {"group": "g", "mode": "notify", "outcome": "empty"}) == 2


def test_long_poll_metrics_count_a_receive_answered_at_once_as_a_hit_and_only_a_held_one_as_long_polling() -> None:
    """is_long_polling is RocketMQ's "suspended": a Pop the broker held. A long-poll receive on a backlog is
    answered at once: a first-Pop hit, as notify's would be (it counted as long polling, and never as a hit, so the
    hit ratio fell whenever adaptive switched to long polling — a review's probe)."""
    metrics = ProxyMetrics(CollectorRegistry())
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics)

    async def scenario() -> None:
        for b in brokers.values():
            b.ready.append(popped(b.name, "backlog-" + b.name))
        for _ in brokers:
            assert ids(await proxy.receive(request(5.0, batch=1))), "a message was waiting at every broker"
        assert ids(await proxy.receive(request(0.2))) == []  # held until its poll time ended
        receive = asyncio.create_task(proxy.receive(request(5.0)))
        await held_becomes(brokers, 1)
        next(b for b in brokers.values() if b.held).put(popped("b1", "later"))
        assert ids(await receive) == ["later"]  # held, then answered

    run(scenario())
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_receive_first_pop_hits_total", {"group": "g"}) == len(brokers)
    assert value("popgate_proxy_long_polling_receives_total", {"group": "g"}) == 2


def test_adaptive_notifies_while_quiet_and_long_polls_when_busy() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    policy = AdaptivePolicy(AdaptiveSettings(window_s=1.0, rate_threshold=0, concurrency_per_broker=1))
    strategy = AdaptiveStrategy(
        pool,
        policy,
        NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics),
        LongPollStrategy(pool, broker_timeout_s=1.0, metrics=metrics),
        metrics=metrics,
    )
    proxy = Proxy(pool, strategy, metrics=metrics)

    async def scenario() -> None:
        receives = [asyncio.create_task(proxy.receive(request(5.0, batch=1))) for _ in range(4)]
        # The first three see fewer than 1 receive per live broker in progress: notify (3 holds each);
        # the fourth sees 3 in progress: long polling (1 hold).
        await held_becomes(brokers, 3 * 3 + 1)
        for i, b in enumerate(brokers.values()):
            b.put(*(popped(b.name, f"m{i}{j}") for j in range(4)))
        await asyncio.wait_for(asyncio.gather(*receives), 2)
        assert policy.in_progress("g") == 0

    run(scenario())
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_receive_mode_decisions_total", {"group": "g", "mode": "notify", "reason": "quiet"}) == 3
    assert (
        value("popgate_proxy_receive_mode_decisions_total", {"group": "g", "mode": "longpoll", "reason": "concurrency"})
        == 1
    )
    assert value("popgate_proxy_long_polling_receives_total", {"group": "g"}) == 4  # 3 notify runs + 1 long poll


def test_a_groups_long_polls_spread_evenly_over_the_brokers_whatever_other_groups_do() -> None:
    """Each long poll of a group goes where the group has the fewest held: 6 receives of g on 3 brokers are 2
    on each, also when two receives of another group come between each (a turn shared by all groups put
    every receive of g on one broker: a message on the others waited for a consumer)."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0)
    closing = asyncio.Event()

    def mine(broker: FakeBroker) -> int:
        return sum(p.group == "g" for p in broker.pops)

    async def scenario() -> None:
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

    run(scenario())


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

    assert run(scenario()) == ["b1-0", "b1-1", "b1-2", "b2-0", "b2-1", "b2-2"]
    moved = metrics.registry.get_sample_value("popgate_proxy_long_polls_moved_total", {"group": "g"})
    assert moved == 2  # both from b3
    assert held(brokers) == 0  # every watch ended with the last Pop


def test_plain_longpoll_does_not_watch_or_move() -> None:
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0)
    closing = asyncio.Event()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        receive = ReceiveRequest("t", "g", "*", 1, 30_000, 0.3, loop.time() + 0.8)
        assert (await strategy.receive(receive, closing)).messages == []

    run(scenario())
    assert [len(b.notifications) for b in brokers.values()] == [0, 0, 0]


def test_a_broker_whose_pop_just_failed_for_the_topic_is_tried_last() -> None:
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

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        receives = []
        for _ in range(12):
            held_before = held(brokers)
            receive = ReceiveRequest("t", "g", "*", 1, 30_000, 5.0, loop.time() + 5.5)
            receives.append(asyncio.create_task(strategy.receive(receive, closing)))
            await held_becomes(brokers, held_before + 1)
        closing.set()
        await asyncio.gather(*receives)

    run(scenario())
    assert len(tried) == 1
    assert [len(b.pops) for b in brokers.values()] == [0, 6, 6]


def test_a_broker_that_failed_is_tried_first_again_once_its_health_checks_see_it_back() -> None:
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

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        await strategy.receive(ReceiveRequest("t", "g", "*", 1, 30_000, 0.0, loop.time() + 1.0), closing)  # b1 fails
        brokers["b1"].fail = None
        places = [await held_at() for _ in range(3)]  # b1, holding none, still comes after b2 and b3
        brokers["b1"].healthy = False  # the health checks saw it down, then up again
        brokers["b1"].healthy = True
        places.append(await held_at())  # b1 holds the fewest of the group's Pops: its turn now
        closing.set()
        await asyncio.gather(*receives)
        return places

    places = run(scenario())
    assert sorted(places[:2]) == ["b2", "b3"] and places[2] != "b1" and places[3] == "b1", places


class AnswersAtTheDeadline(FakeBroker):
    """A consume Pop whose answer (with the message) lands in the loop turn of the receive's hard deadline."""

    deadline = 0.0

    def begin_pop(self, request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bpb.PopResponse] = loop.create_future()
        if request.poll_ms == 0 and not self.ready:
            answer.set_result(bpb.PopResponse())
            return answer
        taken, self.ready = self.ready, []
        loop.call_at(self.deadline - 1e-6, lambda: answer.done() or answer.set_result(bpb.PopResponse(messages=taken)))
        return answer


def test_a_pop_answer_that_crosses_the_receives_end_goes_back_to_its_broker() -> None:
    async def scenario() -> tuple[ReceiveResult, list[str]]:
        brokers = {n: AnswersAtTheDeadline(n) for n in ("b1", "b2")}
        pool = BrokerPool(brokers, first_turn=0)
        proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0))
        receive = request(0.05)
        for broker in brokers.values():
            broker.deadline = receive.deadline
        task = asyncio.ensure_future(proxy.receive(receive))
        await held_becomes(brokers, 2)
        brokers["b2"].put(popped("b2", "m1"))  # wakes b2's Notification: a consume Pop answered at the deadline
        result = await task
        return result, [m.stored.message.message_id for m in brokers["b2"].ready]

    result, back = run(scenario())
    # Received, or ready again (never hidden for its invisible time); not both (a duplicate delivery).
    assert (ids(result) == ["m1"]) != (back == ["m1"]), (ids(result), back)


async def answered_as_the_client_leaves(
    strategy: type[LongPollStrategy | NotifyStrategy], *answers: bpb.PopResponse
) -> list[str]:
    """A receive whose last Pop answers in the loop turn its client goes away; the messages ready again."""
    broker = FakeBroker("b1")
    asked: asyncio.Queue[asyncio.Future[bpb.PopResponse]] = asyncio.Queue()

    def begin_pop(request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        call: asyncio.Future[bpb.PopResponse] = asyncio.get_running_loop().create_future()
        asked.put_nowait(call)
        return call

    broker.begin_pop = begin_pop  # type: ignore[method-assign]
    pool = BrokerPool({"b1": broker}, first_turn=0)
    proxy = Proxy(pool, strategy(pool, broker_timeout_s=1.0))
    task = asyncio.ensure_future(proxy.receive(request(5.0)))
    for answer in answers:
        call = await asyncio.wait_for(asked.get(), 2)
        call.set_result(answer)
    task.cancel()  # the last answer is set, and the client goes away in the same loop turn
    await asyncio.gather(task, return_exceptions=True)
    for _ in range(5):
        await asyncio.sleep(0)
    return [m.stored.message.message_id for m in broker.ready]


def test_a_long_poll_answered_as_its_client_leaves_gives_the_messages_back() -> None:
    m1 = bpb.PopResponse(messages=[popped("b1", "m1")])
    assert run(answered_as_the_client_leaves(LongPollStrategy, m1)) == ["m1"]


def test_a_notify_runs_pop_answered_as_its_client_leaves_gives_the_messages_back() -> None:
    m1 = bpb.PopResponse(messages=[popped("b1", "m1")])
    # the first Pop finds nothing, then (one broker) a held Pop answers
    assert run(answered_as_the_client_leaves(NotifyStrategy, bpb.PopResponse(), m1)) == ["m1"]


class HungBroker(FakeBroker):
    """Accepts requests and never answers them (SIGSTOPped, not yet marked down): each ends at its timeout,
    as the real client's do (BrokerTimeout)."""

    def begin_pop(self, request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        future: asyncio.Future[bpb.PopResponse] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(
            timeout_s, lambda: future.done() or future.set_exception(BrokerTimeout(f"{self.name}: no answer"))
        )
        return future


def test_a_hung_broker_does_not_keep_the_first_pop_from_the_others_past_the_poll() -> None:
    brokers: dict[str, FakeBroker] = {"b1": HungBroker("b1"), "b2": FakeBroker("b2")}
    pool = BrokerPool(brokers, first_turn=0)  # the first Pop goes to b1
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=3.0))
    brokers["b2"].put(popped("b2", "ready-on-b2"))

    async def scenario() -> ReceiveResult:
        return await proxy.receive(request(poll_s=2.0))  # shorter than the broker timeout

    assert ids(run(scenario())) == ["ready-on-b2"]  # not a false empty after waiting on b1


def test_a_broker_that_fails_during_a_long_poll_and_comes_back_is_watched_again() -> None:
    """A broker restarted during a receive: its Notification fails, it is back a moment later, a message then
    lands on it: the receive gets it (a rolling restart must not turn a long poll into a false empty)."""
    proxy, brokers = make()
    brokers["b1"].fail = errors.BrokerUnavailable("b1: session lost")  # its first Pop fails (restarting)

    async def scenario() -> ReceiveResult:
        receive = asyncio.create_task(proxy.receive(request(poll_s=5.0)))
        await held_becomes(brokers, 2)  # b2 and b3 hold Notifications; b1's failed
        brokers["b1"].fail = None  # back (the health checks never saw it down)
        await held_becomes(brokers, 3, timeout_s=3.0)  # watched again after the rewatch delay
        brokers["b1"].put(popped("b1", "after-restart"))
        return await receive

    assert ids(run(scenario())) == ["after-restart"]


def test_a_groups_first_receive_announces_it_to_every_live_broker_once() -> None:
    """So that each broker knows the group (its lag there, its start under `latest`) though the receive's first
    Pop was answered by one broker only."""
    proxy, brokers = make()
    brokers["b1"].ready.append(popped("b1", "m1"))
    brokers["b1"].ready.append(popped("b1", "m2"))

    async def scenario() -> None:
        assert ids(await proxy.receive(request(2.0, batch=1))) == ["m1"]
        assert ids(await proxy.receive(request(2.0, batch=1))) == ["m2"]

    run(scenario())
    for broker in brokers.values():  # one poll-0 Notification each (the second receive's run may watch too)
        announced = [(n.topic, n.group, n.filter) for n in broker.notifications if n.poll_ms == 0]
        assert announced == [("t", "g", "*")], broker.name


def test_a_broker_down_when_the_receive_starts_is_watched_once_it_is_back() -> None:
    """A broker restarting (or stalled past a health check) as a long poll starts: once the checks see it up,
    the receive watches it, and a message stored there is delivered (it was answered empty at the poll's end)."""
    proxy, brokers = make()
    brokers["b1"].healthy = False

    async def scenario() -> ReceiveResult:
        receive = asyncio.create_task(proxy.receive(request(poll_s=5.0)))
        await held_becomes(brokers, 2)  # b2 and b3 hold Notifications
        brokers["b1"].healthy = True
        await held_becomes(brokers, 3)
        brokers["b1"].put(popped("b1", "on-b1"))
        return await receive

    assert ids(run(scenario())) == ["on-b1"]


def test_a_receive_that_does_not_wait_gets_a_backlog_on_any_broker() -> None:
    """poll 0 (`popgate receive --wait 0`, a drain loop): every broker is asked once, in every mode."""
    for mode in ("notify", "adaptive", "longpoll"):
        for where in NAMES:
            brokers = {n: FakeBroker(n) for n in NAMES}
            pool = BrokerPool(brokers, first_turn=0)
            notify, longpoll = NotifyStrategy(pool, broker_timeout_s=1.0), LongPollStrategy(pool, broker_timeout_s=1.0)
            adaptive = AdaptiveStrategy(pool, AdaptivePolicy(AdaptiveSettings()), notify, longpoll)
            proxy = Proxy(pool, {"notify": notify, "longpoll": longpoll, "adaptive": adaptive}[mode])
            brokers[where].put(popped(where, "waiting"))

            async def scenario(proxy: Proxy = proxy) -> tuple[ReceiveResult, ReceiveResult]:
                return await proxy.receive(request(poll_s=0.0)), await proxy.receive(request(poll_s=0.0))

            got, then = run(scenario())
            assert ids(got) == ["waiting"], (mode, where)
            assert then.outcome == "empty" and held(brokers) == 0, (mode, where)


def test_a_has_message_the_answered_receive_did_not_pop_is_handed_back_to_its_broker() -> None:
    proxy, brokers = make()

    async def scenario() -> ReceiveResult:
        receive = asyncio.create_task(proxy.receive(request(5.0, batch=1)))
        await held_becomes(brokers, 3)
        brokers["b1"].put(popped("b1", "m1"))
        brokers["b2"].put(popped("b2", "m2"))  # both announced in the same turn; one Pop at a time: b1's first
        result = await receive
        result.release()
        return result

    assert ids(run(scenario())) == ["m1"]
    assert (brokers["b1"].passed_on, brokers["b2"].passed_on) == (0, 1)  # b2 wakes another consumer for m2


class LosesTheNextRace(FakeBroker):
    """A broker whose next Pop after a `has_message` finds nothing: another consumer took the message first."""

    steal = False

    async def pop(self, request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        if self.steal and request.poll_ms == 0:
            self.steal = False
            self.ready.clear()
        return await super().pop(request, timeout_s=timeout_s)


def test_a_handed_off_run_is_covered_and_moves_to_the_broker_a_message_lands_on() -> None:
    """Adaptive: a notify run that lost a race while its group was busy holds one Pop at that broker. Counted
    with the group's covered long polls, the other brokers stay watched; a message at one of them moves the Pop
    there. Alone it waited out its poll on the empty broker (10.5 s, then an empty answer: a review's probe)."""
    brokers: dict[str, FakeBroker] = {"b1": LosesTheNextRace("b1"), "b2": FakeBroker("b2"), "b3": FakeBroker("b3")}
    pool = BrokerPool(brokers, first_turn=0)
    metrics = ProxyMetrics(CollectorRegistry())
    covered = LongPollStrategy(pool, broker_timeout_s=1.0, metrics=metrics, cover=True)
    notify = NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics, busy=lambda group: True, cover=covered)

    async def scenario() -> list[str]:
        receive = asyncio.create_task(notify.receive(request(20.0), asyncio.Event()))
        await held_becomes(brokers, 3)  # a Notification at each broker
        first = brokers["b1"]
        assert isinstance(first, LosesTheNextRace)
        first.steal = True
        first.put(popped("b1", "taken by another consumer"))
        await held_becomes(brokers, 3)  # handed off: a Pop held at b1, the covered watches at b2 and b3
        assert [b.held for b in brokers.values()] == [1, 1, 1]
        brokers["b3"].put(popped("b3", "m3"))
        return ids(await asyncio.wait_for(receive, 2.0))

    assert run(scenario()) == ["m3"]
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_notify_pops_total", {"group": "g", "kind": "handoff"}) == 1
    assert value("popgate_proxy_long_polls_moved_total", {"group": "g"}) == 1
