"""popgate's gRPC server (proto/popgate_process/h2grpc) driven frame by frame, for what grpc's own client never
sends: a GOAWAY before its call is answered, a flood of calls cancelled as they open, frames on a call that
ended, silence where a PING is due."""

from __future__ import annotations

import asyncio
import socket

import grpc
import h2.config
import h2.connection
import h2.settings
import hpack
import hyperframe.frame
import pytest
from h2.errors import ErrorCodes

from popgate_process.h2grpc import H2Server
from popgate_process.h2grpc.connection import RESET_BURST
from popgate_process.h2grpc.h2conn import H2Connection
from popgate_process.h2grpc.stream import SEND_BUFFER
from tests.integration.process.h2grpc_served import Handlers, started

pytestmark = pytest.mark.asyncio

Frames = list[hyperframe.frame.Frame]


def headers(path: bytes) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"t"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip


class Peer:
    """A client connection written and read frame by frame: `client` encodes what is sent, `frames` keeps every
    frame the server sent, in order (one HPACK decoder reads their header blocks in turn)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.client.initiate_connection()
        self.frames: Frames = []
        self._data = b""

    def send(self) -> None:
        self.writer.write(self.client.data_to_send())

    async def close(self) -> None:
        """Closed before the test's loop ends (a transport the loop's end finds open is a ResourceWarning)."""
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:  # the server reset it first
            pass

    async def read(self, answered: int = 0) -> Frames:
        """The server's frames until it closes the connection, or until it ends stream `answered` (the frames read
        past that one are taken first by the next read)."""
        while True:
            while len(self._data) >= 9:
                frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(self._data[:9]))
                if len(self._data) < 9 + length:
                    break
                frame.parse_body(memoryview(self._data[9 : 9 + length]))
                self._data = self._data[9 + length :]
                self.frames.append(frame)
                if answered and frame.stream_id == answered and "END_STREAM" in frame.flags:
                    return self.frames
            if not (chunk := await asyncio.wait_for(self._chunk(), 10)):
                return self.frames
            self._data += chunk

    async def _chunk(self) -> bytes:
        try:
            return await self.reader.read(65536)
        except ConnectionResetError:  # closed with data unread: as closed
            return b""


async def connected(target: str) -> Peer:
    host, port = target.split(":")
    return Peer(*await asyncio.open_connection(host, int(port)))


def answer(frames: Frames, stream_id: int) -> tuple[bytes, dict[bytes, bytes]]:
    """Stream `stream_id`'s response bytes and trailers."""
    decoder, body, trailers = hpack.Decoder(), b"", {}
    for frame in frames:
        if isinstance(frame, hyperframe.frame.HeadersFrame):
            decoded = dict(decoder.decode(frame.data, raw=True))  # every block, to keep the decoder's table
            if frame.stream_id == stream_id:
                trailers.update(decoded)
        elif isinstance(frame, hyperframe.frame.DataFrame) and frame.stream_id == stream_id:
            body += frame.data
    return body, trailers


async def echoes_ok(peer: Peer, call: int) -> Frames:
    """Send what is queued and a call echoing `ok` as `call`: its answer comes whole (the connection still serves);
    the frames read until then."""
    peer.client.send_headers(call, headers(b"/t.S/echo"))
    peer.client.send_data(call, OK, end_stream=True)
    peer.send()
    frames = await peer.read(answered=call)
    body, trailers = answer(frames, call)
    assert body == OK and trailers[b"grpc-status"] == b"0"
    return frames


OK = b"\x00\x00\x00\x00\x02ok"


async def test_a_client_going_away_still_gets_its_running_calls_answered(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """A client's GOAWAY (Node.js's grpc-js sends one as it closes) ends no call it had started."""
    _, handlers, target = server
    peer = await connected(target)
    peer.client.send_headers(1, headers(b"/t.S/held"))
    peer.client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    peer.client.close_connection()  # GOAWAY; h2's client state machine then takes frames for stream 1 no more
    peer.send()
    await asyncio.sleep(0.2)
    handlers.release.set()
    frames = await peer.read()  # the server closes once the call is answered
    await peer.close()
    body, trailers = answer(frames, 1)
    assert body == b"\x00\x00\x00\x00\x08released"
    assert trailers[b"grpc-status"] == b"0"


async def test_a_new_stream_reset_as_it_comes_on_a_connection_going_away_costs_only_itself(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """A connection going away (the client's GOAWAY, or the server's at a stop) refuses new streams; one whose HEADERS
    and RST_STREAM come in one read is closed before it is refused, and the connection's running call is still
    answered, not cut with the whole connection."""
    _, handlers, target = server
    peer = await connected(target)
    peer.client.send_headers(1, headers(b"/t.S/held"))
    peer.client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    peer.client.close_connection()  # GOAWAY: the server's side of the connection is going away from here
    peer.send()
    await asyncio.sleep(0.2)
    opened = hyperframe.frame.HeadersFrame(3)
    opened.data = peer.client.encoder.encode(headers(b"/t.S/held"))
    for flag in ("END_HEADERS", "END_STREAM"):
        opened.flags.add(flag)
    reset = hyperframe.frame.RstStreamFrame(3)
    reset.error_code = ErrorCodes.CANCEL
    peer.writer.write(opened.serialize() + reset.serialize())  # one write: one read at the server
    await asyncio.sleep(0.2)
    handlers.release.set()
    frames = await peer.read()
    await peer.close()
    _, trailers = answer(frames, 1)
    assert trailers.get(b"grpc-status") == b"0"


async def cancel_calls(client: h2.connection.H2Connection, n: int) -> int:
    """Open `n` streaming calls and cancel each at once; the next stream id."""
    for i in range(n):
        client.send_headers(1 + 2 * i, headers(b"/t.S/chat"))
        client.reset_stream(1 + 2 * i)
    return 1 + 2 * n


async def test_a_client_that_floods_resets_loses_its_connection(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """A "rapid reset" flood (open a call, cancel it, again, CVE-2023-44487): past the allowance the server says
    ENHANCE_YOUR_CALM and closes the connection. Other clients are served."""
    _, _, target = server
    peer = await connected(target)
    await cancel_calls(peer.client, RESET_BURST + 500)
    peer.send()  # in one write: the allowance regains nothing meanwhile
    frames = await peer.read()
    await peer.close()
    goaway = [frame for frame in frames if isinstance(frame, hyperframe.frame.GoAwayFrame)]
    assert goaway and goaway[-1].error_code == ErrorCodes.ENHANCE_YOUR_CALM
    async with grpc.aio.insecure_channel(target) as channel:
        assert await channel.unary_unary("/t.S/echo")(b"served", timeout=5) == b"served"


async def test_a_client_cancelling_calls_within_the_allowance_keeps_its_connection(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """Cancelling many held calls at once, as a client closing with its receives held does, is no flood."""
    _, _, target = server
    peer = await connected(target)
    echo = await cancel_calls(peer.client, RESET_BURST // 2)
    frames = await echoes_ok(peer, echo)
    await peer.close()
    assert not any(isinstance(frame, hyperframe.frame.GoAwayFrame) for frame in frames)


async def test_a_clients_late_frames_on_a_call_the_server_ended_cost_only_that_call(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """The server answered and reset a call its client was still sending on; the client's late trailers on it get
    a RST_STREAM (STREAM_CLOSED, as h2 answers them) and the connection serves its next call."""
    _, _, target = server
    peer = await connected(target)
    peer.client.send_headers(1, headers(b"/t.S/ignore"))
    peer.client.send_data(1, b"\x00\x00\x00\x00\x01x")
    peer.send()
    await peer.read(answered=1)  # "ignored", and the stream reset: the server reads no more of it
    peer.client.send_headers(1, [(b"x-late", b"1")], end_stream=True)
    frames = await echoes_ok(peer, 3)
    await peer.close()
    resets = [frame for frame in frames if isinstance(frame, hyperframe.frame.RstStreamFrame) and frame.stream_id == 1]
    assert ErrorCodes.STREAM_CLOSED in [frame.error_code for frame in resets]


async def test_a_clients_late_data_on_a_call_long_ended_costs_only_that_call(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """Late DATA on a call the server ended so many calls ago that it no longer records how: RST_STREAM
    (STREAM_CLOSED) as on a recent one, and the connection serves its next call."""
    h2server, _, target = server
    peer = await connected(target)
    peer.client.send_headers(1, headers(b"/t.S/ignore"))
    peer.client.send_data(1, b"\x00\x00\x00\x00\x01x")
    peer.send()
    await peer.read(answered=1)
    (connection,) = h2server.connections
    stream_id = 3
    rounds = 0
    while 1 in connection.h2._closed_streams or 1 in connection.h2.streams:  # until its record has gone
        rounds += 1  # 200 calls at a time, within the server's bound
        assert rounds <= 4 * H2Connection.MAX_CLOSED_STREAMS // 200
        ids = range(stream_id, stream_id + 400, 2)
        for call in ids:
            peer.client.send_headers(call, headers(b"/t.S/echo"))
            peer.client.send_data(call, b"\x00\x00\x00\x00\x00", end_stream=True)
        peer.send()
        for call in ids:
            if not any(f.stream_id == call and "END_STREAM" in f.flags for f in peer.frames):
                await peer.read(answered=call)
        stream_id += 400
    peer.client.send_data(1, b"\x00\x00\x00\x00\x01y", end_stream=True)
    frames = await echoes_ok(peer, stream_id)
    await peer.close()
    resets = [frame for frame in frames if isinstance(frame, hyperframe.frame.RstStreamFrame) and frame.stream_id == 1]
    assert ErrorCodes.STREAM_CLOSED in [frame.error_code for frame in resets]
    assert not any(isinstance(frame, hyperframe.frame.GoAwayFrame) for frame in frames)


async def test_a_client_that_answers_no_ping_loses_its_connection() -> None:
    """A client gone without closing (its host down, its process stopped) answers nothing: after a silent
    keepalive period and an unanswered PING the server closes the connection, and its calls go with it."""
    h2server, _, target = await started(max_calls=10, keepalive_s=0.1, keepalive_timeout_s=0.3)
    try:
        peer = await connected(target)
        peer.client.send_headers(1, headers(b"/t.S/held"))
        peer.client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
        peer.send()  # then nothing, not even the ACKs of the server's SETTINGS and PING
        frames = await peer.read()  # until the server closes
        await peer.close()
        assert any(isinstance(frame, hyperframe.frame.PingFrame) for frame in frames)
        assert not h2server.connections and h2server.calls == 0
    finally:
        await h2server.stop(None)


async def test_a_client_answering_pings_keeps_its_connection_and_its_held_call() -> None:
    h2server, handlers, target = await started(max_calls=10, keepalive_s=0.1, keepalive_timeout_s=0.3)
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            call = channel.unary_unary("/t.S/held")(b"", timeout=30)
            await asyncio.sleep(1.5)  # many keepalive periods, each with a PING the client answers
            handlers.release.set()
            assert await call == b"released"
    finally:
        await h2server.stop(None)


async def test_a_stopped_server_has_closed_every_connection_even_one_that_reads_nothing() -> None:
    """`stop` returns once every connection is closed: an idle one at once, one whose client reads none of what
    is queued for it after a bound (aborted). Nothing is left for the loop's end to find open."""
    h2server, handlers, target = await started(max_calls=10)
    idle = await connected(target)
    idle.send()
    stuck = await connected(target)
    stuck.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    stuck.client.increment_flow_control_window(2**31 - 1 - 65535)
    stuck.client.send_headers(1, headers(b"/t.S/flood"))
    stuck.client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    stuck.send()  # then reads nothing: the server's socket and write buffer fill
    sent = -1
    while handlers.sent != sent:
        sent = handlers.sent
        await asyncio.sleep(0.3)
    await h2server.stop(None)
    assert not h2server.connections
    await idle.read()  # to the end: closed
    await idle.close()
    await stuck.close()


async def test_an_aged_connection_is_told_to_go_away_and_closes_after_its_calls() -> None:
    """Past `max_connection_age_s` the client gets GOAWAY (NO_ERROR, its last call included): the call running is
    answered, and then the connection closes."""
    h2server, handlers, target = await started(max_calls=10, max_connection_age_s=0.2, max_connection_age_grace_s=30)
    try:
        peer = await connected(target)
        peer.client.send_headers(1, headers(b"/t.S/held"))
        peer.client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
        peer.send()
        connection = next(iter(h2server.connections))
        await asyncio.wait_for(connection.draining.wait(), 5)
        handlers.release.set()
        frames = await peer.read()  # until the server closes
        await peer.close()
        goaway = [frame for frame in frames if isinstance(frame, hyperframe.frame.GoAwayFrame)]
        assert goaway and goaway[0].error_code == ErrorCodes.NO_ERROR and goaway[0].last_stream_id == 1
        body, trailers = answer(frames, 1)
        assert body == b"\x00\x00\x00\x00\x08released"
        assert trailers[b"grpc-status"] == b"0"
    finally:
        await h2server.stop(None)


async def test_calls_running_past_an_aged_connections_grace_end_with_it() -> None:
    h2server, handlers, target = await started(max_calls=10, max_connection_age_s=0.1, max_connection_age_grace_s=0.3)
    try:
        peer = await connected(target)
        peer.client.send_headers(1, headers(b"/t.S/slow"))
        peer.client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
        peer.send()  # a 30 s call: still running when the grace is over
        frames = await peer.read()  # until the server closes
        await peer.close()
        assert any(isinstance(frame, hyperframe.frame.GoAwayFrame) for frame in frames)
        assert b"grpc-status" not in answer(frames, 1)[1]
        await asyncio.wait_for(handlers.cancelled.wait(), 5)
        assert not h2server.connections and h2server.calls == 0
    finally:
        await h2server.stop(None)


async def test_a_grpc_client_moves_to_a_new_connection_as_each_ages() -> None:
    h2server, _, target = await started(max_calls=10, max_connection_age_s=0.2)
    peers = set()
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            echo = channel.unary_unary("/t.S/echo")
            for i in range(20):
                assert await echo(b"%d" % i, timeout=5) == b"%d" % i
                peers |= {connection.peer for connection in h2server.connections}
                await asyncio.sleep(0.05)
    finally:
        await h2server.stop(None)
    assert len(peers) >= 3  # 1 s of calls over connections that last ~0.2 s each


async def test_a_unary_call_that_sends_on_past_its_request_is_refused_and_keeps_nothing(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """A unary call's second request message is the call's error (INTERNAL) at once, and what the client sends on it
    after is not kept: a client that never ends its side cannot fill the server's memory."""
    h2server, _, target = server
    peer = await connected(target)
    peer.client.send_headers(1, headers(b"/t.S/echo"))
    peer.client.send_data(1, b"\x00\x00\x00\x00\x02ok" * 2)
    peer.send()
    frames = await peer.read(answered=1)
    assert answer(frames, 1)[1][b"grpc-status"] == b"13"
    peer.client.send_data(1, b"\x00\x00\x00\x00\x02ok" * 100)  # sent on: the stream may still be open our way
    await echoes_ok(peer, 3)
    assert all(not stream.inbox for connection in h2server.connections for stream in connection.streams.values())
    await peer.close()


async def test_metadata_that_does_not_decode_fails_its_call_alone(server: tuple[H2Server, Handlers, str]) -> None:
    """A `-bin` value that is not base64 is its call's error (INTERNAL); the connection and its other calls go on."""
    _, handlers, target = server
    peer = await connected(target)
    peer.client.send_headers(1, headers(b"/t.S/held"))
    peer.client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    peer.client.send_headers(3, [*headers(b"/t.S/echo"), (b"x-a-bin", b"a")])
    peer.client.send_data(3, b"\x00\x00\x00\x00\x00", end_stream=True)
    peer.send()
    frames = await peer.read(answered=3)
    assert answer(frames, 3)[1][b"grpc-status"] == b"13"
    handlers.release.set()
    frames = await peer.read(answered=1)
    await peer.close()
    body, trailers = answer(frames, 1)
    assert body == b"\x00\x00\x00\x00\x08released"
    assert trailers[b"grpc-status"] == b"0"


async def test_a_header_block_that_never_ends_costs_at_most_its_bound(server: tuple[H2Server, Handlers, str]) -> None:
    """HEADERS and CONTINUATION frames without END_HEADERS: past MAX_HEADER_BLOCK bytes the connection is refused
    (a protocol error), not kept holding up to 64 frames of a MiB each."""
    h2server, _, target = server
    peer = await connected(target)
    peer.send()  # the preface and SETTINGS
    block = [
        hyperframe.frame.HeadersFrame(1, data=bytes(40_000)),
        hyperframe.frame.ContinuationFrame(1, data=bytes(40_000)),
    ]
    peer.writer.write(b"".join(frame.serialize() for frame in block))
    frames = await peer.read()  # until the server closes the connection
    await peer.close()
    goaway = [frame for frame in frames if isinstance(frame, hyperframe.frame.GoAwayFrame)]
    assert goaway and goaway[-1].error_code == ErrorCodes.PROTOCOL_ERROR
    assert not h2server.connections


async def test_a_client_that_reads_nothing_cannot_grow_the_servers_output_with_pings(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """Each PING is answered; a client that sends them and reads nothing fills the server's send buffer, and then
    the server reads no more of its frames until it reads: the server's unsent output stays near its bound."""
    h2server, _, target = server
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # little room in the kernel for what we never read
    host, port = target.split(":")
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    peer = Peer(*await asyncio.open_connection(sock=sock))
    peer.send()
    ping = hyperframe.frame.PingFrame(0, opaque_data=b"12345678").serialize()
    connection = next(iter(h2server.connections))
    stalled = False
    for _ in range(40):  # up to ~16 MiB of PINGs, ~0.2 s of h2 a MiB
        peer.writer.write(ping * 24_000)
        try:
            await asyncio.wait_for(peer.writer.drain(), 2)
        except TimeoutError:
            stalled = True  # the server stopped reading us
            break
    assert stalled
    assert connection.paused
    assert connection._transport is not None
    assert connection._transport.get_write_buffer_size() < SEND_BUFFER + (1 << 20)
    peer.writer.transport.abort()


async def test_responses_are_flushed_only_as_far_as_the_clients_window_takes_them(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """`write` returns once a response is queued within the send buffer; `flushed` waits until the client's window
    took it. With a window of 0 nothing is taken; opened, everything goes out and the wait ends."""
    _, handlers, target = server
    peer = await connected(target)
    peer.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    peer.client.send_headers(1, headers(b"/t.S/small"))
    peer.client.send_data(1, b"\x00\x00\x00\x00\x0232", end_stream=True)  # 32 frames of 30 KB: < SEND_BUFFER
    peer.send()
    await asyncio.sleep(0.5)
    assert not handlers.flushed.is_set()
    peer.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    peer.client.increment_flow_control_window(2**31 - 1 - 65535)
    peer.send()
    body, trailers = answer(await peer.read(answered=1), 1)
    assert handlers.flushed.is_set()
    assert (len(body), trailers[b"grpc-status"]) == (32 * (5 + 30_000), b"0")
    await peer.close()


async def test_a_request_that_is_not_grpc_gets_an_http_error(server: tuple[H2Server, Handlers, str]) -> None:
    """A request that is no gRPC call (another content-type, a GET) is answered with an HTTP error (415, 405) an
    HTTP client sees, not a 200; its grpc-status says why, and the connection's gRPC calls go on."""
    _, _, target = server
    peer = await connected(target)
    not_grpc = [(k, b"text/plain" if k == b"content-type" else v) for k, v in headers(b"/t.S/echo")]
    get = [(k, b"GET" if k == b":method" else v) for k, v in headers(b"/t.S/echo")]
    for stream_id, sent, http_status in ((1, not_grpc, b"415"), (3, get, b"405")):
        peer.client.send_headers(stream_id, sent)
        peer.client.send_data(stream_id, OK, end_stream=True)
        peer.send()
        _, trailers = answer(await peer.read(answered=stream_id), stream_id)
        assert trailers[b":status"] == http_status and trailers[b"grpc-status"] == b"2"
    await echoes_ok(peer, 5)
    await peer.close()


async def test_a_call_whose_deadline_is_zero_ends_deadline_exceeded(server: tuple[H2Server, Handlers, str]) -> None:
    """A call whose `grpc-timeout` is 0 is past its deadline as it comes: DEADLINE_EXCEEDED, as grpc's own server
    answers it, not the answer of a handler that happens to end at once."""
    _, _, target = server
    peer = await connected(target)
    peer.client.send_headers(1, [*headers(b"/t.S/echo"), (b"grpc-timeout", b"0n")])
    peer.client.send_data(1, OK, end_stream=True)
    peer.send()
    body, trailers = answer(await peer.read(answered=1), 1)
    assert (body, trailers[b"grpc-status"]) == (b"", b"4")
    await echoes_ok(peer, 3)
    await peer.close()
