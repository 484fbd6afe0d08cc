"""Consumer-state commits without sockets: rows a refused commit lost are written again as memory has them,
at once when the store takes writes again, and by the sweep's retry while it still refuses them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from broker.commits import StateCommits
from broker.inflight import Delivery, GroupTopic
from broker.settings import BrokerSettings
from broker.store import DeleteInflight, NewMessage, Op, PurgeQueueInflight, PutInflight, Record, SetPullOffset
from popgate_contract.errors import StoreUnavailable


class Refusing:
    """Just enough of a Store: records every commit it takes, refuses writes on demand."""

    def __init__(self) -> None:
        self.written: list[list[Op]] = []
        self.refuse = False

    def submit(self, appends: Sequence[NewMessage], ops: Sequence[Op]) -> asyncio.Future[list[Record]]:
        future: asyncio.Future[list[Record]] = asyncio.get_running_loop().create_future()
        if self.refuse:
            future.set_exception(StoreUnavailable("disk full"))
        else:
            self.written.append(list(ops))
            future.set_result([])
        return future


async def test_rows_a_refused_commit_lost_are_written_as_memory_has_them_once_the_store_takes_writes() -> None:
    store = Refusing()
    state = GroupTopic("g", "t")
    gq = state.queue(0, 0)
    commits = StateCommits(BrokerSettings(), store, {("g", "t"): state})  # type: ignore[arg-type]
    store.refuse = True
    gq.pull_offset = 2
    state.deliver(0, 0, Delivery(1, 7, 10_000))
    await commits.write([SetPullOffset("g", "t", 0, 2), PutInflight("g", "t", 0, 0, 1, 7, 10_000)])
    await asyncio.sleep(0)  # the refusal is seen
    gq.pull_offset = 3  # a later Pop, its commit refused too: not carrying the backlog
    await commits.write([SetPullOffset("g", "t", 0, 3)])
    await asyncio.sleep(0)
    state.remove(0, 0)  # acked meanwhile
    commits.retry()  # the sweep, still refused
    await asyncio.sleep(0)
    assert store.written == []
    store.refuse = False
    await commits.write([DeleteInflight("g", "t", 0, 5)])  # a deletion alone commits on a full disk too: no sign
    await asyncio.sleep(0)
    lost = [SetPullOffset("g", "t", 0, 3), PurgeQueueInflight("g", "t", 0)]  # the queue's deliveries: none now
    assert store.written == [[DeleteInflight("g", "t", 0, 5)]]
    await commits.write([SetPullOffset("g", "t", 0, 3)])  # the first write to succeed goes alone; the lost rows follow
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    written = store.written
    assert written == [[DeleteInflight("g", "t", 0, 5)], [SetPullOffset("g", "t", 0, 3)], lost]


async def test_what_a_long_refusal_keeps_grows_with_the_queues_not_the_messages() -> None:
    """1,000 messages delivered and acked while the store refuses writes, one still in flight: what is kept to write
    again is the queue's in-flight state and its pull offset, not a row per message, and it is written as memory has
    it once the store takes writes."""
    store = Refusing()
    state = GroupTopic("g", "t")
    gq = state.queue(0, 0)
    commits = StateCommits(BrokerSettings(), store, {("g", "t"): state})  # type: ignore[arg-type]
    store.refuse = True
    for offset in range(1000):
        gq.pull_offset = offset + 1
        state.deliver(0, offset, Delivery(1, offset, 10_000))
        await commits.write(
            [SetPullOffset("g", "t", 0, offset + 1), PutInflight("g", "t", 0, offset, 1, offset, 10_000)]
        )
        if offset < 999:
            state.remove(0, offset)
            await commits.write([DeleteInflight("g", "t", 0, offset)])
    await asyncio.sleep(0)
    assert len(commits._unrecorded) == 2
    store.refuse = False
    commits.retry()
    await asyncio.sleep(0)
    assert store.written == [
        [
            SetPullOffset("g", "t", 0, 1000),
            PurgeQueueInflight("g", "t", 0),
            PutInflight("g", "t", 0, 999, 1, 999, 10_000),
        ]
    ]


async def test_a_queues_state_is_not_written_again_while_a_message_of_it_moves() -> None:
    """A delivery row was lost while the store refused writes; another message of the queue is on its way to the
    dead-letter queue (out of memory, in the store until that commit settles): the queue's state is written again
    only once the move settled, so the purge cannot delete the moving message's row."""
    store = Refusing()
    state = GroupTopic("g", "t")
    gq = state.queue(0, 0)
    commits = StateCommits(BrokerSettings(), store, {("g", "t"): state})  # type: ignore[arg-type]
    store.refuse = True
    state.deliver(0, 0, Delivery(1, 7, 10_000))
    await commits.write([PutInflight("g", "t", 0, 0, 1, 7, 10_000)])
    await asyncio.sleep(0)
    store.refuse = False
    gq.moving = {5}  # offset 5 moves to the DLQ (broker.redelivery)
    commits.retry()
    await asyncio.sleep(0)
    assert all(ops == [] for ops in store.written)  # nothing of the queue
    gq.moving = None  # the move settled
    commits.retry()
    await asyncio.sleep(0)
    assert store.written[-1] == [PurgeQueueInflight("g", "t", 0), PutInflight("g", "t", 0, 0, 1, 7, 10_000)]
