"""popgate.ext.v1 Messaging.Session: many v2 requests on one stream, each answered by id (proto/ext/messaging.proto).

A request costs a stream frame each way instead of a gRPC call. Each request is served by the handler of its
unary RPC (or the receive of ReceiveMessages), with the same validation, permissions and metrics names; its
errors are v2 statuses in its answer. A task per pending request, one writer, everything cancelled when the
stream ends (`sdk/_session.py` is the client side).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from popgate_pb.ext import messaging_pb2 as ext

from popgate_contract import errors
from popgate_contract.session_headers import MAX_MESSAGE_HEADER, RECEIVE_BATCH_HEADER
from proxy.auth import Account, Authenticator
from proxy.v2 import access, receive
from proxy.v2.session_frames import encoded, joined, refusal, request_of, serialized

if TYPE_CHECKING:
    from proxy.v2.service import MessagingService

log = logging.getLogger(__name__)

# Requests pending on one stream. A held receive also counts in the proxy's max_held_receives (TOO_MANY_REQUESTS
# past either) — tests/integration/sdk/test_session.py::test_receives_past_the_proxys_bound_are_answered_too_many.
MAX_PENDING = 4096
# Answers queued and not yet taken by grpc (a client that does not read): past this the stream reads no more
# requests until half of it is written (HTTP/2 flow control then holds the client back).
MAX_OUTBOX_BYTES = 32 * 1024 * 1024
WRITER_DRAIN_S = 5.0  # at the stream's end, the answers queued are written for this long at most
SETTLE_S = 5.0  # a stopping proxy waits this long at most for a stream's requests in progress
# The writer sends the answers queued when it gets to them as one stream message (`more`), up to this many bytes
# (a larger answer, or one glued to the next, goes whole); the rest follows in the next message, once grpc took
# this one, so that a client with many receives answered at once starts on the first while the next is written
# (docs/PROXY.md, "Session stream") —
# tests/unit/proxy/test_session.py::test_answers_queued_together_share_a_message_up_to_the_write_limit.
MAX_WRITE_BYTES = 48 * 1024
# What a queued answer costs beyond its bytes (the bytes object, the outbox entry), counted in MAX_OUTBOX_BYTES so
# that many tiny answers (refusals of a message of thousands of requests) are bounded by the memory they take —
# tests/unit/proxy/test_session.py::test_a_message_of_many_refused_requests_stops_the_reading_at_the_outbox_bound.
ANSWER_OVERHEAD = 160
TAKE_TURN = 256  # a stream message's requests taken between two turns of the loop


class RequestContext:
    """What the servicer reads of a call's context, for one request on a Session stream: the stream's metadata,
    the request's own deadline and, for a receive, `write` of its frames as answers to it."""

    __slots__ = ("_deadline", "_id", "_metadata", "_session")

    def __init__(self, session: Session, request_id: int, deadline: float | None) -> None:
        self._session = session
        self._id = request_id
        self._metadata = session.metadata
        self._deadline = deadline

    def invocation_metadata(self) -> tuple[Any, ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def write(self, frame: Any) -> None:
        """A frame of the receive's answer, returned from once the writer gave it to grpc, as grpc's own stream
        resumes a handler: the OK status only follows written messages, and a receive cancelled or cut off before its
        status (the stream lost) is cancelled here, which gives its messages back —
        tests/integration/sdk/test_session.py::test_a_stream_closed_mid_receive_gives_its_messages_back."""
        session = self._session
        final = isinstance(frame, receive.Joined)
        if isinstance(frame, receive.Joined):
            # Glued: the writer sends both in one stream message, whatever their size — the client gets both or
            # neither (test_session.py::test_a_receive_answer_and_its_status_come_in_one_message).
            session.answer(encoded(self._id, "receive", serialized(frame.frame)), glued=True)
            frame = frame.status
        written = session._loop.create_future()
        session.answer(encoded(self._id, "receive", serialized(frame)), written)
        if not final:
            await written
            return
        try:
            await asyncio.shield(written)
        except asyncio.CancelledError:
            await _written_anyway(written, session.writer_ended)


async def _written_anyway(written: asyncio.Future[None], writer_ended: asyncio.Future[None]) -> None:
    """A receive cut (the connection's age, the proxy stopping) once its last messages and OK status were queued: the
    writer writes them all the same, the client reading the whole answer. So the cut waits for that write (as long
    as the writer writes, at most SETTLE_S + WRITER_DRAIN_S: past a stopping stream's settling, whose close cuts it
    again) and is undone when it went out: the messages are the client's, not given back as well —
    tests/unit/proxy/test_session_cuts.py::test_a_receive_cut_as_its_answer_is_written_is_delivered_not_given_back."""
    loop = asyncio.get_running_loop()
    end = loop.time() + SETTLE_S + WRITER_DRAIN_S
    cuts = 1
    while not (written.done() or writer_ended.done()) and (left := end - loop.time()) > 0:
        try:
            await asyncio.wait((written, writer_ended), timeout=left, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cuts += 1  # cut again (the stream's close): the write's outcome still decides
    if written.done() and not written.cancelled():
        task = asyncio.current_task()
        for _ in range(cuts if task is not None else 0):
            task.uncancel()  # type: ignore[union-attr]
        return
    written.cancel()  # not written: dropped if still queued, and the receive gives its messages back
    raise asyncio.CancelledError


class StreamAccount(Authenticator):
    """The account a stream authenticated as when it opened: its requests are authorized as that account, the date
    not checked again (a stream outlives the signature's clock-skew window)."""

    def __init__(self, account: Account | None) -> None:
        super().__init__(() if account is None else (account,))
        self._account = account

    def authenticate(self, metadata: Any) -> Account | None:
        return self._account


class Session:
    """One stream: `dispatch` starts a task per request; answers go through `outbox` to the one writer."""

    def __init__(self, service: MessagingService, metadata: tuple[Any, ...], account: Account | None) -> None:
        self.service = service
        self.metadata = metadata
        self.account = StreamAccount(account)
        # The servicer's RPCs serve the unary kinds: the same handlers, metrics names and answers.
        self.unary: dict[str, Callable[[Any, RequestContext, Authenticator], Awaitable[Any]]] = {
            "send": service.SendMessage,
            "send_shared": service.SendShared,
            "ack": functools.partial(service.AckMessage, brief=True),
            "change_invisible": service.ChangeInvisibleDuration,
            "change_invisible_many": service.ChangeInvisibleMany,
            "end_transaction": service.EndTransaction,
        }
        self.pending: dict[int, asyncio.Task[None]] = {}
        # Requests cancelled (a cancel frame) whose task has not ended yet: they count against MAX_PENDING with the
        # pending ones, so that "request, cancel" pairs cannot make tasks without bound —
        # tests/unit/proxy/test_session_cuts.py::test_requests_cancelled_as_they_come_still_count_until_they_end.
        self.cancelled: set[asyncio.Task[None]] = set()
        self.receives: set[int] = set()  # the ids in `pending` that are receives
        # Answers with, for a receive's frames, the future the writer resolves once grpc took it, and whether the
        # next answer goes in the same stream message (a receive's last frame and its status).
        self.outbox: asyncio.Queue[tuple[bytes, asyncio.Future[None] | None, bool] | None]
        self.outbox = asyncio.Queue()
        self.outbox_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        self._loop = asyncio.get_running_loop()
        self.writer_ended: asyncio.Future[None] = self._loop.create_future()  # the stream's writer stopped

    def answer(self, response: bytes, written: asyncio.Future[None] | None = None, *, glued: bool = False) -> None:
        self.outbox_bytes += len(response) + ANSWER_OVERHEAD
        self.outbox.put_nowait((response, written, glued))
        if self.outbox_bytes > MAX_OUTBOX_BYTES:
            self.room.clear()

    def written(self, size: int) -> None:
        self.outbox_bytes -= size
        if self.outbox_bytes <= MAX_OUTBOX_BYTES // 2:
            self.room.set()

    def dispatch(self, request: ext.SessionRequest) -> None:
        kind = request.WhichOneof("body")
        request_id = request.id
        if kind == "cancel":
            task = self.pending.pop(request_id, None)
            self.receives.discard(request_id)
            if task is not None:
                task.cancel()  # a receive cut off gives its messages back (receive.receive_message)
                self.cancelled.add(task)
                task.add_done_callback(self.cancelled.discard)
            return
        if request_id in self.pending:
            # Answers name their request by id alone: a reused one would be taken for the pending request's answer.
            raise errors.BadRequest(
                f"session: request id {request_id} is already pending (ids of pending requests are unique on a "
                "stream): the stream ends"
            )
        if kind is None:
            self.answer(refusal(request_id, None, errors.BadRequest("session: a request without a body")))
            return
        if len(self.pending) + len(self.cancelled) >= MAX_PENDING:
            busy = errors.TooManyRequests(f"the session has {MAX_PENDING} requests pending; retry shortly")
            self.answer(refusal(request_id, kind, busy))
            return
        deadline = self._loop.time() + request.timeout_ms / 1000 if request.timeout_ms else None
        context = RequestContext(self, request_id, deadline)
        if kind == "receive":
            work = self.service.ReceiveMessage(  # no coroutine of this stream's around it while it is held
                request.receive,
                context,
                framing=receive.SESSION_BATCH,
                method="ReceiveMessages",
                auth=self.account,
                max_fifo=request.max_fifo,
            )
            self.receives.add(request_id)
        else:
            work = self._unary(request_id, kind, request_of(request, kind), context)
        task = self._loop.create_task(work)
        self.pending[request_id] = task
        task.add_done_callback(functools.partial(self._done, request_id))

    def _done(self, request_id: int, task: asyncio.Task[None]) -> None:
        if self.pending.get(request_id) is task:  # not a later request that reused the id after a cancel
            del self.pending[request_id]
            self.receives.discard(request_id)

    async def _unary(self, request_id: int, kind: str, request: Any, context: RequestContext) -> None:
        answer = await self.unary[kind](request, context, self.account)
        self.answer(encoded(request_id, kind, answer.SerializeToString()))

    def cut_receives(self) -> None:
        """Cancel the receives in progress: each gives its messages back, and its client, told nothing, sends it
        again on its next stream."""
        for request_id in list(self.receives):
            task = self.pending.get(request_id)
            if task is not None:
                task.cancel()

    async def close(self) -> None:
        tasks = [*self.pending.values(), *self.cancelled]
        self.pending.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _gather(session: Session, first: tuple[bytes, asyncio.Future[None] | None, bool]) -> _Write:
    """`first` and the answers queued behind it, up to MAX_WRITE_BYTES (an answer glued to the next is never split
    from it), as one stream message; answers of receives cancelled meanwhile are dropped (their receive gave the
    messages back)."""
    answers: list[bytes] = []
    size = taken = 0
    written: list[asyncio.Future[None]] = []
    item: tuple[bytes, asyncio.Future[None] | None, bool] | None = first
    while item is not None:
        response, future, glued = item
        size += len(response)
        taken += 1
        if future is None or not future.cancelled():
            answers.append(response)
            if future is not None:
                written.append(future)
        if (size >= MAX_WRITE_BYTES and not glued) or session.outbox.empty():
            break
        item = session.outbox.get_nowait()
        if item is None:
            session.outbox.put_nowait(None)  # the end marker, seen again after this write
            break
    message = joined(answers[0], answers[1:]) if answers else None
    return _Write(message, size + taken * ANSWER_OVERHEAD, written)


@dataclass(slots=True)
class _Write:
    message: bytes | None  # None: every answer gathered was dropped
    size: int  # as counted in the outbox bytes
    written: list[asyncio.Future[None]]


async def _write(session: Session, context: Any) -> None:
    while (item := await session.outbox.get()) is not None:
        batch = _gather(session, item)
        if batch.message is not None:
            await context.write(batch.message)
        session.written(batch.size)
        _when_flushed(context, batch.written)


def _when_flushed(context: Any, written: list[asyncio.Future[None]]) -> None:
    """A receive's frame counts as written once the client's flow-control window took it, not when `write` returns
    (on popgate's HTTP/2 server, before): until then its answer stays counted and its write deadline armed; never
    taken (the stream ended first), it was not written —
    tests/unit/proxy/test_session_cuts.py::test_a_receive_frame_is_written_once_the_clients_window_took_it."""
    flushed = getattr(context, "flushed", None) if written else None
    taken = None if flushed is None else flushed()
    if taken is None:
        _settle(written, lost=False)
    else:
        taken.add_done_callback(lambda taken: _settle(written, lost=taken.cancelled()))


def _settle(written: list[asyncio.Future[None]], *, lost: bool) -> None:
    for future in written:
        if not future.done():
            if lost:
                future.cancel()
            else:
                future.set_result(None)


async def _read(session: Session, requests: AsyncIterator[ext.SessionRequest]) -> None:
    async for request in requests:
        await _take(session, request)
        del request  # a stream waiting for its next message keeps nothing of the last (nor do its held receives)
        if session.outbox_bytes > MAX_OUTBOX_BYTES:
            # The client reads its answers slower than it asks: read none of its requests until they fit again.
            await session.room.wait()


async def _take(session: Session, request: ext.SessionRequest) -> None:
    """One stream message: its request, then each of its `more` in order."""
    session.dispatch(request)
    for i, more in enumerate(request.more, 1):
        if session.outbox_bytes > MAX_OUTBOX_BYTES:  # one message may hold thousands of requests
            await session.room.wait()
        elif i % TAKE_TURN == 0:  # the loop's other streams and tasks (and the requests just made) get a turn
            await asyncio.sleep(0)
        if more.more:  # one level: a client that nests them is refused, its nested requests unanswered
            if more.id in session.pending:  # as for any request: its refusal would read as that one's answer
                raise errors.BadRequest(f"session: request id {more.id} is already pending: the stream ends")
            session.answer(refusal(more.id, None, errors.BadRequest("session: `more` inside `more`")))
        else:
            session.dispatch(more)


async def serve(service: MessagingService, requests: AsyncIterator[ext.SessionRequest], context: Any) -> None:
    """Serve one Session stream until the client ends it or goes away; a refused signature ends it at once."""
    metadata = tuple(context.invocation_metadata() or ())
    try:
        account = service.auth.authenticate(access.metadata_of(metadata))
        access.client_id_of(metadata)  # a bad id is refused before anything is served for it
    except errors.DomainError as exc:
        code = (
            grpc.StatusCode.UNAUTHENTICATED
            if isinstance(exc, errors.Unauthorized)
            else grpc.StatusCode.INVALID_ARGUMENT
        )
        await context.abort(code, exc.message)
        return
    await context.send_initial_metadata(
        ((RECEIVE_BATCH_HEADER, str(service.session_receive_batch)), (MAX_MESSAGE_HEADER, str(service.max_message)))
    )
    session = Session(service, metadata, account)
    loop = asyncio.get_running_loop()
    writer = loop.create_task(_write(session, context))
    writer.add_done_callback(functools.partial(_ended, session.writer_ended))
    reader = loop.create_task(_read(session, requests))
    stopping = loop.create_task(service.closing.wait())
    draining = getattr(context, "draining", None)  # popgate's server tells when the connection is to go away
    drained = loop.create_task((draining() if draining is not None else asyncio.Event()).wait())
    try:
        # Ends when the client ends its side or goes away, when a write fails (the stream is lost), or when the
        # proxy stops: then it reads no more requests (the client's next ones go to a new stream, refused here or
        # served elsewhere, rather than to a proxy answering every receive empty at once) and ends once those it
        # took are answered (held receives answer at once) — test_session.py::test_a_stopping_proxy_ends_its_streams.
        await asyncio.wait((reader, writer, stopping, drained), return_when=asyncio.FIRST_COMPLETED)
        if drained.done() and not stopping.done():
            await _drain(session, reader)
        elif reader.done() and not reader.cancelled() and reader.exception() is None and session.pending:
            # The client ended its side (done writing) and waits for its answers: each request it sent is answered
            # (test_session.py::test_a_client_that_ends_its_side_still_gets_its_answers), unless the stream is lost
            # or the proxy stops meanwhile.
            answered = asyncio.gather(*session.pending.values(), return_exceptions=True)
            await asyncio.wait((answered, writer, stopping), return_when=asyncio.FIRST_COMPLETED)
        if stopping.done() and session.pending:
            reader.cancel()
            await asyncio.wait(list(session.pending.values()), timeout=SETTLE_S)
    finally:
        stopping.cancel()
        drained.cancel()
        reader.cancel()
        # Nothing pending on a stream survives it: receives cut off give their messages back.
        await session.close()
        session.outbox.put_nowait(None)
        # The writer is never cancelled mid-write (grpc would lose the stream's final status): it ends at the marker,
        # or, stuck on a client that does not read, with the call once this handler returns.
        await asyncio.wait((writer,), timeout=WRITER_DRAIN_S)
        writer.add_done_callback(_consumed)
        violation = await _reader_end(reader)
    if violation is not None:  # test_session.py::test_a_request_reusing_a_pending_id_ends_the_stream (sdk)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, violation.message)


async def _reader_end(reader: asyncio.Task[None]) -> errors.BadRequest | None:
    """How the stream's reader ended: a request the stream cannot serve on (its status ends the stream), or None."""
    try:
        await reader
    except errors.BadRequest as exc:
        return exc
    except DecodeError:  # the client's bytes: a bad request ending the stream, not an internal error
        return errors.BadRequest("session: a stream message that does not decode")
    except (asyncio.CancelledError, grpc.RpcError):
        pass
    return None


async def _drain(session: Session, reader: asyncio.Task[None]) -> None:
    """The stream's connection is told to go away (its age): as for a stopping proxy, no more requests are read,
    but receives in progress are cut at once (their messages go back; the client sends them again on its next
    stream, on a new connection) so that sends and acks need not wait behind a long poll —
    tests/integration/sdk/test_connection_age.py."""
    reader.cancel()
    session.cut_receives()
    if session.pending:
        await asyncio.wait(list(session.pending.values()), timeout=SETTLE_S)


def _ended(ended: asyncio.Future[None], _writer: asyncio.Task[None]) -> None:
    if not ended.done():
        ended.set_result(None)


def _consumed(task: asyncio.Task[None]) -> None:
    """A writer that ended with the call: its error is the call's, already answered."""
    if not task.cancelled():
        task.exception()
