"""The adaptive policy alone: a sliding-window rate and a concurrency count per group. Pure, no clock."""

from __future__ import annotations

import pytest

from proxy import settings as proxy_settings
from proxy.receive.adaptive import LONGPOLL, NOTIFY, AdaptivePolicy, AdaptiveSettings


def policy(rate: float = 10.0, concurrency: float = 0.0, window: float = 1.0) -> AdaptivePolicy:
    return AdaptivePolicy(AdaptiveSettings(window_s=window, rate_threshold=rate, concurrency_per_broker=concurrency))


def test_a_quiet_group_notifies() -> None:
    p = policy()
    decision = p.start("g", now=100.0, live_brokers=4)
    assert (decision.mode, decision.reason, decision.rate) == (NOTIFY, "quiet", 1.0)


def test_rate_at_the_threshold_switches_to_long_polling_and_back_once_the_window_slides() -> None:
    p = policy(rate=10.0)
    modes = []
    for i in range(10):
        now = 100.0 + i * 0.05
        modes.append(p.start("g", now=now, live_brokers=4).mode)
        p.end("g", now=now)
    assert modes == [NOTIFY] * 9 + [LONGPOLL]
    # A window later the burst has slid out: quiet again.
    assert p.start("g", now=101.6, live_brokers=4).mode == NOTIFY


def test_groups_are_counted_apart() -> None:
    p = policy(rate=3.0)
    for _ in range(3):
        p.start("busy", now=5.0, live_brokers=1)
    assert p.start("busy", now=5.0, live_brokers=1).mode == LONGPOLL
    assert p.start("quiet", now=5.0, live_brokers=1).mode == NOTIFY


def test_concurrency_counts_receives_in_progress_per_live_broker() -> None:
    p = policy(rate=0, concurrency=2.0)
    decisions = [p.start("g", now=1.0, live_brokers=2) for _ in range(5)]
    assert [d.mode for d in decisions] == [NOTIFY] * 4 + [LONGPOLL]
    assert decisions[-1].reason == "concurrency" and decisions[-1].in_progress == 4
    p.end("g", now=1.1)
    assert p.start("g", now=1.2, live_brokers=2).mode == LONGPOLL  # still 4 in progress
    for _ in range(5):
        p.end("g", now=1.3)
    assert p.in_progress("g") == 0
    assert p.start("g", now=1.4, live_brokers=2).mode == NOTIFY


def test_criteria_switched_off_always_notify() -> None:
    p = policy(rate=0, concurrency=0)
    assert {p.start("g", now=1.0, live_brokers=1).mode for _ in range(1000)} == {NOTIFY}


def test_quiet_groups_are_forgotten() -> None:
    p = policy()
    p.start("g", now=1.0, live_brokers=1)
    p.end("g", now=3.0)
    assert p._rates == {} and p._in_progress == {}


@pytest.mark.parametrize("kwargs", [{"window_s": 0}, {"rate_threshold": -1}, {"concurrency_per_broker": -0.5}])
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AdaptiveSettings(**kwargs)


def test_busy_asks_about_the_other_receives_of_the_group() -> None:
    p = policy(rate=0, concurrency=1.0)
    p.start("g", now=1.0, live_brokers=2)
    assert not p.busy("g", now=1.0, live_brokers=2)  # only itself
    p.start("g", now=1.0, live_brokers=2)
    p.start("g", now=1.0, live_brokers=2)
    assert p.busy("g", now=1.0, live_brokers=2)  # two others: one per live broker
    rated = policy(rate=2.0, concurrency=0)
    rated.start("g", now=1.0, live_brokers=1)
    assert not rated.busy("g", now=1.0, live_brokers=1)
    rated.start("g", now=1.0, live_brokers=1)
    assert rated.busy("g", now=1.0, live_brokers=1)
    assert not rated.busy("g", now=2.5, live_brokers=1)  # the window slid past both


def test_the_fleet_size_setting_comes_from_flags_and_environment() -> None:
    base = ["--broker", "b1=127.0.0.1:1"]
    assert proxy_settings.load(base, {}).adaptive_proxies == 1
    assert proxy_settings.load(base, {"POPGATE_ADAPTIVE_PROXIES": "4"}).adaptive_proxies == 4
    assert proxy_settings.load([*base, "--adaptive-proxies", "3"], {}).adaptive_proxies == 3


def test_groups_that_stop_receiving_are_forgotten_once_their_window_has_passed() -> None:
    policy = AdaptivePolicy(AdaptiveSettings(window_s=10.0))
    for i in range(5000):  # one receive each, ended at once: each still counts in its window when it ends
        policy.start(f"once-{i}", now=1.0, live_brokers=2)
        policy.end(f"once-{i}", now=1.0)
    for _ in range(1024):  # later, one busy group
        policy.start("steady", now=100.0, live_brokers=2)
        policy.end("steady", now=100.0)
    assert len(policy._rates) <= 1
