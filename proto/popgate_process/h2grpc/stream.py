"""One call's HTTP/2 stream on popgate's gRPC server: its requests in (deframed, flow-controlled by reading),
its responses and status out (pending until the connection pumps them). Guarded by
tests/integration/process/test_h2grpc.py."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc

from popgate_process.h2grpc import call, wire

if TYPE_CHECKING:
    from popgate_process.h2grpc.connection import Connection

SEND_BUFFER = 1 << 20  # a call's unsent response bytes before its `send` waits
UNREAD_BOUND = 1 << 20  # a streaming call's whole requests unread before its client is made to wait
_EOF = object()
COMPACT_AFTER = 1024  # requests read from the front of a stream's inbox before they are deleted from it
Headers = list[tuple[bytes, bytes]]
RESPONSE_HEADERS: Headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class Stream:
    """One call's HTTP/2 stream: its requests in, its responses and status out."""

    def __init__(self, connection: Connection, stream_id: int, path: str, max_bytes: int, encoding: bytes) -> None:
        self._connection = connection
        self.id = stream_id
        self.path = path
        self.max_bytes = max_bytes
        self.deframer = wire.Deframer(max_bytes, encoding)
        # Requests not yet read, from `_head` on: a list, emptied when all are read, rather than a deque, which keeps a
        # block of its own while empty for as long as a held call lives (order and compaction:
        # tests/unit/process/test_h2grpc_stream.py::test_requests_come_out_in_order_and_the_read_ones_are_let_go).
        self.inbox: list[bytes | wire.Compressed | object] = []
        self._head = 0
        self._arrived: asyncio.Event | None = None
        self._unacked = 0  # flow-controlled bytes received and not yet given back to the stream's window
        self._unread = 0  # bytes of whole requests in the inbox
        self.headers_sent = False
        self.pending = bytearray()  # response bytes not yet given to HTTP/2 (flow control)
        self.handed = 0  # response bytes given to HTTP/2 so far
        self.flushing: list[tuple[int, asyncio.Future[None]]] = []  # `flushed` waiters: (bytes handed, future)
        self.trailers: Headers | None = None
        self._room: asyncio.Event | None = None
        self.finished = False  # a status is decided (sent or queued)
        self.reset = False  # the client went away, or the stream is gone
        self.ended = False  # the client ended its side
        self.unheard = False  # answered without its request (`H2Server`'s `unheard`): its bytes are dropped
        self.handler: grpc.RpcMethodHandler | None = None
        self.context: Any = None
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def draining(self) -> asyncio.Event:
        """Set once the stream's connection is told to go away (GOAWAY)."""
        return self._connection.draining

    # -- requests
    def received(self, data: bytes, flow_length: int) -> None:
        """Request bytes arrived. The stream's window takes them back (the client may send more) at once while the
        handler has less than UNREAD_BOUND of whole requests not yet read — a request larger than the stream's window
        completes so — and otherwise as it reads them (test_h2grpc.py::test_a_request_larger_than_the_window_arrives,
        test_a_handler_that_reads_nothing_stops_its_client): a call holds at most about UNREAD_BOUND + its window
        of whole requests unread, and besides them up to `max_bytes` of a request still arriving (kept until whole,
        as grpc-core keeps it: its bytes are given back as they arrive, or no request past the window would
        complete). The connection's window took them back as they arrived. A call whose status is decided keeps none
        of them; a unary call's second request is the call's error (INTERNAL), not kept either (test_h2grpc_raw.py::
        test_a_unary_call_that_sends_on_past_its_request_is_refused_and_keeps_nothing)."""
        self._unacked += flow_length
        if self.finished or self.unheard:
            self.acknowledge()
            return
        messages = self.deframer.feed(data)
        handler = self.handler
        if messages and handler is not None and not handler.request_streaming and len(self.inbox) + len(messages) > 1:
            self.acknowledge()
            raise wire.WireError(wire.INTERNAL, "a unary call carries one request message, not more")
        for message in messages:
            self._unread += len(message)
        self.inbox.extend(messages)
        if self._unread < UNREAD_BOUND or self.handler is None or not self.handler.request_streaming:
            self.acknowledge()
        if messages and self._arrived is not None:
            self._arrived.set()

    def end_of_requests(self) -> None:
        self.ended = True
        self.inbox.append(_EOF)
        if self._arrived is not None:
            self._arrived.set()

    async def read_bytes(self) -> bytes | None:
        """The next request (inflated: `inflated`), or None once the client ended its side; one that does not
        inflate ends the call with its status (test_h2grpc.py::test_compressed_calls_inflate_and_a_bomb_is_refused)."""
        inbox = self.inbox
        while self._head >= len(inbox):
            if self.reset:
                raise asyncio.CancelledError()
            if self._arrived is None:
                self._arrived = asyncio.Event()
            self._arrived.clear()
            await self._arrived.wait()
        item = inbox[self._head]
        self._head += 1
        if self._head == len(inbox):  # all read: the list gives its items' room back
            inbox.clear()
            self._head = 0
        elif self._head >= COMPACT_AFTER:
            del inbox[: self._head]
            self._head = 0
        if item is _EOF:
            return None
        self._unread -= len(item)  # type: ignore[arg-type]
        if self._unread < UNREAD_BOUND:
            self.acknowledge()
        if item.__class__ is wire.Compressed:
            return await self.inflated(item)
        return item  # type: ignore[return-value]

    async def inflated(self, message: wire.Compressed) -> bytes:
        """`message` inflated: on the loop when it is small (`wire.INLINE_BYTES`), else on one of the server's
        inflating threads, waiting for a place (holding only its compressed bytes) or refused RESOURCE_EXHAUSTED
        past the waiting bound —
        test_h2grpc.py::test_large_compressed_calls_wait_for_an_inflating_thread_and_past_the_bound_are_refused."""
        try:
            inflated = wire.inflate(message, self.max_bytes, wire.INLINE_BYTES)
            if inflated is None:
                job = functools.partial(wire.inflate, message, self.max_bytes)
                inflated = await self._connection.inflaters.run(job)
        except wire.WireError as exc:
            self.cut(exc.code, exc.message)
            raise asyncio.CancelledError() from None
        assert inflated is not None
        return inflated

    async def read(self) -> Any:
        message = await self.read_bytes()
        return grpc.aio.EOF if message is None else message

    def drop_buffers(self) -> None:
        """The stream is done: the bytes it holds go now (test_memory.py, a burst of 4 MiB sends)."""
        self.inbox.clear()
        self._head = 0
        self.pending = bytearray()
        self._unflushed()
        self.deframer = wire.Deframer(0)

    def acknowledge(self) -> None:
        """Every request byte received so far counts as read: the client may send as many more."""
        if self._unacked:
            self._connection.acknowledge(self.id, self._unacked)
            self._unacked = 0

    # -- responses
    async def send(self, message: bytes) -> None:
        if self.finished or self.reset:
            raise asyncio.CancelledError()  # grpc.aio's writes after the call ended fail too
        if not self.headers_sent:
            self.send_headers()
        self.pending += wire.frame(message)
        self._connection.later(self)
        while (len(self.pending) > SEND_BUFFER or self._connection.paused) and not self.reset:
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            self._connection.waiting.add(self)
            await self._room.wait()
        if self.reset:
            raise asyncio.CancelledError()

    def flushed(self) -> asyncio.Future[None] | None:
        """None when every response byte sent so far is given to HTTP/2 (at once if the client's flow-control
        window has room for them), else a future done once they are, cancelled if the stream ends first —
        test_h2grpc_raw.py::test_responses_are_flushed_only_as_far_as_the_clients_window_takes_them."""
        if self.reset:
            raise asyncio.CancelledError()
        if self.pending:
            self._connection.pump_now(self)
            if self.reset:
                raise asyncio.CancelledError()
        if not self.pending:
            return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.flushing.append((self.handed + len(self.pending), future))
        return future

    def settle(self) -> None:
        """More response bytes were given to HTTP/2 (`handed`): the `flushed` waiters they complete are done."""
        if self.flushing:
            waiting = []
            for target, future in self.flushing:
                if target > self.handed:
                    waiting.append((target, future))
                elif not future.done():
                    future.set_result(None)
            self.flushing = waiting

    def _unflushed(self) -> None:
        """The unsent responses are dropped: they never will be given to HTTP/2."""
        waiting, self.flushing = self.flushing, []
        for _, future in waiting:
            future.cancel()

    def send_headers(self, metadata: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """The response's headers (once; none after a status): grpc's, and `metadata` of the handler's."""
        if self.headers_sent or self.finished or self.reset:
            return
        self.headers_sent = True
        self._connection.h2.send_headers(self.id, RESPONSE_HEADERS + list(metadata) if metadata else RESPONSE_HEADERS)
        self._connection.flush_soon()

    def finish(
        self, code: int, message: str, trailing: Sequence[tuple[str, str | bytes]], http_status: bytes = b"200"
    ) -> None:
        """The call's status, sent once its pending responses are (`http_status`: a trailers-only answer's HTTP
        status, for a request that is not a gRPC call). Raises (the call left unfinished) if `trailing` does not
        encode."""
        if self.finished or self.reset:
            return
        trailers = wire.status(code, message, trailing)
        self.finished = True  # the deadline's timer stays armed until the trailers go to h2 (`expire`)
        if not self.headers_sent and not self.pending:
            self.headers_sent = True
            head = RESPONSE_HEADERS if http_status == b"200" else [(b":status", http_status), *RESPONSE_HEADERS[1:]]
            self.trailers = head + trailers  # trailers-only
        else:
            self.trailers = trailers
        self._connection.later(self)

    def wake(self) -> None:
        if self._room is not None:
            self._room.set()

    def gone(self) -> None:
        """The stream is reset or its connection lost: the handler is cancelled, nothing more is sent."""
        self.reset = True
        self.pending.clear()
        self._unflushed()
        self.wake()
        if self._arrived is not None:
            self._arrived.set()
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def expire(self) -> None:
        """The deadline passed: DEADLINE_EXCEEDED now, and the handler is cancelled. A status decided whose answer
        still waits for the client's window is replaced by it, the unsent bytes dropped, so the call ends and frees
        its place (test_h2grpc_raw_calls.py::test_an_answer_the_clients_window_never_takes_ends_at_its_deadline)."""
        if self.finished and not self.reset and self.pending and self.trailers is not None:
            self.pending.clear()
            self._unflushed()
            self.trailers = wire.status(call.DEADLINE_EXCEEDED, "Deadline Exceeded")  # the headers went with data
            self._connection.later(self)
            return
        self.cut(call.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def cut(self, code: int, message: str) -> None:
        """The call ends now with this status, its unsent responses dropped, and the handler is cancelled."""
        if self.finished or self.reset:
            return
        self.pending.clear()
        self._unflushed()
        self.finish(code, message, ())
        if self.task is not None and not self.task.done():
            self.task.cancel()
