"""Client side of the broker's Session stream: many requests on one gRPC call.

A held long poll then costs the broker a stream message instead of a whole gRPC call, and a
Send, Ack or ChangeInvisibleTime a frame instead of a call (the costs are in docs/BROKER.md).
Errors are raised as the same ``grpc.aio.AioRpcError`` the unary RPC would raise (status code, details and the
``popgate-error`` trailer), so callers handle both paths alike. Cancelling a
caller's await (or `cancel`) sends a cancel frame; losing the stream fails every pending call
with UNAVAILABLE. `submit` takes a callback instead of returning an awaitable, so a caller
that holds thousands of requests (the proxy) needs no task or coroutine per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

import grpc
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

from popgate_contract.trailer import rpc_error, session_error

log = logging.getLogger(__name__)


Answer = Callable[[pb.SessionResponse | grpc.aio.AioRpcError], None]


class BrokerSession:
    def __init__(self, stub: pb_grpc.BrokerStub) -> None:
        self._stub = stub
        self._ids = itertools.count(1)
        self._pending: dict[int, Answer] = {}
        # Ids of requests to write (their bodies wait in `_unwritten`, so that a cancel frees a body at once,
        # even while a stalled broker keeps the writer from reaching it), cancel frames, None to end.
        self._outbox: asyncio.Queue[int | pb.SessionRequest | None] = asyncio.Queue()
        self._unwritten: dict[int, pb.SessionRequest] = {}
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._broken: grpc.aio.AioRpcError | None = None
        self._writing: int | None = None  # the request id being written now (it may or may not have left)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def open(self) -> BrokerSession:
        """Start the stream (inside a running event loop); returns self."""
        self._call = self._stub.Session()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read()), loop.create_task(self._write())]
        return self

    @property
    def broken(self) -> bool:
        return self._broken is not None

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

    def submit(self, request: pb.SessionRequest, answer: Answer) -> int:
        """Send ``request`` (its body filled in; the id is set here); its id.

        ``answer`` is called once, from the stream's reader, with the response (an ``error`` body
        included: see `failure`) or with the UNAVAILABLE error of a lost stream; never after
        `cancel`. No task per request: a held long poll costs a dict entry and the callback."""
        if self._broken is not None:
            raise rpc_error(self._broken.code(), self._broken.details() or "", unsent=True)
        request_id = request.id = next(self._ids)
        self._pending[request_id] = answer
        self._unwritten[request_id] = request
        self._outbox.put_nowait(request_id)
        return request_id

    def cancel(self, request_id: int) -> None:
        """Drop a submitted request: never sent if it is still in the outbox, else the broker is told to
        drop it too (a cancel frame; a Pop it had answered already is released by the broker)."""
        if self._pending.pop(request_id, None) is None or self._broken is not None:
            return
        # Not written yet: `_write` skips its id. Written, or being written: the broker is told.
        if self._unwritten.pop(request_id, None) is None or request_id == self._writing:
            self._outbox.put_nowait(pb.SessionRequest(id=request_id, cancel=True))

    def release(self, request_id: int) -> None:
        """A Pop answered whose messages nobody will receive (the answer crossed the receive's end): a cancel
        frame all the same, on which the broker makes them ready again (attempt count unchanged)."""
        if self._broken is None and request_id not in self._pending:
            self._outbox.put_nowait(pb.SessionRequest(id=request_id, cancel=True))

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
        while True:
            item = await self._outbox.get()
            if item is None:
                await self._call.done_writing()
                return
            if not isinstance(item, int):  # a cancel frame
                await self._call.write(item)
                continue
            request = self._unwritten.get(item)
            if request is None:  # cancelled before it was written
                continue
            # Kept in `_unwritten` until the write returns: if the stream is lost first, the request is known
            # never to have left (`_read` says so in its error, and the caller may send it again safely).
            self._writing = item
            try:
                await self._call.write(request)
            finally:
                self._writing = None
            self._unwritten.pop(item, None)

    async def _read(self) -> None:
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, "broker session closed")
        try:
            async for response in self._call:
                answer = self._pending.pop(response.id, None)
                if answer is not None:
                    _deliver(answer, response)
        except grpc.aio.AioRpcError as exc:
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"broker session lost: {exc.details()}")
        finally:
            self._broken = error
            never_sent = set(self._unwritten) - {self._writing}
            self._unwritten.clear()
            pending, self._pending = self._pending, {}
            unsent_error = rpc_error(error.code(), error.details() or "", unsent=True)
            for request_id, answer in pending.items():
                _deliver(answer, unsent_error if request_id in never_sent else error)

    async def close(self) -> None:
        if self._call is None:
            return
        self._call.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                await task
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
