"""The broker's clock: where every message time, deadline and due time of the broker comes from.

One `Clock` is made by the entry point (`broker.__main__`) and handed to the `BrokerCore`, which hands it to the
parts that read the time (the send path and its scheduled delivery, redelivery, readiness, retention); the
metrics and the servicer read the core's. Times are milliseconds since the Unix epoch. Tests hand the core a
clock they set.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...


class WallClock:
    """The system's wall-clock time."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000
