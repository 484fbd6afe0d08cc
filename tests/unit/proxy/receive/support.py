"""What the receive strategies' tests share: a request, the brokers' holds, bounded waits on them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from popgate_pb import broker_pb2 as bpb

from proxy.core import Proxy
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.notify_driver import NotifyStrategy
from proxy.receive.seam import ReceiveRequest, ReceiveResult
from proxy.routing import BrokerPool
from tests.unit.proxy.fakes import FakeBroker

NAMES = ("b1", "b2", "b3")


def request(poll_s: float, *, batch: int = 32) -> ReceiveRequest:
    loop = asyncio.get_running_loop()
    return ReceiveRequest("t", "g", "*", batch, 30_000, poll_s, loop.time() + poll_s + 0.5)


def held(brokers: dict[str, FakeBroker]) -> int:
    return sum(b.held for b in brokers.values())


async def held_becomes(brokers: dict[str, FakeBroker], count: int, timeout_s: float = 2.0) -> None:
    """Wait (bounded) until the brokers hold `count` requests in all, woken by their `changed` events."""
    await changed_until(brokers, lambda: held(brokers) == count, timeout_s)


async def changed_until(brokers: dict[str, FakeBroker], done: Callable[[], bool], timeout_s: float = 2.0) -> None:
    """Wait (bounded) until `done()`, looked at each time a broker's `held` changes."""
    async with asyncio.timeout(timeout_s):
        while not done():
            waits = {asyncio.ensure_future(b.changed.wait()) for b in brokers.values()}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


def ids(result: ReceiveResult) -> list[str]:
    return [m.stored.message.message_id for m in result.messages]


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
