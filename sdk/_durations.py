"""The durations the SDK sends: float seconds checked against what it can send (a number, finite, >= 0, at most
MAX_DURATION_S, a TypeError or ValueError naming the argument otherwise), set into protobuf Durations and Timestamps.
"""

from __future__ import annotations

import math
import numbers

# The longest duration the SDK sends (delay, invisible, wait, request_timeout; deliver_at at most this far ahead).
# Above every default server limit (popgate's and RocketMQ's proxies: delay 1 day, invisible 12 h, long polling
# 20-30 s, clamped), with room for a server configured higher; far below what a protobuf Duration or a gRPC
# deadline can carry (a timeout of ~1e10 s overflows grpc's deadline and fails at once with DEADLINE_EXCEEDED).
MAX_DURATION_S = 7 * 24 * 3600.0


def _set_seconds(target: object, seconds: float) -> None:
    _finite("a duration", seconds)
    whole = int(seconds)
    target.seconds, target.nanos = whole, int(round((seconds - whole) * 1e9))  # type: ignore[attr-defined]


def _finite(name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value}")


def duration(name: str, seconds: float, *, positive: bool = False) -> float:
    """`seconds` when the SDK can send it as the argument `name`: a real number (a bool is not one), finite, >= 0
    (> 0 if `positive`), at most MAX_DURATION_S; else TypeError or ValueError naming the argument —
    tests/unit/sdk/test_refused.py::test_an_argument_of_the_wrong_type_is_refused_naming_it."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {seconds!r}")
    low_ok = seconds > 0 if positive else seconds >= 0
    if not (low_ok and seconds <= MAX_DURATION_S):  # NaN fails both
        low = "> 0" if positive else ">= 0"
        raise ValueError(
            f"{name} must be a finite number of seconds, {low} and <= {MAX_DURATION_S:.0f} (7 days), got {seconds}"
        )
    return seconds


def _deliver_at(deliver_at: float, now: float) -> None:
    if isinstance(deliver_at, bool) or not isinstance(deliver_at, numbers.Real):
        raise TypeError(f"deliver_at must be a time in epoch seconds, got {deliver_at!r}")
    if not 0 <= deliver_at <= now + MAX_DURATION_S:  # also refuses NaN
        raise ValueError(
            f"deliver_at must be a finite time in epoch seconds, at most 7 days ahead "
            f"(<= {now + MAX_DURATION_S:.0f}), got {deliver_at}"
        )
