"""The broker's clock: where every message time, deadline and due time of the broker comes from.

One `Clock` is made by the entry point (`broker.__main__`) and handed to the `BrokerCore`, which hands it to the
parts that read the time (the send path and its scheduled delivery, redelivery, readiness, retention); the
metrics and the servicer read the core's. Times are milliseconds since the Unix epoch. Tests hand the core a
clock they set.

What must keep its length while the broker runs, whatever steps the wall clock takes (the check schedule of half
messages, broker.transactions), is measured on `monotonic_ms`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock no wall-clock step moves (its origin means nothing)."""
        ...


class WallClock:
    """The system's wall-clock time, and its monotonic clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000
