"""A synthetic 11-minute history of three brokers and a real proxy's counters, for the report's flags, charts
and the adaptive recommendation. Snapshots every 20 s, 60 s windows: window k is [T0 + 60k, T0 + 60k + 60).

Topic "orders" on b1, b2 and b3 (one queue each, +400 messages a window on each broker), read by:
- "busy": served by pop with notify that herds — 40 receives/s, each a notify run with 3 Notifications and 3 Pops
  (first, a consume Pop that wins, one that loses the race): 6 broker calls per run, 2,400 runs and 1,200
  deliveries a window, 12 calls per delivered message, more than a lone notify receive costs with 3 brokers (5).
- "stops": first-Pop hits at 2 receives/s (1 call each, 10 messages each) until its consumers go away at
  T0 + 420 (window 7): from then on nothing is delivered or acked and its lag grows by 1,200 a window.
Topic "audit" on b2 only, read by "sparse": 0.5 receives/s by long polling, 4 in 10 of them empty while 50
messages stay ready on b2 at every snapshot: 12 false empties a window.
Broker b3 exports nothing in windows 3 and 4 (T0 + 180 .. T0 + 300).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from popgate_process.export import ExportSettings, RunSnapshots
from proxy.metrics import ProxyMetrics
from proxy.receive.notify import RunStats
from tests.spark.scenario import OLD, T0, rec
from tests.spark.test_transform import write_jsonl

WINDOWS = 11
SNAPSHOT_S = 20
BROKERS = ("b1", "b2", "b3")
MISSING = ("b3", 180, 300)  # broker, from, to (seconds after T0)
STOP_S = 420  # "stops" consumers go away
PER_BROKER_IN = 400 / 60  # orders messages stored per second on each broker


def _orders(t: float, process: str) -> list[dict[str, Any]]:
    stored = round(PER_BROKER_IN * t)
    stops_acked = round(PER_BROKER_IN * min(t, STOP_S - SNAPSHOT_S)) - 20
    common: dict[str, Any] = {"process": process, "topic": "orders"}
    rows = [
        rec(t, "popgate_broker_max_offset", stored, queue=0, **common),
        rec(t, "popgate_broker_messages_in_total", stored, counter=True, **common),
    ]
    for group, acked in (("busy", stored - 10), ("stops", stops_acked)):
        g = {"group": group, **common}
        rows += [
            rec(t, "popgate_broker_consumer_offset", acked, queue=0, **g),
            rec(t, "popgate_broker_pull_offset", acked + 5, queue=0, **g),
            rec(t, "popgate_broker_messages_out_total", acked + 5, counter=True, **g),
            rec(t, "popgate_broker_consumer_lag_messages", stored - acked, **g),
            rec(t, "popgate_broker_ready_messages", stored - acked - 5, **g),
            rec(t, "popgate_broker_oldest_unacked_age_seconds", (stored - acked) / PER_BROKER_IN, **g),
        ]
    return rows


def _audit(t: float) -> list[dict[str, Any]]:
    stored = 100 + round(t / 3)
    g: dict[str, Any] = {"process": "b2", "topic": "audit", "group": "sparse"}
    return [
        rec(t, "popgate_broker_max_offset", stored, process="b2", topic="audit", queue=0),
        rec(t, "popgate_broker_messages_in_total", stored, process="b2", topic="audit", counter=True),
        rec(t, "popgate_broker_consumer_offset", stored - 50, queue=0, **g),
        rec(t, "popgate_broker_pull_offset", stored - 50, queue=0, **g),
        rec(t, "popgate_broker_messages_out_total", stored - 50, counter=True, **g),
        rec(t, "popgate_broker_consumer_lag_messages", 50, **g),
        rec(t, "popgate_broker_ready_messages", 50, **g),
        rec(t, "popgate_broker_oldest_unacked_age_seconds", 150.0, **g),
    ]


def brokers() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for t in range(0, WINDOWS * 60, SNAPSHOT_S):
        for process in BROKERS:
            if process == MISSING[0] and MISSING[1] <= t < MISSING[2]:
                continue
            rows += _orders(t, process)
        rows += _audit(t)
    return rows


def _interval(metrics: ProxyMetrics, t: float) -> None:
    """The receives of the 20 s before snapshot ``t``."""
    herd = RunStats(notifications=3, notified_has_message=2, notified_empty=1, pops=3, lost_races=1, waited=True)
    for _ in range(40 * SNAPSHOT_S):
        metrics.notify_run("busy", herd, "messages")
        metrics.receive("busy", "adaptive", "messages", 0.01)
    if t <= STOP_S - SNAPSHOT_S:  # the last receives of "stops" are those before its last ack
        for _ in range(2 * SNAPSHOT_S):
            metrics.notify_run("stops", RunStats(first_pop_hit=True, pops=1), "messages")
            metrics.receive("stops", "adaptive", "messages", 0.01)
    for n in range(SNAPSHOT_S // 2):
        metrics.long_poll("sparse")
        metrics.receive("sparse", "adaptive", "empty" if n % 3 == 0 else "messages", 1.0)


def proxy() -> list[dict[str, Any]]:
    metrics = ProxyMetrics()
    snapshots = RunSnapshots(ExportSettings(Path("unused"), "px", "proxy", started=OLD))
    rows: list[dict[str, Any]] = []
    for t in range(0, WINDOWS * 60, SNAPSHOT_S):
        if t:
            _interval(metrics, t)
        batch = snapshots.take(metrics.registry, T0 + t)
        snapshots.written(batch, T0 + t)
        rows += batch
    return rows


def write(directory: Path) -> None:
    rows = brokers()
    for process in BROKERS:
        write_jsonl(directory / process / "a.jsonl", [r for r in rows if r["process"] == process])
    write_jsonl(directory / "px" / "a.jsonl", proxy())
