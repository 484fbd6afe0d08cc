"""The scale model (bench/sim): deterministic per seed, and it reproduces what the real system shows."""

from __future__ import annotations

from bench.sim.model import Config, simulate


def sparse(mode: str, seed: int = 1) -> Config:
    # The sparse case of bench/realtime_bench.py, shortened: 1 consumer, 4 brokers, poll 2 s.
    return Config(
        mode=mode, brokers=4, consumers=1, rate=1 / 0.15, arrivals="uniform", messages=80, duration=14.0, seed=seed
    )


def test_same_seed_same_result() -> None:
    a, b = simulate(sparse("notify", 3)), simulate(sparse("notify", 3))
    assert a.latencies == b.latencies
    assert (a.pops, a.notifications, a.completed, a.empties) == (b.pops, b.notifications, b.completed, b.empties)
    assert simulate(sparse("notify", 4)).latencies != a.latencies


def test_longpoll_has_false_empties_with_one_consumer_and_four_brokers() -> None:
    results = [simulate(sparse("longpoll", seed)) for seed in (4, 5, 6)]
    assert sum(r.false_empties for r in results) > 0
    assert all(r.pct(50) > 100 for r in results)  # a message waits for a receive to rotate onto its broker


def test_notify_has_no_false_empty_and_costs_three_calls_per_message() -> None:
    for mode in ("notify", "adaptive"):
        r = simulate(sparse(mode))
        assert r.delivered == 80
        assert r.false_empties == 0
        assert r.pct(50) < 5
        assert 2.9 < r.completed_per_msg < 3.1  # first Pop, has_message, consume Pop (measured 3.00)


def test_adaptive_long_polls_a_busy_group() -> None:
    cfg = Config(
        mode="adaptive", brokers=4, consumers=64, rate=1000, arrivals="ticks", duration=2.0, batch=16, process_s=0.002
    )
    r = simulate(cfg)
    assert r.decisions["longpoll"] > 10 * r.decisions["notify"]  # the real AdaptivePolicy decided
    assert abs(r.completed_per_msg - 0.2) < 0.02  # measured 0.200


def test_fleet_aware_adaptive_long_polls_when_the_fleet_covers_every_broker() -> None:
    # 300 consumers over 30 proxies and 20 brokers: 10 receives per proxy, fewer than brokers on each proxy,
    # but 300 waiting receives fleet-wide cover every broker (docs/SCALE.md).
    base = {"brokers": 20, "proxies": 30, "consumers": 300, "rate": 60.0, "arrivals": "poisson", "duration": 5.0}
    plain = simulate(Config(mode="adaptive", **base))  # type: ignore[arg-type]
    fleet = simulate(Config(mode="adaptive", fleet_aware=True, **base))  # type: ignore[arg-type]
    assert plain.decisions["notify"] > plain.decisions["longpoll"]
    assert fleet.decisions["longpoll"] > 10 * fleet.decisions["notify"]
    assert fleet.rpcs_per_msg < plain.rpcs_per_msg / 3
    assert fleet.false_empties == plain.false_empties == 0


def test_adaptive_settings_proxies_divides_the_concurrency_threshold() -> None:
    from proxy.receive.adaptive import LONGPOLL, NOTIFY, AdaptivePolicy, AdaptiveSettings

    alone, fleet = AdaptivePolicy(), AdaptivePolicy(AdaptiveSettings(proxies=4))
    modes = [
        (alone.start("g", now=0.0, live_brokers=8).mode, fleet.start("g", now=0.0, live_brokers=8).mode)
        for _ in range(9)
    ]
    assert [m for m, _ in modes] == [NOTIFY] * 8 + [LONGPOLL]  # 8 others in progress = 1 per broker
    assert [m for _, m in modes] == [NOTIFY] * 2 + [LONGPOLL] * 7  # 2 here × 4 proxies = 8 fleet-wide
    assert fleet.busy("g", now=0.0, live_brokers=8)
