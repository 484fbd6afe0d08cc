"""The proxy's polling metrics reach the JSON-lines export under the names the Spark job reads."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from broker.export import ExportSettings, records
from proxy.metrics import ProxyMetrics
from proxy.notify import RunStats
from spark_metrics import names


def test_export_carries_first_pop_hits_long_polls_notify_runs_and_empty_receives(tmp_path: Path) -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.notify_run("g", RunStats(first_pop_hit=True, pops=1))
    metrics.notify_run("g", RunStats(notifications=4, notified_has_message=1, pops=2))
    metrics.long_poll("g")
    metrics.receive("g", "adaptive", "empty", 0.5)
    metrics.mode_decision("g", "notify", "quiet")
    exported = {
        (r["metric"], r["group"], tuple(sorted(r["labels"].items()))): r["value"]
        for r in records(metrics.registry, ExportSettings(tmp_path, "proxy-1", "proxy"), now=1.0)
    }
    assert exported[(names.FIRST_POP_HITS[0], "g", ())] == 1
    assert exported[("popgate_proxy_notify_runs_total", "g", ())] == 2
    assert "popgate_proxy_notify_runs_total" in names.NOTIFY_RUNS
    assert "popgate_proxy_long_polling_receives_total" in names.LONG_POLLING
    assert exported[("popgate_proxy_long_polling_receives_total", "g", ())] == 2  # the notify run + the long poll
    assert exported[("popgate_proxy_notifications_total", "g", (("outcome", "has_message"),))] == 1
    assert exported[("popgate_proxy_notifications_total", "g", (("outcome", "unanswered"),))] == 3
    assert exported[("popgate_proxy_receives_total", "g", (("mode", "adaptive"), ("outcome", "empty")))] == 1
    assert exported[("popgate_proxy_receive_mode_decisions_total", "g", (("mode", "notify"), ("reason", "quiet")))] == 1
