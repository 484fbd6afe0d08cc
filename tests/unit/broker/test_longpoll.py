import asyncio

from broker.filters import MATCH_ALL, TagFilter
from broker.longpoll import HoldService, Key, Kind, Outcome


async def holding(service: HoldService, key: Key, kind: Kind, tag_filter: TagFilter, timeout_s: float) -> Outcome:
    """A request held as the broker's callers hold one: `enter`, await the waiter, `leave`."""
    waiter = service.enter(key, kind, tag_filter, timeout_s)
    if isinstance(waiter, Outcome):
        return waiter
    try:
        outcome = await waiter.future
    except asyncio.CancelledError:
        service.leave(key, waiter, cancelled=True)
        raise
    service.leave(key, waiter)
    return outcome


async def test_arrival_wakes_one_request_per_message_oldest_first_whatever_its_kind() -> None:
    """Not Pops first: one consumer's held Pops would take every message while another's Notifications (a quiet
    group's receives, adaptive mode) waited their whole poll."""
    hold = HoldService(capacity=10)
    key = ("t", "g")
    held = []
    for kind in (Kind.NOTIFICATION, Kind.POP, Kind.NOTIFICATION, Kind.POP, Kind.NOTIFICATION):
        held.append(asyncio.ensure_future(holding(hold, key, kind, MATCH_ALL, 5)))
        await asyncio.sleep(0)  # held in this order
    assert hold.total_held == 5
    assert hold.arrived(key, ["x", "y", "z"]) == 3  # the three oldest
    await asyncio.sleep(0)
    assert hold.held == {Kind.POP: 1, Kind.NOTIFICATION: 1}
    hold.close()
    S, C = Outcome.SERVED, Outcome.CLOSED
    assert [await h for h in held] == [S, S, S, C, C]


async def test_filter_decides_who_is_woken() -> None:
    hold = HoldService(capacity=10)
    key = ("t", "g")
    red = asyncio.ensure_future(holding(hold, key, Kind.POP, TagFilter.parse("red"), 0.2))
    blue = asyncio.ensure_future(holding(hold, key, Kind.POP, TagFilter.parse("blue"), 5))
    await asyncio.sleep(0)
    hold.arrived(key, ["blue", None])
    assert (await red, await blue) == (Outcome.TIMED_OUT, Outcome.SERVED)


async def test_redelivery_wake_ignores_tags() -> None:
    hold = HoldService(capacity=10)
    task = asyncio.ensure_future(holding(hold, ("t", "g"), Kind.POP, TagFilter.parse("red"), 5))
    await asyncio.sleep(0)
    assert hold.wake(("t", "g"), 1) == 1
    assert await task is Outcome.SERVED


async def test_capacity_and_cancellation() -> None:
    hold = HoldService(capacity=1)
    first = asyncio.ensure_future(holding(hold, ("t", "g"), Kind.POP, MATCH_ALL, 5))
    await asyncio.sleep(0)
    assert await holding(hold, ("t", "g"), Kind.POP, MATCH_ALL, 5) is Outcome.FULL
    first.cancel()
    await asyncio.sleep(0)
    assert hold.total_held == 0 and hold.keys() == []
    assert await holding(hold, ("t", "g"), Kind.POP, MATCH_ALL, 0.01) is Outcome.TIMED_OUT


async def test_a_woken_request_leaves_the_held_count_at_once_and_a_filter_is_matched_once() -> None:
    calls = 0

    def counting(tag_filter: TagFilter) -> int:
        nonlocal calls
        calls += 1
        return 1

    hold = HoldService(capacity=5000)
    key = ("t", "g")
    held = [asyncio.ensure_future(holding(hold, key, Kind.NOTIFICATION, MATCH_ALL, 5)) for _ in range(4000)]
    await asyncio.sleep(0)
    assert hold._wake(key, counting) == 1  # one message: the oldest is woken
    assert calls == 1  # the filter was looked at once, not once per held request
    assert hold.total_held == 3999
    hold.close()
    await asyncio.gather(*held)


class _CountingTags(list[str | None]):
    """Arrived tags that count how often they are read through."""

    reads = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().__iter__()


async def test_an_arrival_reads_its_tags_once_however_many_distinct_filters_are_held() -> None:
    """A review's Send of 1,024 messages stalled the loop 1.2-1.8 s with 20,000 held Pops of distinct filters:
    every filter read every arrived tag. Now the tags are counted once and each filter looks up its own."""
    hold = HoldService(capacity=1000)
    key = ("t", "g")
    held = [asyncio.ensure_future(holding(hold, key, Kind.POP, TagFilter.parse(f"tag{i}"), 5)) for i in range(500)]
    await asyncio.sleep(0)
    tags = _CountingTags(["tag7"] * 3 + ["other"] * 1021)
    woken = hold.arrived(key, tags)
    hold.close()
    await asyncio.gather(*held)
    assert (woken, tags.reads) == (1, 1)


async def test_each_filter_is_woken_for_the_arrivals_it_matches_oldest_first() -> None:
    """Budgets are per filter: an arrival wakes, for each held filter, as many requests as it has matching
    messages, the filter's oldest first (here its Notifications, held before its Pops); untagged messages
    match only `*`."""
    hold = HoldService(capacity=100)
    key = ("t", "g")
    held: dict[str, list[asyncio.Future[Outcome]]] = {}
    for expression in ("a", "a || b", "*", "c", "b || zz"):
        tag_filter = TagFilter.parse(expression)
        notes = [asyncio.ensure_future(holding(hold, key, Kind.NOTIFICATION, tag_filter, 5)) for _ in range(2)]
        pops = [asyncio.ensure_future(holding(hold, key, Kind.POP, tag_filter, 5)) for _ in range(2)]
        held[expression] = pops + notes
    await asyncio.sleep(0)
    # a: 2, a || b: 3, *: 4, c: 0, b || zz: 1
    assert hold.arrived(key, ["a", "b", None, "a"]) == 2 + 3 + 4 + 0 + 1
    hold.close()
    S, C = Outcome.SERVED, Outcome.CLOSED
    outcomes = {expression: [await f for f in futures] for expression, futures in held.items()}
    assert outcomes == {  # pops, then notifications
        "a": [C, C, S, S],
        "a || b": [S, C, S, S],
        "*": [S, S, S, S],
        "c": [C, C, C, C],
        "b || zz": [C, C, S, C],
    }


async def test_the_sweep_wakes_each_held_request_whose_own_filter_has_something_ready() -> None:
    hold = HoldService(capacity=10)
    key = ("t", "g")
    held = [asyncio.ensure_future(holding(hold, key, Kind.POP, TagFilter.parse(t), 0.3)) for t in ("a", "b", "b", "c")]
    await asyncio.sleep(0)
    set_up_for: list[int] = []

    def ready_check(filters: int):  # type: ignore[no-untyped-def]
        set_up_for.append(filters)  # once per sweep, told how many distinct filters are held
        return lambda tag_filter: tag_filter == TagFilter.parse("b")

    hold.wake_ready(key, ready_check)
    hold.wake_ready(("t", "nobody"), ready_check)  # no request held: nothing is set up
    outcomes = [await h for h in held]
    assert outcomes == [Outcome.TIMED_OUT, Outcome.SERVED, Outcome.SERVED, Outcome.TIMED_OUT]
    assert set_up_for == [3]


async def test_a_wake_passed_on_goes_to_the_oldest_request_something_is_ready_for() -> None:
    hold = HoldService(capacity=10)
    key = ("t", "g")
    red = asyncio.ensure_future(holding(hold, key, Kind.NOTIFICATION, TagFilter.parse("red"), 5))
    await asyncio.sleep(0)
    blue = [
        asyncio.ensure_future(holding(hold, key, kind, TagFilter.parse("blue"), 5)) for kind in (Kind.POP, Kind.POP)
    ]
    await asyncio.sleep(0)
    only_blue = lambda n: lambda f: f == TagFilter.parse("blue")  # noqa: E731 (what is ready: one blue message)
    assert hold.wake_oldest_ready(key, only_blue)  # not red's, older but with nothing ready
    await asyncio.sleep(0)
    woken = [blue[0].done(), blue[1].done(), red.done()]
    assert not hold.wake_oldest_ready(("t", "other"), only_blue)  # nobody held there
    hold.close()
    assert woken == [True, False, False]
