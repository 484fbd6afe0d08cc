"""The GZIP body inflater the proxy's sends and the SDK's receives share: what official clients write inflates."""

from __future__ import annotations

import gzip
import zlib

import pytest

from popgate_contract.gzip_body import GZIP_MAX_MEMBERS, NotGzip, gunzip


def test_gzip_members_zlib_streams_and_zero_padding_inflate_as_their_writers_meant() -> None:
    assert gunzip(gzip.compress(b"gzip"), 100) == b"gzip"
    assert gunzip(zlib.compress(b"zlib, as RocketMQ's Java client writes GZIP"), 100) == (
        b"zlib, as RocketMQ's Java client writes GZIP"
    )
    assert gunzip(gzip.compress(b"a") + gzip.compress(b"b"), 100) == b"ab"  # two members, as gzip.decompress reads
    assert gunzip(gzip.compress(b"padded") + b"\x00" * 16, 100) == b"padded"  # as gzip.decompress skips it


def test_what_does_not_inflate_whole_within_its_cap_is_told_apart() -> None:
    assert gunzip(gzip.compress(b"x" * 101), 100) is None
    with pytest.raises(NotGzip, match="truncated"):
        gunzip(gzip.compress(b"x" * 1000)[:-12], 10_000)
    with pytest.raises(NotGzip):
        gunzip(b"plain text, not compressed", 100)
    with pytest.raises(NotGzip, match="members"):
        gunzip(gzip.compress(b"") * (GZIP_MAX_MEMBERS + 1), 100)
