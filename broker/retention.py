"""Retention: messages older than ``--retention-s`` are deleted, consumed or not (RocketMQ deletes commit-log
files past ``fileReservedTime``, 72 h; SQS deletes past its retention period).

A pass (every ``--retention-check-s``) takes each queue's oldest messages in steps: where the messages stored
before the cut end (in the in-memory index), held back by the lowest offset any group has in flight there (its
redelivery or dead letter must still read it); the store says where the queue then starts (it deletes whole
batch rows, and never a queue's last row: a start derives the queue's offsets from its rows). The index is
trimmed and the pull offsets of the groups that had not read that far are moved up (stored) first, on the event
loop with no await in between, so nothing reads below the new start any more; then the store deletes the rows,
in short transactions between other commits. A crash between the two leaves the rows to the next pass, and a
start clamps pull offsets below a queue's first message (``ConsumerGroups.restore``).

Owned by the core; it reads the topics and group states and knows nothing of the core.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

from broker.clock import Clock
from broker.commits import StateCommits
from broker.inflight import GroupTopic
from broker.log import PayloadCache, QueueLog, TopicLog
from broker.settings import BrokerSettings
from broker.store import DeleteInflight, Op, SetPullOffset, Store
from popgate_contract.errors import StoreUnavailable, TooManyRequests
from popgate_contract.validation import DLQ_PREFIX, DLQ_RESEND_GROUP

log = logging.getLogger(__name__)

# Messages of one queue a step trims at most: what the event loop scans and moves at once, which bounds how long
# a pass holds the loop (docs/BROKER.md "Retention"); a pass takes as many steps as the backlog needs —
# tests/unit/broker/test_retention.py::test_big_deletions_go_in_short_transactions_and_steps.
STEP_MESSAGES = 1 << 16


class Retention:
    def __init__(
        self,
        *,
        settings: BrokerSettings,
        store: Store,
        topics: dict[str, TopicLog],
        groups: dict[tuple[str, str], GroupTopic],
        commits: StateCommits,
        cache: PayloadCache,
        clock: Clock,
        drop_topic: Callable[[str, Callable[[], bool]], Awaitable[bool]] | None = None,
    ) -> None:
        """drop_topic: deletes a topic whole, as DeleteTopic does, unless the check it is given fails just before
        the topic goes (whether it went; `drop_dead_letter_topics`); None keeps them."""
        self.settings = settings
        self.drop_topic = drop_topic
        self.store = store
        self.topics = topics
        self.groups = groups  # (group, topic) -> its state, as the core keeps it
        self.commits = commits
        self.cache = cache
        self.clock = clock
        self.deleted: Counter[str] = Counter()  # messages deleted, by topic (a metric)

    async def run_forever(self) -> None:
        """A pass every ``--retention-check-s`` (none when ``--retention-s 0``)."""
        while self.settings.retention_s > 0:
            await asyncio.sleep(self.settings.retention_check_s)
            try:
                await self.run()
            except StoreUnavailable as exc:  # a full disk: the rows stay until a pass succeeds
                log.warning("retention pass failed, tried again at the next one: %s", exc)
            except Exception:  # a bug must not end retention for the process's life, unsaid
                log.exception("retention pass failed, tried again at the next one")

    async def run(self, now: int | None = None) -> int:
        """One pass at time `now` (default: the clock): the messages it deleted."""
        if self.settings.retention_s <= 0:
            return 0
        started = time.perf_counter()
        cut = (self.clock.now_ms() if now is None else now) - round(self.settings.retention_s * 1000)
        deleted: Counter[str] = Counter()
        rows = 0
        queues = [queue for topic in self.topics.values() for queue in topic.queues]
        while queues:
            full: set[tuple[str, int]] = set()  # queues whose step was cut at STEP_MESSAGES: another step
            targets = []
            logs: dict[tuple[str, int], QueueLog] = {}  # each target's queue, as it was when its cut was chosen
            states = self._states_by_topic()
            for queue in queues:
                # Never past the queue's last message: its row is kept (and a row the writer committed but
                # has not announced yet may start at max_offset: the store would name it as the new start).
                step_end = queue.min_offset + STEP_MESSAGES
                end = min(queue.max_offset - 1, step_end)
                target = min(queue.stored_before(cut, end), _in_flight_floor(queue, states.get(queue.topic, ())))
                if target > queue.min_offset:
                    targets.append((queue.topic, queue.queue_id, target))
                    logs[queue.topic, queue.queue_id] = queue
                    if target == step_end:  # cut by the step, not by the queue's end: another step
                        full.add((queue.topic, queue.queue_id))
            if not targets:
                break
            starts = await self.store.retained_from(targets)
            states = self._states_by_topic()  # a group may have come, or popped, meanwhile
            ops: list[Op] = []
            cuts = []
            for topic, queue_id, _ in targets:  # every cut checked before any is applied: all or nothing
                queue = logs[topic, queue_id]
                if not self._current(queue):  # its topic deleted meanwhile (and maybe made again): not this cut's
                    full.discard((topic, queue_id))
                    continue
                new_min = starts.get((topic, queue_id), queue.min_offset)
                floor = _in_flight_floor(queue, states.get(topic, ()))
                if not queue.min_offset < new_min < queue.max_offset or floor < new_min:
                    full.discard((topic, queue_id))  # nothing to delete, or popped meanwhile: the next pass
                    continue
                cuts.append((topic, queue_id, new_min))
            for topic, queue_id, new_min in cuts:
                queue = logs[topic, queue_id]
                deleted[topic] += new_min - queue.min_offset
                self._trim(queue, new_min, states.get(topic, ()), ops)
            if ops:
                self.commits.commit(ops)  # before the deletion (`delete_before` submits after what is deferred)
            if cuts:
                rows += await self.store.delete_before(cuts)
            queues = [queue for key in full if self._current(queue := logs[key])]
        await self.drop_dead_letter_topics(cut)
        if deleted:
            self.deleted.update(deleted)
            log.info(
                "retention deleted %d messages (%d batch rows) stored before %s from %d topics in %.3f s",
                deleted.total(),
                rows,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cut / 1000)),
                len(deleted),
                time.perf_counter() - started,
            )
        return deleted.total()

    async def drop_dead_letter_topics(self, cut: int) -> list[str]:
        """Delete the `%DLQ%<group>` topics that held a letter and whose every letter was stored before `cut`, of a
        group with no state left here (deleted, or its topics deleted), with no group's state on them: retention
        keeps nothing of them any more but the queue's last row, which alone would keep the topic for good
        (RocketMQ's deleteSubGroup deletes the group's `%DLQ%` topic) — tests/unit/broker/test_retention_dlq.py::
        test_a_deleted_groups_dlq_topic_goes_once_its_letters_expired. An empty topic (an operator's) and one a
        group reads stay (::test_an_operator_created_empty_dlq_topic_and_its_watchers_state_stay,
        ::test_a_dlq_topic_another_group_has_state_on_stays). The dropped topics' names."""
        dropped: list[str] = []
        if self.drop_topic is None:
            return dropped
        for name in [t for t in self.topics if t.startswith(DLQ_PREFIX)]:
            if not self._droppable(name, cut):
                continue
            try:
                # checked again once the topic's pending commits are in, just before it goes: a letter stored or a
                # group made meanwhile keeps it (::test_a_letter_dead_lettered_while_the_topic_is_dropped_stays)
                if not await self.drop_topic(name, functools.partial(self._droppable, name, cut)):
                    continue
            except TooManyRequests:  # an admin is deleting it already
                continue
            dropped.append(name)
            log.info(
                "retention deleted %s: every letter past the retention, group %s gone", name, name[len(DLQ_PREFIX) :]
            )
        return dropped

    def _droppable(self, name: str, cut: int) -> bool:
        """Whether the `%DLQ%` topic `name` held a letter, every letter in it was stored before `cut`, and neither
        its group nor any group reading it has state here — but `popgate dlq resend`'s own group, while it holds none
        of its letters in flight: with every letter expired it has nothing left to re-send
        (test_retention_dlq.py::test_a_dlq_topic_dlq_resend_read_goes_once_its_letters_expired)."""
        topic, owner = self.topics.get(name), name[len(DLQ_PREFIX) :]
        if topic is None:
            return False
        for (group, t), state in self.groups.items():
            if group == owner or (t == name and (group != DLQ_RESEND_GROUP or _holds_invisible(state))):
                return False
        return any(q.max_offset > 0 for q in topic.queues) and all(
            q.stored_before(cut, q.max_offset) == q.max_offset for q in topic.queues
        )

    def _current(self, queue: QueueLog) -> bool:
        """Whether `queue` is still its topic's (not of a topic deleted since, and maybe made again) —
        test_retention.py::test_a_cut_chosen_before_its_topic_was_deleted_and_made_again_is_not_applied."""
        log_ = self.topics.get(queue.topic)
        return log_ is not None and queue.queue_id < len(log_.queues) and log_.queues[queue.queue_id] is queue

    def _states_by_topic(self) -> dict[str, list[GroupTopic]]:
        states: dict[str, list[GroupTopic]] = {}
        for (_, topic), state in self.groups.items():
            states.setdefault(topic, []).append(state)
        return states

    def _trim(self, queue: QueueLog, new_min: int, states: Iterable[GroupTopic], ops: list[Op]) -> None:
        """The queue starts at `new_min` from now on: its index and cache trimmed, and the groups that had not
        read that far lose what they never received (RocketMQ: a consumer offset below the minimum offset is
        corrected to it) — their pull offsets move up, stored."""
        queue.trim(new_min)
        self.cache.drop(queue, new_min)
        for state in states:
            gq = state.queues.get(queue.queue_id)
            if gq is None:
                continue
            if gq.pull_offset < new_min:
                gq.pull_offset = new_min
                ops.append(SetPullOffset(state.group, state.topic, queue.queue_id, new_min))
            # Deliveries whose invisibility passed and that nobody popped again (the floor leaves them out):
            # their messages are gone; the entries still queued for redelivery go stale with them.
            for offset in [o for o, d in gq.inflight.items() if o < new_min and d.expired]:
                state.remove(queue.queue_id, offset)
                ops.append(DeleteInflight(state.group, state.topic, queue.queue_id, offset))


def _in_flight_floor(queue: QueueLog, states: Iterable[GroupTopic]) -> int:
    """The lowest offset of the queue some group holds invisible (popped, its invisibility not passed; a FIFO
    message also while it waits or its dead letter is being committed), or the queue's end. A delivery whose
    invisibility passed and that nobody popped again does not hold the queue back, so a group that popped once
    and left cannot keep every later message for good; like a message never received, it is lost to that group
    once past the retention, as in RocketMQ — tests/unit/broker/test_retention.py::
    test_a_group_that_popped_and_left_does_not_hold_the_queue_back."""
    floor = queue.max_offset
    for state in states:
        gq = state.queues.get(queue.queue_id)
        if gq is not None:
            for offset, delivery in gq.inflight.items():
                if offset < floor and not delivery.expired:
                    floor = offset
            for offset in gq.fifo:  # in flight, or its dead letter being committed (no longer in `inflight`)
                fifo = gq.inflight.get(offset)
                if offset < floor and (fifo is None or not fifo.expired):
                    floor = offset
    return floor


def _holds_invisible(state: GroupTopic) -> bool:
    """Whether the group holds a message invisible (not one given back or expired, waiting to be delivered again)."""
    return any(not d.expired for q in state.queues.values() for d in q.inflight.values())
