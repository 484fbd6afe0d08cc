"""popgate's own gRPC server: HTTP/2 by the h2 library on an asyncio protocol, one process thread.

Why not grpc's: grpc-python hands each response message to its core as an operation of its own (~45 µs each
on our hosts), so a receive of 32 messages costs 32 of them. Here a message a handler sends is appended to its
stream's pending bytes, and every stream's bytes go to the socket in one write when the loop next turns: a
receive's frames leave together, and answers of many calls share a write. Reading is the loop's own, with no
completion thread between the socket and the handler.

Bounds: calls at once (`max_calls`, then RESOURCE_EXHAUSTED before any handler), a request message
(`max_receive_bytes`), a streaming call's unread requests (HTTP/2 flow control: a request's bytes are
acknowledged when its handler takes it), a call's unsent responses (`send` waits past `SEND_BUFFER`, and while
the socket's buffer is full). Guarded by tests/integration/process/test_h2grpc.py.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Sequence
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
from h2.errors import ErrorCodes

from popgate_process.h2grpc import call, wire

log = logging.getLogger(__name__)

UNKNOWN_CONTENT = 2  # grpc's UNKNOWN, for a request that is not gRPC's
SEND_BUFFER = 1 << 20  # a call's unsent response bytes before its `send` waits
STREAM_WINDOW = 1 << 20  # what a client may send on a stream before its bytes are acknowledged
CONNECTION_WINDOW = 16 << 20
MAX_FRAME = 1 << 20  # the largest DATA frame a client may send us
_EOF = object()
_Headers = list[tuple[bytes, bytes]]
_RESPONSE_HEADERS: _Headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class Stream:
    """One call's HTTP/2 stream: its requests in, its responses and status out."""

    def __init__(self, connection: Connection, stream_id: int, path: str, max_bytes: int, encoding: bytes) -> None:
        self._connection = connection
        self.id = stream_id
        self.path = path
        self.peer = connection.peer
        self.deframer = wire.Deframer(max_bytes, encoding)
        self.inbox: deque[bytes | object] = deque()
        self._arrived: asyncio.Event | None = None
        self._unacked = 0  # flow-controlled bytes received and not yet acknowledged
        self.streaming_requests = False
        self.headers_sent = False
        self.pending = bytearray()  # response bytes not yet given to HTTP/2 (flow control)
        self.trailers: _Headers | None = None
        self._room: asyncio.Event | None = None
        self.finished = False  # a status is decided (sent or queued)
        self.reset = False  # the client went away, or the stream is gone
        self.ended = False  # the client ended its side
        self.handler: grpc.RpcMethodHandler | None = None
        self.context: Any = None
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    # -- requests
    def received(self, data: bytes, flow_length: int) -> None:
        self._unacked += flow_length
        messages = self.deframer.feed(data)
        if not self.streaming_requests:
            self._acknowledge()
        self.inbox.extend(messages)
        if messages and self._arrived is not None:
            self._arrived.set()

    def end_of_requests(self) -> None:
        self.ended = True
        self.inbox.append(_EOF)
        if self._arrived is not None:
            self._arrived.set()

    async def read_bytes(self) -> bytes | None:
        while not self.inbox:
            if self.reset:
                raise asyncio.CancelledError()
            if self._arrived is None:
                self._arrived = asyncio.Event()
            self._arrived.clear()
            await self._arrived.wait()
        item = self.inbox.popleft()
        self._acknowledge()
        return None if item is _EOF else item  # type: ignore[return-value]

    async def read(self) -> Any:
        message = await self.read_bytes()
        return grpc.aio.EOF if message is None else message

    def release_unread(self) -> None:
        if self._unacked:
            self._connection.acknowledge(self.id, self._unacked)
            self._unacked = 0

    def _acknowledge(self) -> None:
        if self._unacked and not self.reset:
            self._connection.acknowledge(self.id, self._unacked)
            self._unacked = 0

    # -- responses
    async def send(self, message: bytes) -> None:
        if self.finished or self.reset:
            raise asyncio.CancelledError()  # grpc.aio's writes after the call ended fail too
        if not self.headers_sent:
            self.headers_sent = True
            self._connection.h2.send_headers(self.id, _RESPONSE_HEADERS)
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

    def finish(self, code: int, message: str, trailing: Sequence[tuple[str, str | bytes]]) -> None:
        if self.finished or self.reset:
            return
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
        trailers = wire.status(code, message, trailing)
        if not self.headers_sent and not self.pending:
            self.headers_sent = True
            self.trailers = _RESPONSE_HEADERS + trailers  # trailers-only
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
        self.wake()
        if self._arrived is not None:
            self._arrived.set()
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def expire(self) -> None:
        """The deadline passed: DEADLINE_EXCEEDED now, and the handler is cancelled."""
        if self.finished or self.reset:
            return
        self.pending.clear()
        self.finish(call.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
        if self.task is not None and not self.task.done():
            self.task.cancel()


class _H2Connection(h2.connection.H2Connection):
    """h2's connection, except that a client's GOAWAY ends no call it had started: HTTP/2 lets the streams up to
    its last id finish (RFC 9113 6.8), while h2 would close the whole connection and drop what was queued for them
    (test_h2grpc.py::test_a_client_going_away_still_gets_its_running_calls_answered)."""

    def _receive_goaway_frame(self, frame: hyperframe.frame.GoAwayFrame) -> tuple[list[Any], list[Any]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.errors._error_code_from_int(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class Connection(asyncio.Protocol):
    """One client connection: HTTP/2 by h2, every call's output written once per loop turn."""

    def __init__(self, server: H2Server) -> None:
        self._server = server
        config = h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        self.h2 = _H2Connection(config)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1 << 20,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME,
            },
        )
        self.h2.max_inbound_frame_size = MAX_FRAME  # h2 takes it from settings it changed itself, not these
        self.streams: dict[int, Stream] = {}
        self.waiting: set[Stream] = set()  # streams whose output waits for flow control or the socket
        self.paused = False
        self.going_away = False
        self.peer = ""
        self._transport: asyncio.Transport | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._dirty: set[Stream] = set()  # streams with output to pump when the loop next turns
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=SEND_BUFFER)
        address = transport.get_extra_info("peername")
        self.peer = f"ipv4:{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._server.connections.add(self)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        for stream in list(self.streams.values()):
            self._remove(stream)
            stream.gone()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_waiting()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.info("HTTP/2 protocol error from %s, connection closed: %s", self.peer, exc)
            self._flush()
            if self._transport is not None:
                self._transport.close()
            return
        for event in events:
            self._event(event)
        self._flush()

    def _event(self, event: Any) -> None:  # dispatched on its exact class: h2.events are final
        kind = type(event)
        if kind is h2.events.DataReceived:
            stream = self.streams.get(event.stream_id)
            if stream is None:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                return
            try:
                stream.received(event.data, event.flow_controlled_length)
            except wire.WireError as exc:
                self._refuse(stream, exc)
                return
            if event.stream_ended is not None:
                self._requests_ended(stream)
        elif kind is h2.events.RequestReceived:
            self._server.begin(self, event.stream_id, event.headers, ended=event.stream_ended is not None)
        elif kind is h2.events.StreamEnded:
            stream = self.streams.get(event.stream_id)
            if stream is not None and not stream.ended:
                self._requests_ended(stream)
        elif kind is h2.events.StreamReset:
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                self._remove(stream)
                stream.gone()
        elif kind is h2.events.WindowUpdated or kind is h2.events.RemoteSettingsChanged:
            self._wake_waiting()
        elif kind is h2.events.ConnectionTerminated:
            # The client starts no more calls here; those it started go on unless it says something went wrong.
            self.going_away = True
            if event.error_code != ErrorCodes.NO_ERROR or not self.streams:
                self.close()

    def _requests_ended(self, stream: Stream) -> None:
        stream.end_of_requests()
        if stream.task is None:  # a unary request complete: its handler starts now
            self._server.run(stream)

    def _refuse(self, stream: Stream, exc: wire.WireError) -> None:
        stream.finish(exc.code, exc.message, ())
        if stream.task is not None:
            stream.task.cancel()

    def register(self, stream: Stream) -> None:
        self.streams[stream.id] = stream
        self._server.calls += 1

    def _remove(self, stream: Stream) -> None:
        self.waiting.discard(stream)
        if self.streams.pop(stream.id, None) is not None:
            self._server.calls -= 1
            # Bytes of requests its handler never read: the connection's window must not shrink by them
            # (test_h2grpc.py::test_requests_a_handler_left_unread_do_not_close_the_connections_window).
            stream.release_unread()

    def acknowledge(self, stream_id: int, length: int) -> None:
        try:
            self.h2.acknowledge_received_data(length, stream_id)
        except h2.exceptions.ProtocolError:  # the stream closed meanwhile: h2 keeps the connection's window
            return
        self.flush_soon()

    def pump(self, stream: Stream) -> None:
        """Give the stream's pending bytes to HTTP/2 as far as flow control allows, then its trailers."""
        if stream.reset:
            return
        h2c = self.h2
        pending = stream.pending
        if pending:
            window = h2c.local_flow_control_window(stream.id)
            limit = h2c.max_outbound_frame_size
            while pending and window > 0:
                size = min(window, limit, len(pending))
                h2c.send_data(stream.id, bytes(pending[:size]))
                del pending[:size]
                window -= size
            if pending:
                self.waiting.add(stream)
        if not pending and stream.trailers is not None:
            h2c.send_headers(stream.id, stream.trailers, end_stream=True)
            stream.trailers = None
            self._closed(stream)
        if len(pending) <= SEND_BUFFER and not self.paused:
            stream.wake()
        self.flush_soon()

    def _closed(self, stream: Stream) -> None:
        """The status is sent: the stream is done here; a client still sending is told to stop."""
        self._remove(stream)
        if not stream.ended:
            try:
                self.h2.reset_stream(stream.id, ErrorCodes.NO_ERROR)
            except h2.exceptions.ProtocolError:
                pass
        if self.going_away and not self.streams:
            self._flush()
            self.close()

    def _wake_waiting(self) -> None:
        for stream in list(self.waiting):
            self.waiting.discard(stream)
            self.pump(stream)

    def later(self, stream: Stream) -> None:
        """Pump the stream when the loop next turns: what its handler sends meanwhile goes as one DATA frame."""
        self._dirty.add(stream)
        self.flush_soon()

    def flush_soon(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            for stream in dirty:
                self.pump(stream)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        data = self.h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def go_away(self) -> None:
        """No new calls on this connection (GOAWAY; later streams are refused, which clients retry elsewhere);
        the calls running go on. Written past h2, whose own GOAWAY would close the connection for them too."""
        self.going_away = True
        frame = hyperframe.frame.GoAwayFrame(0)
        frame.last_stream_id = self.h2.highest_inbound_stream_id
        self._flush()
        if self._transport is not None:
            self._transport.write(frame.serialize())

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class H2Server:
    """A gRPC server for the handlers the generated `add_*_to_server` functions register (the subset of
    grpc.aio.Server they call), served by `Connection`s."""

    def __init__(self, *, max_calls: int, max_receive_bytes: int) -> None:
        self._methods: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self._max_calls = max_calls
        self._max_receive = max_receive_bytes
        self._server: asyncio.Server | None = None
        self.connections: set[Connection] = set()
        self.calls = 0
        self._tasks: set[asyncio.Task[None]] = set()

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
            connection.h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            connection._remove(stream)
            return
        if not fields.get(b"content-type", b"").startswith(b"application/grpc"):
            return stream.finish(UNKNOWN_CONTENT, "not a gRPC request (content-type)", ())
        if self.calls > self._max_calls:
            return stream.finish(wire.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!", ())
        handler = self._handler(path)
        if handler is None:
            return stream.finish(wire.UNIMPLEMENTED, "Method not found!", ())
        deadline = None
        if (timeout := fields.get(b"grpc-timeout")) is not None:
            try:
                deadline = asyncio.get_running_loop().time() + wire.timeout_s(timeout)
            except wire.WireError as exc:
                return stream.finish(exc.code, exc.message, ())
            stream.timer = asyncio.get_running_loop().call_at(deadline, stream.expire)
        stream.handler = handler
        stream.context = call.Context(stream, wire.metadata(headers), deadline)
        stream.streaming_requests = handler.request_streaming
        if handler.request_streaming or ended:
            self.run(stream)

    def run(self, stream: Stream) -> None:
        """Start the call's handler: a streaming call's at once, a unary call's with its one request."""
        if stream.handler is None or stream.finished or stream.reset:
            return
        first = None
        if not stream.handler.request_streaming:
            messages = [m for m in stream.inbox if m.__class__ is bytes]
            if len(messages) != 1 or stream.deframer.pending:
                return stream.finish(
                    wire.INTERNAL, f"a unary call carries one request message, not {len(messages)}", ()
                )
            first = messages[0]
        task = asyncio.get_running_loop().create_task(call.run(stream, stream.handler, stream.context, first))
        stream.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, grace: float | None) -> None:
        """Take no more connections or calls; let the calls running end within `grace` seconds, then cancel them."""
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
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()


class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]  # grpc has no types
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()
