"""Consumer-group state: the registry of one ``GroupTopic`` per (group, topic) the broker keeps.

A group's state is made on its first look at an existing topic (a Pop or a Notification): that look fixes
where it starts on every queue (``earliest`` / ``latest``; dead-letter topics always from their first message)
and stores its filter. The registry is bounded (``--max-groups``). A look at a topic that does not exist yet
keeps no state: only that the group looked (bounded, in memory), so that its state is made when the topic's
first messages arrive (``adopt_early``) and starts at the topic's first message also under ``latest``.

Pure bookkeeping, no I/O: the store ops a change needs are appended to the caller's list, and the core
commits them. It knows nothing of the core.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter, OrderedDict

from broker.filters import TagFilter
from broker.inflight import ACKED_AHEAD, Delivery, GroupQueue, GroupTopic
from broker.log import QueueLog, TopicLog
from broker.settings import BrokerSettings
from broker.store import DeleteInflight, Op, SetGroupFilter, SetPullOffset, Snapshot
from popgate_contract import validation
from popgate_contract.consumers import MAX_EARLY_LOOKS
from popgate_contract.errors import IllegalFilter, TooManyRequests

log = logging.getLogger(__name__)


class ConsumerGroups:
    def __init__(self, settings: BrokerSettings, topics: dict[str, TopicLog]) -> None:
        self.settings = settings
        self.topics = topics
        self.groups: dict[tuple[str, str], GroupTopic] = {}  # (group, topic)
        self._looked_early: OrderedDict[tuple[str, str], TagFilter] = OrderedDict()  # see `reader`
        self._early_topics: Counter[str] = Counter()  # topics in _looked_early, how many groups each

    def restore(self, snap: Snapshot, ops: list[Op], now_ms: int) -> None:
        """The stored filters, pull offsets and in-flight deliveries (after the topics: FIFO marks need them).
        State below a queue's first message (retention deleted it, and a crash came before the state's commit)
        is corrected as retention does: a pull offset moves up to it, a delivery of a deleted message is
        dropped; the ops storing that are appended to `ops`. A stored deadline (wall time) is cut to
        `max_invisible_s` after `now_ms`, so no delivery stays invisible longer than a Pop may ask, whatever step
        the wall clock took while the broker was down — tests/unit/broker/test_restore.py::
        test_a_delivery_restored_after_the_clock_went_back_is_invisible_no_longer_than_the_longest_pop."""
        latest_deadline = now_ms + self.settings.max_invisible_ms
        for f in snap.filters:
            self._restore_filter(f.group, f.topic, f.expression)
        for p in snap.pull_offsets:
            pull = max(p.pull_offset, self._min_offset(p.topic, p.queue_id))
            self._state(p.group, p.topic).queue(p.queue_id, pull).pull_offset = pull
            if pull != p.pull_offset:
                ops.append(SetPullOffset(p.group, p.topic, p.queue_id, pull))
        for i in snap.inflight:
            if i.offset < self._min_offset(i.topic, i.queue_id):
                ops.append(DeleteInflight(i.group, i.topic, i.queue_id, i.offset))
                continue
            if i.attempt == ACKED_AHEAD:  # done, taken ahead of the pull offset: taken still, until it passes
                marked = self.groups.get((i.group, i.topic))
                marked_gq = marked.queues.get(i.queue_id) if marked is not None else None
                if marked_gq is None or i.offset < marked_gq.pull_offset:
                    ops.append(DeleteInflight(i.group, i.topic, i.queue_id, i.offset))
                else:
                    marked_gq.ahead = marked_gq.ahead or set()
                    marked_gq.ahead.add(i.offset)
                continue
            state = self._state(i.group, i.topic)
            gq = state.queue(i.queue_id, i.offset + 1)
            if i.offset >= gq.pull_offset:  # taken ahead of its pull offset (broker.priority)
                gq.ahead = (gq.ahead or set()) | {i.offset}
            topic_log = self.topics.get(i.topic)
            fifo = topic_log is not None and topic_log.queues[i.queue_id].is_fifo(i.offset)
            deadline = min(i.deadline_ms, latest_deadline)
            state.deliver(i.queue_id, i.offset, Delivery(i.attempt, i.token, deadline), fifo=fifo)

    def _min_offset(self, topic: str, queue_id: int) -> int:
        topic_log = self.topics.get(topic)
        if topic_log is None or queue_id >= len(topic_log.queues):
            return 0
        return topic_log.queues[queue_id].min_offset

    def _restore_filter(self, group: str, topic: str, expression: str) -> None:
        # One unreadable row (written by another version) costs that group its lag filter until its next Pop sets
        # one, not the whole broker its start: it is logged and the group reads as `*` meanwhile.
        state = self._state(group, topic)
        try:
            state.filter = TagFilter.parse(expression, max_len=None)
        except IllegalFilter as e:
            log.warning(
                "stored filter of group %s on topic %s skipped (%s); it reads as '*' until its next Pop",
                group,
                topic,
                e,
            )

    def reader(
        self, group: str, topic: str, tag_filter: TagFilter, ops: list[Op], *, pop_filter: bool = True
    ) -> GroupTopic | None:
        """The group's state on `topic`, ready to read: start offsets fixed and, for a Pop or a first look, its
        filter stored. None while the topic does not exist: with auto-create any name may be polled, and
        no state is kept or stored for it; only that the group looked (bounded, in memory), so that its state
        is made when the topic's first messages arrive (`adopt_early`: its lag here then counts them before
        its first Pop on this broker) and starts at the topic's first message also under `latest`."""
        if topic not in self.topics:
            if (group, topic) not in self._looked_early:
                self._early_topics[topic] += 1
            self._looked_early[(group, topic)] = tag_filter
            self._looked_early.move_to_end((group, topic))
            if len(self._looked_early) > MAX_EARLY_LOOKS:
                oldest_group, oldest_topic = next(iter(self._looked_early))
                self._forget_early(oldest_group, oldest_topic)
            return None
        new = (group, topic) not in self.groups
        if new and len(self.groups) >= self.settings.max_groups:
            # Each costs memory and a dozen metric series for good: any client could otherwise make a broker keep
            # state for every name it makes up — tests/unit/broker/test_groups.py::
            # test_a_new_group_past_max_groups_is_refused_and_known_ones_go_on.
            raise TooManyRequests(
                f"broker {self.settings.name} keeps state for {len(self.groups)} consumer groups and topics, its"
                " limit (--max-groups): a new group is refused"
            )
        state = self._state(group, topic)
        # A Pop sets the group's filter; so does a group's first look (a proxy announces a group to every
        # broker with a Notification: its lag there then counts what it will take, not every message).
        if (pop_filter or new) and state.filter != tag_filter:
            state.filter = tag_filter
            ops.append(SetGroupFilter(group, topic, str(tag_filter)))
        # A group's first look at an existing topic fixes (and stores) where it starts on every queue, so
        # that `latest` means the moment it first looked, not its first successful Pop. A group that looked
        # before the topic existed starts at its first message: everything in it came after that look.
        # Dead-letter topics are read from their first message whatever the setting (RocketMQ starts its
        # system topics at the minimum offset too): `dlq resend` must find the letters that came before it.
        latest = new and self.settings.consume_from == "latest" and not topic.startswith(validation.DLQ_PREFIX)
        if new and self._forget_early(group, topic):
            latest = False
        topic_log = self.topics[topic]
        if len(state.queues) < len(topic_log.queues):
            for queue in topic_log.queues:
                self.group_queue(state, queue, ops, latest=latest)
        return state

    def group_queue(self, state: GroupTopic, queue: QueueLog, ops: list[Op], *, latest: bool = False) -> GroupQueue:
        """The group's state on one queue; a queue it has not read yet starts at its first message (or, for a
        group's first look under `latest`, after its last) and that start is stored."""
        gq = state.queues.get(queue.queue_id)
        if gq is None:
            start = queue.max_offset if latest else queue.min_offset
            gq = state.queue(queue.queue_id, start)
            ops.append(SetPullOffset(state.group, state.topic, queue.queue_id, start))
        return gq

    def adopt_early(self, topic: str, ops: list[Op]) -> None:
        """The groups that looked at `topic` before it existed get their state now that it has messages (stored:
        their lag counts here from now on, also after a restart, before their first Pop on this broker)."""
        if topic not in self._early_topics:
            return
        for group, topic_filter in [(g, f) for (g, t), f in self._looked_early.items() if t == topic]:
            with contextlib.suppress(TooManyRequests):  # over --max-groups: it gets its state when it polls
                self.reader(group, topic, topic_filter, ops, pop_filter=False)
            self._forget_early(group, topic)

    def forget_early(self, group: str, topic: str = "") -> None:
        """Drop the group's early looks (at `topic`, or at every topic): the group was deleted."""
        for g, t in [k for k in self._looked_early if k[0] == group and (not topic or k[1] == topic)]:
            self._forget_early(g, t)

    def forget_topic(self, topic: str) -> None:
        """Drop every group's early look at the topic: it was deleted."""
        for g, t in [k for k in self._looked_early if k[1] == topic]:
            self._forget_early(g, t)

    def _forget_early(self, group: str, topic: str) -> bool:
        """Drop the group's early look at the topic; whether it had one."""
        if self._looked_early.pop((group, topic), None) is None:
            return False
        self._early_topics[topic] -= 1
        if not self._early_topics[topic]:
            del self._early_topics[topic]
        return True

    def _state(self, group: str, topic: str) -> GroupTopic:
        """The group's state on the topic, made if it has none (no limit: restore and `reader` check it)."""
        state = self.groups.get((group, topic))
        if state is None:
            state = self.groups[(group, topic)] = GroupTopic(group, topic)
        return state
