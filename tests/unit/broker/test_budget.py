"""Bytes of Sends in flight (`--max-send-bytes`): taken when a Send is checked, given back when its commit settles
(stored, failed, or its caller gone meanwhile); a Send that does not fit is refused whole."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker.budget import ByteBudget
from broker.clock import WallClock
from broker.log import TopicLog
from broker.send import SendPath
from broker.settings import BrokerSettings
from broker.store import RECORD_OVERHEAD_BYTES, NewMessage, Op, Record
from popgate_contract.errors import StoreUnavailable, TooManyRequests


def test_a_budget_takes_what_fits_and_one_request_alone_always() -> None:
    budget = ByteBudget(100, what="bytes of things", setting="--max-things")
    assert budget.take(150) == 150  # alone: fits whatever its size
    with pytest.raises(TooManyRequests, match=r"holds 150 bytes of things \(--max-things 100\): 1 more do not fit"):
        budget.take(1)
    assert budget.full() and not budget.fits(1)
    budget.give(150)
    budget.take(60)
    assert budget.fits(40) and not budget.fits(41) and not budget.full()


class PendingStore:
    """Commits that settle when the test says so."""

    def __init__(self) -> None:
        self.commits: list[tuple[list[NewMessage], asyncio.Future[list[Record]]]] = []

    def submit(self, appends: Sequence[NewMessage], ops: Sequence[Op], **how: Any) -> asyncio.Future[list[Record]]:
        future: asyncio.Future[list[Record]] = asyncio.get_running_loop().create_future()
        self.commits.append((list(appends), future))
        return future

    def settle(self, index: int, error: Exception | None = None) -> None:
        appends, future = self.commits[index]
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(
                [Record(a.topic, a.queue_id, i, a.store_ms, a.tag, a.payload) for i, a in enumerate(appends)]
            )


async def test_send_bytes_are_held_until_the_commit_settles_whatever_becomes_of_the_caller() -> None:
    cost = 1000 + RECORD_OVERHEAD_BYTES

    store = PendingStore()
    topics: dict[str, TopicLog] = {}
    settings = BrokerSettings(max_send_bytes=1024 + 2 * RECORD_OVERHEAD_BYTES, auto_create=True)
    sends = SendPath(settings, store, topics, clock=WallClock())  # type: ignore[arg-type]
    message = pb.Message(topic="t", body=b"x" * 1000)
    first = asyncio.ensure_future(sends.send([message]))
    await asyncio.sleep(0)
    assert sends.in_flight.used == cost
    with pytest.raises(TooManyRequests, match="--max-send-bytes"):
        await sends.send([pb.Message(topic="new", body=b"y" * 1000)])
    assert len(store.commits) == 1 and "new" not in topics  # refused whole: nothing created nor submitted
    first.cancel()  # the caller goes away: its commit is still under way, its bytes still held
    await asyncio.sleep(0)
    assert first.cancelled() and sends.in_flight.used == cost
    store.settle(0)
    await asyncio.sleep(0)
    assert sends.in_flight.used == 0
    second = asyncio.ensure_future(sends.send([message]))
    await asyncio.sleep(0)
    store.settle(1, StoreUnavailable("disk full"))  # a failed commit gives its bytes back too
    with pytest.raises(StoreUnavailable):
        await second
    assert sends.in_flight.used == 0
