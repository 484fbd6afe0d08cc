"""The job reads the metric names a broker and a proxy really export (no name no process emits)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from proxy.metrics import ProxyMetrics
from spark_metrics import names as N
from tests.deploy.metrics_contract import sample_labels
from tests.deploy.test_metrics_doc import broker_exposition, exposed


def test_every_name_the_job_reads_is_exported(tmp_path: Path) -> None:
    exported = exposed(broker_exposition(tmp_path)) | exposed(generate_latest(ProxyMetrics().registry).decode())
    assert set(N.USED) - set(exported) == set()


def test_empty_responses_are_receives_with_the_outcome_label() -> None:
    metrics = ProxyMetrics()
    metrics.receive("g", "notify", N.EMPTY_OUTCOME, 0.01)
    labels = sample_labels(generate_latest(metrics.registry).decode())[N.RECEIVES]
    assert labels == [{"group", "mode", N.OUTCOME_LABEL}]
