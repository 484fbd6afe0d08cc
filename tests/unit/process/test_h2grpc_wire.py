"""gRPC's wire pieces of popgate's HTTP/2 server, without sockets (popgate_process.h2grpc.wire)."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from popgate_process.h2grpc import wire


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 97), min_size=1, max_size=20))
def test_messages_come_out_whole_however_the_bytes_are_split(messages: list[bytes], cuts: list[int]) -> None:
    data = b"".join(wire.frame(m) for m in messages)
    deframer = wire.Deframer(1 << 20)
    out: list[bytes] = []
    start = 0
    for cut in cuts * (len(data) // sum(cuts) + 1):
        if start >= len(data):
            break
        out += deframer.feed(data[start : start + cut])
        start += cut
    assert out == messages
    assert deframer.pending == 0


def test_a_message_over_the_bound_is_refused_before_its_bytes_arrive() -> None:
    deframer = wire.Deframer(100)
    with pytest.raises(wire.WireError) as refused:
        deframer.feed(b"\x00" + (101).to_bytes(4, "big"))
    assert refused.value.code == wire.RESOURCE_EXHAUSTED
    assert "101 vs. 100" in refused.value.message


def inflate(max_bytes: int, encoding: bytes, packed: bytes, within: int | None = None) -> bytes | None:
    """The one message of a stream of `packed` (compressed), deframed and inflated."""
    (message,) = wire.Deframer(max_bytes, encoding).feed(b"\x01" + len(packed).to_bytes(4, "big") + packed)
    assert isinstance(message, wire.Compressed)
    return wire.inflate(message, max_bytes, within)


def test_a_gzip_message_is_inflated_and_bounded_inflated() -> None:
    assert inflate(100, b"gzip", gzip.compress(b"a" * 50)) == b"a" * 50
    with pytest.raises(wire.WireError) as refused:
        inflate(100, b"gzip", gzip.compress(b"a" * 1000))
    assert refused.value.code == wire.RESOURCE_EXHAUSTED


def test_a_compressed_message_in_an_unknown_encoding_is_unimplemented() -> None:
    with pytest.raises(wire.WireError) as refused:
        wire.Deframer(100, b"snappy").feed(b"\x01\x00\x00\x00\x01x")
    assert refused.value.code == wire.UNIMPLEMENTED
    with pytest.raises(wire.WireError) as refused:  # a name that is not text is named, not a crash
        wire.Deframer(100, b"\xff").feed(b"\x01\x00\x00\x00\x01x")
    assert refused.value.code == wire.UNIMPLEMENTED


@pytest.mark.parametrize(("encoding", "wbits"), [(b"gzip", 31), (b"deflate", 15)])
def test_a_compressed_bomb_is_refused_at_the_bound(encoding: bytes, wbits: int) -> None:
    """A message that would inflate to 64 MiB is refused having inflated ~its bound (1 MiB), not 64 MiB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    bomb = b"".join(packer.compress(bytes(1 << 20)) for _ in range(64)) + packer.flush()
    tracemalloc.start()
    try:
        with pytest.raises(wire.WireError) as refused:
            inflate(1 << 20, encoding, bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.code == wire.RESOURCE_EXHAUSTED
    assert peak < 4 << 20


@pytest.mark.parametrize(("encoding", "wbits"), [(b"gzip", 31), (b"deflate", 15)])
def test_a_compressed_message_cut_short_or_followed_by_other_bytes_is_refused(encoding: bytes, wbits: int) -> None:
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = packer.compress(b"a" * 50) + packer.flush()
    assert inflate(100, encoding, packed) == b"a" * 50
    for bad in (packed[:-3], packed + b"junk"):
        with pytest.raises(wire.WireError) as refused:
            inflate(100, encoding, bad)
        assert refused.value.code == wire.INTERNAL


@pytest.mark.parametrize("size", [wire.INLINE_BYTES - 1, wire.INLINE_BYTES, wire.INLINE_BYTES + 1, 3 << 20])
def test_messages_on_either_side_of_the_inline_part_inflate_whole_and_bounded(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    assert inflate(size, b"gzip", gzip.compress(body)) == body
    inline = inflate(size, b"gzip", gzip.compress(body), wire.INLINE_BYTES)  # past it: None, inflated off the loop
    assert inline is None if size > wire.INLINE_BYTES else inline in (body, None if size == wire.INLINE_BYTES else body)
    with pytest.raises(wire.WireError) as refused:
        inflate(size - 1, b"gzip", gzip.compress(body))
    assert refused.value.code == wire.RESOURCE_EXHAUSTED
    for extra in (b"junk", gzip.compress(b"second member")):  # within the bound, but not one whole message
        with pytest.raises(wire.WireError) as refused:
            inflate(size, b"gzip", gzip.compress(body) + extra)
        assert refused.value.code == wire.INTERNAL


def test_a_message_of_more_than_a_few_compressed_kib_is_never_inflated_on_the_loop() -> None:
    """However little it inflates to: 1 MiB of empty deflate blocks (a CPU bomb with no output) is left to a thread
    by the on-loop attempt, and inflates there to nothing."""
    empty_block = b"\x00\x00\x00\xff\xff"  # a stored block of no bytes, not the last
    packed = b"x\x9c" + empty_block * 200_000 + b"\x03\x00" + zlib.adler32(b"").to_bytes(4, "big")
    assert len(packed) > wire.INLINE_INPUT_BYTES
    assert inflate(1 << 20, b"deflate", packed, wire.INLINE_BYTES) is None
    assert inflate(1 << 20, b"deflate", packed) == b""


async def test_a_large_message_inflating_on_a_thread_holds_the_loop_little() -> None:
    """A message inflating to 48 MiB (its compressed bytes 48 KiB), inflated on a thread: the event loop runs on
    meanwhile, never held up for more than a small part of the inflation's time (one piece's copy at a time). A
    loaded machine also stops the loop's thread for a while now and then, which looks the same from inside: the
    best of three inflations is taken (inflating under the GIL holds the loop in every one)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    packed = b"".join(packer.compress(bytes(1 << 20)) for _ in range(48)) + packer.flush()
    (message,) = wire.Deframer(64 << 20, b"gzip").feed(b"\x01" + len(packed).to_bytes(4, "big") + packed)
    assert isinstance(message, wire.Compressed)
    held: list[tuple[float, float]] = []  # (longest loop gap, the inflation's time) per try
    while len(held) < 3 and not any(longest < took / 4 for longest, took in held):
        longest, took, inflated = await inflated_watching_the_loop(message)
        assert inflated is not None and len(inflated) == 48 << 20
        held.append((longest, took))
    assert any(longest < took / 4 for longest, took in held), held


async def inflated_watching_the_loop(message: wire.Compressed) -> tuple[float, float, bytes | None]:
    """`message` inflated on a thread: the longest the loop waited for a turn meanwhile, and how long it took."""
    loop = asyncio.get_running_loop()
    started = last = loop.time()
    inflating = asyncio.ensure_future(asyncio.to_thread(wire.inflate, message, 64 << 20))
    longest = 0.0
    while not inflating.done():
        await asyncio.sleep(0)
        now = loop.time()
        longest, last = max(longest, now - last), now
    return longest, loop.time() - started, await inflating


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"250m", 0.25), (b"7u", 7e-6), (b"99999999n", 0.099999999)],
)
def test_grpc_timeouts_read_in_every_unit(header: bytes, seconds: float) -> None:
    assert wire.timeout_s(header) == pytest.approx(seconds)


@pytest.mark.parametrize("header", [b"", b"S", b"123456789S", b"10x", b"-1S", b"1.5S"])
def test_a_bad_grpc_timeout_is_refused(header: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.timeout_s(header)


def test_metadata_leaves_out_the_protocol_headers_and_decodes_binary_values() -> None:
    headers = [
        (b":path", b"/s/m"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"grpc-timeout", b"1S"),
        (b"authorization", b"MQv2-HMAC-SHA1 Credential=ak"),
        (b"x-trace-bin", b"AAEC"),  # base64 of 00 01 02, padding dropped as grpc writes it
    ]
    assert wire.metadata(headers) == (
        ("authorization", "MQv2-HMAC-SHA1 Credential=ak"),
        ("x-trace-bin", b"\x00\x01\x02"),
    )


def test_a_bin_value_that_is_not_base64_is_the_calls_error() -> None:
    with pytest.raises(wire.WireError) as refused:
        wire.metadata([(b"x-trace-bin", b"a")])  # one base64 character: no byte at all
    assert refused.value.code == wire.INTERNAL
    assert "x-trace-bin" in refused.value.message


def test_a_status_message_round_trips_through_its_percent_encoding() -> None:
    message = "bad topic 'ä%' at\r\n100%"
    trailers = dict(wire.status(3, message, [("popgate-error", "BadRequest"), ("k-bin", b"\xff")]))
    assert trailers[b"grpc-status"] == b"3"
    assert all(32 <= c < 127 for c in trailers[b"grpc-message"])
    assert unquote(trailers[b"grpc-message"].decode()) == message
    assert trailers[b"popgate-error"] == b"BadRequest"
    assert trailers[b"k-bin"] == b"/w"


def test_resets_past_the_burst_are_refused_until_time_refills_them() -> None:
    allowance = wire.ResetAllowance(burst=3, per_s=2)
    assert [allowance.spend(10.0) for _ in range(4)] == [True, True, True, False]
    assert not allowance.spend(10.2)  # 0.4 of a reset regained: not one yet
    assert allowance.spend(10.5)  # a whole one after half a second
    assert not allowance.spend(10.5)
    assert [allowance.spend(100.0) for _ in range(4)] == [True, True, True, False]  # never more than the burst
