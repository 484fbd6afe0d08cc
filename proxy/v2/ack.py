"""AckMessage (batch), ChangeInvisibleDuration (one, or many: popgate.ext.v1 ChangeInvisibleMany) and
ForwardMessageToDeadLetterQueue: routed by receipt handle."""

from __future__ import annotations

from collections.abc import Sequence

from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from popgate_contract.codes import status_of
from popgate_contract.receipt import MAX_HANDLE_LEN
from popgate_contract.validation import MAX_MESSAGE_ID_LEN
from proxy import validate
from proxy.metrics import counting
from proxy.v2.context import Call
from proxy.v2.convert import seconds

MAX_ENTRIES = 1024
OK = v2.Status(code=v2.OK, message="OK")


async def ack_message(call: Call, request: pb.AckMessageRequest, *, brief: bool = False) -> pb.AckMessageResponse:
    """`brief`: an answer that acks every entry is its OK status alone, without the entries (a Session stream's: the
    SDK reads entries only from a failed answer) —
    tests/unit/proxy/test_session.py::test_an_ack_on_the_stream_answers_ok_without_its_entries_and_a_failure_with_them."""
    group = validate.group_in(request.group.resource_namespace, request.group.name)
    topic = validate.topic_in(request.topic.resource_namespace, request.topic.name)
    count = len(request.entries)
    if not 1 <= count <= MAX_ENTRIES:
        raise errors.BadRequest(f"AckMessage carries {count} entries: must be 1..{MAX_ENTRIES}")
    entries = None if brief else [(e.message_id, e.receipt_handle) for e in request.entries]  # each read once
    handles = [e.receipt_handle for e in request.entries] if entries is None else [h for _, h in entries]
    outcome = await call.proxy.ack(topic, group, handles, deadline=call.deadline)
    metrics = counting(call.proxy.metrics)
    if metrics is not None:
        metrics.acked(topic, group, outcome)
    if all(error is None for error in outcome):
        if entries is None:
            return pb.AckMessageResponse(status=OK)
        failed = False
    else:
        failed = True
        if entries is None:
            entries = [(e.message_id, e.receipt_handle) for e in request.entries]
    response = pb.AckMessageResponse()
    add = response.entries.add  # built in place: an entry built apart is copied into the response
    ok = v2.OK
    for (message_id, handle), error in zip(entries, outcome, strict=True):
        status = add(
            message_id=_echoed(message_id, MAX_MESSAGE_ID_LEN), receipt_handle=_echoed(handle, MAX_HANDLE_LEN)
        ).status
        if error is None:
            status.code, status.message = ok, "OK"  # cheaper than copying OK into each entry
        else:
            status.CopyFrom(status_of(error))
    response.status.CopyFrom(_overall(response.entries) if failed else OK)
    return response


def _echoed(text: str, limit: int) -> str:
    """`text` to echo in an answer entry: empty when longer than one can be (over `limit` bytes of UTF-8), so that
    1,024 entries stay an answer the client can read (4 MiB by default) — test_bad_input.py::
    test_an_ack_of_a_handle_too_long_to_be_one_does_not_echo_it_so_the_client_can_read_why."""
    if len(text) > limit or not (text.isascii() or len(text.encode()) <= limit):
        return ""
    return text


def _overall(entries: Sequence[pb.AckMessageResultEntry]) -> v2.Status:
    """OK when all acked; the shared error when all failed alike; else MULTIPLE_RESULTS.

    Never MESSAGE_NOT_FOUND: the official client takes that for success.
    """
    codes = {e.status.code for e in entries}
    if codes == {v2.OK}:
        return OK
    if len(codes) == 1:
        return entries[0].status
    failed = sum(1 for e in entries if e.status.code != v2.OK)
    return v2.Status(code=v2.MULTIPLE_RESULTS, message=f"{failed} of {len(entries)} entries failed; see entries")


async def change_invisible_duration(
    call: Call, request: pb.ChangeInvisibleDurationRequest
) -> pb.ChangeInvisibleDurationResponse:
    group = validate.group_in(request.group.resource_namespace, request.group.name)
    topic = validate.topic_in(request.topic.resource_namespace, request.topic.name)
    requested = seconds(request.invisible_duration, what="invisible_duration", error=errors.IllegalInvisibleTime)
    invisible_s = validate.invisible(requested, low=0.0, high=call.settings.max_invisible_s)
    invisible_ms = int(invisible_s * 1000)
    metrics = counting(call.proxy.metrics)
    try:
        handle = await call.proxy.change_invisible(
            topic, group, request.receipt_handle, invisible_ms, deadline=call.deadline
        )
    except errors.DomainError as exc:
        if metrics is not None:
            metrics.changed(topic, group, [exc])
        raise
    if metrics is not None:
        metrics.changed(topic, group, [None])
    return pb.ChangeInvisibleDurationResponse(status=OK, receipt_handle=handle)


async def change_invisible_many(call: Call, request: ext.ChangeInvisibleMany) -> ext.ChangeInvisibleManyResponse:
    """ChangeInvisibleDuration of each entry, to one invisible time, one broker request a broker: an entry each in
    the answer, in order, its new handle when changed (else the one it was sent), and an overall status as
    AckMessage's — tests/unit/proxy/test_change_many.py."""
    group = validate.group_in(request.group.resource_namespace, request.group.name)
    topic = validate.topic_in(request.topic.resource_namespace, request.topic.name)
    count = len(request.entries)
    if not 1 <= count <= MAX_ENTRIES:
        raise errors.BadRequest(f"ChangeInvisibleMany carries {count} entries: must be 1..{MAX_ENTRIES}")
    requested = seconds(request.invisible_duration, what="invisible_duration", error=errors.IllegalInvisibleTime)
    high = 0.0 if request.undelivered else call.settings.max_invisible_s  # given back undelivered: ready at once
    invisible_s = validate.invisible(requested, low=0.0, high=high)
    entries = [(e.message_id, e.receipt_handle) for e in request.entries]
    handles = [handle for _, handle in entries]
    outcome = await call.proxy.change_invisible_many(
        topic, group, handles, int(invisible_s * 1000), deadline=call.deadline, undelivered=request.undelivered
    )
    metrics = counting(call.proxy.metrics)
    if metrics is not None:
        metrics.changed(topic, group, [None if isinstance(r, str) else r for r in outcome])
    response = ext.ChangeInvisibleManyResponse()
    add = response.entries.add
    ok = v2.OK
    for (message_id, handle), result in zip(entries, outcome, strict=True):
        if isinstance(result, str):
            entry = add(message_id=_echoed(message_id, MAX_MESSAGE_ID_LEN), receipt_handle=result)
            entry.status.code, entry.status.message = ok, "OK"
        else:
            echoed = _echoed(handle, MAX_HANDLE_LEN)
            entry = add(message_id=_echoed(message_id, MAX_MESSAGE_ID_LEN), receipt_handle=echoed)
            entry.status.CopyFrom(status_of(result))
    response.status.CopyFrom(_overall(response.entries))
    return response


async def forward_to_dead_letter_queue(
    call: Call, request: pb.ForwardMessageToDeadLetterQueueRequest
) -> pb.ForwardMessageToDeadLetterQueueResponse:
    group = validate.group_in(request.group.resource_namespace, request.group.name)
    topic = validate.topic_in(request.topic.resource_namespace, request.topic.name)
    await call.proxy.dead_letter(topic, group, request.receipt_handle, request.message_id, deadline=call.deadline)
    return pb.ForwardMessageToDeadLetterQueueResponse(status=OK)
