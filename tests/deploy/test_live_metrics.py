"""LIVE: every /metrics of `popgate up` passes promtool and exports what the rules and the dashboard read."""

from __future__ import annotations

import pytest

from .conftest import run, tool
from .live_cluster import Cluster, http_get, wait_for
from .metrics_contract import BROKER, PROCESS, PROXY, exposition_types, missing_labels

pytestmark = [pytest.mark.live_cluster, pytest.mark.slow]


def test_every_metrics_endpoint_passes_promtool_check_metrics(cluster: Cluster) -> None:
    promtool = tool("promtool")
    for process in cluster.processes:
        text = wait_for(f"/metrics of {process.name}", lambda p=process: http_get(f"http://{p.metrics}/metrics"), 10)
        output = run([promtool, "check", "metrics"], stdin=text)
        assert output.strip() == "", f"{process.name}: {output}"


def test_processes_export_what_rules_and_dashboard_read(cluster: Cluster) -> None:
    problems = []
    for process in cluster.processes:
        text = wait_for(f"/metrics of {process.name}", lambda p=process: http_get(f"http://{p.metrics}/metrics"), 10)
        exported = exposition_types(text)
        expected = (BROKER if process.kind == "broker" else PROXY) | PROCESS
        absent = {name: kind for name, kind in expected.items() if exported.get(name) != kind}
        if absent:
            problems.append(f"{process.name} does not export (as this type): {absent}")
        unlabelled = missing_labels(text, expected)
        if unlabelled:
            problems.append(f"{process.name} has samples without these labels: {unlabelled}")
    assert problems == [], "\n".join(problems)
