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
import hyperframe.frame
from h2.errors import ErrorCodes

# A header block's bytes as sent (HEADERS and its CONTINUATION frames) before it ends: h2 keeps up to 64 frames of a
# block unended, each up to MAX_FRAME, and bounds the header list only once the block is whole.
MAX_HEADER_BLOCK = 1 << 16


class HeaderBoundBuffer(h2.frame_buffer.FrameBuffer):
    """h2's frame buffer, refusing (a connection error) a header block past MAX_HEADER_BLOCK bytes while it is still
    being sent — test_h2grpc_raw.py::test_a_header_block_that_never_ends_costs_at_most_its_bound."""

    def _update_header_buffer(self, f: Any) -> Any:
        out = super()._update_header_buffer(f)
        if self._headers_buffer and sum(len(x.data) for x in self._headers_buffer) > MAX_HEADER_BLOCK:
            raise h2.exceptions.ProtocolError(f"a header block of more than {MAX_HEADER_BLOCK} bytes")
        return out


class H2Connection(h2.connection.H2Connection):
    """h2's connection, except that a client's GOAWAY ends no call it had started: HTTP/2 lets the streams up to
    its last id finish (RFC 9113 6.8), while h2 would close the whole connection and drop what was queued for them
    (test_h2grpc_raw.py::test_a_client_going_away_still_gets_its_running_calls_answered)."""

    # How the connection's last calls to close were closed (h2 keeps 65,536 by default: every call is a stream, and
    # a long-lived client's connection would hold that many for its life). The record only tells how a client's late
    # frame on a closed call is answered: on one past the record, DATA is still acknowledged and reset and
    # WINDOW_UPDATE, RST_STREAM and PRIORITY ignored, as on a recorded one; only HEADERS (request trailers, which
    # gRPC clients do not send) on a call reset over this many calls ago closes the connection rather than the call
    # (test_h2grpc_raw.py::test_a_clients_late_data_on_a_call_long_ended_costs_only_that_call,
    # test_h2grpc.py::test_a_connections_record_of_ended_calls_stays_bounded_and_goes_when_it_closes).
    MAX_CLOSED_STREAMS = 1024

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

    def _receive_goaway_frame(self, frame: hyperframe.frame.GoAwayFrame) -> tuple[list[Any], list[Any]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.errors._error_code_from_int(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


def _reset(stream_id: int, code: int) -> hyperframe.frame.RstStreamFrame:
    frame = hyperframe.frame.RstStreamFrame(stream_id)
    frame.error_code = code
    return frame
