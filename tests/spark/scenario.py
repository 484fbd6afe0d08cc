"""A hand-made export: two brokers, a restart, a proxy; the expected figures are worked out in comments."""

from __future__ import annotations

from typing import Any

T0 = 1_800_000_000.0  # a multiple of 60: window k is [T0 + 60k, T0 + 60(k+1))
OLD = T0 - 1000.0  # incarnations that began long before the data
WINDOW_S = 60.0
TOPIC = "orders"


def rec(
    t: float,
    metric: str,
    value: float,
    *,
    process: str = "b1",
    kind: str = "broker",
    started: float = OLD,
    topic: str | None = None,
    group: str | None = None,
    queue: int | None = None,
    counter: bool = False,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "v": 1,
        "time": T0 + t,
        "process": process,
        "kind": kind,
        "started": started,
        "topic": topic,
        "group": group,
        "queue": queue,
        "metric": metric,
        "type": "counter" if counter else "gauge",
        "value": float(value),
        "labels": labels or {},
    }


def offsets(t: float, process: str, q: int, max_: int, slow: tuple[int, int]) -> list[dict[str, Any]]:
    """One snapshot of one queue: max offset, the slow group's (consumer, pull), the fast group caught up."""
    common: dict[str, Any] = {"process": process, "topic": TOPIC, "queue": q}
    return [
        rec(t, "popgate_broker_max_offset", max_, **common),
        rec(t, "popgate_broker_consumer_offset", slow[0], group="slow", **common),
        rec(t, "popgate_broker_pull_offset", slow[1], group="slow", **common),
        rec(t, "popgate_broker_consumer_offset", max_, group="fast", **common),
        rec(t, "popgate_broker_pull_offset", max_, group="fast", **common),
    ]


def broker_window0() -> list[dict[str, Any]]:
    """Window 0. The last snapshot (t=40) counts; t=10 is overwritten.

    per queue       max  consumer pull   lag  inflight available
    b1 q0           100     10     15     90     5        85
    b1 q1            80     20     20     60     0        60
    b2 q0            50      5      5     45     0        45
    b2 q1            70      0     10     70    10        60
    slow total                            265    15       250     fast: 0 0 0
    """
    rows = []
    for process, q in (("b1", 0), ("b1", 1), ("b2", 0), ("b2", 1)):
        rows += offsets(10, process, q, 1, (0, 0))
    rows += offsets(40, "b1", 0, 100, (10, 15)) + offsets(40, "b1", 1, 80, (20, 20))
    rows += offsets(40, "b2", 0, 50, (5, 5)) + offsets(40, "b2", 1, 70, (0, 10))
    for process, lag, age in (("b1", 150, 12.5), ("b2", 115, 30.0)):
        rows.append(rec(40, "popgate_broker_consumer_lag_messages", lag, process=process, topic=TOPIC, group="slow"))
        rows.append(
            rec(40, "popgate_broker_oldest_unacked_age_seconds", age, process=process, topic=TOPIC, group="slow")
        )
    return rows


def counters() -> list[dict[str, Any]]:
    """Running totals across windows 0..2, with b1 restarting at t=75.

    messages_out{orders,slow} on b1: incarnation A (old) 100,110,120 | 130,135 then dies;
      incarnation B (started t=75) 0,5 | 12.
      window 0: 120-100 = 20 (no earlier data: first to last); window 1: (135-120) + (5-0) = 20; window 2: 12-5 = 7.
    messages_in{orders} on b2: 0,30,60 | 90,120,150 -> window 0: 60, window 1: 90 (1.5/s).
    dead_lettered{orders,slow} on b1 (A): 0 | 3 -> window 1: 3; dlq_messages{slow} = 3 in window 1.
    """
    out = "popgate_broker_messages_out_total"
    born = T0 + 75
    tg: dict[str, Any] = {"topic": TOPIC, "group": "slow", "counter": True}
    rows = [rec(t, out, v, **tg) for t, v in ((0, 100), (20, 110), (40, 120), (60, 130), (70, 135))]
    rows += [rec(t, out, v, started=born, **tg) for t, v in ((75, 0), (95, 5), (120, 12))]
    rows += [
        rec(t, "popgate_broker_messages_in_total", v, process="b2", topic=TOPIC, counter=True)
        for t, v in ((0, 0), (20, 30), (40, 60), (60, 90), (80, 120), (100, 150))
    ]
    rows += [rec(t, "popgate_broker_dead_lettered_total", v, **tg) for t, v in ((40, 0), (100, 3))]
    rows += [rec(100, "popgate_broker_dlq_messages", 3, group="slow")]
    return rows


def proxy() -> list[dict[str, Any]]:
    """Window 1 increases (window 0 last -> window 1 last).

    slow (dedicated metrics): receives hit 40->70 (+30), empty 10->20 (+10): 40 receives;
      first_pop_hits 20->38 (+18): ratio 0.45; notify_runs 5->17 (+12): share 0.3; empty rate 0.25.
    fast (labels only): receives with is_short_polling_hit=true 0->8, false+empty 0->2: 10 receives,
      hit ratio 0.8, long polling 10 (all is_long_polling=true), empty rate 0.2, notify share null.
    """
    p: dict[str, Any] = {"process": "px", "kind": "proxy", "counter": True}
    rx = "popgate_proxy_receives_total"
    slow_hit = {"mode": "notify", "outcome": "hit"}
    slow_empty = {"mode": "notify", "outcome": "empty"}
    fast_hit = {"mode": "longpoll", "outcome": "hit", "is_long_polling": "true", "is_short_polling_hit": "true"}
    fast_empty = {"mode": "longpoll", "outcome": "empty", "is_long_polling": "true", "is_short_polling_hit": "false"}
    rows = []
    for t, a, b, c, d, hits, runs in ((0, 0, 0, 0, 0, 0, 0), (40, 40, 10, 0, 0, 20, 5), (100, 70, 20, 8, 2, 38, 17)):
        rows.append(rec(t, rx, a, group="slow", labels=slow_hit, **p))
        rows.append(rec(t, rx, b, group="slow", labels=slow_empty, **p))
        rows.append(rec(t, rx, c, group="fast", labels=fast_hit, **p))
        rows.append(rec(t, rx, d, group="fast", labels=fast_empty, **p))
        rows.append(rec(t, "popgate_proxy_receive_first_pop_hits_total", hits, group="slow", **p))
        rows.append(rec(t, "popgate_proxy_notify_runs_total", runs, group="slow", **p))
        rows.append(rec(t, "popgate_proxy_receive_latency_seconds_count", a + b + c + d, **p))
    return rows


def all_rows() -> list[dict[str, Any]]:
    return broker_window0() + counters() + proxy()
