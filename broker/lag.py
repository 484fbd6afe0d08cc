"""Lag arithmetic per consumer group and queue (RocketMQ's pop-mode definitions, exact with filters).

- Available (ready) = matching messages in [PullOffset, MaxOffset) the group has not taken ahead of its pull offset
  (broker.priority: those are in flight, counted there, or done)
- Inflight = deliveries popped and not acked
- ConsumerLag = Available + Inflight
- Lag in time = now - store time of the oldest un-acked matching message
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.filters import TagFilter
from broker.inflight import GroupQueue
from broker.log import QueueLog
from popgate_contract.lag import lag_seconds


@dataclass(frozen=True, slots=True)
class QueueLag:
    max_offset: int
    consumer_offset: int
    pull_offset: int
    ready: int
    inflight: int
    lag: int
    oldest_unacked_store_ms: int  # 0 when nothing is un-acked

    def lag_seconds(self, now_ms: int) -> float:
        return lag_seconds(self.oldest_unacked_store_ms, now_ms)


def queue_lag(log: QueueLog, state: GroupQueue | None, tag_filter: TagFilter, start_offset: int) -> QueueLag:
    """Lag of one group on one queue; ``state`` is None when the group never popped it."""
    pull = state.pull_offset if state else start_offset
    pull = max(pull, log.min_offset)
    inflight = len(state.inflight) if state else 0
    consumer = state.consumer_offset if state else pull
    ready = _ready(log, state, pull, tag_filter) - _taken_ahead(log, state, pull, tag_filter)
    if state and state.inflight:
        oldest_offset = min(state.inflight)
        if oldest_offset >= pull and ready:  # all taken ahead (priority): an older message may wait behind them
            oldest_offset = min(oldest_offset, log.first_match(pull, tag_filter))
    else:  # nothing ready: no search (with unsummarised blocks it reads every tag after the pull offset)
        oldest_offset = log.first_match(pull, tag_filter) if ready else log.max_offset
    oldest = log.store_ms_at(oldest_offset) if log.min_offset <= oldest_offset < log.max_offset else 0
    return QueueLag(log.max_offset, consumer, pull, ready, inflight, ready + inflight, oldest)


def _taken_ahead(log: QueueLog, state: GroupQueue | None, pull: int, tag_filter: TagFilter) -> int:
    """Matching messages in [pull, MaxOffset) the group took ahead of its pull offset (fewer than
    broker.priority.WINDOW) — tests/unit/broker/test_priority.py::
    test_lag_counts_a_message_taken_ahead_once_and_an_acked_one_not_at_all."""
    if state is None or not state.ahead:
        return 0
    tags, base, end = log.tags, log.min_offset, log.max_offset
    return sum(1 for o in state.ahead if pull <= o < end and tag_filter.matches(tags[o - base]))


def _ready(log: QueueLog, state: GroupQueue | None, pull: int, tag_filter: TagFilter) -> int:
    """Matching messages in [pull, MaxOffset). With a filter, the group's last count is kept and the next one only
    counts what changed since (the messages consumed and the messages arrived): blocks with too many distinct
    tags keep no summary, so a full count would read every tag of the backlog on each Stats call and scrape.
    The reused count must not drift — tests/unit/broker/test_log.py::test_lag_equals_linear_scans_while_the_queue_grows.
    """
    end = log.max_offset
    if tag_filter.tags is None or state is None:
        return log.count_matching(pull, end, tag_filter)
    last = state.counted
    # (A count from before retention trimmed the queue is not reused: what it counted below the queue's first
    # message is gone.)
    if last is not None and last[0] == tag_filter and log.min_offset <= last[1] <= pull <= last[2] <= end:
        count = last[3] - log.count_matching(last[1], pull, tag_filter) + log.count_matching(last[2], end, tag_filter)
    else:
        count = log.count_matching(pull, end, tag_filter)
    state.counted = (tag_filter, pull, end, count)
    return count
