"""LIVE: a real Prometheus finds every broker's and the proxy's series and evaluates the shipped rules without error."""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import pytest

from .live_cluster import TOPIC, Cluster, Prometheus, http_get, wait_for

pytestmark = [pytest.mark.live_cluster, pytest.mark.slow]


def test_prometheus_finds_broker_and_proxy_series(cluster: Cluster, prometheus: Prometheus) -> None:
    def all_up() -> list[dict[str, Any]] | None:
        result = prometheus.query('up{job=~"popgate-.*"} == 1')
        return result if result is not None and len(result) == len(cluster.processes) else None

    wait_for("every popgate target to be up", all_up, 20)

    def broker_series() -> set[str] | None:
        result = prometheus.query('count by (process) ({__name__=~"popgate_broker_.+", job="popgate-broker"})') or []
        processes = {r["metric"]["process"] for r in result}
        return processes if processes == {b.name for b in cluster.brokers} else None

    def proxy_series() -> list[dict[str, Any]] | None:
        return prometheus.query('{__name__=~"popgate_proxy_.+", job="popgate-proxy"}') or None

    wait_for("popgate_broker_* series from both brokers", broker_series, 15)
    wait_for("popgate_proxy_* series from the proxy", proxy_series, 15)
    stored = wait_for(
        "the messages sent to be counted",
        lambda: prometheus.query(f'sum(popgate_broker_messages_in_total{{topic="{TOPIC}"}})'),
        15,
    )
    assert float(stored[0]["value"][1]) >= len(cluster.brokers)


def evaluated_at(rule: dict[str, Any]) -> float:
    """A rule's lastEvaluation as epoch seconds (0 before its first evaluation)."""
    stamp = rule.get("lastEvaluation", "")
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    parsed = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return parsed.timestamp() + float(f"0.{fraction or 0}")


def test_prometheus_loads_and_evaluates_the_rules_without_error(cluster: Cluster, prometheus: Prometheus) -> None:
    def all_up() -> list[dict[str, Any]] | None:
        result = prometheus.query('up{job=~"popgate-.*"} == 1')
        return result if result is not None and len(result) == len(cluster.processes) else None

    wait_for("every popgate target to be scraped", all_up, 20)
    scraped = time.time()

    def evaluated() -> dict[str, Any] | None:  # every rule evaluated over scraped series, not an empty database
        text = http_get(f"{prometheus.url}/api/v1/rules")
        if text is None:
            return None
        groups = {g["name"]: g for g in json.loads(text)["data"]["groups"]}
        rules = [r for g in groups.values() for r in g["rules"]]
        return groups if rules and all(evaluated_at(r) > scraped for r in rules) else None

    groups = wait_for("every rule to be evaluated after the first scrapes", evaluated, 20)
    assert {"popgate.recording", "popgate.alerts"} <= set(groups)
    for group in groups.values():
        for rule in group["rules"]:
            assert rule.get("lastError", "") == "" and rule.get("health") == "ok", rule
