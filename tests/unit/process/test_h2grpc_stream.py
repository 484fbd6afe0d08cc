"""A call's requests as its handler reads them (popgate_process.h2grpc.stream), without sockets: the stream's
connection is a recorder of what the stream tells it."""

from __future__ import annotations

from typing import Any

from popgate_process.h2grpc import wire
from popgate_process.h2grpc.stream import COMPACT_AFTER, Stream


class Acks:
    """The connection, as far as reading requests goes: the bytes each acknowledgement gives back to the client."""

    def __init__(self) -> None:
        self.acknowledged: list[int] = []

    def acknowledge(self, stream_id: int, length: int) -> None:
        self.acknowledged.append(length)


async def test_requests_come_out_in_order_and_the_read_ones_are_let_go() -> None:
    """Thousands of requests in one read come out in order; the list holding them sheds those read (every
    COMPACT_AFTER, and all of them once none is left), so a long stream does not keep what it read."""
    connection: Any = Acks()
    stream = Stream(connection, 1, "/t.S/chat", 1 << 20, b"identity")
    words = [str(i).encode() for i in range(3 * COMPACT_AFTER)]
    data = b"".join(wire.frame(word) for word in words)
    stream.received(data, len(data))
    stream.end_of_requests()
    lengths = []
    read = []
    for _ in words:
        read.append(await stream.read_bytes())
        lengths.append(len(stream.inbox))
    assert read == words
    assert max(lengths) <= len(words) + 1 and min(lengths[COMPACT_AFTER:]) < len(words) - COMPACT_AFTER
    assert await stream.read_bytes() is None  # the client's end
    assert stream.inbox == []
    assert sum(connection.acknowledged) == len(data)
