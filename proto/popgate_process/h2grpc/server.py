"""popgate's own gRPC server: HTTP/2 by the h2 library on an asyncio protocol, one process thread.

Why not grpc's: grpc-python hands each response message to its core as an operation of its own, so a receive
of 32 messages costs 32 of them (what that costs: docs/PROXY.md, "Server"). Here a message a handler sends is
appended to its stream's pending bytes, and every stream's bytes go to the socket in one write when the loop next
turns: a receive's frames leave together, and answers of many calls share a write. Reading is the loop's own, with no
completion thread between the socket and the handler.

Bounds: calls at once (`max_calls`, then RESOURCE_EXHAUSTED before any handler), a request message
(`max_receive_bytes`), a streaming call's unread requests (HTTP/2 flow control: a request's bytes are
acknowledged when its handler takes it), a call's unsent responses (`send` waits past `SEND_BUFFER`, and while
the socket's buffer is full). Guarded by tests/integration/process/test_h2grpc.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Collection, Sequence
from typing import Any

import grpc
import h2.exceptions
from h2.errors import ErrorCodes

from popgate_process.bounded_threads import BoundedThreads
from popgate_process.h2grpc import call, wire
from popgate_process.h2grpc.connection import Connection
from popgate_process.h2grpc.stream import Stream
from popgate_process.throttled import Throttled

log = logging.getLogger(__name__)

RECEIVE_BUFFER = 256 << 10  # the most one read takes from a connection's socket, as asyncio's own reads
UNKNOWN_CONTENT = 2  # grpc's UNKNOWN, for a request that is not gRPC's
KEEPALIVE_S, KEEPALIVE_TIMEOUT_S = 7200.0, 20.0  # grpc-core's server defaults (keepalive_time, keepalive_timeout)
MAX_CONNECTION_AGE_GRACE_S = 60.0  # past the longest long poll (30 s)
Metadata = tuple[tuple[str, str | bytes], ...]  # a call's, as `wire.metadata` reads it
INFLATE_THREADS = 2  # this machine's cores: more threads would only queue for them
INFLATE_WAITING = 64  # compressed requests waiting for a thread, each holding only its compressed bytes


class H2Server:
    """A gRPC server for the handlers the generated `add_*_to_server` functions register (the subset of
    grpc.aio.Server they call), served by `Connection`s."""

    def __init__(
        self,
        *,
        max_calls: int,
        max_receive_bytes: int,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        keepalive_s: float = KEEPALIVE_S,
        keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S,
        max_connection_age_s: float = 0.0,
        max_connection_age_grace_s: float = MAX_CONNECTION_AGE_GRACE_S,
        age_exempt: Collection[str] = (),
        unheard: Callable[[str, Metadata], Metadata | None] | None = None,
    ) -> None:
        """`keepalive_s`: a connection silent this long is sent a PING, and closed if nothing comes back within
        `keepalive_timeout_s` (a client gone without closing: its calls and buffers go with it).
        `max_connection_age_s` (0: never): a connection this old is told to go away (GOAWAY) and closes once its
        calls end, or after `max_connection_age_grace_s` with them, as grpc-core's `grpc.max_connection_age_ms` —
        except calls of the `age_exempt` paths (a client's one long-lived stream), which last until their client ends
        them. `unheard(path, metadata)` (settable later): for a call with one request to answer at its headers, not
        reading the request, the metadata its handler is to see (saying why it refuses the call, as for credentials
        that do not verify), else None: its handler runs at once with that metadata and the empty message, and the
        request's bytes are dropped as they come, so such calls hold no place and no bytes while their requests
        arrive — test_h2grpc_raw_calls.py::
        test_calls_answered_at_their_headers_hold_no_place_while_their_requests_arrive."""
        self.unheard = unheard
        # Compressed requests too large to inflate on the loop (`Stream.inflated`): as many inflate as there are
        # threads, INFLATE_WAITING more wait their turn, later ones are refused.
        self.inflaters = BoundedThreads(
            threads=INFLATE_THREADS,
            places=INFLATE_THREADS,
            waiting=INFLATE_WAITING,
            refused=lambda why: wire.WireError(
                wire.RESOURCE_EXHAUSTED, f"the server is already inflating {INFLATE_THREADS} compressed requests {why}"
            ),
            name="h2grpc-inflate",
        )
        self.keepalive_s = keepalive_s
        self.keepalive_timeout_s = keepalive_timeout_s
        self.max_connection_age_s = max_connection_age_s
        self.max_connection_age_grace_s = max_connection_age_grace_s
        self.age_exempt = frozenset(age_exempt)
        self._interceptors = tuple(interceptors)
        self._methods: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self.max_calls = max_calls
        self._max_receive = max_receive_bytes
        self._server: asyncio.Server | None = None
        self.connections: set[Connection] = set()
        self.calls = 0
        # A connection closed for an HTTP/2 protocol error (a client that is not HTTP/2: an HTTP/1.1 request, a port
        # scan) is a line at most every 10 s, with the count, whatever the rate of such connections —
        # test_h2grpc_raw_calls.py::test_connections_that_do_not_speak_http2_log_a_line_now_and_then_not_each
        self.protocol_error = Throttled(log.info)
        self._tasks: set[asyncio.Task[None]] = set()
        # every connection's reads land here and are copied out at once: one loop, one read at a time
        self.inbox = memoryview(bytearray(RECEIVE_BUFFER))

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            self._methods[f"/{service}/{name}"] = handler

    def _handler(self, path: str) -> grpc.RpcMethodHandler | None:
        handler = self._methods.get(path)
        if handler is None:
            details = _CallDetails(path)
            for generic in self._generic:
                if (handler := generic.service(details)) is not None:
                    self._methods[path] = handler
                    break
        return handler

    async def bind(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Bind the port (0: a free one, returned); calls are taken from `start` on."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), host or None, port, ssl=tls, start_serving=False
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        assert self._server is not None, "bind first"
        await self._server.start_serving()

    def begin(self, connection: Connection, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        """A call's headers arrived: refuse it, or make its stream (a streaming call's handler starts now, a unary
        one's once its request is complete)."""
        fields = dict(headers)
        path = fields.get(b":path", b"").decode("ascii", errors="replace")
        stream = Stream(connection, stream_id, path, self._max_receive, fields.get(b"grpc-encoding", b"identity"))
        connection.register(stream)
        if ended:
            stream.end_of_requests()
        if connection.going_away:
            # A stream the client reset in the same read is closed already: nothing to refuse (an error here would
            # end the whole connection, its running calls unanswered) — test_h2grpc_raw.py::
            # test_a_new_stream_reset_as_it_comes_on_a_connection_going_away_costs_only_itself.
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                connection.h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            connection.remove(stream)
            return
        # A request that is no gRPC call gets an HTTP error, as gRPC's HTTP/2 protocol asks, not a 200 that an
        # HTTP client would take for success — test_h2grpc_raw.py::test_a_request_that_is_not_grpc_gets_an_http_error.
        if fields.get(b":method") != b"POST":
            return stream.finish(UNKNOWN_CONTENT, "not a gRPC request (method)", (), http_status=b"405")
        if not fields.get(b"content-type", b"").startswith(b"application/grpc"):
            return stream.finish(UNKNOWN_CONTENT, "not a gRPC request (content-type)", (), http_status=b"415")
        if self.calls > self.max_calls:
            return stream.finish(wire.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!", ())
        handler = self._handler(path)
        if handler is None:
            return stream.finish(wire.UNIMPLEMENTED, "Method not found!", ())
        try:
            invocation_metadata = wire.metadata(headers)
        except wire.WireError as exc:
            return stream.finish(exc.code, exc.message, ())
        deadline = None
        if (timeout := fields.get(b"grpc-timeout")) is not None:
            try:
                timeout_s = wire.timeout_s(timeout)
            except wire.WireError as exc:
                return stream.finish(exc.code, exc.message, ())
            if timeout_s <= 0:  # past already: its handler never runs (test_h2grpc_raw.py::
                # test_a_call_whose_deadline_is_zero_ends_deadline_exceeded)
                return stream.finish(call.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
            deadline = asyncio.get_running_loop().time() + timeout_s
            stream.timer = asyncio.get_running_loop().call_at(deadline, stream.expire)
        stream.handler = handler
        told = None
        if not handler.request_streaming and self.unheard is not None:
            told = self.unheard(path, invocation_metadata)
        stream.context = call.Context(stream, invocation_metadata if told is None else told, deadline)
        if told is not None:
            stream.unheard = True  # answered without its request, whose bytes are dropped as they come
            self.run(stream)
        elif handler.request_streaming or ended:
            self.run(stream)

    def run(self, stream: Stream) -> None:
        """Start the call's handler: a streaming call's at once, a unary call's with its one request."""
        if stream.handler is None or stream.finished or stream.reset:
            return
        first: bytes | wire.Compressed | None = None
        if stream.unheard:
            first = b""  # the request's empty message
        elif not stream.handler.request_streaming:
            messages = [m for m in stream.inbox if m.__class__ is bytes or m.__class__ is wire.Compressed]
            if len(messages) != 1 or stream.deframer.pending:
                return stream.finish(
                    wire.INTERNAL, f"a unary call carries one request message, not {len(messages)}", ()
                )
            first = messages[0]
            stream.inbox.clear()  # the request lives as long as its handler needs it, no longer
        if self._interceptors:
            running = self._intercepted(stream, stream.handler, first)
        else:
            running = call.run(stream, stream.handler, stream.context, first)
        task = asyncio.get_running_loop().create_task(running)
        stream.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _intercepted(
        self, stream: Stream, handler: grpc.RpcMethodHandler, first: bytes | wire.Compressed | None
    ) -> None:
        """The call run by the handler the interceptors give (as grpc.aio's server applies them: the first
        outermost); one of the same shape, as `handler`'s flags decided how its requests are read."""
        details = _CallDetails(stream.path, stream.context.invocation_metadata())
        try:
            for interceptor in reversed(self._interceptors):
                handler = await interceptor.intercept_service(_Continuation(handler), details)
        except Exception as exc:  # UNKNOWN, as grpc.aio answers it, and the call's place given back (test_h2grpc.py::
            # test_a_failing_interceptor_or_trailer_answers_unknown_and_frees_the_call)
            log.exception("an interceptor of %s failed", stream.path)
            return stream.finish(call.UNKNOWN, f"Unexpected {type(exc)}: {exc}", ())
        if handler is None:
            return stream.finish(wire.UNIMPLEMENTED, "Method not found!", ())
        await call.run(stream, handler, stream.context, first)

    async def stop(self, grace: float | None) -> None:
        """Take no more connections or calls; let the calls running end within `grace` seconds, then cancel them.
        Returns with every connection closed
        (test_h2grpc_raw.py::test_a_stopped_server_has_closed_every_connection_even_one_that_reads_nothing)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away()
        if grace and self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        closing = list(self.connections)
        for connection in closing:
            connection.close()
        if closing:  # each close completes as the loop turns; a client that reads nothing is not waited for
            _, still_open = await asyncio.wait([connection.lost for connection in closing], timeout=1.0)
            if still_open:
                for connection in closing:
                    connection.abort()
                await asyncio.wait(still_open, timeout=1.0)
        if self._server is not None:
            await self._server.wait_closed()
        self.inflaters.close()


class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]  # grpc has no types
    def __init__(self, method: str, metadata: Any = ()) -> None:
        self.method = method
        self.invocation_metadata = metadata


class _Continuation:
    def __init__(self, handler: grpc.RpcMethodHandler) -> None:
        self._handler = handler

    async def __call__(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return self._handler
