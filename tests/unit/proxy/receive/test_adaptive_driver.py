"""The adaptive switch and its hand-off to covered long polling, over in-memory brokers (no sockets)."""

from __future__ import annotations

import asyncio
import inspect

from popgate_pb import broker_pb2 as bpb
from prometheus_client import CollectorRegistry

from proxy.core import Proxy
from proxy.metrics import ProxyMetrics
from proxy.receive.adaptive import AdaptivePolicy, AdaptiveSettings
from proxy.receive.adaptive_driver import AdaptiveStrategy
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.notify_driver import NotifyStrategy
from proxy.receive.seam import ReceiveResult
from proxy.routing import BrokerPool
from tests.unit.proxy.fakes import FakeBroker, popped
from tests.unit.proxy.receive.support import NAMES, held, held_becomes, ids, request


async def test_adaptive_notifies_while_quiet_and_long_polls_when_busy() -> None:
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
    receives = [asyncio.create_task(proxy.receive(request(5.0, batch=1))) for _ in range(4)]
    # The first three see fewer than 1 receive per live broker in progress: notify (3 holds each);
    # the fourth sees 3 in progress: long polling (1 hold).
    await held_becomes(brokers, 3 * 3 + 1)
    for i, b in enumerate(brokers.values()):
        b.put(*(popped(b.name, f"m{i}{j}") for j in range(4)))
    await asyncio.wait_for(asyncio.gather(*receives), 2)
    assert policy.in_progress("g") == 0
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_receive_mode_decisions_total", {"group": "g", "mode": "notify", "reason": "quiet"}) == 3
    assert (
        value("popgate_proxy_receive_mode_decisions_total", {"group": "g", "mode": "longpoll", "reason": "concurrency"})
        == 1
    )
    assert value("popgate_proxy_long_polling_receives_total", {"group": "g"}) == 4  # 3 notify runs + 1 long poll


async def test_a_receive_that_does_not_wait_gets_a_backlog_on_any_broker() -> None:
    """poll 0 (`popgate receive --wait 0`, a drain loop): every broker is asked once, in every mode."""
    for mode in ("notify", "adaptive", "longpoll"):
        for where in NAMES:
            brokers = {n: FakeBroker(n) for n in NAMES}
            pool = BrokerPool(brokers, first_turn=0)
            notify, longpoll = NotifyStrategy(pool, broker_timeout_s=1.0), LongPollStrategy(pool, broker_timeout_s=1.0)
            adaptive = AdaptiveStrategy(pool, AdaptivePolicy(AdaptiveSettings()), notify, longpoll)
            proxy = Proxy(pool, {"notify": notify, "longpoll": longpoll, "adaptive": adaptive}[mode])
            brokers[where].put(popped(where, "waiting"))
            got, then = await proxy.receive(request(poll_s=0.0)), await proxy.receive(request(poll_s=0.0))
            assert ids(got) == ["waiting"], (mode, where)
            assert then.outcome == "empty" and held(brokers) == 0, (mode, where)


class LosesTheNextRace(FakeBroker):
    """A broker whose next Pop after a `has_message` finds nothing: another consumer took the message first."""

    steal = False

    async def pop(self, request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        if self.steal and request.poll_ms == 0:
            self.steal = False
            self.ready.clear()
        return await super().pop(request, timeout_s=timeout_s)


async def handed_off(
    brokers: dict[str, FakeBroker], *, poll_s: float, metrics: ProxyMetrics | None = None
) -> asyncio.Task[ReceiveResult]:
    """A receive of an adaptive proxy's busy group (covered long polls) whose notify run lost the race at b1 (a
    `LosesTheNextRace`) and handed off: its Pop held at b1, the other brokers watched."""
    pool = BrokerPool(brokers, first_turn=0)
    metrics = metrics or ProxyMetrics(CollectorRegistry())
    covered = LongPollStrategy(pool, broker_timeout_s=1.0, metrics=metrics, cover=True)
    notify = NotifyStrategy(pool, broker_timeout_s=1.0, metrics=metrics, busy=lambda group: True, cover=covered)
    receive = asyncio.create_task(notify.receive(request(poll_s), asyncio.Event()))
    await held_becomes(brokers, len(brokers))  # a Notification at each broker
    first = brokers["b1"]
    assert isinstance(first, LosesTheNextRace)
    first.steal = True
    first.put(popped("b1", "taken by another consumer"))
    await held_becomes(brokers, len(brokers))  # handed off
    return receive


class AnswersLate(LosesTheNextRace):
    """Ends a held Pop a moment past its poll time, as a broker's answer crosses the network."""

    async def pop(self, request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        if request.poll_ms > 0 and not self.ready:
            self._held(+1)
            try:
                await asyncio.sleep(request.poll_ms / 1000 + 0.05)
            finally:
                self._held(-1)
            request = bpb.PopRequest(max_messages=request.max_messages)  # then answered with what is ready
        return await super().pop(request, timeout_s=timeout_s)


async def test_a_handed_off_pop_moved_as_its_run_drains_answers_with_the_message_it_moved_for() -> None:
    """Adaptive: the poll ended while the handed-off Pop was still held at b1 (its broker ends it later), and a
    message at b2 moved it there: the run Pops b2 at once and answers with that message. Before, the move found the
    run draining and made no Pop: the run waited for its hard deadline and answered empty, b2's message left to the
    broker's sweep (a review's probe)."""
    brokers: dict[str, FakeBroker] = {"b1": AnswersLate("b1"), "b2": FakeBroker("b2")}
    loop = asyncio.get_running_loop()
    started = loop.time()
    receive = await handed_off(brokers, poll_s=1.0)  # a Pop held at b1, b2 watched
    await asyncio.sleep(started + 1.02 - loop.time())  # the poll is over at the proxy; b1 still holds its Pop
    brokers["b2"].put(popped("b2", "m2"))
    result = await asyncio.wait_for(receive, 5)
    assert (ids(result), result.outcome) == (["m2"], "messages")


async def test_a_handed_off_run_is_covered_and_moves_to_the_broker_a_message_lands_on() -> None:
    """Adaptive: a notify run that lost a race while its group was busy holds one Pop at that broker. Counted
    with the group's covered long polls, the other brokers stay watched; a message at one of them moves the Pop
    there. Alone it waited out its poll on the empty broker (10.5 s, then an empty answer: a review's probe)."""
    brokers: dict[str, FakeBroker] = {"b1": LosesTheNextRace("b1"), "b2": FakeBroker("b2"), "b3": FakeBroker("b3")}
    metrics = ProxyMetrics(CollectorRegistry())
    receive = await handed_off(brokers, poll_s=20.0, metrics=metrics)  # a Pop held at b1, watches at b2 and b3
    assert [b.held for b in brokers.values()] == [1, 1, 1]
    brokers["b3"].put(popped("b3", "m3"))
    result = ids(await asyncio.wait_for(receive, 2.0))
    assert result == ["m3"]
    value = metrics.registry.get_sample_value
    assert value("popgate_proxy_notify_pops_total", {"group": "g", "kind": "handoff"}) == 1
    assert value("popgate_proxy_long_polls_moved_total", {"group": "g"}) == 1


class StopsWhileHolding(LosesTheNextRace):
    """Once `stop` is set, answers the Pop it holds at once, empty, saying it is stopping (a broker's SIGTERM)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.stop = asyncio.Event()

    async def pop(self, request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        if request.poll_ms == 0 or self.ready:
            return await super().pop(request, timeout_s=timeout_s)
        self.pops.append(request)
        self._held(+1)
        try:
            await self.stop.wait()
        finally:
            self._held(-1)
        return bpb.PopResponse(held=True, closing=True)


async def test_a_handed_off_pop_whose_broker_stops_goes_on_watching_the_other_brokers() -> None:
    """Adaptive: the broker holding a handed-off Pop is stopped and answers it at once, empty, saying it is
    stopping: the run watches the other brokers for its time left and gets a message stored there, as a long poll
    goes on at the next broker (it answered empty 0.3 s after the stop, most of its 10 s poll left: a review's
    probe)."""
    stopping = StopsWhileHolding("b1")
    brokers: dict[str, FakeBroker] = {"b1": stopping, "b2": FakeBroker("b2"), "b3": FakeBroker("b3")}
    receive = await handed_off(brokers, poll_s=20.0)  # a Pop held at b1, watches at b2 and b3
    stopping.stop.set()
    await held_becomes(brokers, 2)  # b2 and b3 watched by the run, the group's other watches ended
    assert not receive.done()
    brokers["b2"].put(popped("b2", "m2"))
    result = await asyncio.wait_for(receive, 2.0)
    assert (ids(result), result.outcome) == (["m2"], "messages")


async def test_a_held_adaptive_long_poll_is_one_strategy_coroutine_and_every_receive_ends_at_the_policy() -> None:
    """A held receive is the proxy's unit of memory: an adaptive long poll holds one coroutine of the strategy,
    which awaits its Pop's future itself (no adaptive coroutine, no frame per attempt or awaited call); and the
    policy hears of the end of every receive, whichever strategy served it and however it ended: answered,
    cancelled (the client left) or closed (the proxy stops)."""
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    policy = AdaptivePolicy(AdaptiveSettings(window_s=1.0, rate_threshold=0, concurrency_per_broker=1))
    notify, longpoll = NotifyStrategy(pool, broker_timeout_s=1.0), LongPollStrategy(pool, broker_timeout_s=1.0)
    proxy = Proxy(pool, AdaptiveStrategy(pool, policy, notify, longpoll))
    receives = [asyncio.create_task(proxy.receive(request(5.0, batch=1))) for _ in range(5)]
    await held_becomes(brokers, 3 * 3 + 2)  # 3 notify runs, then 2 long polls
    chain, awaited = [], receives[-1].get_coro()
    while inspect.iscoroutine(awaited):
        chain.append(awaited.cr_code.co_qualname)
        awaited = awaited.cr_await
    assert chain == ["Proxy.receive", "LongPollStrategy.receive"]  # then its Pop's future
    brokers["b1"].put(popped("b1", "m"))
    answered = await asyncio.wait_for(asyncio.wait(receives, return_when=asyncio.FIRST_COMPLETED), 2)
    assert [ids(task.result()) for task in answered[0]] == [["m"]]
    left = [task for task in receives if not task.done()]
    gone = [left.pop(0), left.pop()]  # a notify run's client and a long poll's go away
    for task in gone:
        task.cancel()
    assert all(isinstance(e, asyncio.CancelledError) for e in await asyncio.gather(*gone, return_exceptions=True))
    proxy.close()
    ended = await asyncio.wait_for(asyncio.gather(*left), 2)
    assert [result.outcome for result in ended] == ["closing", "closing"]
    assert policy.in_progress("g") == 0
    await held_becomes(brokers, 0)
