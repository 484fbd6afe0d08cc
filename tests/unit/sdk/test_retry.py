from __future__ import annotations

import itertools
import random

import pytest

from popgate.retry import RetryPolicy


def test_delays_grow_are_jittered_and_bounded() -> None:
    policy = RetryPolicy(max_attempts=8, initial_backoff=0.1, max_backoff=1.0, multiplier=2.0, jitter=0.5)
    delays = list(policy.delays(random.Random(7)))
    assert len(delays) == 7  # attempts include the first call
    bases = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    for delay, base in zip(delays, bases, strict=True):
        assert base * 0.5 <= delay <= base
    assert len(set(delays)) == len(delays)  # jittered, not a fixed schedule


def test_forever_never_ends_and_stays_bounded() -> None:
    policy = RetryPolicy(initial_backoff=0.05, max_backoff=0.5)
    assert all(d <= 0.5 for d in itertools.islice(policy.delays(forever=True), 1000))


def test_one_attempt_means_no_retry() -> None:
    assert list(RetryPolicy(max_attempts=1).delays()) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"initial_backoff": 3.0, "max_backoff": 1.0},
        {"multiplier": 0.5},
        {"jitter": 2},
        {"max_backoff": float("inf")},  # as every other duration: finite, at most 7 days
        {"max_backoff": 1e12},
        {"initial_backoff": float("nan")},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
