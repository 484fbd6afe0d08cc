"""Bounded, jittered exponential back-off for retriable errors (sans-IO: it only computes delays)."""

from __future__ import annotations

import numbers
import random
from collections.abc import Iterator
from dataclasses import dataclass

MAX_BACKOFF_S = 7 * 24 * 3600.0  # as every other duration the SDK takes


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a client retries a call that failed with a retriable error.

    Attributes:
        max_attempts: Attempts in all, the first included (1 = never retry).
        initial_backoff: Delay before the first retry, seconds.
        max_backoff: Upper bound of any single delay, seconds.
        multiplier: Growth of the delay per retry.
        jitter: Each delay is drawn uniformly from ``[d * (1 - jitter), d]`` ("equal jitter"),
            so many clients failing together do not retry together.
    """

    max_attempts: int = 8  # 7 delays, 50 ms doubling to 2 s: 2.6-5.2 s in all, enough for a proxy restart
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        for name in ("max_attempts", "initial_backoff", "max_backoff", "multiplier", "jitter"):
            value = getattr(self, name)
            kind = numbers.Integral if name == "max_attempts" else numbers.Real
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(f"{name} must be {'an int' if kind is numbers.Integral else 'a number'}, got {value!r}")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if not 0 < self.initial_backoff <= self.max_backoff <= MAX_BACKOFF_S:  # 0: a busy loop; NaN fails too
            raise ValueError(f"need 0 < initial_backoff <= max_backoff <= {MAX_BACKOFF_S:.0f} s (7 days), finite")
        if self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("need multiplier >= 1 and 0 <= jitter <= 1")

    def delays(self, rng: random.Random | None = None, *, forever: bool = False) -> Iterator[float]:
        """The delay before each retry: ``max_attempts - 1`` of them, or endless when ``forever``.

        Args:
            rng: Where the jitter comes from (the `random` module when None).
            forever: Never stop (the consumers' iteration retries without end).
        """
        draw = (rng or random).uniform
        base = self.initial_backoff
        retries = 0
        while forever or retries < self.max_attempts - 1:
            yield draw(base * (1 - self.jitter), base)
            base = min(self.max_backoff, base * self.multiplier)
            retries += 1
