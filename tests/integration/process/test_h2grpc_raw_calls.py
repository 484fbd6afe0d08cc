"""popgate's gRPC server (proto/popgate_process/h2grpc) driven frame by frame: how a call ends when its answer
cannot go, and what a client's bad frames on one call cost (that call, not its connection)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import hyperframe.frame
import pytest
from h2.errors import ErrorCodes

from popgate_process.h2grpc import wire
from popgate_process.h2grpc.server import Metadata
from tests.integration.process.h2grpc_served import started
from tests.integration.process.test_h2grpc_raw import OK, Peer, answer, connected, echoes_ok, headers

pytestmark = pytest.mark.asyncio


async def test_an_answer_the_clients_window_never_takes_ends_at_its_deadline() -> None:
    """A unary answer within the send buffer, its status decided while its bytes wait for a client whose window
    never opens (it reads the socket): at its deadline the call answers DEADLINE_EXCEEDED, its unsent bytes dropped
    and its place among the server's calls freed."""
    server, _, target = await started(max_calls=10)
    peer = await connected(target)
    try:
        peer.client.send_headers(1, [*headers(b"/t.S/sized"), (b"grpc-timeout", b"300m")])
        peer.client.send_data(1, wire.frame(b"900000"), end_stream=True)
        peer.send()
        frames = await asyncio.wait_for(peer.read(answered=1), 5)
        body, trailers = answer(frames, 1)
        assert trailers[b"grpc-status"] == b"4"
        assert len(body) < 900_000
        assert server.calls == 0
    finally:
        await peer.close()
        await server.stop(None)


def _request(peer: Peer, fields: list[tuple[bytes, bytes]], flags: tuple[str, ...] = ()) -> bytes:
    """Stream 3's HEADERS with `fields` as they are (h2's client would refuse the malformed ones), ending the
    client's side (a DATA frame after would be answered STREAM_CLOSED, the stream being reset)."""
    flags = ("END_HEADERS", "END_STREAM", *flags)
    frame = hyperframe.frame.HeadersFrame(3, data=peer.client.encoder.encode(fields), flags=flags)
    if "PRIORITY" in flags:
        frame.depends_on, frame.stream_weight = 3, 15
    return frame.serialize()


def _changed(name: bytes, value: bytes | None) -> list[tuple[bytes, bytes]]:
    fields = [(key, old) for key, old in headers(b"/t.S/echo") if key != name]
    return fields if value is None else [*fields, (name, value)]


def _held_3(peer: Peer) -> None:
    peer.client.send_headers(3, headers(b"/t.S/held"))
    peer.client.send_data(3, OK, end_stream=True)
    peer.send()


def _open(peer: Peer, fields: list[tuple[bytes, bytes]], stream_id: int = 3) -> bytes:
    """A HEADERS frame with `fields` as they are, leaving the client's side open."""
    return hyperframe.frame.HeadersFrame(
        stream_id, data=peer.client.encoder.encode(fields), flags=["END_HEADERS"]
    ).serialize()


def _last_data(body: bytes, stream_id: int = 3) -> bytes:
    return hyperframe.frame.DataFrame(stream_id, data=body, flags=["END_STREAM"]).serialize()


def _sized(length: bytes, path: bytes = b"/t.S/echo") -> list[tuple[bytes, bytes]]:
    return [*headers(path), (b"content-length", length)]


def _window_update_0(peer: Peer) -> bytes:
    _held_3(peer)
    return hyperframe.frame.WindowUpdateFrame(3, window_increment=0).serialize()


def _priority_on_itself(peer: Peer) -> bytes:
    _held_3(peer)
    return hyperframe.frame.PriorityFrame(3, depends_on=3, stream_weight=15).serialize()


ODD: dict[str, Callable[[Peer], bytes]] = {
    "te other than trailers": lambda peer: _request(peer, _changed(b"te", b"gzip")),
    "an uppercase header name": lambda peer: _request(peer, [*headers(b"/t.S/echo"), (b"X-Upper", b"v")]),
    "a connection header": lambda peer: _request(peer, [*headers(b"/t.S/echo"), (b"connection", b"keep-alive")]),
    "no :path": lambda peer: _request(peer, _changed(b":path", None)),
    "HEADERS depending on itself": lambda peer: _request(peer, headers(b"/t.S/echo"), ("PRIORITY",)),
    "a content-length not a number": lambda peer: _request(peer, _sized(b"abc")),
    "conflicting content-lengths": lambda peer: _request(peer, [*_sized(b"1"), (b"content-length", b"2")]),
    "DATA past its content-length": lambda peer: _open(peer, _sized(b"1")) + _last_data(OK),
    "DATA short of its content-length": lambda peer: _open(peer, _sized(b"100")) + _last_data(OK),
    "a second HEADERS without END_STREAM on a running call": lambda peer: (
        _open(peer, headers(b"/t.S/slow")) + _open(peer, [(b"x-trailer", b"v")])
    ),
    "WINDOW_UPDATE of 0 on a running call": _window_update_0,
    "PRIORITY of a running call on itself": _priority_on_itself,
}


@pytest.mark.parametrize("odd", ODD, ids=list(ODD))
async def test_a_clients_error_on_one_call_costs_that_call_alone(odd: str) -> None:
    """RFC 9113's stream errors (a malformed request, its DATA not what its content-length says, WINDOW_UPDATE of 0
    on a stream, a stream depending on itself): RST_STREAM (PROTOCOL_ERROR) for that call, whose handler is
    cancelled; the connection serves its next call and answers the call it holds."""
    server, handlers, target = await started(max_calls=10)
    peer = await connected(target)
    try:
        peer.client.send_headers(1, headers(b"/t.S/held"))
        peer.client.send_data(1, OK, end_stream=True)
        peer.send()
        peer.writer.write(ODD[odd](peer))
        frames = await echoes_ok(peer, 5)
        resets = [(f.stream_id, f.error_code) for f in frames if isinstance(f, hyperframe.frame.RstStreamFrame)]
        assert resets == [(3, ErrorCodes.PROTOCOL_ERROR)]
        handlers.release.set()
        body, trailers = answer(await peer.read(answered=1), 1)
        assert (body, trailers[b"grpc-status"]) == (b"\x00\x00\x00\x00\x08released", b"0")
        assert server.calls == 0
    finally:
        await peer.close()
        await server.stop(None)


async def test_connections_that_do_not_speak_http2_log_a_line_now_and_then_not_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """50 connections sending an HTTP/1.1 request, each closed for its protocol error: one log line (the next no
    sooner than 10 s later, with the count left out), and the server serves the next client as before."""
    server, _, target = await started(max_calls=10)
    host, port = target.rsplit(":", 1)
    try:
        with caplog.at_level("INFO", logger="popgate_process.h2grpc"):
            for _ in range(50):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                await asyncio.wait_for(reader.read(), 5)  # the server closes it
                writer.close()
        lines = [r.getMessage() for r in caplog.records if "protocol error" in r.getMessage()]
        assert len(lines) == 1, lines[:3]
        peer = await connected(target)
        try:
            await asyncio.wait_for(echoes_ok(peer, 1), 5)
        finally:
            await peer.close()
    finally:
        await server.stop(None)


async def test_data_refused_for_its_content_length_still_opens_the_connections_window() -> None:
    """A call reset for DATA past its content-length: the frame's bytes count as read for the connection's window
    (h2 took them from it), so 20 such calls of 1 MiB each, past the 16 MiB window, leave the connection serving."""
    server, _, target = await started(max_calls=10)
    peer = await connected(target)
    try:
        peer.send()  # the connection's preface
        calls = range(3, 43, 2)
        for call in calls:
            peer.writer.write(_open(peer, _sized(b"1"), call) + _last_data(b"x" * (1 << 20), call))
        frames = await echoes_ok(peer, 43)
        resets = [(f.stream_id, f.error_code) for f in frames if isinstance(f, hyperframe.frame.RstStreamFrame)]
        assert resets == [(call, ErrorCodes.PROTOCOL_ERROR) for call in calls]
        assert server.calls == 0
    finally:
        await peer.close()
        await server.stop(None)


async def test_calls_answered_at_their_headers_hold_no_place_while_their_requests_arrive() -> None:
    """A server that answers calls without the right key at their headers (`unheard`): a peer opening calls in
    waves of as many as the server takes, each with a request begun and never finished, has each answered at once by
    its handler with the metadata it is told (here an echo of the empty request and a suffix), and the server's
    places are free again for the next wave and for a caller with the key."""

    def unheard(path: str, metadata: Metadata) -> Metadata | None:
        return None if ("x-key", "good") in metadata else (*metadata, ("x-suffix", "!"))

    server, _, target = await started(max_calls=3, unheard=unheard)
    peer = await connected(target)
    try:
        for wave in (range(1, 7, 2), range(7, 13, 2)):
            for stream_id in wave:
                peer.client.send_headers(stream_id, headers(b"/t.S/echo"))
                peer.client.send_data(stream_id, b"\x00\x00\x00\x01\xf4" + b"x" * 100)  # 100 of a 500-byte request
            peer.send()
            for stream_id in wave:  # answered in any order
                if not any(f.stream_id == stream_id and "END_STREAM" in f.flags for f in peer.frames):
                    await asyncio.wait_for(peer.read(answered=stream_id), 5)
            for stream_id in wave:
                body, trailers = answer(peer.frames, stream_id)
                assert (body, trailers.get(b"grpc-status")) == (wire.frame(b"!"), b"0"), stream_id  # as told
        assert server.calls == 0
        async with grpc.aio.insecure_channel(target) as channel:
            echo = channel.unary_unary("/t.S/echo")
            assert await echo(b"hi", metadata=(("x-key", "good"),), timeout=5) == b"hi"
    finally:
        await peer.close()
        await server.stop(None)
