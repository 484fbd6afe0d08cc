"""Admin operations on the broker core: offset reset, group and topic deletion, topic creation, message queries
and the consumers proxies report. The proxy's admin service fans each out to every broker (docs/BROKER.md,
"Admin operations").

Each changes memory first, on the event loop with no await in between, then waits for the commit of its store ops
whatever ``--flush`` says: once answered, a kill -9 keeps it. A failed commit answers the store's error; memory
keeps the change and the rows are written again as consumer state is (broker.commits), and the operation is safe to
repeat (tests/integration/proxy/test_admin_ops.py). Bad input changes nothing.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from popgate_pb import broker_pb2 as pb

from broker.filters import MATCH_ALL
from broker.lookup import query
from broker.reset import check_target, reset_queue, target_offset
from broker.store import Op, PurgeGroup
from broker.topic_purges import TopicDeletion
from popgate_contract import validation
from popgate_contract.errors import BEING_DELETED, BadRequest, TooManyRequests

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from broker.core import BrokerCore

MAX_QUEUES = 256  # queues a created topic may have on one broker
ANSWER_MARGIN = 1024  # a QueryMessages answer's bytes besides its messages (broker name, counts) are fewer


async def _committed(core: BrokerCore, ops: list[Op]) -> None:
    """Commit and wait for it, whatever --flush says (StoreUnavailable when the store refuses it)."""
    await asyncio.shield(core.commits.commit(ops))


async def reset_offset(core: BrokerCore, request: pb.ResetOffsetRequest, out: pb.ResetOffsetResponse) -> None:
    """RocketMQ's resetOffsetByTime on every queue of the topic here (broker.reset); a topic this broker does not
    have answers no queue. Held requests of the group are woken to read from the new offsets."""
    topic, group = validation.check_topic(request.topic), validation.check_group(request.group)
    check_target(request.to, request.timestamp_ms)
    out.broker = core.name
    log_ = core.topics.get(topic)
    if log_ is None:
        return
    ops: list[Op] = []
    state = core.consumers.reader(group, topic, MATCH_ALL, ops, pop_filter=False)
    assert state is not None  # the topic exists
    for queue in log_.queues:
        offset = target_offset(queue, request.to, request.timestamp_ms)
        dropped = reset_queue(state, queue, offset, ops)
        out.queues.add(queue_id=queue.queue_id, offset=offset, dropped_inflight=dropped)
    core.redelivery.schedule(state)
    core.hold.wake_ready((topic, group), functools.partial(core.readiness.check, state))
    await _committed(core, ops)


async def delete_group(
    core: BrokerCore,
    request: pb.DeleteGroupRequest,
    out: pb.DeleteGroupResponse,
    *,
    rows_by: float | None = None,
) -> None:
    """Forget the group's state on its topics here (or on `topic`); its held requests are answered empty. A
    consumer that polls again starts as a new group. Its DLQ topic goes now when asked (as `delete_topic`, with
    `rows_by`), else once retention expired its every letter (Retention.drop_dead_letter_topics)."""
    group = validation.check_group(request.group)
    topic = validation.check_topic(request.topic) if request.topic else ""
    out.broker = core.name
    ops: list[Op] = []
    for t in sorted(t for g, t in core.groups if g == group and (not topic or t == topic)):
        forget_group(core, group, t)
        ops.append(PurgeGroup(group, t))
        out.topics.append(t)
    if topic and not out.topics:
        ops.append(PurgeGroup(group, topic))  # a repeat after a failed commit: the rows go whatever memory says
    core.consumers.forget_early(group, topic)
    # With the rows refused commits left to write: a repeat finds no state of what an earlier refused commit forgot,
    # and answers once that purge is stored (tests/unit/broker/test_admin.py::
    # test_a_group_deletion_repeated_after_a_refused_commit_is_stored_before_it_answers).
    await asyncio.shield(core.commits.commit(ops, with_lost=True))
    if request.delete_dlq:
        dlq = pb.DeleteTopicResponse()
        request_dlq = pb.DeleteTopicRequest(topic=validation.DLQ_PREFIX + group)
        await delete_topic(core, request_dlq, dlq, rows_by=rows_by)
        out.dlq_deleted = dlq.existed


async def delete_topic(
    core: BrokerCore,
    request: pb.DeleteTopicRequest,
    out: pb.DeleteTopicResponse,
    still: Callable[[], bool] | None = None,
    *,
    rows_by: float | None = None,
) -> None:
    """Delete the topic's messages and every group's state on it here. Answered once its rows are deleted too, or
    at `rows_by` (the loop's time; None: no bound) with their deletion going on: the topic is deleted, and not made
    again until its rows are gone. Sends to it are refused while it goes
    (TOPIC_NOT_FOUND); held Pops and Notifications of it are answered empty, not left waiting on a topic that is
    gone. Scheduled and half messages of the topic stay and are delivered into it when due (creating it again),
    as RocketMQ's deleteTopic leaves its timer messages. A refused commit leaves the topic gone from memory and not
    made again until a purge of it commits (StateCommits.purging); a repeat is allowed. `still` (retention's) is
    asked once the topic's pending commits are in, just before it goes: False leaves it as it is, `out.existed`
    unset (test_retention_dlq.py::test_a_letter_dead_lettered_while_the_topic_is_dropped_stays). A deletion asked
    while one of the topic runs waits for it and answers as it did (TOO_MANY_REQUESTS when still running at
    `rows_by`) — tests/unit/broker/test_requests_during_deletion.py::
    test_a_second_deletion_waits_for_the_first_and_answers_as_it."""
    topic = validation.check_topic(request.topic)
    out.broker = core.name
    while (running := core.sends.deleting.get(topic)) is not None:
        await _by(asyncio.shield(running.answer), rows_by, f"topic {topic} {BEING_DELETED} on broker {core.name}")
        first = running.answer.result()
        if first is not None:
            out.CopyFrom(first)
            out.rows_deleting = not await _rows_deleted(core, topic, rows_by)
            return
        await asyncio.shield(running.ended)  # at once: it deleted nothing, and has ended or is ending
    deletion = core.sends.deleting[topic] = TopicDeletion()
    if still is None:
        core.sends.deleting_all.add(topic)
        core.create_when_purged.discard(topic)  # a --topic left to create once an earlier deletion ends: not now
    try:
        if topic in core.topics:
            await core.store.submit([], [])  # Sends submitted before the mark are committed and announced first
        if still is not None and not still():
            return
        log_ = core.topics.get(topic)
        if log_ is not None:
            out.existed = True
            out.messages = sum(q.max_offset - q.min_offset for q in log_.queues)
            out.groups.extend(sorted(g for g, t in core.groups if t == topic))
            out.held_ended = forget_topic(core, topic)
        # Also when gone from memory: a repeat after a failed commit. Until a purge of it commits (this one, or this
        # one written again with later commits) the topic is not made again (StateCommits.purging).
        await asyncio.shield(core.commits.purge_topic(topic))
        deletion.answer.set_result(out)
        # Its rows go after the purge, in steps between other commits (broker.topic_purges); answered once they
        # went, so a send may make it again at once, or when the caller's deadline is near, saying they still go.
        out.rows_deleting = not await _rows_deleted(core, topic, rows_by)
    finally:
        del core.sends.deleting[topic]
        core.sends.deleting_all.discard(topic)
        if not deletion.answer.done():  # not deleted by this call: a deletion waiting for it runs itself
            deletion.answer.set_result(None)
        deletion.ended.set_result(None)


async def _rows_deleted(core: BrokerCore, topic: str, by: float | None) -> bool:
    """Whether `topic`'s stored rows were gone by `by` (waiting for them until then)."""
    return await _by(core.commits.topic_rows.deleted(topic), by)


async def _by(waited: Awaitable[object], by: float | None, refusal: str = "") -> bool:
    """Whether `waited` ended by `by` (the loop's time; None: no bound), waiting until then; not ending in time is
    TooManyRequests(`refusal`) when one is given."""
    within = None if by is None else max(0.0, by - asyncio.get_running_loop().time())
    try:
        await asyncio.wait_for(waited, within)
    except TimeoutError:
        if refusal:
            raise TooManyRequests(f"{refusal}: still at this call's deadline; try again later") from None
        return False
    return True


def forget_group(core: BrokerCore, group: str, topic: str) -> int:
    """Drop the group's state on the topic from memory: its timer, held requests (answered empty, how many),
    counters and metric series (`core.on_forgotten`)."""
    state = core.groups.pop((group, topic), None)
    if state is not None:
        core.redelivery.forget(state)
    for counts in (core.messages_out, core.first_out, core.messages_acked):
        counts.pop((topic, group), None)
    if core.on_forgotten is not None:
        core.on_forgotten(topic, group)
    return core.hold.end((topic, group))


def forget_topic(core: BrokerCore, topic: str) -> int:
    """Drop the topic and every group's state on it from memory; the held requests answered empty (how many)."""
    ended = sum(forget_group(core, g, topic) for g in [g for g, t in core.groups if t == topic])
    ended += core.hold.end_topic(topic)
    log_ = core.topics.pop(topic)
    for queue in log_.queues:
        core.cache.drop(queue, queue.max_offset)
    core.sends.forget(topic)
    core.consumers.forget_topic(topic)
    core.messages_in.pop(topic, None)
    core.bytes_in.pop(topic, None)
    core.retention.deleted.pop(topic, None)  # its series goes with the others (test_retention.py::
    # test_a_deleted_topic_leaves_no_series_behind)
    return ended


async def create_topic(
    core: BrokerCore, request: pb.CreateTopicRequest, out: pb.CreateTopicResponse, *, rows_by: float | None = None
) -> None:
    """Create the topic with `queues` queues (the broker's --queues-per-topic for 0), durably; an existing topic
    keeps its queues (answered `created = false`), also with auto-create off. One in memory whose queue rows are
    not stored yet (its first commit refused, or still under way) has them committed again before the answer, which
    comes after the first commit's — tests/unit/broker/test_admin.py::
    test_a_topic_creation_repeated_after_a_refused_commit_is_stored_before_it_answers and
    test_a_topic_creation_racing_the_first_answers_once_the_topic_is_stored. One being deleted is created once its
    deletion and its rows' ended, or refused TOO_MANY_REQUESTS at `rows_by` — tests/unit/broker/
    test_requests_during_deletion.py::test_a_topic_created_while_it_is_deleted_is_made_once_its_rows_are_gone."""
    topic = validation.check_topic(request.topic)
    if not 0 <= request.queues <= MAX_QUEUES:
        raise BadRequest(f"a topic has 1..{MAX_QUEUES} queues on a broker, not {request.queues}")
    out.broker = core.name
    being_deleted = f"topic {topic} {BEING_DELETED} on broker {core.name}"
    while (running := core.sends.deleting.get(topic)) is not None or topic in core.commits.purging:
        ended = asyncio.shield(running.ended) if running is not None else core.commits.purged(topic)
        await _by(ended, rows_by, being_deleted)
    if topic not in core.topics:
        if len(core.topics) >= core.settings.max_topics:
            raise TooManyRequests(
                f"broker {core.name} has {len(core.topics)} topics, its limit (--max-topics {core.settings.max_topics})"
            )
        out.created = True
    ops: list[Op] = []
    log_ = core.sends.topic_for_send(topic, ops, force=True, queues=request.queues)
    if ops:  # none for a stored topic; awaited: the answer says it is stored (test_admin.py::
        await core.sends.submit([], ops, awaited=True)  # test_a_topic_creation_is_not_deferred_as_consumer_state)
    out.queues = len(log_.queues)


async def query_messages(core: BrokerCore, request: pb.QueryMessagesRequest, out: pb.QueryMessagesResponse) -> None:
    """The newest matches that fit the broker's gRPC message limit: bodies while they fit `--max-pop-bytes`, and
    `scan_cut` when older matches were left out (tests/unit/broker/test_lookup.py::
    test_an_answer_stays_under_the_grpc_limit_and_says_older_matches_were_left_out)."""
    out.broker = core.name
    log_ = core.topics.get(validation.check_topic(request.topic))
    queues = log_.queues if log_ is not None else []
    found = await query(core.store, queues, request, max_bytes=core.settings.max_pop_bytes)
    out.scanned, out.scan_cut = found.scanned, found.cut
    room = core.settings.max_grpc_message_bytes - ANSWER_MARGIN
    bodies = 0
    for match in found.newest_first():
        one = out.messages.add(broker=core.name, body_size=match.body_size)
        stored = one.stored
        stored.message.CopyFrom(match.message)
        bodies += match.body_size
        if bodies > core.settings.max_pop_bytes:
            stored.message.ClearField("body")
        stored.queue_id, stored.offset, stored.store_ms = match.queue_id, match.offset, match.store_ms
        room -= one.ByteSize() + 6  # its field's tag and length
        if room < 0:
            del out.messages[-1]
            out.scan_cut = True
            break


async def report_consumers(
    core: BrokerCore, request: pb.ReportConsumersRequest, out: pb.ReportConsumersResponse
) -> None:
    core.consumers_seen.report(request.proxy, request.consumers, request.ttl_ms, core.clock.now_ms())


async def list_consumers(core: BrokerCore, request: pb.ListConsumersRequest, out: pb.ListConsumersResponse) -> None:
    """A group's consumers; of every group (an empty one), the first EVERY_GROUP_LIMIT and `cut` when more are kept
    (tests/unit/broker/test_consumers.py::test_the_every_group_listing_is_bounded_and_says_it_was_cut)."""
    out.broker = core.name
    now_ms = core.clock.now_ms()
    if request.group:
        seen = core.consumers_seen.of_group(request.group, now_ms)
    else:
        seen, out.cut = core.consumers_seen.every_group(now_ms)
    for s in seen:
        out.consumers.add(group=s.group, client_id=s.client_id, proxy=s.proxy, last_seen_ms=s.last_seen_ms)
