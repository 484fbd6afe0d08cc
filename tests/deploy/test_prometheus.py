"""Prometheus config, alert rules and the Grafana dashboard, checked with promtool."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from .conftest import GRAFANA, PROMETHEUS, ROOT, run, tool
from .metrics_contract import KNOWN, LABELS, metric_names

CONFIGS = ("prometheus.yml", "prometheus-file-sd.yml")
DASHBOARD = GRAFANA / "popgate-dashboard.json"
# Grafana's variables, replaced by what they stand for so promtool can parse the query.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$topic": ".*", "$group": ".*"}


def load_yaml(yaml_module: Any, path: Path) -> Any:
    return yaml_module.safe_load(path.read_text())


def alert_rules(yaml_module: Any) -> list[dict[str, Any]]:
    groups = load_yaml(yaml_module, PROMETHEUS / "rules.yml")["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def grafana_to_promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


@pytest.mark.parametrize("config", CONFIGS)
def test_promtool_check_config(tmp_path: Path, config: str) -> None:
    promtool = tool("promtool")
    # A copy with one file_sd target file, as it is once `popgate up --prometheus-sd` wrote it.
    work = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS, work, ignore=shutil.ignore_patterns("*.json", "__pycache__"))
    shutil.copy(PROMETHEUS / "targets" / "example.json.sample", work / "targets" / "popgate.json")
    output = run([promtool, "check", "config", config], cwd=work)
    assert "SUCCESS" in output and "WARNING" not in output and "FAILED" not in output, output


def test_promtool_check_rules() -> None:
    output = run([tool("promtool"), "check", "rules", str(PROMETHEUS / "rules.yml")])
    assert "SUCCESS" in output and "WARNING" not in output, output


def test_alert_rules_fire_as_their_unit_tests_say() -> None:
    output = run([tool("promtool"), "test", "rules", "rules.test.yml"], cwd=PROMETHEUS)
    assert "SUCCESS" in output, output


def test_every_alert_has_a_unit_test_where_it_fires(yaml_module: Any) -> None:
    alerts = {rule["alert"] for rule in alert_rules(yaml_module) if "alert" in rule}
    assert {"PopgateConsumerLagGrowing", "PopgateDeadLettersGrowing", "PopgatePollingHitRatioFalling"} <= alerts
    tests = load_yaml(yaml_module, PROMETHEUS / "rules.test.yml")["tests"]
    fired = {case["alertname"] for test in tests for case in test.get("alert_rule_test", []) if case["exp_alerts"]}
    assert alerts - fired == set()


def test_rules_and_dashboard_read_only_exported_metrics(yaml_module: Any) -> None:
    exprs = [rule["expr"] for rule in alert_rules(yaml_module)] + [expr for _, expr in dashboard_exprs()]
    used = set().union(*map(metric_names, exprs))
    assert used - set(KNOWN) == set(), "metrics that no process exports (see tests/deploy/metrics_contract.py)"


def test_dashboard_queries_are_valid_promql(yaml_module: Any, tmp_path: Path) -> None:
    # promtool parses every query when they are written as recording rules.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": grafana_to_promql(e)} for i, (_, e) in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml_module.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    output = run([tool("promtool"), "check", "rules", str(path)])
    assert f"SUCCESS: {len(rules)} rules found" in output, output


def test_every_alert_has_a_runbook_section_in_docs(yaml_module: Any) -> None:
    runbook = (ROOT / "docs" / "RUNBOOK.md").read_text()
    headings = {line.removeprefix("## ").strip() for line in runbook.splitlines() if line.startswith("## ")}
    for rule in alert_rules(yaml_module):
        if "alert" in rule:
            name = rule["alert"]
            assert rule["annotations"].get("runbook_url") == f"docs/RUNBOOK.md#{name.lower()}", name
            assert name in headings, f"docs/RUNBOOK.md has no section {name}"


def test_dashboard_shows_health_lag_throughput_latency_errors_and_storage() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows[0] == "Health" and {"Lag", "Throughput", "Latency", "Errors", "Storage"} <= set(rows)
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("lag", "messages in", "delivered", "acked", "delivery latency", "polling hit ratio", "disk"):
        assert topic in titles
    by_title = dict(dashboard_exprs())
    assert "popgate_proxy_receive_first_pop_hits_total" in by_title["Polling hit ratio"]
    assert "popgate_proxy_receives_total" in by_title["Polling hit ratio"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def runbook_section(name: str) -> str:
    runbook = (ROOT / "docs" / "RUNBOOK.md").read_text()
    return runbook.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]


_ITALIC = re.compile(r"(?<![*\w])\*([^*\n]+)\*(?![*\w])")


def test_runbook_names_panels_the_dashboard_has() -> None:
    """Each *panel* the RUNBOOK points at begins a panel's (or a row's) title, so on-call can find it."""
    dashboard = json.loads(DASHBOARD.read_text())
    titles = [p["title"].lower() for p in dashboard["panels"]]
    named = _ITALIC.findall((ROOT / "docs" / "RUNBOOK.md").read_text())
    assert named and [n for n in named if not any(t.startswith(n.lower()) for t in titles)] == []


def test_proxy_error_triage_shows_each_code_and_names_codes_the_proxy_sends() -> None:
    """PopgateProxyErrorRateHigh's section names a panel of the proxy's failed RPCs by method and code, and only
    codes the proxy answers with (proto/popgate_contract/codes.py), the full disk's among them."""
    from popgate_contract.codes import CODES, Code

    section = runbook_section("PopgateProxyErrorRateHigh")
    by_title = dict(dashboard_exprs())
    panels = [t for t in _ITALIC.findall(section) if t in by_title]
    assert any(
        re.search(r"sum by \(method, code\) \(rate\(popgate_proxy_rpc_duration_seconds_count\{code=~", by_title[t])
        for t in panels
    ), panels
    sent = {Code.Name(code) for code in CODES.values()} | {"INTERNAL_SERVER_ERROR"}
    named = set(re.findall(r"\b[A-Z]+(?:_[A-Z]+)+\b", section))
    assert "MASTER_PERSISTENCE_TIMEOUT" in named and named - sent == set()


_SELECTOR = re.compile(r"\b(popgate[_:][a-zA-Z0-9_:]+)(\{[^}]*\})?")


def record_labels(yaml_module: Any) -> dict[str, set[str]]:
    """The labels each recording rule keeps: those of its outermost `by (...)`."""
    labels = {}
    for rule in alert_rules(yaml_module):
        if "record" in rule:
            by = re.search(r"\bby \(([^)]*)\)", rule["expr"])
            labels[rule["record"]] = {label.strip() for label in by[1].split(",")} if by else set()
    return labels


def test_every_panel_filters_by_the_topic_and_group_its_metrics_have(yaml_module: Any) -> None:
    """Each selector of a metric (or record) with a topic or group label is filtered by `$topic` / `$group`: the
    variables narrow every panel that can be narrowed; the others (health, RPCs, storage) are cluster-wide."""
    known = {**LABELS, **record_labels(yaml_module)}
    unfiltered = []
    for title, expr in dashboard_exprs():
        for name, matchers in _SELECTOR.findall(expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name) if name not in known else name
            for label in {"topic", "group"} & known.get(base, set()):
                if f'{label}=~"${label}"' not in matchers:
                    unfiltered.append(f"{title}: {name} without {label}")
    assert unfiltered == []


# --- PopgateTargetDown against the label sets each scrape method gives the prod overlay's pods ----------


def _label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus names it (service discovery replaces invalid characters by `_`)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def scrape_label_sets(objs: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The labels of a down target of every broker and proxy pod, once per scrape method:

    - ServiceMonitor (Prometheus Operator): job = the Service's name (or its `jobLabel` label), plus namespace,
      service, pod, endpoint, instance and the pod labels listed in `podTargetLabels`;
    - annotations (prometheus.io/scrape) with the conventional `kubernetes-pods` job: any job name, and every pod
      label by `labelmap` of __meta_kubernetes_pod_label_(.+), plus namespace, pod and instance.
    """
    from .manifests import find, one, selects

    (monitor,) = find(objs, "ServiceMonitor")
    sets = []
    for kind, workload_name in (("StatefulSet", "popgate-broker"), ("Deployment", "popgate-proxy")):
        workload = one(objs, kind, workload_name)
        template = workload["spec"]["template"]["metadata"]
        namespace = workload["metadata"]["namespace"]
        pod = f"{workload_name}-0"
        assert template["annotations"]["prometheus.io/scrape"] == "true"
        annotated = {_label_name(k): v for k, v in template["labels"].items()}
        sets.append({**annotated, "job": "kubernetes-pods", "namespace": namespace, "pod": pod, "instance": "ip:9100"})
        (service,) = [
            s
            for s in find(objs, "Service")
            if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
            and selects({"matchLabels": s["spec"]["selector"]}, template["labels"])
        ]
        job_label = monitor["spec"].get("jobLabel")
        job = service["metadata"]["labels"][job_label] if job_label else service["metadata"]["name"]
        pod_labels = {_label_name(k): template["labels"][k] for k in monitor["spec"].get("podTargetLabels", [])}
        sets.append(
            {
                **pod_labels,
                "job": job,
                "namespace": namespace,
                "service": service["metadata"]["name"],
                "pod": pod,
                "endpoint": monitor["spec"]["endpoints"][0]["port"],
                "instance": "ip:9100",
            }
        )
    return sets


def test_target_down_fires_for_every_pod_by_either_scrape_method(
    rendered: dict[str, list[dict[str, Any]]], yaml_module: Any, tmp_path: Path
) -> None:
    label_sets = scrape_label_sets(rendered["prod"])
    other = {"job": "kubernetes-pods", "app_kubernetes_io_name": "shop", "pod": "shop-0", "instance": "ip:8080"}

    def series(labels: dict[str, str]) -> str:
        return "up{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"

    def expected(labels: dict[str, str]) -> dict[str, Any]:
        return {
            "exp_labels": {**labels, "severity": "critical"},
            "exp_annotations": {
                "summary": f"popgate target {labels['instance']} ({labels['job']}) is down",
                "description": f"Prometheus cannot scrape {labels['instance']}; the process is down or unreachable.",
                "runbook_url": "docs/RUNBOOK.md#popgatetargetdown",
            },
        }

    # Each set down alone, its own instance: one alert each (sets of one pod differ only in how it is scraped).
    cases = [{**labels, "instance": f"ip-{i}:9100"} for i, labels in enumerate(label_sets)]
    test = {
        "rule_files": [str(PROMETHEUS / "rules.yml")],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series(s), "values": "1 1 0x10"} for s in [*cases, other]],
                "alert_rule_test": [
                    {"eval_time": "6m", "alertname": "PopgateTargetDown", "exp_alerts": [expected(s) for s in cases]}
                ],
            }
        ],
    }
    path = tmp_path / "target-down.test.yml"
    path.write_text(yaml_module.safe_dump(test))
    assert len(cases) == 4
    output = run([tool("promtool"), "test", "rules", str(path)])
    assert "SUCCESS" in output, output
