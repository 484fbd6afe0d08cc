"""Client side of the proxy's Session stream (popgate.ext.v1 Messaging.Session, proto/ext/messaging.proto).

Many requests on one gRPC stream, each a frame each way instead of a call; sends to one topic, and acks of one topic
and group, queued together go as one request (`sdk/_joining.py`). `Waiting` (ids, answers, frame encoding) is
sans-IO; `Session` does the stream's I/O around it. A lost stream fails its pending requests with a retriable
`Unavailable` (the client's retry policy sends them again, on a new stream); a proxy that serves no Session fails
them with `Unimplemented` (the client then uses the unary RPCs).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

import grpc
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract.wire import varint

from . import _joining, errors
from ._joining import Part
from ._transport import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

METHOD = "/popgate.ext.v1.Messaging/Session"
# SessionRequest's fields (proto/ext/messaging.proto): a request is encoded by hand around its serialized body.
ID, TIMEOUT_MS, CANCEL, MORE = 1, 2, 3, 15
# The writer sends the requests queued when it gets to them as one stream message (`more`: grpc costs tens of µs a
# message on each side, whatever its size), up to this many bytes (a larger request goes alone); the rest follows
# in the next message, once grpc took this one. Many requests queued at once (sends of many tasks) so reach the
# proxy in parts and the proxy starts on the first while the next is written, rather than SDK, proxy and broker
# each handling the whole lot in turn (docs/PROXY.md, "Session stream") —
# tests/unit/sdk/test_session.py::test_requests_queued_together_are_joined_up_to_the_write_limit.
MAX_WRITE_BYTES = 48 * 1024
KINDS = {"send": 4, "receive": 5, "ack": 6, "change_invisible": 7, "send_shared": 8}
RESPONSES: dict[str, Callable[..., Any]] = {
    "send": pb.SendMessageResponse,
    "send_shared": pb.SendMessageResponse,
    "receive": ext.ReceiveMessagesResponse,
    "ack": pb.AckMessageResponse,
    "change_invisible": pb.ChangeInvisibleDurationResponse,
}
# The proxy refused the stream when it opened (its metadata): each request fails as its unary call would, with the
# v2 code that call's answer would carry; anything else ends a stream that was lost.
REFUSED = {
    grpc.StatusCode.UNAUTHENTICATED: v2.UNAUTHORIZED,
    grpc.StatusCode.PERMISSION_DENIED: v2.FORBIDDEN,
    grpc.StatusCode.INVALID_ARGUMENT: v2.BAD_REQUEST,
}


ANSWERS = {"send_shared": "send"}  # a kind answered in another kind's field (SessionResponse's `body`)


class Unimplemented(errors.PopgateError):
    """The proxy serves no Session (a RocketMQ proxy, or popgate's with --no-batch-receive): nothing was served."""


class KindUnknown(errors.PopgateError):
    """The proxy's Session does not know this request's kind (a proxy older than it): nothing was served."""


def encode(request_id: int, kind: str, body: bytes, timeout_ms: int = 0) -> bytes:
    """A SessionRequest carrying the serialized v2 request `body` as `kind` —
    tests/unit/sdk/test_session.py::test_a_hand_encoded_request_reads_as_the_generated_message."""
    head = b"\x08" + varint(request_id)
    if timeout_ms:
        head += b"\x10" + varint(timeout_ms)
    return head + varint(KINDS[kind] << 3 | 2) + varint(len(body)) + body


def encode_cancel(request_id: int) -> bytes:
    return b"\x08" + varint(request_id) + b"\x18\x01"


def join(first: bytes, more: list[bytes]) -> bytes:
    """One SessionRequest carrying `first` and then `more` (each an encoded request) —
    tests/unit/sdk/test_session.py::test_requests_joined_in_one_message_read_as_each_in_order."""
    tag = varint(MORE << 3 | 2)
    return first + b"".join(tag + varint(len(request)) + request for request in more)


Queued = bytes | Part  # an encoded request (or cancel), or a request that may be joined with others (sdk/_joining.py)


def _size(item: Queued) -> int:
    return len(item) if isinstance(item, bytes) else len(item.body) + 16


def with_queued(first: Queued, outbox: Any, waiting: Waiting) -> tuple[bytes | None, Queued | None]:
    """`first` and the requests queued behind it in `outbox` as one message of at most MAX_WRITE_BYTES (or `first`
    alone), and the request taken that did not fit (to go first in the next message); the end marker (None), if
    met, is queued again to be seen after this message. Sends to one topic queued together go as one request, and so
    do acks of one topic and group (`Waiting.join`); a part whose caller stopped waiting before it was written is
    not sent (None: nothing left to send) — tests/unit/sdk/test_joining.py."""
    items = [first]
    size = _size(first)
    carried: Queued | None = None
    while not outbox.empty():
        queued = outbox.get_nowait()
        if queued is None:
            outbox.put_nowait(None)
            break
        if size + _size(queued) + 16 > MAX_WRITE_BYTES:
            carried = queued
            break
        items.append(queued)
        size += _size(queued) + 16
    requests = [r for group in _joining.groups(items) if (r := _encoded_group(group, waiting)) is not None]
    if not requests:
        return None, carried
    return (join(requests[0], requests[1:]) if len(requests) > 1 else requests[0]), carried


def _encoded_group(group: bytes | list[Part], waiting: Waiting) -> bytes | None:
    if isinstance(group, bytes):
        return group
    parts = [p for p in group if p.request_id in waiting]
    if not parts:
        return None
    if len(parts) == 1:
        return alone(parts[0])
    timeout_ms = max(p.timeout_ms for p in parts)
    return encode(waiting.join(parts), parts[0].kind, b"".join(p.body for p in parts), timeout_ms)


def alone(part: Part) -> bytes:
    """The SessionRequest of `part` alone, under its own id."""
    return encode(part.request_id, part.kind, part.body, part.timeout_ms)


def encoded(request_id: int, kind: str, body: Any, within_s: float) -> Queued:
    """The SessionRequest for `body` (a send's or an ack's: a Part, encoded when written, maybe joined with others);
    MessageBodyTooLarge (not retried, nothing sent) past gRPC's message limit, as the unary call fails: sent, it
    would end the stream for every request on it."""
    data = body.SerializeToString()
    timeout_ms = int(within_s * 1000)
    if len(encode(request_id, kind, b"", timeout_ms)) + len(varint(len(data))) + len(data) > MAX_MESSAGE_BYTES:
        raise errors.MessageBodyTooLarge(
            f"a {kind} request of {len(data)} bytes is larger than the gRPC message limit ({MAX_MESSAGE_BYTES})",
            code_name="RESOURCE_EXHAUSTED",
        )
    if kind in _joining.JOINED_KINDS:
        return _joining.part(request_id, kind, body, data, timeout_ms)
    return encode(request_id, kind, data, timeout_ms)


class Waiting:
    """The requests of one stream waiting for their answers, by id (sans-IO).

    A receive's answer is its frames up to the status frame that ends it. Messages of an answer nobody waits for
    any more (cancelled, timed out, the stream lost before its status) go to `orphaned`, which gives them back.
    """

    def __init__(self, orphaned: Callable[[list[v2.Message]], None] | None = None) -> None:
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[str, asyncio.Future[Any], list[ext.ReceiveMessagesResponse]]] = {}
        self._orphaned = orphaned
        self._joined: dict[int, list[Part]] = {}  # a joined request's id: its parts, each waiting under its own id
        self._part_of: dict[int, int] = {}  # a part's id: the joined request it went in

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._waiting

    def join(self, parts: list[Part]) -> int:
        """The id of a request joining `parts` (each still answered under its own id)."""
        joined_id = next(self._ids)
        self._joined[joined_id] = parts
        for p in parts:
            self._part_of[p.request_id] = joined_id
        return joined_id

    def to_cancel(self, request_id: int) -> int | None:
        """The request to cancel at the proxy now that `request_id` is dropped: itself, or the joined request it
        went in once none of that request's parts is waiting any more (None until then)."""
        joined_id = self._part_of.pop(request_id, None)
        if joined_id is None:
            return request_id
        parts = self._joined.get(joined_id, ())
        if any(p.request_id in self._waiting for p in parts):
            return None
        self._joined.pop(joined_id, None)
        return joined_id

    def add(self, kind: str, future: asyncio.Future[Any]) -> int:
        request_id = next(self._ids)
        self._waiting[request_id] = (kind, future, [])
        return request_id

    def answer(self, response: ext.SessionResponse) -> list[Part]:
        """Route one frame of the stream: the answer (or the next frame of the answer) of its request. Returns the
        parts of a joined request refused as a whole, to send again one by one (`_joining.refused_whole`)."""
        body = response.WhichOneof("body")
        parts = self._joined.pop(response.id, None)
        if parts is not None:
            return self._answer_joined(response, body, parts)
        entry = self._waiting.get(response.id)
        if entry is None:
            if body == "receive" and response.receive.WhichOneof("content") == "messages":
                self._orphan([response.receive])
            return []
        kind, future, frames = entry
        if body == "status" and kind in ANSWERS and response.status.code == v2.BAD_REQUEST:
            # Refused as a request without a body: a proxy that does not know the kind (popgate's own answer any
            # request of a kind it knows in its kind's field) — the caller sends it again as the v2 request.
            del self._waiting[response.id]
            if not future.done():
                future.set_exception(KindUnknown(f"session: {response.status.message}"))
            return []
        if body == "status":  # refused before the proxy knew its kind: the kind's answer with that status
            answer = RESPONSES[kind](status=response.status)
        elif body == ANSWERS.get(kind, kind):
            answer = getattr(response, body)
        else:  # an answer of another kind (or none): the proxy's mistake, this request's error alone
            self.drop(response.id)
            if not future.done():
                future.set_exception(errors.ServerError(f"session: a {body} answer to a {kind} request"))
            return []
        if kind == "receive":
            frames.append(answer)
            if answer.WhichOneof("content") != "status":
                return []
            answer = frames
        del self._waiting[response.id]
        if not future.done():
            future.set_result(answer)
        elif kind == "receive":  # its caller was cancelled before it could drop it: nobody gets these messages
            self._orphan(frames)
        return []

    def _answer_joined(self, response: ext.SessionResponse, body: str | None, parts: list[Part]) -> list[Part]:
        kind = parts[0].kind
        for p in parts:
            self._part_of.pop(p.request_id, None)
        live = [p for p in parts if p.request_id in self._waiting]
        if body == "status":
            answer = RESPONSES[kind](status=response.status)
        elif body == ANSWERS.get(kind, kind):
            answer = getattr(response, body)
        else:  # an answer of another kind (or none): the proxy's mistake, this request's error
            error = errors.ServerError(f"session: a {body} answer to a {kind} request")
            for p in live:
                future = self._waiting.pop(p.request_id)[1]
                if not future.done():
                    future.set_exception(error)
            return []
        if _joining.refused_whole(answer, parts):
            return live
        for p, mine in zip(parts, _joining.split(answer, [p.count for p in parts]), strict=True):
            entry = self._waiting.pop(p.request_id, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(mine)
        return []

    def drop(self, request_id: int) -> bool:
        """Stop waiting for a request (cancelled, timed out); its frames so far are orphaned. Whether it waited."""
        entry = self._waiting.pop(request_id, None)
        if entry is None:
            return False
        self._orphan(entry[2])
        return True

    def fail_all(self, error: BaseException) -> None:
        self._joined.clear()
        self._part_of.clear()
        waiting, self._waiting = self._waiting, {}
        for _, future, frames in waiting.values():
            self._orphan(frames)
            if not future.done():
                future.set_exception(error)

    def _orphan(self, frames: list[ext.ReceiveMessagesResponse]) -> None:
        messages = [m for frame in frames if frame.WhichOneof("content") == "messages" for m in frame.messages.messages]
        if messages and self._orphaned is not None:
            try:
                self._orphaned(messages)
            except Exception:  # a give-back's failure must not end the stream for the other requests
                log.exception("giving back the messages of an answer nobody waits for failed")


def stream_error(
    exc: grpc.aio.AioRpcError | None, convert: Callable[[grpc.RpcError], errors.PopgateError]
) -> Exception:
    """What a stream's pending requests fail with when it ends (`exc`: how, None when the proxy ended it cleanly):
    `convert`'s error for a unary call that failed so (its hints, a certificate that does not verify not retried),
    retriable unless it is such an Unavailable."""
    if exc is None:
        return errors.Unavailable("the proxy ended the session stream", retriable=True)
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        return Unimplemented(exc.details() or "no Session")
    if exc.code() in REFUSED:
        return errors.error_for(REFUSED[exc.code()], exc.details() or exc.code().name)
    error = convert(exc)
    if isinstance(error, errors.Unavailable):
        return error
    return errors.Unavailable(f"session stream lost: {error}", code_name=exc.code().name, retriable=True)


class Session:
    """One open Session stream (made inside the running loop): `request` sends and awaits the answer."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        metadata: tuple[tuple[str, str], ...],
        convert: Callable[[grpc.RpcError], errors.PopgateError],
        orphaned: Callable[[list[v2.Message]], None] | None = None,
    ) -> None:
        self._waiting = Waiting(orphaned)
        self._convert = convert
        self._outbox: asyncio.Queue[Queued | None] = asyncio.Queue()
        self._call: Any = channel.stream_stream(METHOD, response_deserializer=ext.SessionResponse.FromString)(
            metadata=metadata
        )
        self.broken: Exception | None = None
        loop = asyncio.get_running_loop()
        self._tasks = (loop.create_task(self._read()), loop.create_task(self._write()))

    async def request(self, kind: str, body: Any, within_s: float) -> Any:
        """The answer to one request (a receive's: its frames), waiting at most `within_s` seconds.

        Raises:
            Timeout: No answer in time (retriable; the proxy is told to drop the request).
            Unavailable: The stream was lost (retriable) or closed.
            Unimplemented: The proxy serves no Session.
        """
        if self.broken is not None:
            raise self.broken
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        request_id = self._waiting.add(kind, future)
        try:
            data = encoded(request_id, kind, body, within_s)
        except errors.PopgateError:
            self._waiting.drop(request_id)
            raise
        self._outbox.put_nowait(data)
        timer = loop.call_later(within_s, self._timed_out, request_id, future, within_s)
        try:
            return await future
        except asyncio.CancelledError:
            self._drop(request_id)  # messages it had read are given back
            if kind == "receive" and future.done() and not future.cancelled():
                # Answered, then cancelled before it resumed: nobody gets these messages; given back at once —
                # tests/unit/sdk/test_session.py::test_a_receive_cancelled_after_its_answer_gives_the_messages_back.
                self._waiting._orphan(future.result())
            raise
        finally:
            timer.cancel()

    def _timed_out(self, request_id: int, future: asyncio.Future[Any], timeout: float) -> None:
        if self._drop(request_id) and not future.done():
            future.set_exception(errors.Timeout(f"no answer within {timeout:g} s", code_name="DEADLINE_EXCEEDED"))

    def _drop(self, request_id: int) -> bool:
        dropped = self._waiting.drop(request_id)
        if dropped and self.broken is None and (cancel := self._waiting.to_cancel(request_id)) is not None:
            self._outbox.put_nowait(encode_cancel(cancel))
        return dropped

    async def _write(self) -> None:
        with contextlib.suppress(asyncio.InvalidStateError, grpc.RpcError):  # the call ended: `_read` fails the rest
            frame = await self._outbox.get()
            while frame is not None:
                message, carried = with_queued(frame, self._outbox, self._waiting)
                if message is not None:
                    await self._call.write(message)
                frame = carried if carried is not None else await self._outbox.get()

    async def _read(self) -> None:
        ended: grpc.aio.AioRpcError | None = None
        try:
            while (response := await self._call.read()) is not grpc.aio.EOF:
                again = self._waiting.answer(response)
                for more in response.more:
                    again += self._waiting.answer(more)
                for p in again:  # refused joined: each part alone (not joined again), answered under its own id
                    self._outbox.put_nowait(alone(p))
        except grpc.aio.AioRpcError as exc:
            ended = exc
        finally:
            self._end(stream_error(ended, self._convert))

    def _end(self, error: Exception) -> None:
        if self.broken is None:
            self.broken = error
        self._waiting.fail_all(self.broken)
        self._outbox.put_nowait(None)

    async def close(self) -> None:
        """End the stream; requests still pending fail with a non-retriable Unavailable."""
        self._end(errors.Unavailable("the client is closed", retriable=False))
        self._call.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                await task
