"""A broker added to the pool (broker discovery) while receives are held: they watch it from then on, in pop with
notify and in the adaptive mode's covered long polls, so its first message is not left until they end."""

from __future__ import annotations

import asyncio

from proxy.core import Proxy
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.notify import NotifyRun
from proxy.receive.notify_commands import AwaitUp, Cancel, Notify, Pop
from proxy.receive.notify_driver import NotifyStrategy
from proxy.receive.seam import ReceiveRequest
from proxy.routing import BrokerPool
from tests.unit.proxy.fakes import FakeBroker, popped
from tests.unit.proxy.receive.notify_runs import finish, message, notifying, started
from tests.unit.proxy.receive.support import NAMES, changed_until, held_becomes, ids, request

# -- the state machine ----------------------------------------------------------------------------------------------


def test_a_broker_added_while_the_run_notifies_is_notified_for_the_poll_time_left() -> None:
    run = notifying(now=0.0)
    assert run.added("b4", healthy=True, now=2.0) == [Notify("b4", 8000)]
    assert run.notified("b4", has_message=True, polling_full=False, now=2.5) == [Pop("b4")]


def test_a_broker_added_down_is_notified_once_its_health_checks_see_it_up() -> None:
    run = notifying(now=0.0)
    assert run.added("b4", healthy=False, now=1.0) == [AwaitUp("b4")]
    assert run.rewatch("b4", healthy=True, now=3.0) == [Notify("b4", 7000)]


def test_a_broker_added_during_the_first_pop_is_notified_with_the_others() -> None:
    run, _ = started()
    assert run.added("b4", healthy=True, now=0.001) == []
    assert run.popped("b1", [], polling_full=False, now=0.002) == [Notify(b, 9998) for b in ("b1", "b2", "b3", "b4")]


def test_a_broker_the_run_knows_is_left_to_its_own_rewatch() -> None:
    run = notifying(now=0.0)
    assert run.added("b2", healthy=True, now=1.0) == []  # notified already
    assert run.outstanding == ["b1", "b2", "b3"]


def _held_alone(*, covered: bool = False) -> NotifyRun:
    """A run whose first Pop found the only broker it knew empty: a Pop held there for the poll."""
    run = NotifyRun(("b1",), 10.0, covered=covered)
    run.start()
    assert run.popped("b1", [], polling_full=False, now=0.0) == [Pop("b1", 10_000)]
    return run


def test_a_pop_held_at_the_only_broker_gives_way_to_notifications_once_an_added_broker_is_up() -> None:
    run = _held_alone()
    assert run.added("b2", healthy=False, now=1.0) == [AwaitUp("b2")]  # the held Pop stays until b2 is up
    assert run.rewatch("b2", healthy=True, now=2.0) == [Cancel("b1"), Notify("b1", 8000), Notify("b2", 8000)]
    assert run.popped("b1", message("late"), polling_full=False, now=2.1) == []  # the cancelled Pop's: handed back
    assert run.notified("b2", has_message=True, polling_full=False, now=2.5) == [Pop("b2")]
    cmds = run.popped("b2", message("m2"), polling_full=False, now=2.6)
    assert [m.stored.message.message_id for m in finish(cmds).messages] == ["m2"]
    assert Cancel("b1") in cmds


def test_a_broker_added_up_ends_the_held_pop_at_once_and_a_run_near_its_end_keeps_it() -> None:
    assert _held_alone().added("b2", healthy=True, now=1.0) == [Cancel("b1"), Notify("b1", 9000), Notify("b2", 9000)]
    assert _held_alone().added("b2", healthy=True, now=9.999) == []  # too little poll time left to notify


def test_a_held_pop_the_adaptive_modes_cover_watches_is_left_to_it() -> None:
    assert _held_alone(covered=True).added("b2", healthy=True, now=1.0) == []


# -- through the drivers, over in-memory brokers ----------------------------------------------------------------------


async def _pops_held(brokers: dict[str, FakeBroker], count: int) -> None:
    """Wait (bounded) until `count` Pops were made and every broker holds a request."""

    def made() -> bool:
        return sum(len(b.pops) for b in brokers.values()) >= count and all(b.held for b in brokers.values())

    await changed_until(brokers, made)


def _added(pool: BrokerPool, brokers: dict[str, FakeBroker], proxy: Proxy) -> FakeBroker:
    """b4 as broker discovery adds it: into the pool, then up (`BrokerClients.came_up` tells the proxy)."""
    new = brokers["b4"] = FakeBroker("b4")
    pool.put(new)
    proxy.broker_up(new)
    return new


async def test_a_notify_receive_held_when_a_broker_is_added_gets_its_first_message_at_once() -> None:
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0))
    receive = asyncio.create_task(proxy.receive(request(5.0)))
    await held_becomes(brokers, 3)
    new = _added(pool, brokers, proxy)
    await held_becomes(brokers, 4)  # b4 watched by the run
    new.put(popped("b4", "m4"))
    result = await asyncio.wait_for(receive, 2)  # not the 5 s poll
    assert ids(result) == ["m4"]
    result.release()


async def test_a_notify_receive_held_at_the_only_broker_gets_an_added_brokers_first_message_at_once() -> None:
    brokers = {"b1": FakeBroker("b1")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, NotifyStrategy(pool, broker_timeout_s=1.0))
    receive = asyncio.create_task(proxy.receive(request(5.0)))
    await _pops_held(brokers, 2)  # the first Pop, then one held at b1
    new = _added(pool, brokers, proxy)
    await changed_until(brokers, lambda: new.held == 1 and len(brokers["b1"].pops) == 2 and brokers["b1"].held == 1)
    new.put(popped("b4", "m4"))
    result = await asyncio.wait_for(receive, 2)  # not the 5 s poll
    assert ids(result) == ["m4"]
    result.release()
    await held_becomes(brokers, 0)  # b1's Notification cancelled after the answer


async def test_covered_long_polls_held_when_a_broker_is_added_move_there_for_its_first_message() -> None:
    brokers = {n: FakeBroker(n) for n in NAMES}
    pool = BrokerPool(brokers, first_turn=0)
    strategy = LongPollStrategy(pool, broker_timeout_s=1.0, cover=True)
    proxy = Proxy(pool, strategy)
    loop = asyncio.get_running_loop()
    receives = []
    for n in range(1, 4):  # one Pop of the group held at each broker; one without is watched meanwhile
        r = ReceiveRequest("t", "g", "*", 1, 30_000, 5.0, loop.time() + 5.5)
        receives.append(asyncio.create_task(proxy.receive(r)))
        await _pops_held(brokers, n)
    new = _added(pool, brokers, proxy)
    await held_becomes(brokers, 4)  # a watch at b4, where none of the group's Pops is held
    new.put(popped("b4", "m4"))
    done, _ = await asyncio.wait(receives, timeout=2, return_when=asyncio.FIRST_COMPLETED)  # not the 5 s poll
    assert [ids(task.result()) for task in done] == [["m4"]]
    for task in receives:
        task.cancel()
    await asyncio.gather(*receives, return_exceptions=True)
