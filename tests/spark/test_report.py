"""The report: a group's proxy figures counted once however many topics it consumes, and printed whatever the
output's file system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark_metrics.job import JobSettings, run, run_batch
from tests.spark import scenario as S
from tests.spark.test_transform import write_jsonl


def rows() -> list[dict[str, Any]]:
    """Broker b1: group g1 consumes topics t1 and t2, g2 consumes t1 (snapshots at t=0, 40, 100).
    Proxy: receives g1 0, 10, 27 and g2 0, 5, 5; first-Pop hits g1 0, 4, 10.
      window 0: receives 10 + 5 = 15; window 1: 17 (6 hits: 35.3 %); in all 32 receives, 10 hits (31.2 %).
    """
    out = []
    proxy: dict[str, Any] = {"process": "px", "kind": "proxy", "counter": True}
    for t, g1, g2, hits in ((0, 0, 0, 0), (40, 10, 5, 4), (100, 27, 5, 10)):
        out += [
            S.rec(t, "popgate_broker_max_offset", 100, topic="t1", queue=0),
            S.rec(t, "popgate_broker_max_offset", 50, topic="t2", queue=0),
            S.rec(t, "popgate_broker_consumer_offset", 90, topic="t1", group="g1", queue=0),
            S.rec(t, "popgate_broker_consumer_offset", 20, topic="t2", group="g1", queue=0),
            S.rec(t, "popgate_broker_consumer_offset", 100, topic="t1", group="g2", queue=0),
            S.rec(t, "popgate_proxy_receives_total", g1, group="g1", labels={"outcome": "messages"}, **proxy),
            S.rec(t, "popgate_proxy_receives_total", g2, group="g2", labels={"outcome": "messages"}, **proxy),
            S.rec(t, "popgate_proxy_receive_first_pop_hits_total", hits, group="g1", **proxy),
        ]
    return out


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("two-topics")
    write_jsonl(d / "a.jsonl", rows())
    return d


def test_a_group_on_two_topics_has_its_receives_counted_once(
    spark: SparkSession, export_dir: Path, tmp_path: Path
) -> None:
    run_batch(spark, JobSettings(input=str(export_dir), output=str(tmp_path)))
    text = (tmp_path / "report.txt").read_text()
    assert "receives 32, polling hit ratio 31.2 %" in text
    parquet = spark.read.parquet(str(tmp_path / "windows")).collect()
    assert sum(r["receives"] or 0 for r in parquet) == 32  # any reader's sum over rows is the total
    # the group's hit ratio is shown next to each of its topics
    table = [cells for cells in map(str.split, text.splitlines()) if cells and cells[0] in ("t1", "t2")]
    assert sorted((cells[0], cells[1], cells[2], cells[7]) for cells in table) == [
        ("t1", "g1", "10", "35.3"),
        ("t1", "g2", "0", "-"),
        ("t2", "g1", "30", "35.3"),
    ]


def test_batch_prints_the_report_for_an_output_given_as_a_uri(
    spark: SparkSession, export_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(JobSettings(input=str(export_dir), output=tmp_path.as_uri()))  # file:///...: as for s3a://
    printed = capsys.readouterr().out
    assert "receives 32, polling hit ratio 31.2 %" in printed
    assert (tmp_path / "report.txt").read_text() == printed


def test_streaming_once_prints_it_too(
    spark: SparkSession, export_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(JobSettings(input=str(export_dir), output=tmp_path.as_uri(), lateness_s=10, streaming=True, once=True))
    printed = capsys.readouterr().out  # data up to t=100, 10 s lateness: window 0 is final
    assert "popgate metrics: 1 windows" in printed and "receives 15," in printed
    assert (tmp_path / "report.txt").read_text() == printed


def test_input_that_makes_no_rows_gives_a_report_not_a_failure_and_streaming_goes_on(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Messages on a topic no group consumes yet make no topic/group row: the first run writes no Parquet, and
    later runs — streaming ones replay that batch — must not fail on it."""
    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    write_jsonl(
        inbox / "a.jsonl", [S.rec(t, "popgate_broker_max_offset", 10 * t, topic="t1", queue=0) for t in (0, 100)]
    )
    run(JobSettings(input=str(inbox), output=str(out), lateness_s=10, streaming=True, once=True))
    assert "no complete window" in capsys.readouterr().out
    run_batch(spark, JobSettings(input=str(inbox), output=str(tmp_path / "batch")))
    assert "no complete window" in (tmp_path / "batch" / "report.txt").read_text()
    write_jsonl(inbox / "b.jsonl", rows())  # a consumer group appears: the next run goes on with it
    run(JobSettings(input=str(inbox), output=str(out), lateness_s=10, streaming=True, once=True))
    assert "receives 15," in capsys.readouterr().out


def test_a_group_that_never_had_an_empty_receive_or_a_first_pop_hit_shows_zero_rates(
    spark: SparkSession, tmp_path: Path
) -> None:
    proxy: dict[str, Any] = {"process": "px", "kind": "proxy", "counter": True}
    records = [
        S.rec(t, "popgate_proxy_receives_total", n, group="g", labels={"outcome": "messages"}, **proxy)
        for t, n in ((0, 0), (40, 30), (100, 60))
    ]
    write_jsonl(tmp_path / "in.jsonl", records)
    run_batch(spark, JobSettings(input=str(tmp_path / "in.jsonl"), output=str(tmp_path / "out")))
    [row] = [r for r in spark.read.parquet(str(tmp_path / "out" / "windows")).collect() if r["receives"]][:1]
    assert (row["empty_responses"], row["empty_rate"], row["first_pop_hits"], row["polling_hit_ratio"]) == (0, 0, 0, 0)


def test_an_input_directory_not_made_yet_is_empty_input_when_streaming(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a fresh volume no exporter has written yet (the CronJob's first --streaming --once runs): a report,
    not a failure. A batch run over a missing input is an error (tests/spark/test_cli.py)."""
    settings = JobSettings(input=str(tmp_path / "not yet"), output=str(tmp_path / "out"), streaming=True, once=True)
    run(settings)
    assert "no complete window" in capsys.readouterr().out
