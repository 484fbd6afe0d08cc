"""Consumer-state commits: deliveries, acks, pull offsets and filters on their way to the store.

The core hands every consumer-state change here as store ops. Under ``--flush sync`` the caller waits for
the commit (``record``); under ``async`` it is answered at once and the commit follows. When the store refuses
writes (disk full, read-only), consumption goes on from memory: the rows a failed commit did not write are
kept (by row, the latest op winning; a delivery's as its queue's in-flight state) and written again, as memory has
them then, with the first commits that succeed, and by the sweep's ``retry`` once a second while the store still
refuses them.

A topic deletion's purge goes through here too (`purge_topic`): until a purge of it commits and its rows are
deleted (broker.topic_purges), the topic is in ``purging`` and is not made again (broker.send), for the store's
offsets and rows of it go on until then.

Owned by the core; it reads the group states (to write a lost row as it is now) and knows nothing of the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Callable

from broker.inflight import GroupTopic
from broker.settings import BrokerSettings
from broker.store import (
    DeleteInflight,
    Op,
    PurgeGroup,
    PurgeQueueInflight,
    PurgeTopic,
    PutInflight,
    Record,
    SetGroupFilter,
    SetPullOffset,
    Store,
)
from broker.topic_purges import TopicPurges
from popgate_contract.errors import StoreUnavailable

log = logging.getLogger(__name__)


def _lost(op: Op) -> Op:
    """What to write again for an op a refused commit lost: a delivery's row as its queue's whole in-flight state (a
    purge of its stored rows, then each row as memory has it: `_as_now`), so that what is kept while the store
    refuses writes grows with the queues, not with the messages consumed meanwhile —
    tests/unit/broker/test_commits.py::test_what_a_long_refusal_keeps_grows_with_the_queues_not_the_messages."""
    if isinstance(op, PutInflight | DeleteInflight):
        return PurgeQueueInflight(op.group, op.topic, op.queue_id)
    return op


def _row(op: Op) -> tuple[object, ...]:
    """The stored row an op writes (ops on one row supersede each other)."""
    if isinstance(op, PutInflight | DeleteInflight):
        return ("inflight", op.group, op.topic, op.queue_id, op.offset)
    if isinstance(op, SetPullOffset):
        return ("pull", op.group, op.topic, op.queue_id)
    if isinstance(op, SetGroupFilter):
        return ("filter", op.group, op.topic)
    return (type(op).__name__, *op)


class StateCommits:
    def __init__(self, settings: BrokerSettings, store: Store, groups: dict[tuple[str, str], GroupTopic]) -> None:
        self.settings = settings
        self.store = store
        self.groups = groups  # (group, topic) -> its state, as the core keeps it
        self._degraded = False  # the store refuses writes: consumer state lives in memory only
        self._unrecorded: dict[tuple[object, ...], Op] = {}  # rows a failed commit did not write, by row
        # The commit of those rows made when the store takes writes again (see `record`).
        self._catch_up: asyncio.Future[list[Record]] | None = None
        # Deleted topics whose PurgeTopic has not committed (under way, or to be written again); the send path
        # shares the set and refuses to make them again meanwhile.
        self.purging: set[str] = set()
        self.topic_rows = TopicPurges(store, self._rows_gone)  # the rows of topics whose purge committed
        self.on_purged: Callable[[str], None] | None = None  # told when a topic leaves `purging`
        self._purges: Counter[str] = Counter()  # PurgeTopic ops submitted and not settled, by topic
        self._purged_waiters: dict[str, asyncio.Future[None]] = {}  # `purged` callers, by topic

    async def write(self, ops: list[Op]) -> None:
        """Commit the ops and wait for it as the flush policy says (`commit`, then `record`)."""
        await self.record(self.commit(ops))

    def retry(self) -> None:
        """The sweep's retry of the rows the store refused, once a second (`commit`)."""
        if self._unrecorded:
            self.commit([], with_lost=True)

    def purge_topic(self, topic: str) -> asyncio.Future[list[Record]]:
        """Commit a deleted topic's purge (broker.admin). Refused, it is written again as the rows are (`commit`);
        the topic stays in `purging` until one commits and its rows are deleted after it (`topic_rows`)."""
        self.purging.add(topic)
        return self.commit([PurgeTopic(topic)])

    async def purged(self, topic: str) -> None:
        """Return once `topic` is not `purging` (at once when it is not)."""
        if topic not in self.purging:
            return
        waiter = self._purged_waiters.get(topic)
        if waiter is None:
            waiter = self._purged_waiters[topic] = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)

    def commit(self, ops: list[Op], *, with_lost: bool = False) -> asyncio.Future[list[Record]]:
        """Submit consumer-state ops (deliveries, acks, offsets, filters).

        Rows an earlier commit failed to write (the store refused writes for a while) go along, as they
        are in memory now, so that a later pull offset is not stored without the deliveries below it
        (after a restart those messages would count as acked). They go with every commit while the store
        takes writes, and while it refuses them only when `with_lost` (the sweep's retry, once a second:
        carrying them in every failing commit would cost each Pop the whole backlog). A row the new ops
        write is theirs (they are its latest state)."""
        if self._unrecorded and (with_lost or not self._degraded):
            fresh = {_row(op) for op in ops}
            lost, self._unrecorded = self._unrecorded, {}
            again: list[Op] = []
            for row, op in lost.items():
                if row in fresh:
                    continue
                if self._moving(op):  # written once its queue's dead-letter moves settled
                    self._unrecorded[row] = op
                else:
                    again += self._as_now(op)
            ops = again + ops
        committed = self.store.submit([], ops)
        purged = [op.topic for op in ops if isinstance(op, PurgeTopic)] if self.purging else []
        self._purges.update(purged)
        committed.add_done_callback(functools.partial(self._recorded, ops, purged))
        return committed

    def _moving(self, op: Op) -> bool:
        """Whether `op` writes a queue's whole in-flight state while a message of it moves to its dead-letter queue:
        that message is in flight in the store but not in memory until its commit settles (broker.redelivery), so the
        purge would delete its row, and should that commit fail, a kill -9 would lose it —
        tests/unit/broker/test_commits.py::test_a_queues_state_is_not_written_again_while_a_message_of_it_moves."""
        if not isinstance(op, PurgeQueueInflight):
            return False
        state = self.groups.get((op.group, op.topic))
        queue = state.queues.get(op.queue_id) if state is not None else None
        return queue is not None and bool(queue.moving)

    def _as_now(self, op: Op) -> list[Op]:
        """The ops that write `op`'s row as memory has it now (none: nothing to write any more).

        A group's purge written again after the group was made again (a consumer polled meanwhile) would delete
        what its new state stored, while later commits keep only what changes: it is followed, in its commit, by
        every row of that state — tests/unit/broker/test_admin.py::
        test_a_group_deletion_written_again_after_the_group_came_back_keeps_its_new_state."""
        if isinstance(op, PurgeGroup):
            state = self.groups.get((op.group, op.topic))
            return [op] if state is None else [op, *state.rows()]
        if isinstance(op, PurgeQueueInflight):  # likewise: the deliveries made since the reset stay
            state = self.groups.get((op.group, op.topic))
            return [op] if state is None else [op, *state.inflight_rows(op.queue_id)]
        if isinstance(op, PutInflight | DeleteInflight | SetPullOffset | SetGroupFilter):
            state = self.groups.get((op.group, op.topic))
            if state is None:
                return []
            if isinstance(op, SetGroupFilter):
                return [SetGroupFilter(op.group, op.topic, str(state.filter))]
            queue = state.queues.get(op.queue_id)
            if queue is None:
                return []
            if isinstance(op, SetPullOffset):
                return [SetPullOffset(op.group, op.topic, op.queue_id, queue.pull_offset)]
            d = queue.inflight.get(op.offset)
            if d is None:
                return [state.done_op(op.queue_id, op.offset)]
            return [PutInflight(op.group, op.topic, op.queue_id, op.offset, d.attempt, d.token, d.deadline_ms)]
        return [op]  # the others are idempotent as they are

    def _purged(self, topics: list[str], failed: bool) -> None:
        """PurgeTopic ops of a commit settled. A committed one supersedes one left to write again (nothing of its topic
        was written since: it was not made again). A topic is made again only once no purge of it is under way or
        left to write: that one would delete the new topic's messages."""
        self._purges.subtract(topics)
        for topic in topics:
            if not failed:
                self._unrecorded.pop(_row(PurgeTopic(topic)), None)
                self.topic_rows.start(topic)
            self._rows_gone(topic)

    def _rows_gone(self, topic: str) -> None:
        """`topic` leaves `purging` once no purge of it is under way or left to write, and no deletion of its rows
        runs (`topic_rows`) — tests/unit/broker/test_topic_purges.py::
        test_a_deletion_stopped_midway_is_finished_by_the_next_start_before_the_topic_is_made_again."""
        if topic in self.topic_rows or _row(PurgeTopic(topic)) in self._unrecorded:
            return
        if self._purges[topic] <= 0:
            self._purges.pop(topic, None)
            if topic in self.purging:
                self.purging.discard(topic)
                if (waiter := self._purged_waiters.pop(topic, None)) is not None and not waiter.done():
                    waiter.set_result(None)
                if self.on_purged is not None:
                    self.on_purged(topic)

    async def record(self, committed: asyncio.Future[list[Record]]) -> None:
        """Wait for a consumer-state commit when ``--flush sync`` asks for it. With ``async`` the caller is
        answered at once and the commit follows (as RocketMQ's pop buffer does): a kill -9 in between
        loses that state change, so the message is delivered again (at least once). Sends always wait: a
        message is never accepted without its commit. When the store refuses writes (disk full,
        read-only), consumption goes on from memory in the same way, and the rows are written with the
        first commit that succeeds (`commit`)."""
        if self.settings.flush == "sync":
            with contextlib.suppress(StoreUnavailable):
                await asyncio.shield(committed)
                # The first commit to succeed after the store refused writes goes without the rows it lost (a
                # pull offset among them); those follow in a commit of their own (`_recorded`). The answer waits
                # for that one too, so a kill -9 right after it never leaves a pull offset stored without the
                # deliveries below it (which would count those messages as acked after the restart) —
                # tests/faults/test_disk_full.py::
                # test_messages_popped_while_the_disk_was_full_come_back_after_a_restart.
                catch_up = self._catch_up
                if catch_up is not None and not catch_up.done():
                    await asyncio.shield(catch_up)

    def _recorded(self, ops: list[Op], purged: list[str], committed: asyncio.Future[list[Record]]) -> None:
        exc = None if committed.cancelled() else committed.exception()
        failed = committed.cancelled() or exc is not None
        if failed:
            for op in ops:
                lost = _lost(op)
                self._unrecorded[_row(lost)] = lost
        if purged:
            self._purged(purged, failed)
        if isinstance(exc, StoreUnavailable):
            if not self._degraded:
                log.warning("store refuses writes, consumer state kept in memory only: %s", exc)
            self._degraded = True
        elif exc is None:
            if self._degraded and all(isinstance(op, DeleteInflight) for op in ops):
                # Deletions alone may change no page (rows the store never got), and so commit on a full disk: no
                # sign that it takes writes again — tests/unit/broker/test_core_commits.py::
                # test_acks_that_commit_on_a_full_disk_do_not_end_its_refusal.
                return
            was_degraded, self._degraded = self._degraded, False
            if was_degraded and self._unrecorded:  # the store takes writes again: what it lost, at once
                self._catch_up = self.commit([])
        else:
            log.warning("consumer state commit failed: %s", exc)
