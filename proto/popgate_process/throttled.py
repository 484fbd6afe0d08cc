"""A log line for a failure that repeats, at most every so often."""

from __future__ import annotations

import time
from collections.abc import Callable

FAILURE_LOG_EVERY_S = 10.0


class Throttled:
    """A failure that repeats is logged once, then at most every `every_s` with how many were left out: the
    log grows with time, not with the clients' retry rate, on what may be the same full disk."""

    def __init__(self, emit: Callable[..., None], every_s: float = FAILURE_LOG_EVERY_S) -> None:
        self._emit = emit
        self._every_s = every_s
        self._next = 0.0
        self._left_out = 0

    def __call__(self, text: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._left_out += 1
            return
        if self._left_out:
            text, args = text + " (and %d more since the last such line)", (*args, self._left_out)
        self._emit(text, *args)
        self._left_out = 0
        self._next = now + self._every_s
