"""The adaptive receive policy: pop with notify while a group is quiet, coupled long polling when busy. Pure.

Why switch at all (docs/ARCHITECTURE.md §3): pop with notify costs a first Pop plus a Notification
to every live broker per receive that has to wait, which is what removes false empty
responses when few consumers face many brokers. With many receives of a group in
flight every broker already has a waiter of that group, coupled long polling has no
false empties left to fix, and it costs one broker call per receive.

Two criteria, per consumer group on this proxy (either can be switched off with 0):
- rate: receive requests per second over a sliding window (`window_s`), bucketed so
  memory per group is fixed; at or above `rate_threshold` → longpoll;
- concurrency: receives of the group in progress at or above
  `concurrency_per_broker` × live brokers → longpoll; with `proxies` > 1 (the size of the
  proxy fleet the group's consumers are spread over) this proxy's count stands for
  `proxies` times as many receives fleet-wide, so the threshold is divided by `proxies`
  (docs/SCALE.md: otherwise, with many proxies per broker, each proxy sees too few receives of
  the group to switch and the whole fleet stays in notify mode) —
  tests/unit/sim/test_sim.py::test_adaptive_settings_proxies_divides_the_concurrency_threshold.
The numbers behind the defaults are in docs/RECEIVE.md.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

NOTIFY = "notify"
LONGPOLL = "longpoll"
_BUCKETS = 10  # per window: the rate is exact to a tenth of the window


@dataclass(frozen=True, slots=True)
class AdaptiveSettings:
    window_s: float = 1.0
    rate_threshold: float = 0.0  # receive requests / s of one group; 0 = criterion off (the default)
    concurrency_per_broker: float = 1.0  # receives in progress per live broker; 0 = criterion off
    proxies: int = 1  # proxies the group's consumers are spread over; 1 = judge this proxy alone (the default)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ValueError(f"adaptive window {self.window_s!r} s must be > 0")
        if self.rate_threshold < 0 or self.concurrency_per_broker < 0:
            raise ValueError("adaptive thresholds must be >= 0 (0 switches a criterion off)")
        if self.proxies < 1:
            raise ValueError(f"adaptive proxies {self.proxies!r} must be >= 1")


@dataclass(slots=True)
class _Rate:
    """Requests in the last window, counted in `_BUCKETS` buckets."""

    buckets: deque[list[int]] = field(default_factory=deque)  # [bucket number, count]
    total: int = 0

    def add(self, bucket: int, horizon: int) -> int:
        self.expire(horizon)
        if self.buckets and self.buckets[-1][0] == bucket:
            self.buckets[-1][1] += 1
        else:
            self.buckets.append([bucket, 1])
        self.total += 1
        return self.total

    def expire(self, horizon: int) -> None:
        while self.buckets and self.buckets[0][0] <= horizon:
            self.total -= self.buckets.popleft()[1]


@dataclass(frozen=True, slots=True)
class Decision:
    mode: str  # NOTIFY or LONGPOLL
    reason: str  # "quiet", "rate", "concurrency"
    rate: float  # requests / s of the group, this one included
    in_progress: int  # receives of the group in progress, this one excluded


class AdaptivePolicy:
    """Chooses the mode of each receive; tell it when receives start and end."""

    def __init__(self, settings: AdaptiveSettings | None = None) -> None:
        self.settings = settings or AdaptiveSettings()
        self._width = self.settings.window_s / _BUCKETS
        self._rates: dict[str, _Rate] = {}
        self._in_progress: dict[str, int] = {}
        self._starts = 0

    def start(self, group: str, *, now: float, live_brokers: int) -> Decision:
        """A receive of `group` arrives: count it and choose its mode."""
        s = self.settings
        bucket = int(now / self._width)
        self._starts += 1
        if self._starts % 1024 == 0:
            self._forget_quiet(bucket - _BUCKETS)
        count = self._rates.setdefault(group, _Rate()).add(bucket, bucket - _BUCKETS)
        rate = count / s.window_s
        busy = self._in_progress.get(group, 0)
        self._in_progress[group] = busy + 1
        if s.concurrency_per_broker and busy >= self._concurrency_limit(live_brokers):
            return Decision(LONGPOLL, "concurrency", rate, busy)
        if s.rate_threshold and rate >= s.rate_threshold:
            return Decision(LONGPOLL, "rate", rate, busy)
        return Decision(NOTIFY, "quiet", rate, busy)

    def busy(self, group: str, *, now: float, live_brokers: int) -> bool:
        """Whether `group` is busy now by either criterion (a receive in progress asks about the others)."""
        s = self.settings
        others = self._in_progress.get(group, 0) - 1
        if s.concurrency_per_broker and others >= self._concurrency_limit(live_brokers):
            return True
        rate = self._rates.get(group)
        if not s.rate_threshold or rate is None:
            return False
        rate.expire(int(now / self._width) - _BUCKETS)
        return rate.total / s.window_s >= s.rate_threshold

    def end(self, group: str, *, now: float) -> None:
        """A receive of `group` was answered (or abandoned)."""
        left = self._in_progress.get(group, 0) - 1
        if left > 0:
            self._in_progress[group] = left
            return
        self._in_progress.pop(group, None)
        rate = self._rates.get(group)
        if rate is not None:
            rate.expire(int(now / self._width) - _BUCKETS)
            if not rate.total:  # forget quiet groups: memory follows the groups in use
                del self._rates[group]

    def _forget_quiet(self, oldest_bucket: int) -> None:
        """Drop the rates of groups with no receive in progress and none in the window: a group whose last
        receive ended while its window still counted (and never came back) is not kept forever."""
        for group in [g for g in self._rates if g not in self._in_progress]:
            rate = self._rates[group]
            rate.expire(oldest_bucket)
            if not rate.total:
                del self._rates[group]

    def _concurrency_limit(self, live_brokers: int) -> float:
        """Receives of a group in progress on this proxy from which it long-polls (never below 1)."""
        s = self.settings
        return max(1.0, s.concurrency_per_broker * max(1, live_brokers) / s.proxies)

    def in_progress(self, group: str) -> int:
        return self._in_progress.get(group, 0)
