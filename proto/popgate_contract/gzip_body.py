"""A message body declared GZIP, inflated as the proxy reads a sent one and the SDK a received one: every member
(RFC 1952 allows several, as `gzip.decompress` reads them), each to its end, at most one byte past a cap, and at most
GZIP_MAX_MEMBERS members — each member's inflater copies the input left after it, so a body of thousands of empty
members would cost seconds (quadratic) for nothing."""

from __future__ import annotations

import zlib

GZIP_MAX_MEMBERS = 64  # real bodies have one or a few


class NotGzip(ValueError):
    """A body declared GZIP that does not inflate whole: not GZIP, truncated, or past GZIP_MAX_MEMBERS members."""


def gunzip(body: bytes, cap: int) -> bytes | None:
    """`body` inflated; None when it inflates past `cap` bytes (inflating stops one byte past it) —
    tests/unit/proxy/test_v2_edge.py (a sent body), tests/unit/sdk/test_corrupt.py (a received one)."""
    parts: list[bytes] = []
    size, rest = 0, body
    try:
        for _ in range(GZIP_MAX_MEMBERS):
            inflater = zlib.decompressobj(wbits=31)
            part = inflater.decompress(rest, cap + 1 - size)
            size += len(part)
            if size > cap:
                return None
            if not inflater.eof:
                raise NotGzip("the stream is truncated")
            parts.append(part)
            rest = inflater.unused_data
            if not rest:
                return b"".join(parts)
    except zlib.error as exc:
        raise NotGzip(str(exc)) from None
    raise NotGzip(f"it has more than {GZIP_MAX_MEMBERS} members")
