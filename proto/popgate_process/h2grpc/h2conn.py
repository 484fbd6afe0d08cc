"""h2's connection and frame buffer as popgate's server needs them: a header block bounded while it is sent, a
client's GOAWAY ending none of its started calls, no trace-log repr of every frame. Guarded by
tests/integration/process/test_h2grpc_raw.py."""

from __future__ import annotations

from typing import Any

import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.utilities
import hyperframe.frame
from h2.errors import ErrorCodes

# A header block's bytes as sent (HEADERS and its CONTINUATION frames) before it ends: h2 keeps up to 64 frames of a
# block unended, each up to MAX_FRAME, and bounds the header list only once the block is whole.
MAX_HEADER_BLOCK = 1 << 16


_REQUEST = h2.utilities.HeaderValidationFlags(False, False, False, False)
_TRAILERS = h2.utilities.HeaderValidationFlags(False, True, False, False)
_WINDOW_UPDATE = 0x8


class HeaderBoundBuffer(h2.frame_buffer.FrameBuffer):
    """h2's frame buffer, refusing (a connection error) a header block past MAX_HEADER_BLOCK bytes while it is still
    being sent — test_h2grpc_raw.py::test_a_header_block_that_never_ends_costs_at_most_its_bound. A WINDOW_UPDATE of
    0 on a stream is passed on, for its stream's error, rather than refused as hyperframe refuses it (a connection
    error) — test_h2grpc_raw_calls.py::test_a_clients_error_on_one_call_costs_that_call_alone."""

    def __next__(self) -> Any:
        data = self._data
        if len(data) >= 13 and data[3] == _WINDOW_UPDATE and data[:3] == b"\x00\x00\x04":
            stream_id = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
            if stream_id and not int.from_bytes(data[9:13], "big") & 0x7FFFFFFF:
                del data[:13]
                frame = self._update_header_buffer(hyperframe.frame.WindowUpdateFrame(stream_id, window_increment=0))
                return frame if frame is not None else self.__next__()
        return super().__next__()

    def _update_header_buffer(self, f: Any) -> Any:
        out = super()._update_header_buffer(f)
        if self._headers_buffer and sum(len(x.data) for x in self._headers_buffer) > MAX_HEADER_BLOCK:
            raise h2.exceptions.ProtocolError(f"a header block of more than {MAX_HEADER_BLOCK} bytes")
        return out


class H2Connection(h2.connection.H2Connection):
    """h2's connection, except that a client's GOAWAY ends no call it had started: HTTP/2 lets the streams up to
    its last id finish (RFC 9113 6.8), while h2 would close the whole connection and drop what was queued for them
    (test_h2grpc_raw.py::test_a_client_going_away_still_gets_its_running_calls_answered)."""

    # How the connection's last calls to close were closed, past those closed since the last count (`_open_streams`),
    # which h2 still holds as streams (h2 keeps 65,536 by default: every call is a stream, and a long-lived client's
    # connection would hold that many for its life). The record only tells how a client's late frame on a closed call
    # is answered: on one past the record, DATA is still acknowledged and reset and WINDOW_UPDATE, RST_STREAM and
    # PRIORITY ignored, as on a recorded one; only HEADERS (request trailers, which gRPC clients do not send) on a
    # call reset longer ago than this record and the streams held closes the connection rather than the call
    # (test_h2grpc_raw.py::test_a_clients_late_data_on_a_call_long_ended_costs_only_that_call,
    # test_h2grpc.py::test_a_connections_record_of_ended_calls_stays_bounded_and_goes_when_it_closes).
    MAX_CLOSED_STREAMS = 1024

    # h2 counts a connection's open streams, for MAX_CONCURRENT_STREAMS, by walking all it holds at each new stream,
    # pruning the closed ones as it goes: with n calls open on a connection, each new one cost O(n), n more O(n²). Here
    # the walk runs only once the streams held have doubled since the last (or reach the limit): a new stream costs
    # O(1) amortized, and closed streams held wait at most that long to be pruned
    # (tests/unit/process/test_h2grpc_streams.py). Between walks the count is the streams held, at least those open.
    _walk_at = 64

    def _open_streams(self, remainder: int) -> int:
        held = len(self.streams)
        if held < self._walk_at and held < self.local_settings.max_concurrent_streams:
            return held
        count: int = super()._open_streams(remainder)
        self._walk_at = 2 * len(self.streams) + 64
        return count

    def forget(self) -> None:
        """The connection is closed: its calls' state goes now, not with the next full garbage collection (the
        connection is a reference cycle of its own)."""
        self._closed_streams.clear()
        self.streams.clear()

    def acknowledge_connection(self, length: int) -> None:
        """`length` flow-controlled bytes received on some stream count as read for the connection's window alone:
        acknowledged as they arrive, as grpc-core does, so that a call whose handler reads nothing holds back only
        its own stream's window (test_h2grpc.py::
        test_streams_whose_handlers_read_nothing_leave_the_connection_serving_other_calls)."""
        increment = self._inbound_flow_control_window_manager.process_bytes(length)
        if increment:
            frame = hyperframe.frame.WindowUpdateFrame(0)
            frame.window_increment = increment
            self._prepare_for_sending([frame])

    def acknowledge_stream(self, length: int, stream_id: int) -> None:
        """`length` bytes of stream `stream_id` are read by its handler: its window alone takes them back (nothing
        once the stream is closed)."""
        stream = self.streams.get(stream_id)
        if stream is not None and stream.open:
            self._prepare_for_sending(stream.acknowledge_received_data(length))

    def _receive_frame(self, frame: hyperframe.frame.Frame) -> list[Any]:
        """h2's own, less its trace log, for which h2 builds every frame's repr even when nothing logs: the hex of a
        whole DATA frame's bytes, then cut to 20 characters. A frame on a stream that is closed is answered as h2
        answers it, RST_STREAM or a connection error
        (test_h2grpc_raw.py::test_a_clients_late_frames_on_a_call_the_server_ended_cost_only_that_call)."""
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except h2.exceptions.StreamClosedError as exc:
            if not self._stream_is_closed_by_reset(exc.stream_id):
                raise
            self._prepare_for_sending([_reset(exc.stream_id, exc.error_code)])
            return list(exc._events)
        except h2.exceptions.StreamIDTooLowError as exc:
            if self._stream_is_closed_by_reset(exc.stream_id):
                self._prepare_for_sending([_reset(exc.stream_id, ErrorCodes.STREAM_CLOSED)])
                return []
            if self._stream_is_closed_by_end(exc.stream_id):
                raise h2.exceptions.StreamClosedError(exc.stream_id) from exc
            raise
        self._prepare_for_sending(frames)
        return list(events)

    # RFC 9113's stream errors that h2 makes the connection's: a malformed request (8.1.1: h2's own validation is off
    # and made here; a content-length not a number, conflicting, or not what the DATA add up to; a second HEADERS
    # without END_STREAM), WINDOW_UPDATE of 0 on a stream (6.9), a stream depending on itself (5.3.1). Each resets
    # its stream alone (test_h2grpc_raw_calls.py::test_a_clients_error_on_one_call_costs_that_call_alone).
    def _receive_headers_frame(self, frame: hyperframe.frame.HeadersFrame) -> tuple[list[Any], list[Any]]:
        selfish = "PRIORITY" in frame.flags and frame.depends_on == frame.stream_id
        if selfish:
            frame.flags.discard("PRIORITY")
        try:
            frames, events = super()._receive_headers_frame(frame)
        except h2.exceptions.ProtocolError as exc:
            if not self._request_refused(exc, frame.stream_id):
                raise
            return [], self._stream_error(frame.stream_id)
        if selfish or any(_malformed(event) for event in events):
            return frames, self._stream_error(frame.stream_id)
        return frames, events

    def _receive_data_frame(self, frame: hyperframe.frame.DataFrame) -> tuple[list[Any], list[Any]]:
        try:
            return super()._receive_data_frame(frame)
        except h2.exceptions.InvalidBodyLengthError:
            if not self._is_open(frame.stream_id):
                raise
            self.acknowledge_connection(frame.flow_controlled_length)  # consumed by h2, read by no one
            return [], self._stream_error(frame.stream_id)

    def _request_refused(self, exc: h2.exceptions.ProtocolError, stream_id: int) -> bool:
        """`exc` is h2's refusal of an open stream's header fields (its content-length, trailers without
        END_STREAM), raised bare; not an HPACK error (raised from its cause: the decoder's state is the
        connection's), nor a closed, too-low or one-too-many stream (subclasses), nor a closed connection."""
        return (
            type(exc) is h2.exceptions.ProtocolError
            and exc.__cause__ is None
            and self.state_machine.state is not h2.connection.ConnectionState.CLOSED
            and self._is_open(stream_id)
        )

    def _receive_window_update_frame(self, frame: hyperframe.frame.WindowUpdateFrame) -> tuple[list[Any], list[Any]]:
        if frame.stream_id and not frame.window_increment and self._is_open(frame.stream_id):
            return [], self._stream_error(frame.stream_id)
        return super()._receive_window_update_frame(frame)

    def _receive_priority_frame(self, frame: Any) -> tuple[list[Any], list[Any]]:
        if frame.depends_on != frame.stream_id:
            return super()._receive_priority_frame(frame)
        return [], self._stream_error(frame.stream_id) if self._is_open(frame.stream_id) else []

    def _is_open(self, stream_id: int) -> bool:
        stream = self.streams.get(stream_id)
        return stream is not None and stream.open

    def _stream_error(self, stream_id: int) -> list[Any]:
        """The client's error on `stream_id` alone: RST_STREAM (PROTOCOL_ERROR), and an event that ends its call."""
        self.reset_stream(stream_id, ErrorCodes.PROTOCOL_ERROR)
        return [h2.events.StreamReset(stream_id=stream_id, error_code=ErrorCodes.PROTOCOL_ERROR, remote_reset=False)]

    def _receive_goaway_frame(self, frame: hyperframe.frame.GoAwayFrame) -> tuple[list[Any], list[Any]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.errors._error_code_from_int(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


def _malformed(event: Any) -> bool:
    """A request's or its trailers' header fields break HTTP/2's rules (h2's own validation, RFC 9113 8.2-8.3)."""
    kind = type(event)
    if kind is not h2.events.RequestReceived and kind is not h2.events.TrailersReceived:
        return False
    try:
        for _ in h2.utilities.validate_headers(
            event.headers, _TRAILERS if kind is h2.events.TrailersReceived else _REQUEST
        ):
            pass
    except h2.exceptions.ProtocolError:
        return True
    return False


def _reset(stream_id: int, code: int) -> hyperframe.frame.RstStreamFrame:
    frame = hyperframe.frame.RstStreamFrame(stream_id)
    frame.error_code = code
    return frame
