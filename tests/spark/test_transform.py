"""The shared transformation on a hand-made export: windows, lag arithmetic, counter resets, polling ratios,
duplicates and order, and streaming against batch."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_metrics.job import JobSettings, read_records, run_batch, start_streaming
from spark_metrics.transform import OUTPUT_COLUMNS, PROCESS_COLUMNS, aggregate
from tests.spark import scenario as S

Key = tuple[int, str, str]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, separators=(",", ":"), sort_keys=True) + "\n" for r in rows))
    tmp.rename(path)  # as the exporter does: never a half-written .jsonl


def by_key(df: DataFrame) -> dict[Key, dict[str, Any]]:
    out = {}
    for row in df.collect():
        r = row.asDict()
        window = int((r["window_start"].timestamp() - S.T0) // S.WINDOW_S)
        out[(window, r["topic"], r["group"])] = r
    return out


def per_process(spark: SparkSession, output: Path) -> list[str]:
    """The per-process output, rows as comparable text, sorted."""

    def norm(v: Any) -> Any:
        return round(v, 9) if isinstance(v, float) else v

    rows = spark.read.parquet(str(output / "processes")).collect()
    return sorted(repr(tuple(norm(r[c]) for c in PROCESS_COLUMNS)) for r in rows)


def comparable(rows: dict[Key, dict[str, Any]]) -> dict[Key, tuple[Any, ...]]:
    def norm(v: Any) -> Any:
        return round(v, 9) if isinstance(v, float) else v

    return {k: tuple(norm(r[c]) for c in OUTPUT_COLUMNS) for k, r in rows.items()}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("export")
    rows = S.all_rows()
    write_jsonl(d / "b1" / "a.jsonl", [r for r in rows if r["process"] == "b1"])
    write_jsonl(d / "b2" / "a.jsonl", [r for r in rows if r["process"] == "b2"])
    write_jsonl(d / "proxy" / "a.jsonl", [r for r in rows if r["kind"] == "proxy"])
    (d / "b1" / ".in-progress.jsonl.tmp").write_text('{"v":1,"time":')  # hidden: never read
    return d


@pytest.fixture(scope="module")
def result(spark: SparkSession, export_dir: Path) -> dict[Key, dict[str, Any]]:
    return by_key(aggregate(read_records(spark, str(export_dir)), S.WINDOW_S))


def test_windows_take_the_last_snapshot_and_are_aligned(result: dict[Key, dict[str, Any]]) -> None:
    slow = result[(0, S.TOPIC, "slow")]
    assert slow["window_start"].timestamp() == S.T0
    assert slow["window_end"].timestamp() == S.T0 + 60
    assert str(slow["date"]) == "2027-01-15"
    assert {k[0] for k in result} == {0, 1, 2}


def test_lag_arithmetic_matches_hand_computed_values(result: dict[Key, dict[str, Any]]) -> None:
    slow, fast = result[(0, S.TOPIC, "slow")], result[(0, S.TOPIC, "fast")]
    assert (slow["consumer_lag"], slow["inflight"], slow["available"]) == (265, 15, 250)
    assert (fast["consumer_lag"], fast["inflight"], fast["available"]) == (0, 0, 0)
    assert slow["exact_lag"] == 265
    assert slow["lag_seconds"] == 30.0  # the oldest across brokers
    assert (slow["lag_rank"], fast["lag_rank"]) == (1, 2)


def test_counters_become_window_increases_across_a_restart(result: dict[Key, dict[str, Any]]) -> None:
    assert [result[(w, S.TOPIC, "slow")]["messages_out"] for w in (0, 1, 2)] == [20, 20, 7]
    assert [result[(w, S.TOPIC, "slow")]["messages_in"] for w in (0, 1)] == [60, 90]
    assert result[(1, S.TOPIC, "slow")]["in_rate"] == 1.5
    assert result[(1, S.TOPIC, "slow")]["dlq_growth"] == 3
    assert result[(1, "", "slow")]["dlq_messages"] == 3  # the group's DLQ size knows no topic


def test_polling_ratios_from_the_proxy_counters(result: dict[Key, dict[str, Any]]) -> None:
    slow, fast = result[(1, "", "slow")], result[(1, "", "fast")]  # proxies know no topic: the group's row
    assert result[(1, S.TOPIC, "slow")]["receives"] is None  # not repeated on each topic of the group
    counts = ("receives", "first_pop_hits", "notify_runs", "long_polling_receives", "empty_responses")
    assert tuple(slow[c] for c in counts) == (40, 6, 12, 34, 10)
    assert (slow["polling_hit_ratio"], slow["notify_share"], slow["empty_rate"]) == (0.15, 0.3, 0.25)
    # no first-Pop hit or notify run series for fast: none happened, so 0, not unknown
    assert tuple(fast[c] for c in counts) == (10, 0, 0, 10, 2)
    assert (fast["polling_hit_ratio"], fast["notify_share"], fast["empty_rate"]) == (0.0, 0.0, 0.2)


def test_duplicates_and_arrival_order_change_nothing(
    spark: SparkSession, tmp_path: Path, result: dict[Key, dict[str, Any]]
) -> None:
    rows = S.all_rows() * 2
    random.Random(7).shuffle(rows)
    write_jsonl(tmp_path / "x.jsonl", rows[: len(rows) // 2])
    write_jsonl(tmp_path / "y.jsonl", rows[len(rows) // 2 :] + S.all_rows()[:50])
    again = by_key(aggregate(read_records(spark, str(tmp_path)), S.WINDOW_S))
    assert comparable(again) == comparable(result)


def test_malformed_records_change_nothing_and_stop_nothing(
    spark: SparkSession, tmp_path: Path, result: dict[Key, dict[str, Any]]
) -> None:
    """Another writer's records, a nanosecond clock, a wrong type: skipped, not a crash (Spark's ANSI mode makes
    an out-of-range time an overflow error) and not a phantom series."""
    template = next(r for r in S.all_rows() if r["metric"] == "popgate_broker_max_offset")
    bad = [
        {**template, "time": 1e20},
        {**template, "time": -1e20},
        {**template, "time": template["time"] * 1e9},  # nanoseconds
        {**template, "queue": 1e30},
        {**template, "labels": ["a"]},
        {**template, "value": "many"},
        {**template, "started": 1e20},
    ]
    write_jsonl(tmp_path / "good.jsonl", S.all_rows())
    write_jsonl(tmp_path / "bad.jsonl", bad)
    with (tmp_path / "bad.jsonl").open("a") as f:
        f.write("not json at all\n")
    again = by_key(aggregate(read_records(spark, str(tmp_path)), S.WINDOW_S))
    assert comparable(again) == comparable(result)


def test_a_file_deleted_after_the_listing_is_skipped(spark: SparkSession, tmp_path: Path) -> None:
    """Retention may delete a finished file at any time (docs/METRICS.md §2), also while a run reads the input:
    the run goes on without it."""
    rows = S.all_rows()
    write_jsonl(tmp_path / "b1.jsonl", [r for r in rows if r["process"] == "b1"])
    write_jsonl(tmp_path / "rest.jsonl", [r for r in rows if r["process"] != "b1"])
    records = read_records(spark, str(tmp_path))  # lists the files
    (tmp_path / "b1.jsonl").unlink()
    assert records.count() == len([r for r in rows if r["process"] != "b1"])


def test_streaming_gives_the_batch_answer_with_late_and_duplicate_records(
    spark: SparkSession, tmp_path: Path, result: dict[Key, dict[str, Any]]
) -> None:
    rows = S.all_rows()
    late = [r for r in rows if r["process"] == "b2" and r["time"] < S.T0 + 60]  # window 0, arriving later
    first = [r for r in rows if r["time"] < S.T0 + 60 and r not in late]
    second = [r for r in rows if r["time"] >= S.T0 + 60] + late + first[:40]  # with duplicates
    # the clock moves on: a later snapshot lets the watermark close windows 0..2
    closer = [S.rec(1000, "popgate_broker_max_offset", 0, topic="other", queue=0)]
    src, out = tmp_path / "in", tmp_path / "out"
    settings = JobSettings(
        input=str(src), output=str(out), window_s=S.WINDOW_S, lateness_s=150, streaming=True, trigger_s=0.1
    )
    write_jsonl(src / "1.jsonl", first)
    query = start_streaming(spark, settings)
    try:
        query.processAllAvailable()
        write_jsonl(src / "2.jsonl", second)
        query.processAllAvailable()
        assert not (out / "windows").exists()  # nothing final yet: the watermark is still in window 0
        write_jsonl(src / "3.jsonl", closer)
        query.processAllAvailable()
    finally:
        query.stop()
    streamed = by_key(spark.read.parquet(str(out / "windows")))
    assert comparable(streamed) == comparable(result)
    assert "slow" in (out / "report.txt").read_text()

    batch_out = tmp_path / "batch"
    run_batch(spark, JobSettings(input=str(src), output=str(batch_out), window_s=S.WINDOW_S))
    assert comparable(by_key(spark.read.parquet(str(batch_out / "windows")))) == comparable(result)
    # the per-process output too, but for the window of the closing record alone (final in batch only)
    assert per_process(spark, out) == [r for r in per_process(spark, batch_out) if "2027, 1, 15, 8, 16" not in r]
    assert (batch_out / "lag.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_streaming_counts_a_record_up_to_the_lateness_late_when_the_window_is_longer(
    spark: SparkSession, tmp_path: Path
) -> None:
    """--lateness 30s with 60 s windows: b2's snapshots of window 0 are read when b1 is already 15-25 s
    further on, within the lateness, so they count (they were dropped when the watermark ran a window ahead)."""

    def snapshot(t: float, process: str) -> list[dict[str, Any]]:
        rows = [S.rec(t, "popgate_broker_messages_in_total", t, process=process, topic="t", counter=True)]
        if process == "b1":
            rows += [
                S.rec(t, "popgate_broker_max_offset", t, topic="t", queue=0),
                S.rec(t, "popgate_broker_consumer_offset", 0, topic="t", group="g", queue=0),
            ]
        return rows

    b1 = [r for t in range(0, 80, 10) for r in snapshot(t, "b1")]  # up to t=70
    src, out = tmp_path / "in", tmp_path / "out"
    write_jsonl(src / "1.jsonl", b1 + snapshot(5, "b2") + snapshot(25, "b2"))
    settings = JobSettings(input=str(src), output=str(out), window_s=60, lateness_s=30, streaming=True, trigger_s=0.1)
    query = start_streaming(spark, settings)
    try:
        query.processAllAvailable()
        write_jsonl(src / "2.jsonl", snapshot(45, "b2") + snapshot(55, "b2"))  # 25 s and 15 s behind t=70
        query.processAllAvailable()
        early = (out / "windows").exists()
        write_jsonl(src / "3.jsonl", snapshot(200, "b1"))  # the clock moves on: windows 0 and 1 are final
        query.processAllAvailable()
    finally:
        query.stop()
    streamed = by_key(spark.read.parquet(str(out / "windows")))
    # window 0: b1 50 - 0, b2 55 - 5 (both ran long before: first to last); window 1: b1 70 - 50
    assert [streamed[(w, "t", "g")]["messages_in"] for w in (0, 1)] == [100, 20]
    batch = by_key(aggregate(read_records(spark, str(src)), 60))
    assert comparable({k: batch[k] for k in streamed}) == comparable(streamed)
    assert not early  # window 0 waited for records up to 30 s late


def test_offsets_summed_per_group_give_the_same_figures_as_per_queue(spark: SparkSession, tmp_path: Path) -> None:
    """A broker without --metrics-queue-offsets exports a group's consumer and pull offsets summed over its queues,
    with no queue: the job's lags are the same as from the per-queue series."""
    offsets = ("popgate_broker_consumer_offset", "popgate_broker_pull_offset")
    per_queue = S.broker_window0() + S.counters()
    summed: dict[tuple[Any, ...], dict[str, Any]] = {}
    rows = []
    for r in per_queue:
        if r["metric"] not in offsets:
            rows.append(r)
            continue
        key = (r["time"], r["process"], r["metric"], r["topic"], r["group"])
        pair = summed.setdefault(key, {**r, "queue": None, "value": 0.0})
        pair["value"] += r["value"]
    assert len(summed) < sum(r["metric"] in offsets for r in per_queue)  # the scenario has several queues
    write_jsonl(tmp_path / "queues" / "a.jsonl", per_queue)
    write_jsonl(tmp_path / "pairs" / "a.jsonl", rows + list(summed.values()))
    figures = [by_key(aggregate(read_records(spark, str(tmp_path / d)), S.WINDOW_S)) for d in ("queues", "pairs")]
    slow = figures[1][(0, S.TOPIC, "slow")]
    assert (slow["consumer_lag"], slow["inflight"], slow["available"]) == (265, 15, 250)
    assert comparable(figures[1]) == comparable(figures[0])
