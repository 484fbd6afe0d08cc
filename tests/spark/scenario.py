"""A hand-made export: two brokers, a restart, and a real proxy's counters; the expected figures are worked out
in comments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from popgate_process.export import ExportSettings, RunSnapshots
from proxy.metrics import ProxyMetrics
from proxy.receive.notify import RunStats

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


def served(metrics: ProxyMetrics, group: str, how: str, outcome: str) -> None:
    """One receive, counted as the proxy counts it: ``hit`` a notify run whose first Pop found messages,
    ``notified`` a notify run that sent Notifications (it waited), ``longpoll`` a coupled long-poll Pop."""
    if how == "hit":
        metrics.notify_run(group, RunStats(first_pop_hit=True, pops=1), outcome)
    elif how == "notified":
        metrics.notify_run(group, RunStats(notifications=1, notified_has_message=1, pops=2, waited=True), outcome)
    else:
        metrics.long_poll(group)
    metrics.receive(group, "adaptive", outcome, 0.01)


# per group and snapshot interval: receives (how, outcome) -> count
TRAFFIC: dict[float, dict[str, dict[tuple[str, str], int]]] = {
    40: {"slow": {("hit", "messages"): 4, ("notified", "messages"): 2, ("longpoll", "messages"): 10}},
    100: {
        "slow": {
            ("hit", "messages"): 6,
            ("notified", "messages"): 4,
            ("notified", "empty"): 2,
            ("longpoll", "messages"): 20,
            ("longpoll", "empty"): 8,
        },
        "fast": {("longpoll", "messages"): 8, ("longpoll", "empty"): 2},
    },
}


def proxy() -> list[dict[str, Any]]:
    """A real proxy's counters (ProxyMetrics), exported as its exporter does, at t=0, 40 and 100.

    A counter series appears at its first count, with its value-0 record at the previous snapshot (METRICS.md §3).
    Window 1 (t=40 -> 100):
      slow: 40 receives: 6 first-Pop hits (ratio 0.15), 12 notify runs (share 0.3), 6 + 28 = 34 long polling,
        10 empty (rate 0.25).
      fast (it first receives in this window, all long polls): 10 receives, 10 long polling, 2 empty (rate 0.2);
        no first-Pop hit or notify run series at all: 0, so hit ratio and notify share 0.
    """
    metrics = ProxyMetrics()
    snapshots = RunSnapshots(ExportSettings(Path("unused"), "px", "proxy", started=OLD))
    rows: list[dict[str, Any]] = []
    for t in (0, 40, 100):
        for group, receives in TRAFFIC.get(t, {}).items():
            for (how, outcome), count in receives.items():
                for _ in range(count):
                    served(metrics, group, how, outcome)
        batch = snapshots.take(metrics.registry, T0 + t)
        snapshots.written(batch, T0 + t)
        rows += batch
    return rows


def all_rows() -> list[dict[str, Any]]:
    return broker_window0() + counters() + proxy()
