"""popgate's gRPC server (proto/popgate_process/h2grpc) driven frame by frame: how a call ends when its answer
cannot go, and what a client's bad frames on one call cost (that call, not its connection)."""

from __future__ import annotations

import asyncio

import pytest

from popgate_process.h2grpc import wire
from tests.integration.process.h2grpc_served import started
from tests.integration.process.test_h2grpc_raw import answer, connected, headers

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
