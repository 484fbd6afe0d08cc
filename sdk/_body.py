"""A received message's body checked as RocketMQ's official clients check it (sans-IO): its digest, of the body as it
came, and a GZIP body inflated, within a bound. `_wire.from_v2` reads every received message through these."""

from __future__ import annotations

import hashlib
import zlib

from popgate_pb.v2 import definition_pb2 as v2

from popgate_contract.gzip_body import NotGzip, gunzip

# A GZIP body inflates to at most the largest answer the client takes (`_transport.MAX_MESSAGE_BYTES`): as large as a
# body that came plain could be. Not the proxy's default body limit: an operator may raise it (and a RocketMQ broker's
# maxMessageSize), and a RocketMQ producer holds the body it compresses to it, so a sound body inflates within it —
# tests/unit/sdk/test_corrupt.py::test_a_body_that_does_not_inflate_or_match_its_digest_is_marked_corrupted.
MAX_INFLATED_BYTES = 64 * 1024 * 1024


def digest_mismatch(kind: int, checksum: str, body: bytes) -> str | None:
    """Why `body` does not match its `checksum` of type `kind`; None when it does (in any letter case, and a CRC32
    in any of the official clients' texts: hex padded or not, decimal), or when the type is one the SDK does not know
    (not checked, as the official clients do not)."""
    if kind == v2.CRC32:
        crc = zlib.crc32(body)
        expected = {f"{crc:X}", f"{crc:08X}", str(crc)}
    elif kind in (v2.MD5, v2.SHA1):
        expected = {hashlib.new("md5" if kind == v2.MD5 else "sha1", body, usedforsecurity=False).hexdigest().upper()}
    else:
        return None
    if checksum.upper() in expected:
        return None
    return f"its body does not match its {v2.DigestType.Name(kind)} digest {checksum!r}"


def inflated(body: bytes) -> tuple[bytes, str | None]:
    """A GZIP body inflated, and why it is corrupt if it does not inflate whole within MAX_INFLATED_BYTES (then the
    body as it came)."""
    try:
        whole = gunzip(body, MAX_INFLATED_BYTES)
    except NotGzip as exc:
        return body, f"its GZIP body does not inflate: {exc}"
    if whole is None:
        return body, f"its GZIP body inflates to more than {MAX_INFLATED_BYTES} bytes"
    return whole, None
