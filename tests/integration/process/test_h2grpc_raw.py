"""popgate's gRPC server (proto/popgate_process/h2grpc) driven frame by frame, for what grpc's own client never
sends: a GOAWAY before its call is answered, a flood of calls cancelled as they open."""

from __future__ import annotations

import asyncio

import grpc
import h2.config
import h2.connection
import hpack
import hyperframe.frame
import pytest
from h2.errors import ErrorCodes

from popgate_process.h2grpc import H2Server
from popgate_process.h2grpc.connection import RESET_BURST
from tests.integration.process.test_h2grpc import Handlers, server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.asyncio

Frames = list[hyperframe.frame.Frame]


def headers(path: bytes) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"t"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip


async def connected(target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, h2.connection.H2Connection]:
    host, port = target.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    return reader, writer, client


async def frames_until_closed(reader: asyncio.StreamReader, answered: int = 0) -> Frames:
    """The frames the server sends until it closes the connection, or until it ends stream `answered`."""
    data, frames = b"", []
    while chunk := await asyncio.wait_for(reader.read(65536), 10):
        data += chunk
        while len(data) >= 9:
            frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
            if len(data) < 9 + length:
                break
            frame.parse_body(memoryview(data[9 : 9 + length]))
            data = data[9 + length :]
            frames.append(frame)
            if answered and frame.stream_id == answered and "END_STREAM" in frame.flags:
                return frames
    return frames


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


async def test_a_client_going_away_still_gets_its_running_calls_answered(
    server: tuple[H2Server, Handlers, str],  # noqa: F811
) -> None:
    """A client's GOAWAY (Node.js's grpc-js sends one as it closes) ends no call it had started."""
    _, handlers, target = server
    reader, writer, client = await connected(target)
    client.send_headers(1, headers(b"/t.S/held"))
    client.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
    client.close_connection()  # GOAWAY; h2's client state machine then takes frames for stream 1 no more
    writer.write(client.data_to_send())
    await asyncio.sleep(0.2)
    handlers.release.set()
    frames = await frames_until_closed(reader)  # the server closes once the call is answered
    writer.close()
    body, trailers = answer(frames, 1)
    assert body == b"\x00\x00\x00\x00\x08released"
    assert trailers[b"grpc-status"] == b"0"


async def cancel_calls(client: h2.connection.H2Connection, n: int) -> int:
    """Open `n` streaming calls and cancel each at once; the next stream id."""
    for i in range(n):
        client.send_headers(1 + 2 * i, headers(b"/t.S/chat"))
        client.reset_stream(1 + 2 * i)
    return 1 + 2 * n


async def test_a_client_that_floods_resets_loses_its_connection(
    server: tuple[H2Server, Handlers, str],  # noqa: F811
) -> None:
    """A "rapid reset" flood (open a call, cancel it, again, CVE-2023-44487): past the allowance the server says
    ENHANCE_YOUR_CALM and closes the connection. Other clients are served."""
    _, _, target = server
    reader, writer, client = await connected(target)
    await cancel_calls(client, RESET_BURST + 500)
    writer.write(client.data_to_send())  # in one write: the allowance regains nothing meanwhile
    frames = await frames_until_closed(reader)
    writer.close()
    goaway = [frame for frame in frames if isinstance(frame, hyperframe.frame.GoAwayFrame)]
    assert goaway and goaway[-1].error_code == ErrorCodes.ENHANCE_YOUR_CALM
    async with grpc.aio.insecure_channel(target) as channel:
        assert await channel.unary_unary("/t.S/echo")(b"served", timeout=5) == b"served"


async def test_a_client_cancelling_calls_within_the_allowance_keeps_its_connection(
    server: tuple[H2Server, Handlers, str],  # noqa: F811
) -> None:
    """Cancelling many held calls at once, as a client closing with its receives held does, is no flood."""
    _, _, target = server
    reader, writer, client = await connected(target)
    echo = await cancel_calls(client, RESET_BURST // 2)
    client.send_headers(echo, headers(b"/t.S/echo"))
    client.send_data(echo, b"\x00\x00\x00\x00\x02ok", end_stream=True)
    writer.write(client.data_to_send())
    frames = await frames_until_closed(reader, answered=echo)
    writer.close()
    body, trailers = answer(frames, echo)
    assert body == b"\x00\x00\x00\x00\x02ok"
    assert trailers[b"grpc-status"] == b"0"
    assert not any(isinstance(frame, hyperframe.frame.GoAwayFrame) for frame in frames)
