"""Protobuf wire encoding by hand, for bytes built without message objects where that is cheaper: the broker's
v2 encoding of a stored message (popgate_contract/v2wire.py) and the proxy's splicing of a delivery into it
(proxy/v2/convert.py) — tests/unit/proxy/test_splice.py::test_a_spliced_message_reads_as_to_client_builds_it checks
these against the protobuf library."""

from __future__ import annotations

SMALL = [bytes((n,)) for n in range(0x80)]  # the one-byte varints
_U64 = (1 << 64) - 1


def varint(n: int) -> bytes:
    """`n` as a protobuf varint (negative numbers as their 64-bit two's complement, as int64 fields are)."""
    if 0 <= n < 0x80:
        return SMALL[n]
    if 0 < n < 1 << 35:  # lengths, offsets, seconds since the epoch: one bytes() call
        if n < 1 << 14:
            return bytes((n & 0x7F | 0x80, n >> 7))
        if n < 1 << 21:
            return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
        if n < 1 << 28:
            return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14 & 0x7F | 0x80, n >> 21))
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14 & 0x7F | 0x80, n >> 21 & 0x7F | 0x80, n >> 28))
    n &= _U64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), its length, its payload."""
    return tag + varint(len(payload)) + payload


_NANOS = [b"\x10" + varint(millis * 1_000_000) if millis else b"" for millis in range(1000)]
_SECONDS: dict[int, bytes] = {}  # Timestamp.seconds fields of recent seconds (a batch's times share a few)


def timestamp(tag: bytes, ms: int) -> bytes:
    """A google.protobuf.Timestamp field of `ms` since the epoch (present even when zero, as a set field is)."""
    seconds, millis = divmod(ms, 1000)
    head = _SECONDS.get(seconds)
    if head is None:
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        head = _SECONDS[seconds] = b"\x08" + varint(seconds) if seconds else b""
    inner = head + _NANOS[millis]
    return tag + SMALL[len(inner)] + inner  # at most 1 + 10 + 1 + 5 bytes: a one-byte length


def timestamp_ns(tag: bytes, ns: int) -> bytes:
    """A google.protobuf.Timestamp field of `ns` nanoseconds since the epoch."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    inner = (b"\x08" + varint(seconds) if seconds else b"") + (b"\x10" + varint(nanos) if nanos else b"")
    return tag + SMALL[len(inner)] + inner
