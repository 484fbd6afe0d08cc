"""Committed messages made visible (the store's ArrivalListener, `BrokerCore.arrived`), and the held requests
they wake: one per message a group can read (a FIFO group held back by a message in flight only for what it can
read of the arrival) — tests/unit/broker/test_arrival.py."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker.readiness import Arrivals, arrivals_by_queue, held_back, readable_arrivals
from broker.store import Op, Record

if TYPE_CHECKING:
    from broker.core import BrokerCore

log = logging.getLogger(__name__)


def announce(core: BrokerCore, records: Sequence[Record]) -> None:
    """Append each record to its queue's index and cache, count it, and wake the groups waiting on its topic."""
    by_topic: dict[str, list[str | None]] = {}
    fifo_topics: set[str] = set()  # topics with an arrival in a queue holding FIFO messages
    for record in records:
        topic_log = core.topics.get(record.topic)
        if topic_log is None:  # deleted while its Send was being committed (broker.admin.delete_topic)
            continue
        if record.queue_id >= len(topic_log.queues):  # the send path appends none (send.remembered_queue)
            # Logged; the batch's other records are announced all the same — tests/unit/broker/test_arrival.py::
            # test_a_record_of_a_queue_the_topic_lacks_hides_no_other_record_of_its_batch
            log.error("committed %s/%s/%s: the topic has no such queue", record.topic, record.queue_id, record.offset)
            continue
        queue = topic_log.queues[record.queue_id]
        queue.append(record)
        core.cache.add(queue, record.offset, record.payload)
        by_topic.setdefault(record.topic, []).append(record.tag)
        core.bytes_in[record.topic] = core.bytes_in.get(record.topic, 0) + len(record.payload)
        if queue.fifo is not None:
            fifo_topics.add(record.topic)
    for topic in by_topic:
        ops: list[Op] = []
        core.consumers.adopt_early(topic, ops)
        if ops:  # the Send that brought these waits for it (`send`): announced before that Send is answered
            core.adoptions[topic] = core.commits.commit(ops)
    for topic, tags in by_topic.items():
        core.messages_in[topic] = core.messages_in.get(topic, 0) + len(tags)
        log_ = core.topics[topic]
        by_queue: Arrivals | None = None
        counts: Counter[str | None] | None = None  # the arrival's tags, counted once for every group
        for group in core.hold.groups_waiting(topic):
            state = core.groups.get((group, topic))
            ends = held_back(state, log_) if topic in fifo_topics and state is not None else None
            if not ends:
                if counts is None:
                    counts = Counter(tags)
                core.hold.arrived((topic, group), tags, counts)
                continue
            # Held back by a FIFO message in flight: woken only for what it can read of the arrival.
            if by_queue is None:
                by_queue = arrivals_by_queue(records, topic)
            core.hold.arrived((topic, group), readable_arrivals(by_queue, ends))
