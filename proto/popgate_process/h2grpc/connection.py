"""One client connection of popgate's gRPC server: HTTP/2 by h2 on an asyncio protocol, every call's output
handed to h2 when the loop next turns and written to the socket at once. Guarded by
tests/integration/process/test_h2grpc.py and test_h2grpc_raw.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import TYPE_CHECKING, Any

import h2.config
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
from h2.errors import ErrorCodes

from popgate_process.h2grpc import wire
from popgate_process.h2grpc.h2conn import H2Connection, HeaderBoundBuffer
from popgate_process.h2grpc.stream import SEND_BUFFER, Stream

if TYPE_CHECKING:
    from popgate_process.bounded_threads import BoundedThreads
    from popgate_process.h2grpc.server import H2Server

log = logging.getLogger(__name__)

STREAM_WINDOW = 1 << 20  # what a client may send on a stream before its bytes are acknowledged
CONNECTION_WINDOW = 16 << 20
MAX_FRAME = 1 << 20  # the largest DATA frame a client may send us
# Calls a client may cancel while they run (RST_STREAM), at once and then a second (nghttp2's defaults): a "rapid
# reset" flood (open a call, cancel it, again) costs the server a handler start each and is not served. The burst
# is never below the server's call bound, so a client may always cancel every call it holds at once.
RESET_BURST, RESET_RATE = 1000, 33


class Connection(asyncio.BufferedProtocol):
    """One client connection: HTTP/2 by h2, every call's output written once per loop turn. Its bytes are read
    into the server's one receive buffer (`get_buffer`), not a new 256 KiB bytes object per read as asyncio's
    `Protocol` reads them."""

    def __init__(self, server: H2Server) -> None:
        self._server = server
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
            validate_inbound_headers=False,  # validated by H2Connection: a malformed request is its stream's error
        )
        self.h2 = H2Connection(config)
        self.h2.incoming_buffer = HeaderBoundBuffer(server=True)
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
        self._resets = wire.ResetAllowance(max(RESET_BURST, server.max_calls), RESET_RATE)
        self.calmed = False  # closed for cancelling too many calls: its further frames are not read
        self._heard = True  # the client sent something since the last keepalive check
        self._pinged = False  # a keepalive PING is out, unanswered
        self._keepalive: asyncio.TimerHandle | None = None
        self.lost: asyncio.Future[None] = self._loop.create_future()  # done once the connection is closed
        self.draining = asyncio.Event()  # set once the client is told to take new calls elsewhere (GOAWAY)
        self._aging: asyncio.TimerHandle | None = None

    @property
    def inflaters(self) -> BoundedThreads:
        """The server's threads for compressed requests too large to inflate on the loop (`Stream.inflated`)."""
        return self._server.inflaters

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
        self._keepalive = self._loop.call_later(self._server.keepalive_s, self._check_alive)
        if (age := self._server.max_connection_age_s) > 0:  # spread ±10 %, so connections made together age apart
            self._aging = self._loop.call_later(age * random.uniform(0.9, 1.1), self._aged)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        if not self.lost.done():
            self.lost.set_result(None)
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._aging is not None:
            self._aging.cancel()
        for stream in list(self.streams.values()):
            self.remove(stream)
            stream.gone()
        self.h2.forget()

    def pause_writing(self) -> None:
        """The socket's send buffer is full (the client reads slower than we write): read none of its frames until it
        drains. Each would queue an answer of ours past the bound (a PING's, a SETTINGS ack, a RST_STREAM) —
        test_h2grpc_raw.py::test_a_client_that_reads_nothing_cannot_grow_the_servers_output_with_pings."""
        self.paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
        self._wake_waiting()
        self.flush_soon()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._server.inbox

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._server.inbox[:nbytes].tobytes())  # copied out before the buffer's next read

    def data_received(self, data: bytes) -> None:
        self._heard = True
        if self.calmed:
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._server.protocol_error("HTTP/2 protocol error from %s, connection closed: %s", self.peer, exc)
            self._flush()
            if self._transport is not None:
                self._transport.close()
            return
        for event in events:
            if self.calmed:
                return
            self._event(event)
        self._flush()

    def _event(self, event: Any) -> None:  # dispatched on its exact class: h2.events are final
        kind = type(event)
        if kind is h2.events.DataReceived:
            self.h2.acknowledge_connection(event.flow_controlled_length)
            stream = self.streams.get(event.stream_id)
            if stream is None:
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
                self.remove(stream)
                stream.gone()
                if not stream.finished and not self._resets.spend(self._loop.time()):
                    self._calm()
                elif self.going_away and not self.streams:  # its last call: it closes, as when one ends
                    self.close()
        elif kind is h2.events.WindowUpdated or kind is h2.events.RemoteSettingsChanged:
            self._wake_waiting()
        elif kind is h2.events.ConnectionTerminated:
            # The client starts no more calls here; those it started go on unless it says something went wrong.
            self.going_away = True
            if event.error_code != ErrorCodes.NO_ERROR or not self.streams:
                self.close()

    def _check_alive(self) -> None:
        """Every `keepalive_s`: a client silent since the last check is sent a PING; one silent since the PING, for
        `keepalive_timeout_s`, is gone (test_h2grpc_raw.py::test_a_client_that_answers_no_ping_loses_its_connection)."""
        if self._transport is None:
            return
        server = self._server
        if self._heard:
            self._heard = self._pinged = False
            self._keepalive = self._loop.call_later(server.keepalive_s, self._check_alive)
        elif not self._pinged:
            self._pinged = True
            try:
                self.h2.ping(b"popgate!")
            except h2.exceptions.ProtocolError:  # the connection is closing already
                return
            self._flush()
            self._keepalive = self._loop.call_later(server.keepalive_timeout_s, self._check_alive)
        else:
            log.info("%s answered no keepalive PING in %s s: connection closed", self.peer, server.keepalive_timeout_s)
            self._transport.abort()

    def _aged(self) -> None:
        """`max_connection_age_s` passed: GOAWAY, so the client makes its next calls on a new connection (to any
        proxy behind the same address); the calls running may end within `max_connection_age_grace_s`, then the
        connection closes with them
        (test_h2grpc_raw.py::test_an_aged_connection_is_told_to_go_away_and_closes_after_its_calls)."""
        if self._transport is None or self.going_away:
            return
        self.go_away()
        if not self.streams:
            self.close()
            return
        self._aging = self._loop.call_later(self._server.max_connection_age_grace_s, self._grace_over)

    def _grace_over(self) -> None:
        """The calls still running end with the connection, except those of the server's `age_exempt` paths: they
        last until their client ends them, and the connection closes then (test_h2grpc.py::
        test_a_call_exempt_from_connection_age_outlives_the_grace_while_new_calls_go_to_a_new_connection)."""
        if self._transport is None:
            return
        cut = [stream for stream in self.streams.values() if stream.path not in self._server.age_exempt]
        if len(cut) == len(self.streams):
            log.info("%s: %d calls still running past the connection's age and grace: closed", self.peer, len(cut))
            self._transport.abort()
            return
        kept = len(self.streams) - len(cut)
        log.info("%s: past the connection's age and grace: %d calls cut, %d kept", self.peer, len(cut), kept)
        for stream in cut:  # UNAVAILABLE, as the connection's close told them; one only slow to read its end is reset
            if stream.finished:
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.h2.reset_stream(stream.id, ErrorCodes.CANCEL)
                self.remove(stream)
                stream.gone()
            stream.cut(wire.UNAVAILABLE, "the connection is past its age and grace")
        self._flush()

    def _calm(self) -> None:
        """The client cancels calls faster than its allowance: GOAWAY (ENHANCE_YOUR_CALM) and the connection closes,
        its running calls cancelled (test_h2grpc_raw.py::test_a_client_that_floods_resets_loses_its_connection)."""
        log.warning(
            "%s cancelled calls faster than %s a second (rapid reset?): connection closed", self.peer, RESET_RATE
        )
        self.calmed = True
        self.h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM, last_stream_id=self.h2.highest_inbound_stream_id)
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

    def remove(self, stream: Stream) -> None:
        self.waiting.discard(stream)
        if self.streams.pop(stream.id, None) is not None:
            self._server.calls -= 1
            if stream.timer is not None:
                stream.timer.cancel()
            stream.drop_buffers()  # a stream lingers in reference cycles (its context, its task) until the next GC
            if stream.context is not None:
                stream.context.ended()

    def acknowledge(self, stream_id: int, length: int) -> None:
        """The handler read `length` bytes of the stream's requests: its window takes them back (the connection's
        took them as they arrived, `H2Connection.acknowledge_connection`)."""
        self.h2.acknowledge_stream(length, stream_id)
        if self.h2._data_to_send:  # h2 sends WINDOW_UPDATE once half a window is read, not per request
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
            before = len(pending)
            while pending and window > 0:
                size = min(window, limit, len(pending))
                h2c.send_data(stream.id, bytes(pending[:size]))
                del pending[:size]
                window -= size
            stream.handed += before - len(pending)
            if stream.flushing:
                stream.settle()
            if pending:
                self.waiting.add(stream)
        if not pending and stream.trailers is not None:
            h2c.send_headers(stream.id, stream.trailers, end_stream=True)
            stream.trailers = None
            self._closed(stream)
        if len(pending) <= SEND_BUFFER and not self.paused:
            stream.wake()

    def _pump_or_drop(self, stream: Stream) -> None:
        """`pump`, and a stream h2 will no longer send on (a state it did not tell of) ends like a reset one."""
        try:
            self.pump(stream)
        except h2.exceptions.ProtocolError as exc:
            log.info("call %s on %s ended: HTTP/2 refused its output (%s)", stream.path, self.peer, exc)
            self.remove(stream)
            stream.gone()

    def pump_now(self, stream: Stream) -> None:
        """`pump` the stream now rather than when the loop next turns; h2's bytes are written then as usual."""
        self._pump_or_drop(stream)
        if self.h2._data_to_send:
            self.flush_soon()

    def _closed(self, stream: Stream) -> None:
        """The status is sent: the stream is done here; a client still sending is told to stop."""
        self.remove(stream)
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
            self._pump_or_drop(stream)

    def later(self, stream: Stream) -> None:
        """Pump the stream when the loop next turns: what its handler sends meanwhile goes as one DATA frame."""
        self._dirty.add(stream)
        self.flush_soon()

    def flush_soon(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Pump the streams with output, then write everything h2 has for the socket at once."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            for stream in dirty:
                self._pump_or_drop(stream)
        data = self.h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def go_away(self) -> None:
        """No new calls on this connection (GOAWAY; later streams are refused, which clients retry elsewhere);
        the calls running go on. Written past h2, whose own GOAWAY would close the connection for them too."""
        self.going_away = True
        self.draining.set()
        frame = hyperframe.frame.GoAwayFrame(0)
        frame.last_stream_id = self.h2.highest_inbound_stream_id
        self._flush()
        if self._transport is not None:
            self._transport.write(frame.serialize())

    def abort(self) -> None:
        """Close now, dropping what is queued."""
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        """Close once what is queued is written (the last statuses of a graceful stop included)."""
        if self._transport is not None:
            self._flush()
            if self._transport is not None:
                self._transport.close()
