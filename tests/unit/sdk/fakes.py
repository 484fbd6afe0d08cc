"""A fake MessagingService stub for the consumer's ack / nack / DLQ calls: no sockets, scripted faults.

It keeps what a broker keeps for these calls (which receipt handles are live) and refuses a stale
handle with INVALID_RECEIPT_HANDLE, as a broker does. Faults are scripted per call:

* ``entry_faults[handle]``: v2 codes the next AckMessage (or ChangeInvisibleMany) entries for that handle
  answer, one per call, without acking (changing) it (a broker failover, an overloaded proxy).
* ``call_faults``: one per call, popped in order; ``("refused", status)`` fails the call before it does
  anything, ``("lost", status)`` does the work and then fails the call, so the answer is lost (a
  deadline that passed while the broker was applying it); ``("unconnected", UNAVAILABLE)`` fails it as
  grpc does when the channel never connected (the request never left).
"""

from __future__ import annotations

import asyncio
import os
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Message, _frames, _waiting


class FakeRpcError(grpc.RpcError):
    def __init__(self, status: grpc.StatusCode, details: str = "") -> None:
        super().__init__(status.name)
        self._status = status
        self._details = details or f"fake {status.name}"

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details


@dataclass
class FakeStub:
    live: set[str] = field(default_factory=set)
    acked: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    entry_faults: dict[str, list[int]] = field(default_factory=dict)
    call_faults: list[tuple[str, grpc.StatusCode]] = field(default_factory=list)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    renewals: int = 0

    def message(self, message_id: str, topic: str = "t") -> Message:
        handle = f"{message_id}@0"
        self.live.add(handle)
        return Message(b"x", topic=topic, message_id=message_id, receipt_handle=handle)

    def sent(self, method: str) -> list[Any]:
        return [request for name, request in self.calls if name == method]

    def _call(self, method: str, request: Any) -> grpc.StatusCode | None:
        """The status to fail with once the work is done ("lost"), if any."""
        self.calls.append((method, request))
        if not self.call_faults:
            return None
        how, status = self.call_faults.pop(0)
        if how == "refused":
            raise FakeRpcError(status)
        if how == "unconnected":
            raise FakeRpcError(status, "failed to connect to all addresses; last error: Connection refused")
        return status

    def _lose(self, lost: grpc.StatusCode | None) -> None:
        if lost is not None:
            raise FakeRpcError(lost)

    def Heartbeat(self, request: pb.HeartbeatRequest, **_: Any) -> pb.HeartbeatResponse:
        """What a client sends while it backs off after an Unavailable (it keeps the channel polled)."""
        return pb.HeartbeatResponse(status=v2.Status(code=v2.OK))

    def AckMessage(self, request: pb.AckMessageRequest, **_: Any) -> pb.AckMessageResponse:
        lost = self._call("AckMessage", request)
        entries = []
        for entry in request.entries:
            faults = self.entry_faults.get(entry.receipt_handle)
            if faults:
                code = faults.pop(0)
            elif entry.receipt_handle in self.live:
                self.live.remove(entry.receipt_handle)
                self.acked.append(entry.message_id)
                code = v2.OK
            else:
                code = v2.INVALID_RECEIPT_HANDLE
            entries.append(
                pb.AckMessageResultEntry(
                    message_id=entry.message_id,
                    receipt_handle=entry.receipt_handle,
                    status=v2.Status(code=code, message=v2.Code.Name(code)),
                )
            )
        self._lose(lost)
        codes = {e.status.code for e in entries}
        overall = entries[0].status if len(codes) == 1 else v2.Status(code=v2.MULTIPLE_RESULTS)
        return pb.AckMessageResponse(status=overall, entries=entries)

    def ChangeInvisibleDuration(
        self, request: pb.ChangeInvisibleDurationRequest, **_: Any
    ) -> pb.ChangeInvisibleDurationResponse:
        lost = self._call("ChangeInvisibleDuration", request)
        if request.receipt_handle not in self.live:
            return pb.ChangeInvisibleDurationResponse(status=v2.Status(code=v2.INVALID_RECEIPT_HANDLE, message="stale"))
        self.live.remove(request.receipt_handle)
        self.renewals += 1
        new = f"{request.message_id}@{self.renewals}"
        self.live.add(new)
        self._lose(lost)
        return pb.ChangeInvisibleDurationResponse(status=v2.Status(code=v2.OK), receipt_handle=new)

    def ChangeInvisibleMany(self, request: ext.ChangeInvisibleMany, **_: Any) -> ext.ChangeInvisibleManyResponse:
        """popgate's extension (the consumer's ``_ext`` stub): each entry changed as ChangeInvisibleDuration does."""
        lost = self._call("ChangeInvisibleMany", request)
        entries = []
        for entry in request.entries:
            faults = self.entry_faults.get(entry.receipt_handle)
            code, new = v2.INVALID_RECEIPT_HANDLE, ""
            if faults:
                code = faults.pop(0)
            elif entry.receipt_handle in self.live:
                self.live.remove(entry.receipt_handle)
                self.renewals += 1
                code, new = v2.OK, f"{entry.message_id}@{self.renewals}"
                self.live.add(new)
            entries.append(
                pb.AckMessageResultEntry(
                    message_id=entry.message_id,
                    receipt_handle=new,
                    status=v2.Status(code=code, message=v2.Code.Name(code)),
                )
            )
        self._lose(lost)
        return ext.ChangeInvisibleManyResponse(status=v2.Status(code=v2.MULTIPLE_RESULTS), entries=entries)

    def ForwardMessageToDeadLetterQueue(
        self, request: pb.ForwardMessageToDeadLetterQueueRequest, **_: Any
    ) -> pb.ForwardMessageToDeadLetterQueueResponse:
        lost = self._call("ForwardMessageToDeadLetterQueue", request)
        if request.receipt_handle not in self.live:
            return pb.ForwardMessageToDeadLetterQueueResponse(
                status=v2.Status(code=v2.INVALID_RECEIPT_HANDLE, message="stale")
            )
        self.live.remove(request.receipt_handle)
        self.dead_lettered.append(request.message_id)
        self._lose(lost)
        return pb.ForwardMessageToDeadLetterQueueResponse(status=v2.Status(code=v2.OK))


class AsyncStub:
    """The same fake, as a grpc.aio stub (each call a coroutine)."""

    def __init__(self, fake: FakeStub) -> None:
        self.fake = fake

    def __getattr__(self, method: str) -> Any:
        sync = getattr(self.fake, method)

        async def call(request: Any, **kwargs: Any) -> Any:
            return sync(request, **kwargs)

        return call


class UnimplementedCall(grpc.aio.AioRpcError):
    """A stream call to a server that has no such method: every read fails with UNIMPLEMENTED."""

    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(), "no such method")

    async def initial_metadata(self) -> grpc.aio.Metadata:  # type: ignore[override]  # a call's, not an error's
        return grpc.aio.Metadata()

    async def read(self) -> Any:
        raise self

    async def write(self, request: Any) -> None:
        return None

    def cancel(self) -> bool:
        return False


class FakeChannel:
    """A channel to a proxy that serves no Session stream (a RocketMQ proxy): the SDK's unary calls go to the fake
    stubs a test puts in place."""

    def stream_stream(self, method: str, **_: Any) -> Any:
        return lambda **__: UnimplementedCall()

    async def close(self) -> None:
        return None


class Callers:
    """Requests queued as the Session queues them, each with the future its caller awaits (no stream): the proxy
    said it takes receives of `receive_batch` messages; messages nobody waits for go to `orphaned`."""

    def __init__(self, receive_batch: int = 0, orphaned: Callable[[list[v2.Message]], None] | None = None) -> None:
        self.waiting = _waiting.Waiting(orphaned)
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.futures: dict[int, asyncio.Future[Any]] = {}
        self.receive_batch = receive_batch

    def request(self, kind: str, body: Any) -> int:
        future = asyncio.get_running_loop().create_future()
        request_id = self.waiting.add(kind, future)
        self.futures[request_id] = future
        self.outbox.put(_frames.encoded(request_id, kind, body, 3.0, self.receive_batch))
        return request_id

    def written(self) -> list[ext.SessionRequest]:
        """The requests of the next stream message the writer sends."""
        message, carried = _frames.with_queued(self.outbox.get(), self.outbox, self.waiting)
        assert carried is None and message is not None
        first = ext.SessionRequest.FromString(message)
        return [first, *first.more]


class SessionCall:
    """A Session call whose answers the test hands in (`answers`), and whose writes it sees (`written`)."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[Any] = asyncio.Queue()
        self.written: list[bytes] = []

    async def write(self, message: bytes) -> None:
        self.written.append(message)

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()

    async def read(self) -> Any:
        return await self.answers.get()

    def cancel(self) -> None:
        self.answers.put_nowait(grpc.aio.EOF)


class SessionChannel:
    """A channel whose Session stream is `call`."""

    def __init__(self, call: SessionCall | None = None) -> None:
        self.call = call or SessionCall()

    def stream_stream(self, method: str, **_: Any) -> Any:
        return lambda metadata: self.call

    async def close(self) -> None:
        return None


def closed_then_forked(client: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """`client` closed, then seen from a forked child (another pid): the channels it opens from now on, one True
    each."""
    client.close()
    connected: list[bool] = []
    client._connect = lambda: connected.append(True)
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)
    return connected
