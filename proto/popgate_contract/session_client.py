"""Client side of the broker's Session stream: many requests on one gRPC call.

A held long poll then costs the broker a stream message instead of a whole gRPC call, and a
Send, Ack or ChangeInvisibleTime a frame instead of a call (the costs are in docs/BROKER.md).
Errors are raised as the same ``grpc.aio.AioRpcError`` the unary RPC would raise (status code, details and the
``popgate-error`` trailer), so callers handle both paths alike. Cancelling a
caller's await (or `cancel`) sends a cancel frame; losing the stream fails every pending call
with UNAVAILABLE, and so does an answer that does not decode (the stream is ended then). `submit` takes a callback
instead of returning an awaitable, so a caller that holds thousands of requests (the proxy) needs no task or coroutine
per request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from popgate_pb import broker_pb2 as pb

from popgate_contract.trailer import rpc_error, session_error
from popgate_contract.wire import varint

log = logging.getLogger(__name__)

METHOD = "/popgate.broker.v1.Broker/Session"
# Said by each side of a Session stream that reads joined stream messages (`more`): the caller in its call
# metadata, the broker in its initial metadata when the stream opens. Each side joins only towards one that said it.
MORE_KEY = "popgate-session-more"
# Said by a broker that stores a Send's `runs` (SharedRun), in its initial metadata when the stream opens: a caller
# that has not seen it sends each run's messages whole (an older broker would drop the runs it does not know).
RUNS_KEY = "popgate-session-runs"
# Said by a broker that reads EndTransaction on the stream (older ones take only the unary call).
TRANSACTIONS_KEY = "popgate-session-transactions"
# Said by a broker that reads ChangeInvisibleTimes (`change_invisible_many`) on the stream: a caller that has not seen
# it sends a ChangeInvisibleTime per handle.
CHANGE_MANY_KEY = "popgate-session-change-many"
# Said by a broker in its initial metadata: the largest stream message it takes (its --max-grpc-message-bytes). A
# larger one would end the whole stream (every request on it failed, the broker taken for down): a request alone
# past it is refused here, and joined messages stay well under it.
MAX_BYTES_KEY = "popgate-session-max-bytes"
SAID_WAIT_S = 1.0  # the longest a new stream's first write waits for the broker's initial metadata
_ID = b"\x08"  # SessionRequest.id: field 1, a varint
_MORE_TAG = varint(15 << 3 | 2)  # SessionRequest.more and SessionResponse.more: field 15, length-delimited
# The writer sends the requests queued when it gets to them as one stream message, of at most this many bytes unless
# one request alone is larger (so joining never makes a message the broker's size limit refuses).
MAX_WRITE_BYTES = 1024 * 1024
# Streams ended because their answers could not be read, per broker name: their WARNING is logged for the 1st, 10th,
# 100th ... (a broker that sends garbage on every stream would otherwise log each one).
_unread: collections.Counter[str] = collections.Counter()


def join(first: bytes, more: Sequence[bytes]) -> bytes:
    """One encoded SessionRequest (or SessionResponse) carrying `first` and then `more`, each an encoded one: a
    repeated field's entries may follow the other fields (protobuf merges them), so no entry is decoded or copied
    but once, here (tests/unit/broker/test_session_more.py)."""
    return b"".join([first, *(_MORE_TAG + varint(len(entry)) + entry for entry in more)])


def decode(data: bytes) -> pb.SessionResponse | None:
    """A stream message as a SessionResponse; None when it does not decode (grpc's own deserializer would log a
    traceback for each such message; the reader ends the stream on the first)."""
    try:
        return pb.SessionResponse.FromString(data)
    except DecodeError:
        return None


def encode_cancel(request_id: int) -> bytes:
    """The cancel frame of a request: SessionRequest(id=request_id, cancel=True), encoded."""
    return _ID + varint(request_id) + b"\x20\x01"


Answer = Callable[[pb.SessionResponse | grpc.aio.AioRpcError], None]


class BrokerSession:
    """The Session stream on `channel`: requests written as bytes, joined when the broker reads them joined."""

    def __init__(self, channel: grpc.aio.Channel, *, name: str = "?") -> None:
        self._channel = channel
        self._name = name  # the broker's, in what is logged
        self._ids = itertools.count(1)
        self._pending: dict[int, Answer] = {}
        # Ids of requests to write (their bodies wait in `_unwritten`, so that a cancel frees a body at once,
        # even while a stalled broker keeps the writer from reaching it), encoded cancel frames, None to end.
        self._outbox: asyncio.Queue[int | bytes | None] = asyncio.Queue()
        self._unwritten: dict[int, pb.SessionRequest | bytes] = {}  # a request, or it encoded with its id
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._broken: grpc.aio.AioRpcError | None = None
        # The request ids of the stream message being written now (they may or may not have left).
        self._writing: frozenset[int] = frozenset()
        self._joined = False  # the broker said it reads joined requests (MORE_KEY in its initial metadata)
        self.reads_runs = False  # the broker said it stores a Send's runs (RUNS_KEY in its initial metadata)
        self.ends_transactions = False  # the broker said it reads EndTransaction (TRANSACTIONS_KEY)
        self.changes_many = False  # the broker said it reads ChangeInvisibleTimes (CHANGE_MANY_KEY)
        self._carry: int | bytes | None = None  # taken from the outbox, first in the next message (it did not fit)
        self._max_bytes = 0  # the largest stream message the broker takes (MAX_BYTES_KEY); 0: not said
        self._said = asyncio.Event()  # the broker's initial metadata was read (or the stream ended first)
        self._write_bytes = MAX_WRITE_BYTES  # joined messages up to this many bytes

    @property
    def pending(self) -> int:
        return len(self._pending)

    def open(self) -> BrokerSession:
        """Start the stream (inside a running event loop); returns self."""
        metadata = ((MORE_KEY, "1"),)
        # Requests are written as bytes: no serializer.
        stream = self._channel.stream_stream(METHOD, response_deserializer=decode)
        self._call = stream(metadata=metadata)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read()), loop.create_task(self._write())]
        return self

    @property
    def broken(self) -> bool:
        return self._broken is not None

    async def said(self, timeout_s: float = SAID_WAIT_S) -> None:
        """Return once the broker said what it reads (or the stream ended first), or after `timeout_s` (at most
        SAID_WAIT_S: what the stream's first write waits for anyway)."""
        if not self._said.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._said.wait(), min(timeout_s, SAID_WAIT_S))

    async def pop(self, request: pb.PopRequest) -> pb.PopResponse:
        return (await self.call(pb.SessionRequest(pop=request))).pop

    async def notification(self, request: pb.NotificationRequest) -> pb.NotificationResponse:
        return (await self.call(pb.SessionRequest(notification=request))).notification

    async def send(self, request: pb.SendRequest) -> pb.SendResponse:
        return (await self.call(pb.SessionRequest(send=request))).send

    async def ack(self, request: pb.AckRequest) -> pb.AckResponse:
        return (await self.call(pb.SessionRequest(ack=request))).ack

    async def change_invisible(self, request: pb.ChangeInvisibleTimeRequest) -> pb.ChangeInvisibleTimeResponse:
        return (await self.call(pb.SessionRequest(change_invisible=request))).change_invisible

    async def renew(self, request: pb.RenewRequest) -> pb.RenewResponse:
        return (await self.call(pb.SessionRequest(renew=request))).renew

    def submit(self, request: pb.SessionRequest | list[bytes], answer: Answer) -> int:
        """Send ``request`` (its body filled in; the id is set here), or such a request encoded without its id, in
        parts (joined once, after the id); its id.

        ``answer`` is called once, from the stream's reader, with the response (an ``error`` body
        included: see `failure`) or with the UNAVAILABLE error of a lost stream; never after
        `cancel`. No task per request: a held long poll costs a dict entry and the callback."""
        if self._broken is not None:
            raise rpc_error(self._broken.code(), self._broken.details() or "", unsent=True)
        request_id = next(self._ids)
        if isinstance(request, list):
            self._unwritten[request_id] = b"".join([_ID, varint(request_id), *request])  # fields: read in any order
        else:
            request.id = request_id
            self._unwritten[request_id] = request
        self._pending[request_id] = answer
        self._outbox.put_nowait(request_id)
        return request_id

    def cancel(self, request_id: int) -> None:
        """Drop a submitted request: never sent if it is still in the outbox, else the broker is told to
        drop it too (a cancel frame; a Pop it had answered already is released by the broker)."""
        if self._pending.pop(request_id, None) is None or self._broken is not None:
            return
        # Not written yet: `_write` skips its id. Written, or being written: the broker is told.
        if self._unwritten.pop(request_id, None) is None or request_id in self._writing:
            self._outbox.put_nowait(encode_cancel(request_id))

    def release(self, request_id: int) -> None:
        """A Pop answered whose messages nobody will receive (the answer crossed the receive's end): a cancel
        frame all the same, on which the broker makes them ready again (attempt count unchanged)."""
        if self._broken is None and request_id not in self._pending:
            self._outbox.put_nowait(encode_cancel(request_id))

    async def call(self, request: pb.SessionRequest) -> pb.SessionResponse:
        """`submit` and await the answer; an ``error`` body is raised as the unary RPC's error.
        Callers with a large body build it inside the SessionRequest, saving a copy."""
        future: asyncio.Future[pb.SessionResponse] = asyncio.get_running_loop().create_future()

        def answer(response: pb.SessionResponse | grpc.aio.AioRpcError) -> None:
            if future.done():
                return
            if isinstance(response, grpc.aio.AioRpcError):
                future.set_exception(response)
            else:
                future.set_result(response)

        request_id = self.submit(request, answer)
        try:
            response = await future
        except asyncio.CancelledError:
            self.cancel(request_id)
            raise
        error = failure(response)
        if error is not None:
            raise error
        return response

    async def _write(self) -> None:
        try:
            await self._write_all()
        except asyncio.InvalidStateError:
            # The call ended under a write (the broker closed the stream: it is stopping). `_read` fails what is
            # pending; a request whose write did not return counts as never sent. Not an error of `close()`.
            return

    async def _write_all(self) -> None:
        # Nothing is written before the broker said what it takes (its size limit first: a message over it would end
        # the stream) — tests/integration/broker/test_session.py::
        # test_a_first_request_larger_than_the_broker_takes_fails_alone. A broker that says nothing when the stream
        # opens (an older one: with its first answer) is written to after SAID_WAIT_S.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._said.wait(), SAID_WAIT_S)
        while True:
            item, self._carry = self._carry, None
            if item is None and (item := await self._outbox.get()) is None:
                break
            frames, ids = self._gather(item)
            if not frames:  # cancelled before they were written
                continue
            # Kept in `_unwritten` until the write returns: if the stream is lost first, the requests are known
            # never to have left (`_read` says so in their error, and the caller may send them again safely).
            self._writing = frozenset(ids)
            try:
                await self._call.write(self._message(frames))
            finally:
                self._writing = frozenset()
            for request_id in ids:
                self._unwritten.pop(request_id, None)
        await self._call.done_writing()

    def _gather(self, item: int | bytes) -> tuple[list[bytes], list[int]]:
        """`item` and, once the broker said it reads them joined, the frames queued behind it, in order, up to
        MAX_WRITE_BYTES (the first one that does not fit is carried to the next message): encoded frames, and the
        ids of the requests among them. The end marker stays queued (tests/unit/broker/test_session_more.py)."""
        frames: list[bytes] = []
        ids: list[int] = []
        size = 0
        while True:
            if isinstance(item, bytes):  # a cancel frame
                data: bytes | None = item
            elif (request := self._unwritten.get(item)) is not None:
                data = request if isinstance(request, bytes) else request.SerializeToString()
            else:  # cancelled before it was written
                data = None
            if data is not None and self._max_bytes and len(data) > self._max_bytes and isinstance(item, int):
                self._too_large(item, len(data))
                data = None
            if data is not None:
                if frames and size + len(data) > self._write_bytes:
                    self._carry = item  # encoded again then: rare, a message is full
                    return frames, ids
                frames.append(data)
                size += len(data)
                if not isinstance(item, bytes):
                    ids.append(item)
            if not self._joined or size >= self._write_bytes or self._outbox.empty():
                return frames, ids
            queued = self._outbox.get_nowait()
            if queued is None:
                self._outbox.put_nowait(None)  # nothing is queued behind the end marker
                return frames, ids
            item = queued

    def _too_large(self, request_id: int, size: int) -> None:
        """Refuse a request larger than the broker takes, alone, never written: as the unary call's refusal
        (RESOURCE_EXHAUSTED, "larger than max") — tests/integration/broker/test_session.py::
        test_a_request_larger_than_the_broker_takes_fails_alone."""
        self._unwritten.pop(request_id, None)
        answer = self._pending.pop(request_id, None)
        if answer is not None:
            details = f"the request ({size} bytes) is larger than max the broker takes ({self._max_bytes})"
            _deliver(answer, rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, details))

    def _message(self, frames: list[bytes]) -> bytes:
        """The stream message carrying `frames`."""
        return join(frames[0], frames[1:]) if len(frames) > 1 else frames[0]

    async def _read(self) -> None:
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, "broker session closed")
        try:
            # Sent by a broker that reads joined requests when the stream opens; an older one sends its initial
            # metadata with its first answer (there is nothing to read before that anyway).
            said = dict(await self._call.initial_metadata())
            self._joined, self.reads_runs = said.get(MORE_KEY) == "1", said.get(RUNS_KEY) == "1"
            self.ends_transactions = said.get(TRANSACTIONS_KEY) == "1"
            self.changes_many = said.get(CHANGE_MANY_KEY) == "1"
            if (limit := str(said.get(MAX_BYTES_KEY, ""))).isdigit():
                self._max_bytes = int(limit)
                self._write_bytes = max(1, min(MAX_WRITE_BYTES, self._max_bytes // 2))  # room for the joins' tags
            self._said.set()
            async for response in self._call:
                if response is None:
                    error = self._unreadable("an answer from the broker does not decode")
                    break
                self._answer(response)
                for more in response.more:  # one level: `more` inside `more` is not read
                    self._answer(more)
        except grpc.aio.AioRpcError as exc:
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"broker session lost: {exc.details()}")
        except Exception as exc:  # an answer the reader fails on: the stream is lost, the task does not fail
            error = self._unreadable(f"reading its answers failed: {exc!r}", exc)
        finally:
            self._said.set()
            self._broken = error
            never_sent = set(self._unwritten) - self._writing
            self._unwritten.clear()
            pending, self._pending = self._pending, {}
            unsent_error = rpc_error(error.code(), error.details() or "", unsent=True)
            for request_id, answer in pending.items():
                _deliver(answer, unsent_error if request_id in never_sent else error)

    def _unreadable(self, why: str, exc: Exception | None = None) -> grpc.aio.AioRpcError:
        """End a stream whose answers cannot be read: its call cancelled, its requests failed as on a lost stream
        (UNAVAILABLE: sent again or failed over), one WARNING for the 1st, 10th, 100th ... such stream of this broker,
        the reader task ended without an error — tests/unit/contract/test_session_client.py::
        test_an_undecodable_answer_ends_the_stream_as_lost_with_one_warning_and_a_new_stream_serves."""
        self._call.cancel()
        _unread[self._name] += 1
        if str(count := _unread[self._name]).rstrip("0") == "1":
            log.warning(
                "broker %s: Session stream ended, its requests failed as on a lost one: %s (%d such stream(s) so far)",
                self._name,
                why,
                count,
                exc_info=exc,
            )
        return rpc_error(grpc.StatusCode.UNAVAILABLE, f"broker session lost: {why}")

    def _answer(self, response: pb.SessionResponse) -> None:
        answer = self._pending.pop(response.id, None)
        if answer is not None:
            _deliver(answer, response)

    async def close(self) -> None:
        if self._call is None:
            return
        self._call.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, grpc.RpcError):
                pass
            except Exception:  # reported here, never left for asyncio to report as unretrieved (close() runs as a task)
                log.exception("broker %s: a Session task failed", self._name)
        self._call = None


def _deliver(answer: Answer, response: pb.SessionResponse | grpc.aio.AioRpcError) -> None:
    try:
        answer(response)
    except Exception:  # a caller's bug must not end the stream for every other caller
        log.exception("session answer callback failed")


def failure(response: pb.SessionResponse) -> grpc.aio.AioRpcError | None:
    """The unary RPC's error for an ``error`` answer; None for any other."""
    if response.WhichOneof("body") != "error":
        return None
    e = response.error
    return session_error(e.error, e.message, e.grpc_code)
