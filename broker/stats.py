"""The Stats answer: every queue's offsets, then each (topic, group)'s lag per queue, cut to fit the broker's gRPC
message limit (docs/BROKER.md, "Stats")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from popgate_pb import broker_pb2 as pb

from broker.longpoll import Kind

if TYPE_CHECKING:
    from broker.core import BrokerCore

ANSWER_MARGIN = 1024  # the answer's bytes besides its rows (broker name, counts) are fewer
ROW_FRAMING = 6  # a repeated row's field tag and length


async def stats(core: BrokerCore, request: pb.StatsRequest, out: pb.StatsResponse) -> None:
    """Rows while they fit the limit, a topic and a (topic, group) whole or not at all, and `cut` once one was left
    out: a reader's sums over queues stay right (tests/unit/broker/test_stats_answer.py::
    test_an_answer_stays_under_the_grpc_limit_and_says_groups_were_left_out)."""
    out.broker, out.now_ms = core.name, core.clock.now_ms()
    out.held_pops, out.held_notifications = core.hold.held[Kind.POP], core.hold.held[Kind.NOTIFICATION]
    room = _add_queues(core, request, out, core.settings.max_grpc_message_bytes - ANSWER_MARGIN)
    if room >= 0:
        room = _add_groups(core, request, out, room)
    out.cut = room < 0


def _add_queues(core: BrokerCore, request: pb.StatsRequest, out: pb.StatsResponse, room: int) -> int:
    """Each topic's queues while they fit `room`; the room left, negative when a topic was left out."""
    for name, topic in sorted(core.topics.items()):
        if request.topic and name != request.topic:
            continue
        start = len(out.queues)
        for q in topic.queues:
            row = out.queues.add(topic=name, queue_id=q.queue_id, min_offset=q.min_offset, max_offset=q.max_offset)
            room -= row.ByteSize() + ROW_FRAMING
        if room < 0:
            del out.queues[start:]
            break
    return room


def _add_groups(core: BrokerCore, request: pb.StatsRequest, out: pb.StatsResponse, room: int) -> int:
    """Each (topic, group)'s queues while they fit `room`; the room left, negative when a pair was left out."""
    start, pair = 0, ("", "")
    for lag_row in core.iter_lags(request.topic, request.group):
        if (lag_row.topic, lag_row.group) != pair:  # the previous pair is whole
            if room < 0:
                break
            start, pair = len(out.groups), (lag_row.topic, lag_row.group)
        lag = lag_row.lag
        row = out.groups.add(
            topic=lag_row.topic,
            group=lag_row.group,
            queue_id=lag_row.queue_id,
            max_offset=lag.max_offset,
            consumer_offset=lag.consumer_offset,
            pull_offset=lag.pull_offset,
            ready=lag.ready,
            inflight=lag.inflight,
            lag=lag.lag,
            oldest_unacked_store_ms=lag.oldest_unacked_store_ms,
        )
        room -= row.ByteSize() + ROW_FRAMING
    if room < 0:
        del out.groups[start:]
    return room
