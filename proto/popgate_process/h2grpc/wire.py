"""gRPC over HTTP/2, the parts without sockets: message framing, deadlines, metadata and status trailers.

What the protocol says (grpc's PROTOCOL-HTTP2.md): each message is a 1-byte compressed flag, a 4-byte big-endian
length and the bytes; a deadline is `grpc-timeout` (up to 8 digits and a unit); metadata keys ending in `-bin`
carry base64; a status is the `grpc-status` and percent-encoded `grpc-message` trailers. Guarded by
tests/unit/process/test_h2grpc_wire.py.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterable, Sequence
from urllib.parse import quote

Header = tuple[bytes, bytes]

_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# zlib's window bits for each `grpc-encoding` it inflates: gzip's header and trailer, or zlib's (deflate).
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
# A compressed message inflating to at most INLINE_BYTES does so on the event loop (well under a millisecond); a
# larger one is inflated again, whole, on a thread (`H2Server.inflaters`), PIECE_BYTES at a time.
INLINE_BYTES = 64 * 1024
INLINE_INPUT_BYTES = 16 * 1024  # and of at most this many compressed bytes (however little they inflate to)
PIECE_BYTES = 1 << 20
# Request headers that are HTTP/2's or gRPC's own, not the caller's metadata (grpc.aio leaves them out too).
_RESERVED = frozenset((b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"))


class WireError(Exception):
    """A request the protocol cannot carry: answered with `code` (a grpc status number) and `message`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14


def frame(message: bytes) -> bytes:
    """One uncompressed gRPC message as it goes on the wire."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


class Compressed:
    """A compressed request message as it came, inflated by its call's reader (`inflate`), not as it arrives."""

    __slots__ = ("data", "wbits")

    def __init__(self, data: bytes, wbits: int) -> None:
        self.data = data
        self.wbits = wbits

    def __len__(self) -> int:
        return len(self.data)


class Deframer:
    """Cuts a request stream's DATA into messages, however the bytes were split into frames.

    A message longer than `max_bytes` is refused before its bytes are kept; a compressed one (gzip or deflate, as
    `grpc-encoding` names) comes out as `Compressed`, which `inflate` inflates up to the same bound."""

    __slots__ = ("_buffer", "_encoding", "_max")

    def __init__(self, max_bytes: int, encoding: bytes = b"identity") -> None:
        self._buffer = bytearray()
        self._max = max_bytes
        self._encoding = encoding

    def feed(self, data: bytes) -> list[bytes | Compressed]:
        buffer = self._buffer
        buffer += data
        out: list[bytes | Compressed] = []
        start = 0
        while len(buffer) - start >= 5:
            length = int.from_bytes(buffer[start + 1 : start + 5], "big")
            if length > self._max:
                raise WireError(RESOURCE_EXHAUSTED, f"Received message larger than max ({length} vs. {self._max})")
            end = start + 5 + length
            if len(buffer) < end:
                break
            message = bytes(buffer[start + 5 : end])
            out.append(Compressed(message, self._wbits()) if buffer[start] else message)
            start = end
        if start:
            del buffer[:start]
        return out

    @property
    def pending(self) -> int:
        """Bytes of a message not yet complete."""
        return len(self._buffer)

    def _wbits(self) -> int:
        wbits = _WBITS.get(self._encoding)
        if wbits is None:
            name = self._encoding.decode(errors="replace")
            raise WireError(UNIMPLEMENTED, f"a compressed message in encoding {name!r}")
        return wbits


def inflate(message: Compressed, max_bytes: int, within: int | None = None) -> bytes | None:
    """`message` inflated, refused once past `max_bytes` (a "zip bomb" costs that much memory and no more:
    test_h2grpc_wire.py::test_a_compressed_bomb_is_refused_at_the_bound) or when it does not inflate whole; None,
    given `within`, when it is larger than INLINE_INPUT_BYTES or inflates past `within` bytes (the caller inflates
    it again off the event loop). Its input goes in slices and its output comes in pieces of PIECE_BYTES, so zlib
    lets go of the GIL for nearly all the work: on a thread, the loop waits at most one piece's copy at a time —
    test_h2grpc_wire.py::test_a_large_message_inflating_on_a_thread_holds_the_loop_little."""
    if within is not None and len(message.data) > INLINE_INPUT_BYTES:
        return None
    inflater = zlib.decompressobj(message.wbits)
    limit = max_bytes if within is None else min(max_bytes, within)  # past it: refused, or None
    view, taken, pieces, total = memoryview(message.data), 0, [], 0
    while not inflater.eof and taken < len(view):
        data: bytes | memoryview = view[taken : taken + PIECE_BYTES]
        taken += len(data)
        while data or not inflater.eof:  # this slice, and what zlib holds back past a full piece
            room = min(PIECE_BYTES, limit + 1 - total)
            try:
                piece = inflater.decompress(data, room)
            except zlib.error as exc:
                raise WireError(INTERNAL, f"a compressed message does not inflate: {exc}") from None
            data = inflater.unconsumed_tail
            pieces.append(piece)
            total += len(piece)
            if total > max_bytes:
                raise WireError(RESOURCE_EXHAUSTED, f"Received message larger than max (more than {max_bytes})")
            if within is not None and total > within:
                return None
            if inflater.eof or (not data and len(piece) < room):
                break  # the message ended, or the slice is inflated and nothing is held back
    if not inflater.eof or inflater.unused_data or taken < len(view):
        raise WireError(INTERNAL, "a compressed message does not inflate: truncated or followed by other bytes")
    return b"".join(pieces)


def timeout_s(value: bytes) -> float:
    """The seconds a `grpc-timeout` header gives; WireError if it is not one."""
    digits, unit = value[:-1], value[-1:]
    if not 0 < len(digits) <= 8 or not digits.isdigit() or unit not in _UNITS:
        raise WireError(INTERNAL, f"a grpc-timeout of {value.decode(errors='replace')!r}")
    return int(digits) * _UNITS[unit]


def metadata(headers: Iterable[Header]) -> tuple[tuple[str, str | bytes], ...]:
    """The caller's metadata as grpc.aio's `invocation_metadata()` gives it: text values as str, `-bin` ones
    decoded to bytes, HTTP/2's and gRPC's own headers left out. WireError (INTERNAL, the call's alone) for a `-bin`
    value that is not base64 — test_h2grpc_wire.py::test_a_bin_value_that_is_not_base64_is_the_calls_error."""
    out: list[tuple[str, str | bytes]] = []
    for key, value in headers:
        if key[:1] == b":" or key in _RESERVED:
            continue
        name = key.decode("ascii", errors="replace")
        if key.endswith(b"-bin"):
            try:
                out.append((name, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except binascii.Error:
                raise WireError(INTERNAL, f"metadata {name!r} is not base64") from None
        else:
            out.append((name, value.decode("latin-1")))
    return tuple(out)


def encode_metadata(pairs: Sequence[tuple[str, str | bytes]] | None) -> list[Header]:
    """Metadata as headers: `-bin` values base64 without padding, as grpc writes them."""
    out: list[Header] = []
    for key, value in pairs or ():
        name = key.lower().encode("ascii")
        if name.endswith(b"-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            out.append((name, base64.b64encode(raw).rstrip(b"=")))
        else:
            out.append((name, value.encode("latin-1") if isinstance(value, str) else value))
    return out


def status(code: int, message: str = "", trailing: Sequence[tuple[str, str | bytes]] | None = None) -> list[Header]:
    """A call's status as trailers: `grpc-message` percent-encoded (grpc's unreserved characters kept)."""
    out = [(b"grpc-status", str(code).encode())]
    if message:
        out.append((b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode("ascii")))
    out += encode_metadata(trailing)
    return out


class ResetAllowance:
    """How many calls a client may cancel (RST_STREAM on a call still running) before its connection is closed:
    `burst` at once, and `per_s` more each second after, up to `burst` again
    (tests/unit/process/test_h2grpc_wire.py::test_resets_past_the_burst_are_refused_until_time_refills_them)."""

    __slots__ = ("_burst", "_per_s", "_left", "_at")

    def __init__(self, burst: float, per_s: float) -> None:
        self._burst = burst
        self._per_s = per_s
        self._left = burst
        self._at: float | None = None

    def spend(self, now: float) -> bool:
        """One cancelled call at `now` (seconds, any monotonic clock): False once the allowance is spent."""
        if self._at is not None:
            self._left = min(self._burst, self._left + (now - self._at) * self._per_s)
        self._at = now
        if self._left < 1:
            return False
        self._left -= 1
        return True
