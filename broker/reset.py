"""Where a consumer group's offset reset puts it on a queue, and what the reset does to its state there (pure).

RocketMQ's resetOffsetByTime: per queue, the first message stored at or after the time (its store-time search), the
end when none is; ``earliest`` is the first message kept, ``latest`` the end. The group's pull offset moves there
and every in-flight delivery of the group on the queue is dropped — RocketMQ's reset clears the group's in-flight
count and its orderly block of the queue the same way: a message below the new offset is never delivered to the
group again, one at or above it is delivered again as a new delivery from the new offset; the old receipt handles
answer INVALID_RECEIPT_HANDLE (tests/unit/broker/test_admin.py).
"""

from __future__ import annotations

from popgate_pb import broker_pb2 as pb

from broker.inflight import GroupTopic
from broker.log import QueueLog
from broker.store import Op, PurgeQueueInflight, SetPullOffset
from popgate_contract.errors import BadRequest

To = pb.ResetOffsetRequest.To


def check_target(to: int, timestamp_ms: int) -> None:
    """BadRequest unless `to` is earliest, latest or a timestamp (ms since the epoch, >= 0)."""
    if to not in (To.EARLIEST, To.LATEST, To.TIMESTAMP):
        raise BadRequest("an offset reset needs a target: earliest, latest or a timestamp")
    if to == To.TIMESTAMP and timestamp_ms < 0:
        raise BadRequest(f"reset timestamp {timestamp_ms} ms is before the epoch")


def target_offset(queue: QueueLog, to: int, timestamp_ms: int) -> int:
    """The queue offset a reset to `to` (and `timestamp_ms`) puts a group at."""
    if to == To.EARLIEST:
        return queue.min_offset
    if to == To.LATEST:
        return queue.max_offset
    return queue.stored_before(timestamp_ms, queue.max_offset)


def reset_queue(state: GroupTopic, queue: QueueLog, offset: int, ops: list[Op]) -> int:
    """Put the group at `offset` on the queue: pull offset moved, its in-flight deliveries there dropped, its FIFO
    block and priority look-ahead cleared; the store ops appended to `ops`. How many deliveries were dropped."""
    gq = state.queue(queue.queue_id, offset)
    dropped = len(gq.inflight)
    # One statement drops the rows of the deliveries and the ACKED_AHEAD marks of what was taken ahead
    # (broker.inflight), however many: a mark left would keep its message from the group after a restart —
    # tests/unit/broker/test_priority.py::test_a_reset_forgets_what_was_taken_ahead_also_after_a_restart; the work
    # is bounded — tests/unit/broker/test_reset.py.
    ops.append(PurgeQueueInflight(state.group, state.topic, queue.queue_id))
    state.drop_all(queue.queue_id)
    gq.fifo.clear()
    gq.ahead = None
    gq.moving = None  # a dead letter on its way whose commit fails is not put back over the reset
    gq.counted = None
    gq.pull_offset = offset
    ops.append(SetPullOffset(state.group, state.topic, queue.queue_id, offset))
    return dropped
