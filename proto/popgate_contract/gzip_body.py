"""A message body declared GZIP, inflated as the proxy reads a sent one and the SDK a received one: every member
(RFC 1952 allows several, as `gzip.decompress` reads them), each to its end, at most one byte past a cap, and at most
GZIP_MAX_MEMBERS members — each member's inflater copies the input left after it, so a body of thousands of empty
members would cost seconds (quadratic) for nothing. A member may have a zlib header instead of a gzip one: RocketMQ's
Java client compresses with zlib and declares GZIP, and RocketMQ's proxy declares a 4.x producer's zlib body so (the
official Go client reads both); zero bytes after the last member are padding, as `gzip.decompress` skips them."""

from __future__ import annotations

import zlib

GZIP_MAX_MEMBERS = 64  # real bodies have one or a few
_GZIP_OR_ZLIB = 32 + 15  # zlib's wbits: either header detected, the largest window


class NotGzip(ValueError):
    """A body declared GZIP that does not inflate whole: not GZIP, truncated, or past GZIP_MAX_MEMBERS members."""


def gunzip(body: bytes, cap: int) -> bytes | None:
    """`body` inflated; None when it inflates past `cap` bytes (inflating stops one byte past it) —
    tests/unit/contract/test_gzip_body.py, tests/unit/proxy/test_v2_edge.py (a sent body),
    tests/unit/sdk/test_corrupt.py (a received one)."""
    parts: list[bytes] = []
    size, rest = 0, body
    try:
        for _ in range(GZIP_MAX_MEMBERS):
            inflater = zlib.decompressobj(wbits=_GZIP_OR_ZLIB)
            part = inflater.decompress(rest, cap + 1 - size)
            size += len(part)
            if size > cap:
                return None
            if not inflater.eof:
                raise NotGzip("the stream is truncated")
            parts.append(part)
            rest = inflater.unused_data
            if not rest.strip(b"\x00"):
                return b"".join(parts)
    except zlib.error as exc:
        raise NotGzip(str(exc)) from None
    raise NotGzip(f"it has more than {GZIP_MAX_MEMBERS} members")
