"""Readiness: what a consumer group can read now.

- Where its reading of a queue ends (``readable_end``): the queue's end or, while one of its FIFO messages is
  in flight to the group, the next FIFO message (broker.core, "FIFO order").
- Whether a Pop would take something now (``Readiness.check``, ``has_ready``): a Notification answers with it and
  the sweep wakes held requests with it; FIFO messages held back count as none.
- Which tags of an arrival (``readable_arrivals``) or of a FIFO release (``Readiness.released``) the group can
  read: the core wakes that many of its held requests, not all of them.

Owned by the core, which does the waking; it reads the topics and asks the redelivery, and knows nothing of
the core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from broker.clock import Clock
from broker.filters import TagFilter
from broker.inflight import GroupQueue, GroupTopic
from broker.log import QueueLog, TopicLog
from broker.redelivery import Redelivery
from broker.store import Record

Arrivals = dict[int, tuple[int, list[str | None]]]  # queue id -> (first offset, tags) of a commit's new messages


def readable_end(gq: GroupQueue, queue: QueueLog) -> int:
    """Where the group may read new messages of the queue up to: the end, or, while one of its FIFO
    messages is in flight to the group, the next FIFO message."""
    return queue.next_fifo(gq.pull_offset) if gq.fifo else queue.max_offset


def held_back(state: GroupTopic, topic: TopicLog) -> dict[int, int]:
    """The queues where a FIFO message in flight holds the group back: where its reading ends in each."""
    return {q: readable_end(gq, topic.queues[q]) for q, gq in state.queues.items() if gq.fifo}


def arrivals_by_queue(records: Sequence[Record], topic: str) -> Arrivals:
    """The topic's new messages of a commit by queue (consecutive offsets in each)."""
    by_queue: Arrivals = {}
    for r in records:
        if r.topic == topic:
            by_queue.setdefault(r.queue_id, (r.offset, []))[1].append(r.tag)
    return by_queue


def readable_arrivals(by_queue: Arrivals, ends: dict[int, int]) -> list[str | None]:
    """The tags of the new messages a group held back (`held_back`) can read: of each queue's, those before
    where its reading ends; not what waits behind a FIFO message."""
    readable: list[str | None] = []
    for queue_id, (first, queue_tags) in by_queue.items():
        end = ends.get(queue_id)
        readable += queue_tags if end is None else queue_tags[: max(0, end - first)]
    return readable


class Readiness:
    def __init__(
        self, *, topics: dict[str, TopicLog], redelivery: Redelivery, max_pop_batch: int, clock: Clock
    ) -> None:
        self.topics = topics
        self.clock = clock
        self.redelivery = redelivery
        self.max_pop_batch = max_pop_batch

    def has_ready(self, state: GroupTopic, tag_filter: TagFilter) -> bool:
        """Whether a Pop with this filter would take something now (FIFO messages held back count as none)."""
        return self.check(state)(tag_filter)

    def check(self, state: GroupTopic, filters: int = 1) -> Callable[[TagFilter], bool]:
        """`has_ready` for one group and any number of filters: what does not depend on the filter is worked
        out once. For several (`filters` > 1: the sweep over held requests), a filter none of whose tags the
        readable ranges' block summaries hold is answered without a search, so a sweep over many held filters
        beside a backlog of other tags does not search the backlog once per filter."""
        self.redelivery.expire(state, self.clock.now_ms())
        if self.redelivery.has_ready(state):
            return lambda tag_filter: True
        topic = self.topics.get(state.topic)
        ranges = []
        for queue in topic.queues if topic is not None else ():
            gq = state.queues.get(queue.queue_id)
            start, end = (
                (queue.min_offset, queue.max_offset) if gq is None else (gq.pull_offset, readable_end(gq, queue))
            )
            if start < end:
                ranges.append((queue, start, end))
        present: set[str | None] | None = None
        if filters > 1 and ranges:
            present = set()
            for queue, start, end in ranges:
                tags = queue.tags_between(start, end, max_blocks=64)
                if tags is None:
                    present = None
                    break
                present |= tags

        def ready(tag_filter: TagFilter) -> bool:
            if not ranges:
                return False
            if tag_filter.tags is None:
                return True
            if present is not None and tag_filter.tags.isdisjoint(present):
                return False
            return any(queue.first_match(start, tag_filter, end) < end for queue, start, end in ranges)

        return ready

    def released(self, state: GroupTopic, queue_id: int) -> tuple[list[str | None], bool]:
        """A FIFO message of the queue was acked or dead-lettered: the tags of what the queue now serves the
        group — its redeliveries whose turn came and, when it is no longer held back, its next messages (up to a
        Pop's batch) — and whether more is readable past that batch (a held filter may match only there)."""
        topic = self.topics.get(state.topic)
        if topic is None:
            return [], False
        queue, gq = topic.queues[queue_id], state.queues[queue_id]
        base = queue.min_offset
        tags = [queue.tags[o - base] for o in self.redelivery.fifo_ready(state, queue_id)]
        cut = False
        if not gq.fifo:
            end = min(queue.max_offset, gq.pull_offset + self.max_pop_batch)
            tags += queue.tags[gq.pull_offset - base : end - base]
            cut = end < queue.max_offset
        return tags, cut
