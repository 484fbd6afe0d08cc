import asyncio

from broker.filters import MATCH_ALL, TagFilter
from broker.longpoll import HoldService, Kind, Outcome


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_arrival_wakes_one_request_per_message_pops_first() -> None:
    async def scenario() -> list[Outcome]:
        hold = HoldService(capacity=10)
        key = ("t", "g")
        notes = [asyncio.ensure_future(hold.hold(key, Kind.NOTIFICATION, MATCH_ALL, 5)) for _ in range(3)]
        pops = [asyncio.ensure_future(hold.hold(key, Kind.POP, MATCH_ALL, 5)) for _ in range(2)]
        await asyncio.sleep(0)
        assert hold.total_held == 5
        assert hold.arrived(key, ["x", "y", "z"]) == 3  # 2 pops + the oldest notification
        await asyncio.sleep(0)
        assert hold.total_held == 2
        hold.close()
        return [await p for p in pops] + [await n for n in notes]

    outcomes = run(scenario())
    assert outcomes == [Outcome.SERVED, Outcome.SERVED, Outcome.SERVED, Outcome.CLOSED, Outcome.CLOSED]


def test_filter_decides_who_is_woken() -> None:
    async def scenario() -> tuple[Outcome, Outcome]:
        hold = HoldService(capacity=10)
        key = ("t", "g")
        red = asyncio.ensure_future(hold.hold(key, Kind.POP, TagFilter.parse("red"), 0.2))
        blue = asyncio.ensure_future(hold.hold(key, Kind.POP, TagFilter.parse("blue"), 5))
        await asyncio.sleep(0)
        hold.arrived(key, ["blue", None])
        return await red, await blue

    assert run(scenario()) == (Outcome.TIMED_OUT, Outcome.SERVED)


def test_redelivery_wake_ignores_tags() -> None:
    async def scenario() -> Outcome:
        hold = HoldService(capacity=10)
        task = asyncio.ensure_future(hold.hold(("t", "g"), Kind.POP, TagFilter.parse("red"), 5))
        await asyncio.sleep(0)
        assert hold.wake(("t", "g"), 1) == 1
        return await task

    assert run(scenario()) is Outcome.SERVED


def test_capacity_and_cancellation() -> None:
    async def scenario() -> None:
        hold = HoldService(capacity=1)
        first = asyncio.ensure_future(hold.hold(("t", "g"), Kind.POP, MATCH_ALL, 5))
        await asyncio.sleep(0)
        assert await hold.hold(("t", "g"), Kind.POP, MATCH_ALL, 5) is Outcome.FULL
        first.cancel()
        await asyncio.sleep(0)
        assert hold.total_held == 0 and hold.keys() == []
        assert await hold.hold(("t", "g"), Kind.POP, MATCH_ALL, 0.01) is Outcome.TIMED_OUT

    run(scenario())


def test_a_woken_request_leaves_the_held_count_at_once_and_a_filter_is_matched_once() -> None:
    calls = 0

    def counting(tag_filter: TagFilter) -> int:
        nonlocal calls
        calls += 1
        return 1

    async def scenario() -> None:
        hold = HoldService(capacity=5000)
        key = ("t", "g")
        held = [asyncio.ensure_future(hold.hold(key, Kind.NOTIFICATION, MATCH_ALL, 5)) for _ in range(4000)]
        await asyncio.sleep(0)
        assert hold._wake(key, counting) == 1  # one message: the oldest is woken
        assert calls == 1  # the filter was looked at once, not once per held request
        assert hold.total_held == 3999
        hold.close()
        await asyncio.gather(*held)

    run(scenario())
