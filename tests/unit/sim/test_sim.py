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
