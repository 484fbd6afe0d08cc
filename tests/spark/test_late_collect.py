"""Streaming `--once` runs over files a periodic collector copies in, one source skipped by one collect: its files
still count when the lateness covers the collect period + a roll period + one window, the rule the Kubernetes
CronJob's --lateness follows (tests/deploy/test_export_retention.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark_metrics.job import JobSettings, read_records, start_streaming
from spark_metrics.transform import aggregate
from tests.spark import scenario as S
from tests.spark.test_transform import by_key, comparable, write_jsonl

PERIOD_S, ROLL_S, WINDOW_S = 300, 60, 60


def snapshot(t: float, process: str) -> list[dict[str, Any]]:
    rows = [S.rec(t, "popgate_broker_messages_in_total", 2 * t, process=process, topic="t", counter=True)]
    if process == "b1":
        rows += [
            S.rec(t, "popgate_broker_max_offset", t, topic="t", queue=0),
            S.rec(t, "popgate_broker_consumer_offset", 0, topic="t", group="g", queue=0),
        ]
    return rows


def roll_file(src: Path, process: str, start: int) -> None:
    """One finished file: a roll period of 10 s snapshots."""
    rows = [r for t in range(start, start + ROLL_S, 10) for r in snapshot(t, process)]
    write_jsonl(src / f"broker-{process}-{start:05d}.jsonl", rows)


def collect_once(spark: SparkSession, settings: JobSettings) -> None:
    query = start_streaming(spark, settings)
    try:
        assert query.awaitTermination(timeout=100)  # --once: stops by itself
    finally:
        query.stop()


@pytest.mark.timeout(300)  # three --once runs, each writing its report
def test_a_source_skipped_by_one_collect_counts_at_the_next(spark: SparkSession, tmp_path: Path) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    lateness = PERIOD_S + ROLL_S + WINDOW_S
    settings = JobSettings(str(src), str(out), window_s=WINDOW_S, lateness_s=lateness, streaming=True, once=True)
    # collect at 300 s: both brokers' files finished by then; at 600 s: b2 does not answer; then b2 answers (and
    # files up to 1500 s close the windows up to 900 s)
    for collect_at, answering in ((PERIOD_S, ("b1", "b2")), (2 * PERIOD_S, ("b1",)), (5 * PERIOD_S, ("b1", "b2"))):
        for process in answering:
            for start in range(0, collect_at, ROLL_S):
                if not (src / f"broker-{process}-{start:05d}.jsonl").exists():
                    roll_file(src, process, start)
        collect_once(spark, settings)
    streamed = by_key(spark.read.parquet(str(out / "windows")))
    assert set(range(15)) <= {w for w, _, _ in streamed}
    batch = by_key(aggregate(read_records(spark, str(src)), WINDOW_S))
    assert comparable({k: batch[k] for k in streamed}) == comparable(streamed)
    assert streamed[(7, "t", "g")]["messages_in"] == 2 * 2 * WINDOW_S  # both brokers, in a window b2 came late
