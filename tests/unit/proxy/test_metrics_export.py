"""The proxy's polling metrics reach the JSON-lines export under the names the Spark job reads."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from popgate_process.export import ExportSettings, records
from proxy.metrics import ProxyMetrics
from proxy.receive.notify import RunStats
from spark_metrics import names


def test_export_carries_first_pop_hits_long_polls_notify_runs_and_empty_receives(tmp_path: Path) -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.notify_run("g", RunStats(first_pop_hit=True, pops=1), "messages")
    metrics.notify_run("g", RunStats(notifications=4, notified_has_message=1, pops=2, waited=True), "messages")
    metrics.long_poll("g")
    metrics.receive("g", "adaptive", "empty", 0.5)
    metrics.mode_decision("g", "notify", "quiet", request=object())
    exported = {
        (r["metric"], r["group"], tuple(sorted(r["labels"].items()))): r["value"]
        for r in records(metrics.registry, ExportSettings(tmp_path, "proxy-1", "proxy"), now=1.0)
    }
    assert exported[(names.FIRST_POP_HITS, "g", ())] == 1
    assert exported[(names.NOTIFY_RUNS, "g", ())] == 2
    assert exported[(names.LONG_POLLING, "g", ())] == 2  # the notify run + the long poll
    assert exported[("popgate_proxy_notifications_total", "g", (("outcome", "has_message"),))] == 1
    assert exported[("popgate_proxy_notifications_total", "g", (("outcome", "unanswered"),))] == 3
    empty = (("mode", "adaptive"), (names.OUTCOME_LABEL, names.EMPTY_OUTCOME))
    assert exported[(names.RECEIVES, "g", empty)] == 1
    assert exported[("popgate_proxy_receive_mode_decisions_total", "g", (("mode", "notify"), ("reason", "quiet")))] == 1


def test_groups_beyond_the_label_limit_share_one_label() -> None:
    """Any client can name a new group per request; the proxy's label sets (kept for its whole life) are bounded."""
    metrics = ProxyMetrics(CollectorRegistry(), max_groups=2)
    for group in ("a", "b", "c", "d", "a"):
        metrics.receive(group, "notify", "empty", 0.01)
        metrics.notify_run(group, RunStats(notifications=1, notified_empty=1), "empty")
    sample = metrics.registry.get_sample_value
    receives = {
        g: sample("popgate_proxy_receives_total", {"group": g, "mode": "notify", "outcome": "empty"})
        for g in ("a", "b", "c", "_other")
    }
    assert receives == {"a": 2.0, "b": 1.0, "c": None, "_other": 2.0}
    assert sample("popgate_proxy_notify_runs_total", {"group": "_other"}) == 2.0
