"""A consumer group's max delivery attempts as its brokers have it (proxy.attempts), without sockets: the largest
answer, kept for a while and for a bounded number of groups, one lookup for concurrent askers, 17 in time when no
broker answers."""

from __future__ import annotations

import asyncio

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.attempts import DEFAULT_MAX_ATTEMPTS, GroupAttempts

pytestmark = pytest.mark.timeout(10)  # a lookup that hangs fails here, not at the suite's per-test bound


class Broker:
    """Answers GroupConfig with `attempts` per group (default `default`), fails with `fail`, or never answers."""

    def __init__(self, name: str, default: int = 17, *, fail: bool = False, hang: bool = False, **attempts: int):
        self.name = name
        self.default = default
        self.attempts = attempts
        self.fail = fail
        self.hang = hang
        self.asked: list[str] = []
        self.answer = asyncio.Event()  # set: answer now (for the tests of concurrent lookups)
        self.answer.set()

    async def group_config(self, group: str, *, timeout_s: float) -> bpb.GroupConfigResponse:
        self.asked.append(group)
        if self.hang:
            await asyncio.sleep(3600)
        await self.answer.wait()
        if self.fail:
            raise errors.BadRequest("session: unknown request")  # a broker from before GroupConfig
        return bpb.GroupConfigResponse(max_delivery_attempts=self.attempts.get(group, self.default))


def attempts_of(*brokers: Broker, **kwargs: object) -> GroupAttempts:
    return GroupAttempts(lambda: list(brokers), **kwargs)  # type: ignore[arg-type]


async def test_the_groups_own_number_and_the_largest_when_brokers_disagree() -> None:
    cache = attempts_of(Broker("b1", 3, fast=1), Broker("b2", 3, fast=2), Broker("b3", fail=True))
    result = [await cache.of("fast"), await cache.of("other")]
    assert result == [2, 3]  # the brokers' own default for a group without an override


async def test_an_answer_is_kept_for_the_ttl_then_asked_again() -> None:
    now = [100.0]
    broker = Broker("b1", orders=5)
    cache = attempts_of(broker, ttl_s=30.0, clock=lambda: now[0])
    seen = [await cache.of("orders"), await cache.of("orders")]
    broker.attempts["orders"] = 7  # the broker's flag changed
    now[0] += 29.0
    seen.append(await cache.of("orders"))
    now[0] += 1.0
    seen.append(await cache.of("orders"))
    assert seen == [5, 5, 5, 7]
    assert broker.asked == ["orders", "orders"]


async def test_at_most_max_groups_are_kept_the_oldest_goes_first() -> None:
    broker = Broker("b1")
    cache = attempts_of(broker, max_groups=2)
    for group in ("g1", "g2", "g3", "g3", "g2", "g1"):
        await cache.of(group)
    assert broker.asked == ["g1", "g2", "g3", "g1"]  # g1 went when g3 came; g2 and g3 were still kept


async def test_concurrent_askers_share_one_lookup_and_one_that_goes_away_leaves_it_to_the_others() -> None:
    broker = Broker("b1", orders=4)
    broker.answer.clear()
    cache = attempts_of(broker)
    first = asyncio.ensure_future(cache.of("orders"))
    others = [asyncio.ensure_future(cache.of("orders")) for _ in range(9)]
    await asyncio.sleep(0)
    first.cancel()  # its Telemetry stream ended meanwhile
    broker.answer.set()
    result = list(await asyncio.gather(*others))
    assert result == [4] * 9
    assert broker.asked == ["orders"]


async def test_with_no_answer_in_time_it_is_17_at_the_timeout_and_asked_again_next_time() -> None:
    silent, refusing = Broker("b1", hang=True), Broker("b2", fail=True)
    cache = attempts_of(silent, refusing, timeout_s=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = await cache.of("orders")
    took = loop.time() - started
    await cache.of("orders")
    assert answer == DEFAULT_MAX_ATTEMPTS
    assert 0.2 <= took < 2.0
    assert silent.asked == refusing.asked == ["orders", "orders"]


async def test_with_no_live_broker_it_is_17_at_once() -> None:
    result = await attempts_of().of("orders")
    assert result == DEFAULT_MAX_ATTEMPTS
