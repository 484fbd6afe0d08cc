"""The broker's requests as core calls, shared by the unary RPCs (`broker.server`) and the Session stream
(`broker.session`), answered in the same way on both."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from sys import intern
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError
from popgate_pb import broker_pb2 as pb

from broker.core import BrokerCore
from broker.model import PopResult
from popgate_contract import errors, validation

# -- request → core call → response, shared by the unary RPCs and the Session stream ---------
# Each fills in the response it is given: a sub-message is built in place, not built apart and copied
# into its parent (a Pop answer's payloads would be copied twice).


async def send(core: BrokerCore, request: pb.SendRequest, out: pb.SendResponse) -> None:
    add = out.results.add
    within_s = request.timeout_ms / 1000 if request.timeout_ms else None
    for s in await core.send(request.messages, request.runs, within_s):
        add(
            message_id=s.message_id,
            topic=s.topic,
            queue_id=s.queue_id,
            offset=s.offset,
            recall_handle=s.recall_handle,
            transaction_id=s.transaction_id,
        )


class Asked(NamedTuple):
    """What the answer to a request that may be held (and its undo) needs of the request, read before it is held:
    a held request keeps no protobuf (a message's arena, or the whole stream message it came in)."""

    topic: str
    group: str
    v2: bool = False


def popping(core: BrokerCore, request: pb.PopRequest) -> tuple[Awaitable[PopResult], Asked]:
    r = request
    topic, group = intern(r.topic), intern(r.group)  # the group's held requests share one string of each
    waiting = core.pop(topic, group, r.filter, r.max_messages, r.invisible_ms, r.poll_ms, r.max_fifo)
    return waiting, Asked(topic, group, r.v2)


async def pop(core: BrokerCore, request: pb.PopRequest, out: pb.PopResponse) -> PopResult:
    waiting, asked = popping(core, request)
    return fill_pop(core, asked, await waiting, out)


def fill_pop(core: BrokerCore, asked: Asked, result: PopResult, out: pb.PopResponse) -> PopResult:
    """`out`: the answer of a Pop that got `result`."""
    add = out.messages.add
    v2 = asked.v2
    for p in result.messages:
        popped = add(receipt_handle=p.handle, delivery_attempt=p.attempt, invisible_until_ms=p.invisible_until_ms)
        stored = popped.stored
        message = stored.message
        try:
            message.MergeFromString(p.payload)
        except DecodeError:  # damaged on disk: the others are answered, this one goes to the DLQ as it is
            del out.messages[-1]
            core.unreadable(asked.topic, asked.group, p.handle)
            continue
        if not v2:  # the proxy's byte path reads it; a Pop without `v2` is answered as before
            message.ClearField("v2_system")
        stored.queue_id = p.queue_id
        stored.offset = p.offset
        stored.store_ms = p.store_ms
    out.polling_full = result.polling_full
    out.held = result.held
    out.closing = result.closing
    return result


MAX_CHECK_TOPICS = 1024  # topics of one TransactionChecks (a proxy asks in chunks: proxy.txchecks)
POPPED_OVERHEAD = 128  # bytes of a popped message's answer beyond its payload (handle, ids, offsets)


def answer_bytes(result: PopResult) -> int:
    """What a Pop answer holds in memory until its caller takes it (the budgets of both Pop paths)."""
    return sum(len(p.payload) for p in result.messages) + POPPED_OVERHEAD * len(result.messages)


def _results(out: Any, handles: Sequence[str], outcome: Sequence[errors.DomainError | None]) -> None:
    """Per handle, in request order: ok, or the error's name and text (Ack and Renew answers)."""
    add = out.add
    for handle, e in zip(handles, outcome, strict=True):
        if e is None:
            add(receipt_handle=handle, ok=True)
        else:
            add(receipt_handle=handle, ok=False, error=e.name, error_message=e.message)


async def ack(core: BrokerCore, request: pb.AckRequest, out: pb.AckResponse) -> None:
    handles = request.receipt_handles
    _results(out.results, handles, await core.ack(request.topic, request.group, handles))


async def change_invisible(
    core: BrokerCore, request: pb.ChangeInvisibleTimeRequest, out: pb.ChangeInvisibleTimeResponse
) -> None:
    r = request
    out.receipt_handle, out.invisible_until_ms = await core.change_invisible(
        r.topic, r.group, r.receipt_handle, r.invisible_ms
    )


async def change_invisible_many(
    core: BrokerCore, request: pb.ChangeInvisibleTimesRequest, out: pb.ChangeInvisibleTimesResponse
) -> None:
    r = request
    outcome, _ = await core.change_invisible_many(
        r.topic, r.group, r.receipt_handles, r.invisible_ms, undelivered=r.undelivered
    )
    add = out.results.add
    for result in outcome:
        if isinstance(result, tuple):
            add(ok=True, receipt_handle=result[0], invisible_until_ms=result[1])
        else:
            add(ok=False, error=result.name, error_message=result.message)


async def renew(core: BrokerCore, request: pb.RenewRequest, out: pb.RenewResponse) -> None:
    handles = request.receipt_handles
    outcome, out.invisible_until_ms = await core.renew(
        request.group, handles, request.invisible_ms, bring_forward=request.bring_forward
    )
    _results(out.results, handles, outcome)


def noticing(core: BrokerCore, request: pb.NotificationRequest) -> tuple[Awaitable[tuple[bool, bool]], Asked]:
    topic, group = intern(request.topic), intern(request.group)
    return core.notification(topic, group, request.filter, request.poll_ms), Asked(topic, group)


async def notification(core: BrokerCore, request: pb.NotificationRequest, out: pb.NotificationResponse) -> None:
    waiting, asked = noticing(core, request)
    fill_notification(core, asked, await waiting, out)


def fill_notification(core: BrokerCore, asked: Asked, result: tuple[bool, bool], out: pb.NotificationResponse) -> None:
    out.has_message, out.polling_full = result
    out.closing = not out.has_message and core.hold.closed  # stopping: the proxy watches the other brokers


async def group_config(core: BrokerCore, request: pb.GroupConfigRequest, out: pb.GroupConfigResponse) -> None:
    out.max_delivery_attempts = core.settings.max_attempts_of(validation.check_group(request.group))


async def recall(core: BrokerCore, request: pb.RecallRequest, out: pb.RecallResponse) -> None:
    out.message_id = await core.recall(request.topic, request.recall_handle)


async def end_transaction(core: BrokerCore, request: pb.EndTransactionRequest, out: pb.EndTransactionResponse) -> None:
    await core.transactions.end(request.topic, request.transaction_id, commit=request.commit)


async def transaction_checks(
    core: BrokerCore, request: pb.TransactionChecksRequest, out: pb.TransactionChecksResponse
) -> None:
    named = len(request.topics) + len(request.asked_topics)
    if named > MAX_CHECK_TOPICS:
        raise errors.BadRequest(f"TransactionChecks names {named} topics, at most {MAX_CHECK_TOPICS}")
    for topic in (*request.topics, *request.asked_topics):
        validation.check_topic(topic)
    checks, out.next_due_ms = await core.transactions.checks(
        request.topics, request.max_checks, asked=request.asked_topics
    )
    out.now_ms = core.clock.now_ms()
    out.check_interval_ms = core.transactions.schedule.interval_ms
    for c in checks:
        added = out.checks.add(transaction_id=c.transaction_id, check=c.check)
        stored = added.message
        stored.message.MergeFromString(c.row.payload)
        stored.queue_id = c.row.queue_id
        stored.offset = -1
        stored.store_ms = c.row.store_ms


# The kinds a broker may hold (long polls): the core's call (what to await, and what the answer needs of the request),
# then what fills the answer from its result. The Session stream drops the request before it awaits and makes the
# answer only once the result is there, so a held request holds neither —
# tests/unit/broker/test_session_more.py::test_a_held_pop_or_notification_is_two_coroutines_and_holds_no_protobuf.
Held = tuple[Callable[[BrokerCore, Any], tuple[Awaitable[Any], Asked]], Callable[[BrokerCore, Asked, Any, Any], Any]]
HELD_CALLS: dict[str, Held] = {
    "pop": (popping, fill_pop),
    "notification": (noticing, fill_notification),
}

# What a Session request of each kind runs; its response goes in the field of the same name.
SESSION_CALLS: dict[str, Callable[[BrokerCore, Any, Any], Awaitable[Any]]] = {
    "pop": pop,
    "notification": notification,
    "send": send,
    "ack": ack,
    "change_invisible": change_invisible,
    "change_invisible_many": change_invisible_many,
    "renew": renew,
    "group_config": group_config,
    "end_transaction": end_transaction,
}
