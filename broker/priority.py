"""Priority messages: which of a queue's ready messages a group takes first (pure, no I/O).

RocketMQ 5's PRIORITY message type: among the messages of a queue a group may read now, a higher priority is
delivered first, the earliest first among equals. Only queues holding priority messages take this path
(`QueueLog.priority`); the others keep plain offset order. A group looks at most `WINDOW` matching messages past
its pull offset, so both the work of a Pop and what the group remembers are bounded: the offsets it took ahead of
its pull offset (`GroupQueue.ahead`) are fewer than `WINDOW`, and its pull offset moves past them once it reaches
them — tests/unit/broker/test_priority.py.
"""

from __future__ import annotations

import heapq

from broker.filters import TagFilter
from broker.inflight import GroupQueue
from broker.log import QueueLog

WINDOW = 1024  # matching messages past a group's pull offset that a priority Pop chooses among


def take_prioritized(
    queue: QueueLog,
    gq: GroupQueue,
    tag_filter: TagFilter,
    want: int,
    end: int,
    passed: list[int] | None = None,
    chosen: list[int] | None = None,
) -> list[int]:
    """Up to `want` offsets in [pull offset, end) the group has not taken, highest priority first (`chosen`: `best`
    of them, already found); they are recorded as taken and the pull offset moves past every taken one at its front.
    The offsets taken ahead earlier and done (acked, dead-lettered: their stored rows are ACKED_AHEAD marks,
    broker.inflight) that the pull offset now passes are appended to `passed`: their marks can go."""
    before = gq.ahead if gq.ahead is not None else set()
    ahead = set(before)
    priority = queue.priority or {}
    if chosen is None:
        chosen = best(queue, gq, tag_filter, want, end)
    ahead.update(chosen)
    new_pull = end
    for offset in queue.matching(gq.pull_offset, tag_filter, len(ahead) + 1, end):
        if offset not in ahead:
            new_pull = offset
            break
    gq.pull_offset = max(gq.pull_offset, new_pull)
    if passed is not None:  # not the ones chosen now: their deliveries are not recorded yet
        passed.extend(o for o in before if o < gq.pull_offset and o not in gq.inflight)
    ahead = {o for o in ahead if o >= gq.pull_offset}
    gq.ahead = ahead or None
    return sorted(chosen, key=lambda o: (-priority.get(o, 0), o))


def best(queue: QueueLog, gq: GroupQueue, tag_filter: TagFilter, want: int, end: int) -> list[int]:
    """The `want` offsets in [pull offset, end) the group has not taken that `take_prioritized` would take, highest
    priority first (nothing recorded: a Pop over several queues compares them first, broker.pop.take_new)."""
    ahead = gq.ahead or ()
    priority = queue.priority or {}
    window = [o for o in queue.matching(gq.pull_offset, tag_filter, WINDOW, end) if o not in ahead]
    return heapq.nsmallest(want, window, key=lambda o: (-priority.get(o, 0), o))
