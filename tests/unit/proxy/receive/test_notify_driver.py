"""Pop with notify through the core, over in-memory brokers (no sockets)."""

from __future__ import annotations

import asyncio

import pytest
from popgate_pb import broker_pb2 as bpb
from prometheus_client import CollectorRegistry

from popgate_contract import errors
from popgate_contract.errors import BrokerTimeout
from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.receive.notify_driver import NotifyStrategy
from proxy.routing import BrokerPool
from tests.unit.proxy.fakes import FakeBroker, popped
from tests.unit.proxy.receive.support import NAMES, answered_as_the_client_leaves, held, held_becomes, ids, request


def make(*, metrics: ProxyMetrics | None = None) -> tuple[Proxy, dict[str, FakeBroker]]:
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    return Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics), metrics=metrics), brokers


def watches(broker: FakeBroker) -> list[bpb.NotificationRequest]:
    """The Notifications a run sent `broker` (poll 0 ones are the group's announcement, proxy.receive.announce)."""
    return [n for n in broker.notifications if n.poll_ms > 0]


async def test_backlog_is_served_by_the_first_pop_without_notifications() -> None:
    proxy, brokers = make()
    brokers["b1"].ready.append(popped("b1", "m1"))
    result = await proxy.receive(request(2.0))
    assert ids(result) == ["m1"]
    assert all(not watches(b) for b in brokers.values())


async def test_a_message_on_any_broker_wakes_the_receive_at_once_and_no_hold_is_left() -> None:
    proxy, brokers = make()
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
    assert ids(result) == ["m3"] and waited < 2.5  # not the 5 s poll


async def test_with_one_broker_the_receive_waits_in_a_held_pop_and_sends_no_notification() -> None:
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0))
    receive = asyncio.create_task(proxy.receive(request(5.0)))
    await held_becomes({"b1": broker}, 1)
    broker.put(popped("b1", "m1"))
    result = await asyncio.wait_for(receive, 2)
    assert ids(result) == ["m1"]
    assert not watches(broker) and [p.poll_ms > 0 for p in broker.pops] == [False, True]


async def test_two_receives_race_for_one_message_the_loser_waits_for_the_next() -> None:
    proxy, brokers = make()
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
    won, next_one = ids(done.result()), ids(await asyncio.wait_for(loser, 2))
    assert won == ["m1"] and next_one == ["m2"]


async def test_end_of_poll_time_answers_empty_and_releases_every_broker() -> None:
    proxy, brokers = make()
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await proxy.receive(request(0.2))
    took = loop.time() - started
    await held_becomes(brokers, 0)
    assert result.outcome == "empty" and not result.messages and 0.15 < took < 0.9  # not a 1 s broker timeout


async def test_a_client_that_goes_away_leaves_no_hold_on_any_broker() -> None:
    proxy, brokers = make()
    receive = asyncio.create_task(proxy.receive(request(5.0)))
    await held_becomes(brokers, 3)
    receive.cancel()
    await asyncio.gather(receive, return_exceptions=True)
    await held_becomes(brokers, 0, 0.5)


async def test_shutdown_answers_held_receives_at_once() -> None:
    proxy, brokers = make()
    receive = asyncio.create_task(proxy.receive(request(5.0)))
    await held_becomes(brokers, 3)
    proxy.close()
    result = await asyncio.wait_for(receive, 0.5)
    await held_becomes(brokers, 0)
    assert result.outcome == "closing"


async def test_notify_metrics_count_runs_notifications_and_first_pop_hits() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    proxy, brokers = make(metrics=metrics)
    brokers["b1"].ready.append(popped("b1", "m1"))
    await proxy.receive(request(1.0))  # first-pop hit
    receive = asyncio.create_task(proxy.receive(request(5.0)))
    await held_becomes(brokers, 3)
    brokers["b2"].put(popped("b2", "m2"))
    await receive
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_receive_first_pop_hits_total", {"group": "g"}) == 1
    assert value("popgate_proxy_notify_runs_total", {"group": "g"}) == 2
    assert value("popgate_proxy_notifications_total", {"group": "g", "outcome": "has_message"}) == 1
    assert value("popgate_proxy_notifications_total", {"group": "g", "outcome": "unanswered"}) == 2
    assert value("popgate_proxy_notify_pops_total", {"group": "g", "kind": "consume"}) == 1
    assert value("popgate_proxy_receives_total", {"group": "g", "mode": "notify", "outcome": "messages"}) == 2


async def test_notify_metrics_tell_held_until_the_poll_ended_from_a_receive_that_did_not_wait() -> None:
    """A receive held until its poll ended: its Notifications count as empty (not unanswered) and it long-polled;
    one that does not wait (poll 0: a last look at every broker) did not long-poll."""
    metrics = ProxyMetrics(CollectorRegistry())
    proxy, _ = make(metrics=metrics)
    await proxy.receive(request(0.2))
    await proxy.receive(request(0.0))
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_notifications_total", {"group": "g", "outcome": "empty"}) == 3 + 2
    assert value("popgate_proxy_notifications_total", {"group": "g", "outcome": "unanswered"}) is None
    assert value("popgate_proxy_long_polling_receives_total", {"group": "g"}) == 1
    assert value("popgate_proxy_receives_total", {"group": "g", "mode": "notify", "outcome": "empty"}) == 2


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


async def test_a_pop_answer_that_crosses_the_receives_end_goes_back_to_its_broker() -> None:
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
    back = [m.stored.message.message_id for m in brokers["b2"].ready]
    # Received, or ready again (never hidden for its invisible time); not both (a duplicate delivery).
    assert (ids(result) == ["m1"]) != (back == ["m1"]), (ids(result), back)


async def test_a_notify_runs_pop_answered_as_its_client_leaves_gives_the_messages_back() -> None:
    m1 = bpb.PopResponse(messages=[popped("b1", "m1")])
    # the first Pop finds nothing, then (one broker) a held Pop answers
    assert await answered_as_the_client_leaves(NotifyStrategy, bpb.PopResponse(), m1) == ["m1"]


class HungBroker(FakeBroker):
    """Accepts requests and never answers them (SIGSTOPped, not yet marked down): each ends at its timeout,
    as the real client's do (BrokerTimeout)."""

    def begin_pop(self, request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        future: asyncio.Future[bpb.PopResponse] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(
            timeout_s, lambda: future.done() or future.set_exception(BrokerTimeout(f"{self.name}: no answer"))
        )
        return future


async def test_a_hung_broker_does_not_keep_the_first_pop_from_the_others_past_the_poll() -> None:
    brokers: dict[str, FakeBroker] = {"b1": HungBroker("b1"), "b2": FakeBroker("b2")}
    pool = BrokerPool(brokers, first_turn=0)  # the first Pop goes to b1
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=3.0))
    brokers["b2"].put(popped("b2", "ready-on-b2"))
    result = await proxy.receive(request(poll_s=2.0))  # shorter than the broker timeout
    assert ids(result) == ["ready-on-b2"]  # not a false empty after waiting on b1


class SlowFirstPop(FakeBroker):
    """Never answers its first Pop (one that does not wait), which ends at its short timeout (BrokerTimeout) as the
    real client's does under a burst of receives; answers everything after that, its health checks passing."""

    def begin_pop(self, request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        if self.pops:
            return super().begin_pop(request, timeout_s=timeout_s)
        self.pops.append(request)
        future: asyncio.Future[bpb.PopResponse] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(
            timeout_s, lambda: future.done() or future.set_exception(BrokerTimeout(f"{self.name}: no answer"))
        )
        return future


async def test_a_long_poll_at_a_lone_broker_slow_to_answer_its_first_pop_waits_on_and_gets_a_later_message() -> None:
    broker = SlowFirstPop("b1")
    pool = BrokerPool({"b1": broker}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=3.0))
    receive = asyncio.create_task(proxy.receive(request(poll_s=3.0)))
    await held_becomes({"b1": broker}, 1, timeout_s=2.5)  # looked at again after the rewatch delay
    broker.put(popped("b1", "later"))
    assert ids(await receive) == ["later"]  # not the first Pop's timeout (PROXY_TIMEOUT) at 0.5 s
    empty = SlowFirstPop("b1")
    pool = BrokerPool({"b1": empty}, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=3.0))
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert ids(await proxy.receive(request(poll_s=2.0))) == []  # nothing came: empty at the poll's end
    assert loop.time() - start >= 1.9


async def test_a_broker_that_fails_during_a_long_poll_and_comes_back_is_watched_again() -> None:
    """A broker restarted during a receive: its Notification fails, it is back a moment later, a message then
    lands on it: the receive gets it (a rolling restart must not turn a long poll into a false empty)."""
    proxy, brokers = make()
    brokers["b1"].fail = errors.BrokerUnavailable("b1: session lost")  # its first Pop fails (restarting)
    receive = asyncio.create_task(proxy.receive(request(poll_s=5.0)))
    await held_becomes(brokers, 2)  # b2 and b3 hold Notifications; b1's failed
    brokers["b1"].fail = None  # back (the health checks never saw it down)
    await held_becomes(brokers, 3, timeout_s=3.0)  # watched again after the rewatch delay
    brokers["b1"].put(popped("b1", "after-restart"))
    result = await receive
    assert ids(result) == ["after-restart"]


async def test_a_groups_first_receive_announces_it_to_every_live_broker_once() -> None:
    """So that each broker knows the group (its lag there, its start under `latest`) though the receive's first
    Pop was answered by one broker only."""
    proxy, brokers = make()
    brokers["b1"].ready.append(popped("b1", "m1"))
    brokers["b1"].ready.append(popped("b1", "m2"))
    assert ids(await proxy.receive(request(2.0, batch=1))) == ["m1"]
    assert ids(await proxy.receive(request(2.0, batch=1))) == ["m2"]
    for broker in brokers.values():  # one poll-0 Notification each (the second receive's run may watch too)
        announced = [(n.topic, n.group, n.filter) for n in broker.notifications if n.poll_ms == 0]
        assert announced == [("t", "g", "*")], broker.name


async def test_a_broker_down_when_the_receive_starts_is_watched_once_it_is_back() -> None:
    """A broker restarting (or stalled past a health check) as a long poll starts: once the checks see it up,
    the receive watches it, and a message stored there is delivered (it was answered empty at the poll's end)."""
    proxy, brokers = make()
    brokers["b1"].healthy = False
    receive = asyncio.create_task(proxy.receive(request(poll_s=5.0)))
    await held_becomes(brokers, 2)  # b2 and b3 hold Notifications
    brokers["b1"].healthy = True
    await held_becomes(brokers, 3)
    brokers["b1"].put(popped("b1", "on-b1"))
    result = await receive
    assert ids(result) == ["on-b1"]


async def test_a_broker_that_moves_while_down_is_watched_at_its_new_client_once_that_is_up() -> None:
    """Down as the receive starts, then found at another address (discovery replaced its client): the run waits
    for the new client to be up, watches it, and a message stored there is delivered."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0))
    brokers["b1"].healthy = False
    receive = asyncio.create_task(proxy.receive(request(poll_s=5.0)))
    await held_becomes(brokers, 2)
    moved = FakeBroker("b1", healthy=False)
    pool.put(moved)
    brokers["b1"].retire()
    await asyncio.sleep(0.05)  # the old client's wait answered: the run looked at the new one
    assert not moved.notifications  # down: not watched yet
    moved.healthy = True
    await held_becomes({**brokers, "b1": moved}, 3)
    moved.put(popped("b1", "moved"))
    assert ids(await receive) == ["moved"]


async def test_a_has_message_the_answered_receive_did_not_pop_is_handed_back_to_its_broker() -> None:
    proxy, brokers = make()
    receive = asyncio.create_task(proxy.receive(request(5.0, batch=1)))
    await held_becomes(brokers, 3)
    brokers["b1"].put(popped("b1", "m1"))
    brokers["b2"].put(popped("b2", "m2"))  # both announced in the same turn; one Pop at a time: b1's first
    result = await receive
    result.release()
    assert ids(result) == ["m1"]
    assert (brokers["b1"].passed_on, brokers["b2"].passed_on) == (0, 1)  # b2 wakes another consumer for m2


class HangsOnceWatched(FakeBroker):
    """Answers Notifications, and never answers a Pop once it has answered one (a stall): the Pop ends at its
    timeout (BrokerTimeout) or with its receive, and the broker may never have run it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.stalled = asyncio.Event()  # set when a Pop is left unanswered

    def begin_pop(self, request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        if not self.notifications:
            return super().begin_pop(request, timeout_s=timeout_s)
        self.stalled.set()
        future: asyncio.Future[bpb.PopResponse] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(
            timeout_s, lambda: future.done() or future.set_exception(BrokerTimeout(f"{self.name}: no answer"))
        )
        return future


@pytest.mark.parametrize("ends", ["timed out", "client gone"])
async def test_a_has_message_whose_pop_ends_unanswered_is_handed_back_to_its_broker(ends: str) -> None:
    brokers: dict[str, FakeBroker] = {"b1": HangsOnceWatched("b1"), "b2": FakeBroker("b2")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=0.2))  # a poll-0 Pop times out after 0.2 s
    receive = asyncio.create_task(proxy.receive(request(poll_s=0.8)))
    await held_becomes(brokers, 2)
    brokers["b1"].put(popped("b1", "m1"))  # has_message, then a Pop b1 never answers
    stalled = brokers["b1"]
    assert isinstance(stalled, HangsOnceWatched)
    await asyncio.wait_for(stalled.stalled.wait(), 2)
    if ends == "client gone":
        receive.cancel()
    await asyncio.gather(receive, return_exceptions=True)
    assert brokers["b1"].passed_on == 1  # b1 wakes another consumer's request for m1
