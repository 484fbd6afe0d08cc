"""SendMessage: one or many messages, each checked, then stored by the core.

A request with GZIP bodies is converted on a worker thread (`Inflation`): inflating costs CPU in proportion to
the inflated size, and on the event loop it would hold every other RPC of the proxy meanwhile. zlib lets go of
the GIL while it inflates, so the loop goes on —
tests/integration/proxy/test_gzip.py::test_other_calls_go_on_while_two_clients_send_gzip_bodies_that_inflate_to_56_mib_a_request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from popgate_contract.codes import status_of
from popgate_process.bounded_threads import BoundedThreads
from proxy import validate
from proxy.core import REPLY_RESERVE_S
from proxy.outgoing import Run, runs_of, shared_run
from proxy.sending import PartlyStored
from proxy.v2.context import Call
from proxy.v2.convert import SendLimits, body_of, to_broker

INFLATE_THREADS = 2  # this machine's cores: more threads would only queue for them
INFLATE_REQUESTS = 4  # GZIP requests converting or queued for a thread; each inflates to at most max_message_bytes
INFLATE_WAITING = 64  # GZIP requests waiting for one of those places (they hold only what grpc has read already)


class Inflation(BoundedThreads):
    """At most `requests` GZIP conversions at a time on `threads` worker threads, `waiting` more waiting their turn
    within their deadline, past which TOO_MANY_REQUESTS (`BoundedThreads`)."""

    def __init__(
        self, *, threads: int = INFLATE_THREADS, requests: int = INFLATE_REQUESTS, waiting: int = INFLATE_WAITING
    ) -> None:
        def refused(why: str) -> errors.TooManyRequests:
            return errors.TooManyRequests(
                f"the proxy is already inflating {requests} requests of GZIP bodies {why}: retry later"
            )

        super().__init__(
            threads=threads,
            places=requests,
            waiting=waiting,
            refused=refused,
            name="gzip-inflate",
            reserve_s=REPLY_RESERVE_S,
        )


async def send_message(call: Call, request: pb.SendMessageRequest, *, inflation: Inflation) -> pb.SendMessageResponse:
    validate.send_count(len(request.messages))  # before a message is read
    sent = list(request.messages)  # each message's Python object made once, for the three passes below
    # Before the bodies are copied into broker messages (a GZIP body counts at its compressed size here).
    cost = call.proxy.check_send_room(sent)
    limits = SendLimits(call.settings.max_body_bytes, call.settings.max_delay_s)
    now = time.time()

    gzipped = any(m.system_properties.body_encoding == v2.GZIP for m in sent)
    topics: dict[tuple[str, str], str] = {}

    def convert() -> list[Run]:
        if not gzipped:  # `room` bounds inflated bodies only
            return runs_of([to_broker(m, limits, now_s=now, topics=topics) for m in sent])
        # Inflated GZIP bodies may fill no more than the largest request taken as sent (max_message_bytes), so a
        # small request of highly compressed bodies cannot make the proxy hold or inflate more than that —
        # tests/unit/proxy/test_overload.py::
        # test_gzip_bodies_of_one_request_inflate_to_no_more_than_the_largest_request_and_nothing_is_stored
        room = call.settings.max_message_bytes
        messages = []
        for m in sent:
            message = to_broker(m, limits, now_s=now, room=room, topics=topics)
            room -= len(message.body)
            messages.append(message)
        return runs_of(messages)

    if gzipped:
        return await _stored(call, await _inflated(call, inflation, convert, cost), admitted=True)
    return await _stored(call, convert())


async def _inflated(call: Call, inflation: Inflation, convert: Callable[[], list[Run]], cost: int) -> list[Run]:
    """`convert()` on an inflation thread; the request's bytes (`cost`) count against max_send_bytes while it waits
    for its turn and inflates, as a send's do while they wait for a broker."""
    with call.proxy.sender.holding(cost):
        return await inflation.run(convert, deadline=call.deadline)


async def send_shared(call: Call, request: ext.SendShared, *, inflation: Inflation) -> pb.SendMessageResponse:
    """popgate.ext.v1 SendShared: the SendMessage of its runs' messages, answered as that SendMessage would be; what
    the messages of a run share is converted and checked once —
    tests/unit/proxy/test_send_shared.py::test_a_shared_send_stores_and_answers_as_the_send_of_its_messages."""
    given = request.runs
    validate.shared_runs(len(given))  # before anything is made of a run
    count = validate.send_count(sum(len(run.bodies) for run in given), what="SendShared")
    runs = [_run(run) for run in given]
    # Each run's shared part (its first message but for the body) counted once, as the proxy holds it.
    held = sum(first.ByteSize() - len(first.body) + sum(map(len, bodies)) for first, bodies, _ in runs)
    cost = call.proxy.check_send_bytes(held, count)
    limits = SendLimits(call.settings.max_body_bytes, call.settings.max_delay_s)
    now = time.time()
    gzipped = any(first.system_properties.body_encoding == v2.GZIP for first, _, _ in runs)
    topics: dict[tuple[str, str], str] = {}

    def convert() -> list[Run]:
        # Each run's first message is checked whole (an error names the violation its SendMessage would name
        # first); the others are it with their own body and id, checked as its SendMessage would check them.
        # Plain bodies go to the broker as they came, the run's shared part encoded once; GZIP bodies share the
        # request's `room` as in send_message.
        room = call.settings.max_message_bytes if gzipped else None
        out: list[Run] = []
        for first, bodies, ids in runs:
            encoding = first.system_properties.body_encoding
            template = to_broker(first, limits, now_s=now, room=room, topics=topics)
            if room is None:
                for body, message_id in zip(bodies[1:], ids[1:], strict=True):
                    validate.message_id(message_id)
                    validate.body(body, limit=limits.max_body_bytes)
                out.append(shared_run(template, bodies, ids))
                continue
            messages = [template]
            for body, message_id in zip(bodies[1:], ids[1:], strict=True):
                room -= len(messages[-1].body)
                message = bpb.Message()
                message.CopyFrom(template)
                message.message_id = validate.message_id(message_id)
                message.body = body_of(body, encoding, limits.max_body_bytes, room)
                messages.append(message)
            room -= len(messages[-1].body)
            out.extend(runs_of(messages))
        return out

    if gzipped:
        return await _stored(call, await _inflated(call, inflation, convert, cost), admitted=True)
    return await _stored(call, convert())


def _run(run: ext.SharedMessages) -> tuple[v2.Message, list[bytes], list[str]]:
    """A run as its first message (shared, with its own body and id), its bodies and its ids; BadRequest when its
    bodies and ids do not pair up or `shared` has a body or id of its own."""
    bodies, ids = list(run.bodies), list(run.message_ids)
    if not bodies or len(ids) != len(bodies):
        raise errors.BadRequest(f"a SendShared run carries {len(bodies)} bodies and {len(ids)} message ids: one each")
    shared = run.shared
    if shared.body or shared.system_properties.message_id:
        raise errors.BadRequest("a SendShared run's shared message has a body or a message id of its own")
    first = v2.Message()
    first.CopyFrom(shared)
    first.body, first.system_properties.message_id = bodies[0], ids[0]
    return first, bodies, ids


async def _stored(call: Call, runs: list[Run], *, admitted: bool = False) -> pb.SendMessageResponse:
    """Store converted messages; the answer, an entry per message (`admitted`: `Sender.send_runs`)."""
    ok = v2.Status(code=v2.OK, message="OK")
    status = failed = ok
    try:
        results: Sequence[bpb.SendResult | None] = await call.proxy.send_runs(
            runs, deadline=call.deadline, admitted=admitted
        )
    except PartlyStored as partly:
        # The top-level status is the failure (official clients read nothing else: they resend the whole request,
        # at least once); the entries say which messages are stored, for a client that reads them (this SDK).
        results, error = partly.results, partly.error
        failed = status_of(error)
        stored = sum(r is not None for r in results)
        status = v2.Status(
            code=failed.code, message=f"{stored} of {len(results)} stored (see entries): {error.message}"
        )
    return _response(status, failed, results, [message_id for run in runs for message_id in run.ids])


# One entry of status OK, encoded in a SendMessageResponse: `_response` parses it once per message, which makes the
# entries and their statuses in one call, and fills in the rest of each.
_OK_ENTRY = pb.SendMessageResponse(
    entries=[pb.SendResultEntry(status=v2.Status(code=v2.OK, message="OK"))]
).SerializeToString()


def _response(
    status: v2.Status, failed: v2.Status, results: Sequence[bpb.SendResult | None], ids: Sequence[str]
) -> pb.SendMessageResponse:
    """An entry per message: OK with the broker's result when stored, `failed` and the message's id when not —
    tests/unit/proxy/test_v2_edge.py::test_send_entries_are_each_messages_result_or_its_failure."""
    response = pb.SendMessageResponse(status=status)
    response.MergeFromString(_OK_ENTRY * len(results))
    for entry, r, message_id in zip(response.entries, results, ids, strict=True):
        if r is None:
            entry.status.CopyFrom(failed)
            entry.message_id = message_id
            continue
        entry.message_id = r.message_id or message_id
        entry.offset = r.offset
        recall_handle, transaction_id = r.recall_handle, r.transaction_id
        if recall_handle:
            entry.recall_handle = recall_handle
        if transaction_id:
            entry.transaction_id = transaction_id
    return response
