"""The multiplexed Session stream: many requests on one gRPC call, a task per pending request, one writer.

A held long poll costs the broker a few hundred bytes here instead of a whole gRPC call
(`popgate_contract.session_client` is the other side).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from popgate_pb import broker_pb2 as pb

from broker.core import BrokerCore
from broker.handlers import HELD_CALLS, SESSION_CALLS, Asked
from broker.metrics import BrokerMetrics
from popgate_contract import errors
from popgate_contract.session_client import (
    CHANGE_MANY_KEY,
    MAX_BYTES_KEY,
    MORE_KEY,
    RUNS_KEY,
    TRANSACTIONS_KEY,
    join,
)
from popgate_contract.trailer import ERROR_KEY, status_of

log = logging.getLogger(__name__)

WRITER_DRAIN_S = 5.0
SESSION_SETTLE_S = 5.0  # a stopping broker waits this long at most for a Session's requests in progress

# Requests that may be held (long polls) count against the broker's --max-held per session; the
# others (Send, Ack, ChangeInvisibleTime, Renew: each a store commit away from done) against this.
HELD_KINDS = frozenset({"pop", "notification"})
SESSION_MAX_SHORT = 4096
# Answers written to the stream's outbox and not yet taken by grpc (a slow reader): past this, the
# session stops reading requests. One Pop answer may be up to --max-pop-bytes (8 MiB) on its own.
SESSION_MAX_OUTBOX_BYTES = 32 * 1024 * 1024
# The writer sends the answers queued when it gets to them as one stream message (`more`) to a caller that said it
# reads them (MORE_KEY), of at most this many bytes unless one answer alone is larger (so joining never makes a
# message the caller's size limit refuses) — tests/unit/broker/test_session_more.py::
# test_the_broker_writer_joins_queued_answers_within_its_bound_and_leaves_the_end_marker_queued.
MAX_WRITE_BYTES = 1024 * 1024
SESSION_RECENT_ANSWERS = 4096  # answers a late cancel frame can still undo, per stream (a hand-back may come a
# consume step later; each kept as one small undo callable)


class Session:
    """One multiplexed stream: a task per pending request, one writer, everything cancelled at the end."""

    def __init__(self, core: BrokerCore, metrics: BrokerMetrics, max_pending: int) -> None:
        self.core = core
        self.metrics = metrics
        self.max_pending = max_pending
        self.pending: dict[int, asyncio.Task[None]] = {}
        self.short = 0  # pending requests not of HELD_KINDS
        self.held: dict[int, str] = {}  # pending long polls (HELD_KINDS with a poll time): their kind by id
        # Answers, encoded when queued (so no answer is encoded twice: once to size it, once to write it), bounded
        # in bytes by the reader pausing (see `serve`).
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.outbox_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        # The last answers a caller may not use, with what undoes them, by id: a Pop's messages (released: ready
        # again) and a Notification's has_message (its wake passed on). A cancel frame for an answered request
        # (one that crossed the answer, or the caller's "not used") undoes it (see `dispatch`).
        self.unused: OrderedDict[int, Callable[[], object]] = OrderedDict()

    def answer(self, response: pb.SessionResponse) -> None:
        """Queue an answer (encoded now: the writer sends bytes, joined or alone)."""
        data = response.SerializeToString()
        self.outbox_bytes += len(data)
        self.outbox.put_nowait(data)
        if self.outbox_bytes > SESSION_MAX_OUTBOX_BYTES:
            self.room.clear()
            self._end_long_polls()

    def _end_long_polls(self) -> None:
        """Over its outbox budget, the stream's held Pops and Notifications end now with an empty answer: held on,
        each would take messages when it woke and queue them past the budget (the caller is not reading)."""
        held, self.held = self.held, {}
        answering = asyncio.current_task()  # the Pop whose answer passed the budget: it is answered already
        for request_id, kind in held.items():
            task = self.pending.get(request_id)
            if task is None or task.done() or task is answering:
                continue
            del self.pending[request_id]
            task.cancel()  # a Pop caught taking its messages puts them back (BrokerCore.pop)
            response = pb.SessionResponse(id=request_id)
            getattr(response, kind).SetInParent()
            self.answer(response)

    def written(self, size: int) -> None:
        self.outbox_bytes -= size
        if self.outbox_bytes <= SESSION_MAX_OUTBOX_BYTES // 2:
            self.room.set()

    def take(self, request: pb.SessionRequest) -> None:
        """One stream message: its request, then each of its `more` in order, as if each came alone
        (tests/unit/broker/test_session_more.py). One level: an entry with `more` of its own is refused, and the
        requests nested in it are not served. A long poll held keeps nothing of the message (up to a MiB of Sends):
        see `_serve`."""
        self.dispatch(request)
        for entry in request.more:
            if entry.more:
                self._error(entry.id, errors.BadRequest("session: `more` inside `more`"))
            else:
                self.dispatch(entry)

    def dispatch(self, request: pb.SessionRequest) -> None:
        kind = request.WhichOneof("body")
        if kind == "cancel":
            task = self.pending.pop(request.id, None)
            if task is not None:
                self.held.pop(request.id, None)
                task.cancel()
            elif (undo := self.unused.pop(request.id, None)) is not None:
                undo()  # answered before the cancel was read, or answered and not used: nobody got it
            return
        if request.id in self.pending:
            # Answers name their request by id alone: a reused one would be taken for the pending request's answer.
            raise errors.BadRequest(
                f"session: request id {request.id} is already pending (ids of pending requests "
                "are unique on a stream): the stream ends"
            )
        if kind is None:
            self._error(request.id, errors.BadRequest("session: unknown request"))
            return
        self.unused.pop(request.id, None)  # an id used again: a later cancel is about this request
        held = kind in HELD_KINDS and getattr(request, kind).poll_ms > 0  # poll 0: answered at once
        if held and len(self.pending) - self.short >= self.max_pending:
            self._error(request.id, errors.TooManyRequests(f"session has {self.max_pending} pending long polls"))
            return
        if not held and self.short >= SESSION_MAX_SHORT:
            self._error(request.id, errors.TooManyRequests(f"session has {SESSION_MAX_SHORT} pending {kind} requests"))
            return
        task = asyncio.get_running_loop().create_task(self._serve(request, kind))
        self.pending[request.id] = task
        if held:
            # Forgotten by `_serve` as it ends, or where it is cancelled (a task cancelled before it starts never
            # runs): no done callback, whose context and partial a held Pop would keep for its whole poll time.
            self.held[request.id] = kind
        else:
            self.short += 1
            task.add_done_callback(self._short_done)

    def _short_done(self, _: asyncio.Task[None]) -> None:
        self.short -= 1

    async def _serve(self, request: pb.SessionRequest, kind: str) -> None:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        request_id = request.id
        try:
            held = HELD_CALLS.get(kind)
            if held is None:
                response = pb.SessionResponse(id=request_id)
                body = getattr(response, kind)
                body.SetInParent()  # an answer with no field set is still an answer of this kind
                await SESSION_CALLS[kind](self.core, getattr(request, kind), body)
                self.answer(response)
            else:
                waiting, asked = held[0](self.core, getattr(request, kind))
                del request  # held with no protobuf: not its own arena, nor that of a joined stream message
                self._answer_held(request_id, kind, asked, await waiting, held[1])
        except errors.DomainError as exc:
            code = status_of(exc)
            self._error(request_id, exc)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code = grpc.StatusCode.INTERNAL
            log.exception("session %s failed", kind)
            self._error(request_id, errors.DomainError(f"internal error: {type(exc).__name__}"))
        finally:
            if self.pending.get(request_id) is asyncio.current_task():  # not a later request that reused the id
                del self.pending[request_id]
                self.held.pop(request_id, None)
            self.metrics.rpc_duration.labels(f"Session.{kind}", code.name).observe(time.perf_counter() - started)

    def _answer_held(self, request_id: int, kind: str, asked: Asked, result: Any, fill: Callable[..., Any]) -> None:
        """The answer to a request that may have been held, made now that there is a `result`: a held request holds
        no answer. One a caller may not use can be undone (see `unused`). A Pop's messages answered while the stream
        holds SESSION_MAX_OUTBOX_BYTES of answers its caller has not taken (Pops joined in one stream message are
        all taken before any is answered) go back, ready at once with their attempt unchanged, and the Pop is
        refused — tests/unit/broker/test_session_stream.py::test_pops_past_the_outbox_bound_are_refused_and_put_back.
        """
        if kind == "pop" and result.messages and self.outbox_bytes >= SESSION_MAX_OUTBOX_BYTES:
            self.core.release(asked.topic, asked.group, [p.handle for p in result.messages])
            why = f"session holds {self.outbox_bytes} bytes of answers not taken; Pop refused, its messages put back"
            self._error(request_id, errors.TooManyRequests(why))
            return
        response = pb.SessionResponse(id=request_id)
        body = getattr(response, kind)
        body.SetInParent()
        fill(self.core, asked, result, body)
        self.answer(response)
        if kind == "pop" and result.messages:
            popped = [p.handle for p in result.messages]  # handles from the core's own values, not the protobuf
            self._undoable(request_id, functools.partial(self.core.release, asked.topic, asked.group, popped))
        elif kind == "notification" and body.has_message:
            self._undoable(request_id, functools.partial(self.core.pass_on, asked.topic, asked.group))

    def _undoable(self, request_id: int, undo: Callable[[], object]) -> None:
        self.unused[request_id] = undo
        if len(self.unused) > SESSION_RECENT_ANSWERS:
            self.unused.popitem(last=False)

    def _error(self, request_id: int, exc: errors.DomainError) -> None:
        error = pb.SessionError(error=exc.name, message=exc.message, grpc_code=status_of(exc).value[0])
        self.answer(pb.SessionResponse(id=request_id, error=error))

    async def settle(self, within_s: float) -> None:
        """Wait (at most `within_s`) for the requests taken to be answered."""
        tasks = list(self.pending.values())
        if tasks:
            await asyncio.wait(tasks, timeout=within_s)

    async def close(self) -> None:
        tasks = list(self.pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def gather(outbox: asyncio.Queue[bytes | None], first: bytes, *, joined: bool) -> tuple[bytes, int, bytes | None]:
    """The stream message to write: `first` and, when `joined`, the answers queued behind it, in order, up to
    MAX_WRITE_BYTES; the bytes of answers it carries (for `Session.written`); the answer taken that did not fit
    (first in the next message). The end marker stays queued (tests/unit/broker/test_session_more.py)."""
    if not joined or outbox.empty():
        return first, len(first), None
    more: list[bytes] = []
    size = len(first)
    carry = None
    while size < MAX_WRITE_BYTES and not outbox.empty():
        queued = outbox.get_nowait()
        if queued is None:
            outbox.put_nowait(None)  # nothing is queued behind the end marker
            break
        if size + len(queued) > MAX_WRITE_BYTES:
            carry = queued
            break
        more.append(queued)
        size += len(queued)
    return (join(first, more) if more else first), size, carry


def said_more(context: grpc.aio.ServicerContext) -> bool:
    """Whether the caller reads joined answers (it said so in its call metadata)."""
    return any(key == MORE_KEY and value == "1" for key, value in context.invocation_metadata() or ())


async def serve(
    core: BrokerCore,
    metrics: BrokerMetrics,
    stopping: asyncio.Event,
    request_iterator: AsyncIterator[pb.SessionRequest],
    context: grpc.aio.ServicerContext,
) -> None:
    """Serve one Session stream until the caller ends it or `stopping` is set (the broker is stopping)."""
    session = Session(core, metrics, core.settings.max_held)
    joined = said_more(context)
    # Told when the stream opens, before any answer: this broker serves joined requests (`Session.take`) and a Send's
    # runs (broker.send). A caller that has not seen it sends each request alone and each run's messages whole (an
    # older broker would drop the `more` and the runs it does not know).
    limit = str(core.settings.max_grpc_message_bytes)  # the largest request message it takes (the caller keeps under)
    await context.send_initial_metadata(
        ((MORE_KEY, "1"), (RUNS_KEY, "1"), (MAX_BYTES_KEY, limit), (TRANSACTIONS_KEY, "1"), (CHANGE_MANY_KEY, "1"))
    )

    async def write() -> None:
        outbox = session.outbox
        carry: bytes | None = None
        while (first := carry if carry is not None else await outbox.get()) is not None:
            message, size, carry = gather(outbox, first, joined=joined)
            await context.write(message)
            session.written(size)

    async def read() -> None:
        async for request in request_iterator:
            session.take(request)
            del request  # a stream waiting for its next message keeps nothing of the last (nor do held requests)
            if session.outbox_bytes > SESSION_MAX_OUTBOX_BYTES:
                # The caller reads its answers slower than it asks: stop reading its requests (HTTP/2
                # flow control then holds it back) until the answers it has not taken fit again.
                await session.room.wait()

    loop = asyncio.get_running_loop()
    writer = loop.create_task(write())
    reader = loop.create_task(read())
    stopped = loop.create_task(stopping.wait())
    violation: errors.BadRequest | None = None  # a request the stream cannot serve on: it ends with its status
    try:
        await asyncio.wait((reader, stopped), return_when=asyncio.FIRST_COMPLETED)
        if not reader.done():
            # The broker is stopping (its held requests are being answered): read no more requests, let
            # those taken finish, then end the stream. Left open, it would take requests for the whole
            # shutdown grace; a proxy's requests written meanwhile fail with UNAVAILABLE, unread, and it
            # fails over at once.
            reader.cancel()
            await session.settle(SESSION_SETTLE_S)
        elif not reader.cancelled() and (exc := reader.exception()) is not None:
            if not isinstance(exc, errors.BadRequest):
                raise exc
            violation = exc
    finally:
        reader.cancel()
        stopped.cancel()
        # The caller closed its side or went away: nothing pending on this stream survives it.
        # The writer is never cancelled mid-write (grpc core would then lose the final status):
        # it finishes what is queued and stops at the end marker.
        await session.close()
        session.outbox.put_nowait(None)
        session.room.set()
        with contextlib.suppress(asyncio.CancelledError, grpc.RpcError, TimeoutError):
            await asyncio.wait_for(writer, WRITER_DRAIN_S)
    # tests/integration/broker/test_session.py::test_a_request_reusing_a_pending_id_ends_the_stream
    if violation is not None:
        context.set_trailing_metadata(((ERROR_KEY, violation.name),))  # named, as every refusal of the broker's
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, violation.message)
