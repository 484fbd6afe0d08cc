"""ReceiveMessage: check the request, compute the poll time, let the core's strategy serve it, stream the answer.

Two framings of one answer (`Framing`), the same receive behind both:
- v2 ``ReceiveMessage``: a ``delivery_timestamp`` frame (now), one ``message`` frame per message, then ``status``
  OK;
- popgate's ``ReceiveMessages`` (proto/ext/messaging.proto): ``messages`` frames of up to `BATCH_FRAME_BYTES` of
  messages each (the first with the delivery timestamp), then ``status`` OK.
An empty poll is a single ``status`` MESSAGE_NOT_FOUND; an error is a single ``status`` with the error's code.
Message frames are bytes, spliced from what the broker stored (docs/BROKER.md, "Pop answers for the v2 byte path");
the other frames are objects (proxy/server.py's PassBytes writes both).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from popgate_contract.wire import timestamp_ns, varint
from proxy import validate
from proxy.core import Proxy
from proxy.metrics import counting, first_since_ms
from proxy.receive.polltime import PollLimits, poll_seconds
from proxy.receive.seam import ReceiveRequest, ReceiveResult
from proxy.v2.context import Call
from proxy.v2.convert import client_items, seconds, to_client

log = logging.getLogger(__name__)
LOG_EVERY_S = 10.0
BATCH_FRAME_BYTES = 1024 * 1024  # a ReceiveMessages frame holds messages up to this size (one larger alone)
# Tags of the byte path's frames: ReceiveMessageResponse.message (2), ReceiveMessagesResponse.messages (2),
# Messages.messages (1) and Messages.delivery_timestamp (2).
_MESSAGE, _MESSAGES, _MESSAGES_ITEM, _MESSAGES_TIMESTAMP = b"\x12", b"\x12", b"\x0a", b"\x12"
# A Session receive may stand for up to this many receives of the client's, joined (sdk/_joining.py): its batch_size
# up to this many times `max_batch`, when it says one receive's batch (its `max_fifo`, 1..max_batch; only a Session
# request carries one). The proxy says how many messages that is when a stream opens
# (popgate_contract.session_headers), and a client joins receives only where it was told.
JOINED_RECEIVES = 4
_UNAVAILABLE = 14  # the gRPC status of a call cut off at its write deadline (`Flushing.cut`)


def build_request(call: Call, request: pb.ReceiveMessageRequest, *, max_fifo: int = 0) -> ReceiveRequest:
    """The core's receive of a client's `request`; with `max_fifo` > 0 (one receive's batch) it may stand for
    `JOINED_RECEIVES` receives, and its answer holds at most `max_fifo` FIFO messages —
    tests/unit/proxy/test_v2_edge.py."""
    s = call.settings
    group = validate.group_in(request.group.resource_namespace, request.group.name)
    topic = validate.topic_in(request.message_queue.topic.resource_namespace, request.message_queue.topic.name)
    expression = request.filter_expression
    filter_text = validate.tag_filter(expression.expression, is_sql=expression.type == v2.SQL)
    if not 0 <= max_fifo <= s.max_batch:
        raise errors.BadRequest(f"max_fifo {max_fifo} is out of range: must be 0..{s.max_batch}")
    joins = JOINED_RECEIVES if max_fifo else 1  # a receive standing for several says one's batch
    batch = validate.batch_size(request.batch_size, limit=s.max_batch * joins)
    if request.auto_renew:
        _ = call.client_id  # whose handles to renew once answered: a bad id is refused before anything is popped
    if request.auto_renew or not request.HasField("invisible_duration"):
        # auto_renew: renewed while the client is alive (proxy.renewal, docs/PROXY.md "auto_renew").
        invisible_s = s.default_invisible_s
    else:
        invisible_s = validate.invisible(
            seconds(request.invisible_duration, what="invisible_duration", error=errors.IllegalInvisibleTime),
            low=s.min_invisible_s,
            high=s.max_invisible_s,
        )
    requested = (
        seconds(request.long_polling_timeout, what="long_polling_timeout", error=errors.IllegalPollingTime)
        if request.HasField("long_polling_timeout")
        else None
    )
    now = asyncio.get_running_loop().time()
    remaining = None if call.deadline is None else call.deadline - now
    limits = PollLimits(s.min_long_polling_s, s.max_long_polling_s, s.default_long_polling_s, s.poll_reserve_s)
    try:
        poll_s = poll_seconds(requested, remaining, limits)
    except (errors.TooManyRequests, errors.IllegalPollingTime) as exc:
        call.proxy.refused(group, exc)
        raise
    if call.deadline is None:
        deadline = now + poll_s + s.broker_timeout_s
    else:
        deadline = call.deadline - s.poll_reserve_s / 2
    return ReceiveRequest(topic, group, filter_text, batch, int(invisible_s * 1000), poll_s, deadline, max_fifo)


Popped = Sequence[bpb.PoppedMessage]
Firsts = list[int] | None  # where a frame adds its first deliveries' since-times (proxy.metrics.first_since_ms)


class Framing(Protocol):
    """How an answer's messages and status become the frames of one RPC's stream."""

    def status(self, status: v2.Status) -> Any: ...

    def opening(self) -> Any | None:
        """The frame before the messages, if any."""

    def frames(self, sizes: Sequence[int]) -> list[range]:
        """The messages of each frame, in order, given each message's body size (computed at once: nothing refers
        to a message meanwhile)."""

    def frame(self, messages: Popped, indexes: range, first: bool, namespace: str, firsts: Firsts = None) -> Any:
        """The frame of `messages[indexes]`: its bytes when its broker stored the v2 system properties (the byte
        path, proxy.v2.convert.client_items), else an object built in place (no copy of a message after). Each
        first delivery's `proxy.metrics.first_since_ms` is added to `firsts`, if given, in order."""


class V2Framing:
    """apache.rocketmq.v2 ReceiveMessage: one frame per message, after a delivery_timestamp frame."""

    def status(self, status: v2.Status) -> pb.ReceiveMessageResponse:
        return pb.ReceiveMessageResponse(status=status)

    def opening(self) -> pb.ReceiveMessageResponse:
        frame = pb.ReceiveMessageResponse()
        frame.delivery_timestamp.FromNanoseconds(time.time_ns())
        return frame

    def frames(self, sizes: Sequence[int]) -> list[range]:
        return [range(i, i + 1) for i in range(len(sizes))]

    def frame(
        self, messages: Popped, indexes: range, first: bool, namespace: str, firsts: Firsts = None
    ) -> pb.ReceiveMessageResponse | bytes:
        popped = messages[indexes.start]
        if popped.stored.message.v2_system:  # the byte path
            return b"".join(client_items(messages, indexes, namespace, _MESSAGE, firsts)[0])
        frame = pb.ReceiveMessageResponse()
        to_client(popped, namespace=namespace, out=frame.message)
        if firsts is not None:
            firsts += first_since_ms([popped])
        return frame


class BatchFraming:
    """popgate.ext.v1 ReceiveMessages: many messages per frame, up to `max_bytes` of bodies each (at least one) —
    tests/unit/proxy/test_batch_framing.py::test_batch_frames_hold_messages_up_to_their_size_and_a_larger_one_alone.

    `joins_status`: the last messages frame and the OK status come as one `Joined` item, for a writer that sends
    them in one stream message (the Session's `more`), so the client gets both or neither."""

    def __init__(self, max_bytes: int = BATCH_FRAME_BYTES, *, joins_status: bool = False) -> None:
        self.max_bytes = max_bytes
        self.joins_status = joins_status

    def status(self, status: v2.Status) -> ext.ReceiveMessagesResponse:
        return ext.ReceiveMessagesResponse(status=status)

    def opening(self) -> None:
        return None

    def frames(self, sizes: Sequence[int]) -> list[range]:
        if sum(sizes) <= self.max_bytes:
            return [range(len(sizes))] if sizes else []
        out: list[range] = []
        start, size = 0, 0
        for i, body in enumerate(sizes):
            if i > start and size + body > self.max_bytes:
                out.append(range(start, i))
                start, size = i, 0
            size += body
        if start < len(sizes):
            out.append(range(start, len(sizes)))
        return out

    def frame(
        self, messages: Popped, indexes: range, first: bool, namespace: str, firsts: Firsts = None
    ) -> ext.ReceiveMessagesResponse | bytes:
        if messages[indexes.start].stored.message.v2_system:  # the byte path
            return self._frame_bytes(messages, indexes, first, namespace, firsts)
        if firsts is not None:
            firsts += first_since_ms(messages[i] for i in indexes)
        frame = ext.ReceiveMessagesResponse()
        batch = frame.messages
        if first:
            batch.delivery_timestamp.FromNanoseconds(time.time_ns())
        add = batch.messages.add
        for i in indexes:
            to_client(messages[i], namespace=namespace, out=add())
        return frame

    @staticmethod
    def _frame_bytes(messages: Popped, indexes: range, first: bool, namespace: str, firsts: Firsts) -> bytes:
        """The byte path: ReceiveMessagesResponse{messages: Messages{messages..., delivery_timestamp}} as bytes."""
        parts, size = client_items(messages, indexes, namespace, _MESSAGES_ITEM, firsts)
        if first:
            stamp = timestamp_ns(_MESSAGES_TIMESTAMP, time.time_ns())
            parts.append(stamp)
            size += len(stamp)
        return b"".join((_MESSAGES, varint(size), *parts))


@dataclass(frozen=True, slots=True)
class Joined:
    """The last messages frame and the answer's status, to be written as one stream message: resumed after it, the
    writer took both."""

    frame: Any
    status: Any


V2 = V2Framing()
BATCH = BatchFraming()
SESSION_BATCH = BatchFraming(joins_status=True)


class _WriteDeadline:
    """An answer's write deadline. A client that does not read (HTTP/2 flow control stalls the writes) would keep
    the answer's messages, and its place in the proxy's bounds, for as long as it keeps its connection: at the
    deadline the messages go back to their broker (ready at once) and only the frame grpc is stuck writing stays
    counted in `max_answer_bytes` — that memory stays in grpc until the call ends (the client reads, goes away
    or reaches its deadline: grpc.aio cannot end a call whose write is stalled). Should the client read on, it
    gets an error status instead of the rest."""

    def __init__(self, result: ReceiveResult, after_s: float, proxy: Proxy, group: str) -> None:
        self.result = result
        self.proxy = proxy
        self.group = group
        self.writing = range(0)  # the messages of the frame grpc is writing (none yet)
        self.renewed: list[str] = []  # auto_renew handles being renewed until the answer is written
        self.passed = False
        self.cut: Callable[[], None] | None = None  # once set, the call is ended at the deadline too
        self._timer = asyncio.get_running_loop().call_later(after_s, self._passed)

    _logged_at = float("-inf")  # one log line per LOG_EVERY_S at most: many lazy clients must not flood the log
    _unlogged = 0

    def _passed(self) -> None:
        self.passed = True
        self.proxy.not_read(self.group)
        now = time.monotonic()
        cls = _WriteDeadline
        cls._unlogged += 1
        if now - cls._logged_at >= LOG_EVERY_S:
            log.warning(
                "%d ReceiveMessage answer(s) not read by their clients in time: their messages were given back "
                "(popgate_proxy_answers_not_read_total counts every one)",
                cls._unlogged,
            )
            cls._logged_at, cls._unlogged = now, 0
        self.result.hand_back_unread(self.writing)
        if self.renewed:
            self.proxy.renewer.forget(self.renewed)
            self.renewed = []
        if self.cut is not None:
            self.cut()

    def cancel(self) -> None:
        self._timer.cancel()


Write = Callable[[Any], Awaitable[None]]


class Flushing(Protocol):
    """A call whose `write` returns before the client's flow-control window took the frame (popgate's HTTP/2
    server, popgate_process.h2grpc.call.Context): `flushed` tells when it did, `cut` ends the call at once."""

    def flushed(self) -> asyncio.Future[None] | None: ...

    def cut(self, code: int, message: str) -> None: ...


async def answer(
    call: Call,
    receive: ReceiveRequest,
    result: ReceiveResult,
    write: Write,
    framing: Framing = V2,
    *,
    namespace: str = "",
    auto_renew: bool = False,
    flushing: Flushing | None = None,
) -> int:
    """Answer `receive` (`build_request` of the client's request, whose resource namespace and auto_renew are given)
    with what the core's receive gave: its frames in `framing`, each through `write`, which returns once the frame is
    written (as grpc's `context.write`); the code of the status written last. Awaited as soon as the result is there
    (it gives the messages back if cut off). With `flushing` the answer is written only once the client's window
    took all of it, its status included: until then it stays counted and its deadline armed, which then gives its
    messages back and ends the call, its unsent frames dropped —
    tests/integration/proxy/test_cut_answers.py::test_small_frames_a_client_never_takes_are_cut_off_and_stay_counted.

    A coroutine made once the receive is answered, not one around its wait: a held receive keeps no frame of this
    one, nor an async generator (and its entry in the loop's set of them) —
    tests/unit/proxy/test_v2_service.py::test_a_held_receive_is_three_coroutines_and_no_generator_or_protobuf."""
    complete = False  # the OK status frame was written: the client has the whole answer
    deadline: _WriteDeadline | None = None
    try:
        if not result.messages:
            text = "the proxy is shutting down" if result.outcome == "closing" else "no new message"
            await write(framing.status(v2.Status(code=v2.MESSAGE_NOT_FOUND, message=text)))
            return v2.MESSAGE_NOT_FOUND
        # Past the invisible time the messages are redelivered anyway: what the client would read then is stale.
        write_s = min(call.settings.max_answer_write_s, receive.invisible_ms / 1000)
        deadline = _WriteDeadline(result, write_s, call.proxy, receive.group)
        if auto_renew:  # tracked before written, so that no ack can come first
            deadline.renewed = [m.receipt_handle for m in result.messages]
            call.proxy.renewer.track(call.client_id, receive.group, deadline.renewed, account=call.account)
        opening = framing.opening()
        if opening is not None:
            await write(opening)
        ranges = framing.frames(result.body_sizes())
        last = ranges[-1] if getattr(framing, "joins_status", False) else None
        firsts: list[int] = []  # the delivery metrics' (proxy.metrics.first_since_ms), read as frames are made
        for indexes in ranges:  # no reference to a message kept across the write
            if deadline.passed:
                break
            frame = framing.frame(result.messages, indexes, indexes.start == 0, namespace, firsts)
            deadline.writing = indexes
            if indexes is last:
                # Written with its OK status in one stream message: once written, the client has both. Should the
                # deadline pass during that write, the messages went back and the client's acks fail: at least
                # once still —
                # tests/integration/sdk/test_session.py::test_a_receive_answer_and_its_status_come_in_one_message.
                await write(Joined(frame, framing.status(v2.Status(code=v2.OK, message="OK"))))
                complete = True
                break
            await write(frame)
            del frame
        if not complete:
            # After the last message's frame is written the client has every message. The deadline may no longer
            # give them back (an OK status after given-back messages would make their acks fail) — unless it ends
            # the call too, before the OK status reaches the client.
            text = f"the answer was not read within {write_s:g} s: its messages went back to their broker"
            if flushing is None or deadline.passed:
                deadline.cancel()
            if deadline.passed:
                await write(framing.status(v2.Status(code=v2.PROXY_TIMEOUT, message=text)))
                return v2.PROXY_TIMEOUT
            if flushing is not None:
                deadline.cut = functools.partial(flushing.cut, _UNAVAILABLE, text)
            # Written, the status got through; a write that fails instead (the client went away) fails its call too.
            await write(framing.status(v2.Status(code=v2.OK, message="OK")))
            if flushing is not None and (taken := flushing.flushed()) is not None:
                await taken
            deadline.cancel()
            complete = True
        deadline.renewed = []
        # Passed during the last (joined) write, the deadline gave the messages back: none counted as delivered.
        _count_delivered(call, receive, result, [] if deadline.passed else firsts)
        return v2.OK
    finally:
        if deadline is not None:
            deadline.cancel()
        if result.messages and not complete and not (deadline is not None and deadline.passed):
            # Cut off before its status (the client went away, the stream broke): the client has at most some of
            # the messages, and clients discard an answer without its status. Ready again at once at their broker.
            result.give_back()
        result.release()  # also when the client goes away mid-answer (the write is cancelled)
        if deadline is not None and deadline.renewed:  # not written: given back above, or left to their time
            call.proxy.renewer.forget(deadline.renewed)


def _count_delivered(call: Call, receive: ReceiveRequest, result: ReceiveResult, firsts: list[int]) -> None:
    metrics = counting(call.proxy.metrics)
    if metrics is not None:
        now_ms = time.time_ns() // 1_000_000
        size = sum(result.body_sizes())
        metrics.delivered(receive.topic, receive.group, result.messages, now_ms, firsts=firsts, body_bytes=size)
