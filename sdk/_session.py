"""Client side of the proxy's Session stream (popgate.ext.v1 Messaging.Session, proto/ext/messaging.proto).

Many requests on one gRPC stream, each a frame each way instead of a call; sends to one topic, acks of one topic
and group, and receives alike, queued together go as one request (`sdk/_joining.py`). The frames (`sdk/_frames.py`),
`Waiting` (`sdk/_waiting.py`: ids, answers) and `Room` (`sdk/_room.py`: at most the proxy's bound of requests
pending, callers past it waiting their turn) are sans-IO; `Session` does the stream's I/O around them. A lost stream
fails its pending requests with a retriable `Unavailable` (the client's retry policy sends them again, on a new
stream); a proxy that serves no Session fails them with `Unimplemented` (the client then uses the unary RPCs).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2

from popgate_contract.session_headers import max_message_of, receive_batch_of

from . import errors
from ._frames import MAX_WRITE_BYTES, Queued, alone, encode_cancel, encoded, id_of, size_of, too_large, with_queued
from ._outbox import Outbox
from ._resend import NOT_SENT
from ._room import Room
from ._transport import MAX_MESSAGE_BYTES
from ._waiting import Waiting

log = logging.getLogger(__name__)

METHOD = "/popgate.ext.v1.Messaging/Session"
# The most bytes of requests waiting to be written (the proxy bounds its own outbox alike): past it a request waits
# for room within its time (then a retriable Timeout, nothing sent) instead of queuing while the stream's write is
# stalled — tests/unit/sdk/test_session.py::test_a_stalled_stream_queues_at_most_its_bound_and_drops_what_timed_out.
MAX_OUTBOX_BYTES = 32 * 1024 * 1024
# A stream message larger than requests are joined up to (one request alone) waits at most this long for the
# proxy's headers, which say the largest message it reads: past that one would end the stream for every request on
# it, so such a request fails alone instead — tests/unit/sdk/test_session.py::
# test_a_request_past_the_proxys_message_limit_fails_alone_and_the_stream_goes_on.
HEADERS_WAIT_S = 1.0
# The proxy refused the stream when it opened (its metadata): each request fails as its unary call would, with the
# v2 code that call's answer would carry; anything else ends a stream that was lost.
REFUSED = {
    grpc.StatusCode.UNAUTHENTICATED: v2.UNAUTHORIZED,
    grpc.StatusCode.PERMISSION_DENIED: v2.FORBIDDEN,
    grpc.StatusCode.INVALID_ARGUMENT: v2.BAD_REQUEST,
}


class Unimplemented(errors.PopgateError):
    """The proxy serves no Session (a RocketMQ proxy, or popgate's with --no-batch-receive): nothing was served."""


class Ended(errors.Unavailable):
    """The proxy ended the stream cleanly (its connection told to go away, or the proxy stopping) before answering
    the request, or refused it as its connection went away: a receive was not served (the proxy gave back what it
    had taken) and is asked again on a new stream without counting as an attempt (`_aio_consumer`); other requests
    are retried as after a lost stream."""


# grpc-core's details of a stream it removed because the connection's GOAWAY came before the stream was taken (a
# stream the server had, cut as the connection closed, says "Stream removed (Socket closed (GOAWAY ...": not this).
REFUSED_AWAY = "Stream removed (GOAWAY received"


def stream_error(
    exc: grpc.aio.AioRpcError | None, convert: Callable[[grpc.RpcError], errors.PopgateError], *, opened: bool = True
) -> Exception:
    """What a stream's pending requests fail with when it ends (`exc`: how, None when the proxy ended it cleanly;
    `opened`: the proxy's headers had come): `convert`'s error for a unary call that failed so (its hints, a
    certificate that does not verify not retried), retriable unless it is such an Unavailable. A stream refused
    before it opened because its connection was going away (opened on it as the proxy's GOAWAY came, should gRPC's
    transparent retry not take it to a new connection) served nothing either: `Ended` —
    tests/unit/sdk/test_session.py::test_a_stream_refused_by_goaway_before_it_opened_served_nothing."""
    if exc is None:
        return Ended("the proxy ended the session stream", retriable=True)
    if not opened and exc.code() == grpc.StatusCode.UNAVAILABLE and (exc.details() or "").startswith(REFUSED_AWAY):
        return Ended(f"the session stream was refused as its connection went away ({NOT_SENT})", retriable=True)
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        return Unimplemented(exc.details() or "no Session")
    if exc.code() in REFUSED:
        return errors.error_for(REFUSED[exc.code()], exc.details() or exc.code().name)
    error = convert(exc)
    if isinstance(error, errors.Unavailable):
        return error
    return errors.Unavailable(f"session stream lost: {error}", code_name=exc.code().name, retriable=True)


def _timeout(within_s: float, *, sent: bool = True) -> errors.Timeout:
    """A request's Timeout; one never written says so (`_resend.maybe_applied`: it cannot have been applied) —
    tests/unit/sdk/test_session.py::test_a_request_that_timed_out_unwritten_says_nothing_was_sent."""
    if sent:
        return errors.Timeout(f"no answer within {within_s:g} s", code_name="DEADLINE_EXCEEDED")
    return errors.Timeout(f"not written within {within_s:g} s: {NOT_SENT}", code_name="DEADLINE_EXCEEDED")


def _no_room(room: asyncio.Future[None], within_s: float) -> None:
    if not room.done():
        room.set_exception(_timeout(within_s, sent=False))


class Session:
    """One open Session stream (made inside the running loop): `request` sends and awaits the answer."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        metadata: tuple[tuple[str, str], ...],
        convert: Callable[[grpc.RpcError], errors.PopgateError],
        orphaned: Callable[[list[v2.Message]], None] | None = None,
    ) -> None:
        self._orphaned = orphaned
        self._waiting = Waiting(self._orphan if orphaned is not None else None, self._cancel)
        self.closing = False  # once `close` began: the proxy gives back what the closed stream left unanswered
        self._convert = convert
        self._outbox = Outbox()
        self._carried: Queued | None = None  # taken from the outbox, to go first in the writer's next message
        self._outbox_turns: deque[asyncio.Future[None]] = deque()  # requests waiting for room in it, in order
        self._room = Room()
        self._call: Any = channel.stream_stream(METHOD, response_deserializer=ext.SessionResponse.FromString)(
            metadata=metadata
        )
        self.broken: Exception | None = None
        self.receive_batch = 0  # the largest joined receive the proxy takes, once its headers came (0: none)
        self.max_bytes = MAX_MESSAGE_BYTES  # the largest stream message the proxy reads, once its headers said it
        self._headers = asyncio.Event()  # the proxy's headers came (or the stream ended)
        loop = asyncio.get_running_loop()
        self._tasks = (loop.create_task(self._read()), loop.create_task(self._write()))

    async def request(self, kind: str, body: Any, within_s: float) -> Any:
        """The answer to one request (a receive's: its frames), waiting at most `within_s` seconds.

        Raises:
            Timeout: No answer in time (retriable; the proxy is told to drop the request, or it is never sent: also
                when MAX_OUTBOX_BYTES of requests waited to be written all that time).
            Unavailable: The stream was lost (retriable) or closed.
            Unimplemented: The proxy serves no Session.
        """
        if self.broken is not None:
            raise copy.copy(self.broken)  # each caller its own error (see `Waiting.fail_all`)
        if not self._room.take(kind):
            within_s = await self._room_for(kind, within_s)
        try:
            return await self._sent(kind, body, within_s)
        finally:
            self._room.release(kind)

    async def _room_for(self, kind: str, within_s: float) -> float:
        """Wait, within `within_s`, until the stream has room for a request of `kind` (`sdk/_room.py`): what is left
        of `within_s` then. Never sent past the proxy's bound, a request is not refused there to be retried —
        tests/unit/sdk/test_session_room.py."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        room: asyncio.Future[None] = loop.create_future()
        self._room.queue(kind, room)
        timer = loop.call_later(within_s, _no_room, room, within_s)
        try:
            await room
        except asyncio.CancelledError:
            if room.done() and not room.cancelled() and room.exception() is None:
                self._room.release(kind)  # the room was given, then the caller cancelled before it resumed
            else:
                self._room.gone()
            raise
        except errors.Timeout:
            self._room.gone()
            raise
        finally:
            timer.cancel()
        left = deadline - loop.time()
        if self.broken is not None or left <= 0:
            self._room.release(kind)
            if self.broken is not None:
                raise copy.copy(self.broken)
            raise _timeout(within_s, sent=False)
        return left

    async def _sent(self, kind: str, body: Any, within_s: float) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        request_id = self._waiting.add(kind, future, body.batch_size if kind == "receive" else 0)
        try:
            data = encoded(request_id, kind, body, within_s, self.receive_batch, self.max_bytes)
        except errors.PopgateError:
            self._waiting.drop(request_id)
            raise
        if self._outbox_turns or (self._outbox.size and self._outbox.size + size_of(data) > MAX_OUTBOX_BYTES):
            try:
                within_s = await self._outbox_room(size_of(data), within_s)
                # Encoded again: with what is left of the caller's time (not the time before the wait), and against
                # the proxy's limit, which its headers may have lowered meanwhile — tests/unit/sdk/test_session.py::
                # test_a_request_that_waited_for_room_gives_the_proxy_only_the_time_left,
                # ::test_a_request_past_a_limit_lowered_while_it_waited_for_room_fails_and_is_not_kept.
                data = encoded(request_id, kind, body, within_s, self.receive_batch, self.max_bytes)
            except BaseException:
                self._waiting.drop(request_id)
                if future.done() and not future.cancelled():
                    future.exception()  # failed with the stream meanwhile: the caller gets that error raised here
                raise
        self._outbox.put_request(request_id, data)
        timer = loop.call_later(within_s, self._timed_out, request_id, future, within_s)
        try:
            return await future
        except asyncio.CancelledError:
            self._drop(request_id)  # messages it had read are given back
            if kind == "receive" and future.done() and not future.cancelled() and future.exception() is None:
                # Answered, then cancelled before it resumed: nobody gets these messages; given back at once —
                # tests/unit/sdk/test_session.py::test_a_receive_cancelled_after_its_answer_gives_the_messages_back.
                # Failed, then cancelled: the cancellation goes on, not the failure (which a retry would take up) —
                # test_a_receive_cancelled_after_it_failed_stays_cancelled.
                self._waiting._orphan(future.result())
            raise
        finally:
            timer.cancel()

    async def _outbox_room(self, size: int, within_s: float) -> float:
        """Wait, within `within_s`, until `size` more bytes fit among those waiting to be written (MAX_OUTBOX_BYTES;
        one request alone always fits), after the requests that waited before it (first come, first served: a
        large one is not passed by small ones): what is left of `within_s` then. Memory stays bounded, and a
        request the writer would take in a moment is not refused — tests/unit/sdk/test_session.py::
        test_requests_past_the_outbox_bound_wait_for_room_and_go,
        ::test_a_large_request_waiting_for_room_is_not_passed_by_small_ones."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        turn: asyncio.Future[None] = loop.create_future()
        self._outbox_turns.append(turn)
        if self._outbox_turns[0] is turn:
            turn.set_result(None)
        try:
            await asyncio.wait_for(asyncio.shield(turn), within_s)  # the first of those waiting
            while self._outbox.size and self._outbox.size + size > MAX_OUTBOX_BYTES and self.broken is None:
                await asyncio.wait_for(asyncio.shield(self._outbox.shrunk()), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise _timeout(within_s, sent=False) from None
        finally:
            first = self._outbox_turns[0] is turn
            self._outbox_turns.remove(turn)
            if first and self._outbox_turns and not self._outbox_turns[0].done():
                self._outbox_turns[0].set_result(None)  # the next one's turn
        if self.broken is not None:
            raise copy.copy(self.broken)
        return deadline - loop.time()

    def _orphan(self, messages: list[v2.Message]) -> None:
        # Handed to be given back until the stream's close begins, the client's close() included —
        # tests/unit/sdk/test_give_back.py::test_a_receive_answered_after_its_cancel_as_close_gives_back_is_given_back.
        if not self.closing and self._orphaned is not None:
            self._orphaned(messages)

    def _timed_out(self, request_id: int, future: asyncio.Future[Any], timeout: float) -> None:
        unwritten = self._outbox.queued(request_id) or self._is_carried(request_id)
        if self._drop(request_id) and not future.done():
            future.set_exception(_timeout(timeout, sent=not unwritten))

    def _is_carried(self, request_id: int) -> bool:
        """Whether the request is the one the writer took to go first in its next message (not written yet)."""
        carried = self._carried
        if carried is None:
            return False
        return (id_of(carried) if isinstance(carried, bytes) else carried.request_id) == request_id

    def _drop(self, request_id: int) -> bool:
        dropped = self._waiting.drop(request_id)
        if dropped and self._is_carried(request_id):
            # Never written: the writer goes on with the outbox —
            # tests/unit/sdk/test_session.py::test_a_request_carried_to_the_next_write_that_times_out_is_never_sent.
            self._carried = None
            return dropped
        if dropped and self._outbox.discard(request_id):
            return dropped  # never written: nothing for the proxy to drop
        if dropped and (cancel := self._waiting.to_cancel(request_id)) is not None:
            self._cancel(cancel)
        return dropped

    def _cancel(self, request_id: int) -> None:
        if self.broken is None:
            self._outbox.put_nowait(encode_cancel(request_id))

    async def _write(self) -> None:
        """Write the queued requests until the stream ends. Should writing fail otherwise than by the call's end
        (which `_read` sees), the stream ends as a lost one, as when reading fails: its call cancelled, its requests
        failed retriably (sent again on a new stream) —
        tests/unit/sdk/test_session.py::test_a_writer_that_fails_ends_the_stream_as_a_lost_one."""
        try:
            frame = await self._outbox.get()
            while frame is not None:
                # Joined up to half what the proxy reads, so a message past it is one request, failed alone.
                joined = min(MAX_WRITE_BYTES, self.max_bytes // 2)
                message, self._carried = with_queued(frame, self._outbox, self._waiting, joined)
                if message is not None and len(message) > joined and await self._past_limit(message):
                    message = None
                if message is not None:
                    await self._call.write(message)
                frame, self._carried = self._carried, None  # None: dropped meanwhile, or none was carried
                if frame is None:
                    frame = await self._outbox.get()
        except (asyncio.InvalidStateError, grpc.RpcError):  # the call ended: `_read` fails the rest
            return
        except Exception as exc:
            log.warning("session stream ended: writing to the proxy failed: %r", exc, exc_info=True)
            self._end(errors.Unavailable(f"session stream lost: {exc}", code_name="INTERNAL", retriable=True))
            self._call.cancel()

    async def _past_limit(self, message: bytes) -> bool:
        """Whether `message` (one request alone) is larger than the proxy reads, once its headers said how much (an
        older proxy's come with its first answer: written after HEADERS_WAIT_S as before); its request then fails
        alone with MessageBodyTooLarge, nothing sent, not retried."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._headers.wait(), HEADERS_WAIT_S)
        if len(message) <= self.max_bytes:
            return False
        request_id = id_of(message)
        kind = self._waiting.kind_of(request_id) or "request"
        self._waiting.fail(request_id, too_large(kind, len(message), self.max_bytes))
        return True

    async def _read(self) -> None:
        """Route the stream's answers until it ends. An answer that does not decode (grpc.aio reads it as None and
        logs why), or any other the reader fails on, ends the stream as a lost one: its call cancelled, its requests
        failed with a retriable Unavailable, the task ended without an error —
        tests/unit/sdk/test_session.py::test_an_undecodable_frame_ends_the_stream_with_a_typed_error_and_no_task_error."""
        error: Exception | None = None
        opened = False  # the proxy's headers came (grpc.aio gives a stream that failed before them empty ones)
        try:
            headers = await self._call.initial_metadata()
            opened = bool(headers)
            self.receive_batch = receive_batch_of(headers)
            self.max_bytes = min(MAX_MESSAGE_BYTES, max_message_of(headers) or MAX_MESSAGE_BYTES)
            self._headers.set()
            while (response := await self._call.read()) is not grpc.aio.EOF:
                if response is None:
                    raise errors.ServerError("an answer from the proxy does not decode", code_name="INTERNAL")
                again = self._waiting.answer(response)
                for more in response.more:
                    again += self._waiting.answer(more)
                for p in again:  # refused joined: each part alone (not joined again), answered under its own id
                    self._outbox.put_nowait(alone(p))
        except grpc.aio.AioRpcError as exc:
            error = stream_error(exc, self._convert, opened=opened)
        except Exception as exc:
            log.warning("session stream ended: reading the proxy's answers failed: %r", exc, exc_info=True)
            self._call.cancel()
            error = errors.Unavailable(f"session stream lost: {exc}", code_name="INTERNAL", retriable=True)
        finally:
            self._headers.set()
            self._end(error if error is not None else stream_error(None, self._convert))

    def _end(self, error: Exception) -> None:
        if self.broken is None:
            self.broken = error
        self._waiting.fail_all(self.broken)
        self._room.fail_all(self.broken)
        self._outbox.put_nowait(None)
        self._outbox.wake()
        for turn in self._outbox_turns:  # each then sees the stream broken
            if not turn.done():
                turn.set_result(None)

    async def close(self) -> None:
        """End the stream; requests still pending fail with a non-retriable Unavailable."""
        self.closing = True
        self._end(errors.Unavailable("the client is closed", retriable=False))
        self._call.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                await task
