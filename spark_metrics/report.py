"""The report from the job's Parquet output (small: windows x groups x processes): text, charts and the proxy
config fragment, over the last `span_s` of windows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_metrics import advice as A
from spark_metrics import charts, health, text
from spark_metrics.paths import hadoop_fs, join, local_path

Row = dict[str, Any]


def _read(spark: SparkSession, path: str, keys: list[str]) -> DataFrame | None:
    if not _has_output(spark, path):
        return None
    # a streaming batch replayed after a crash appends its rows again: drop them
    return spark.read.parquet(path).dropDuplicates(keys)


def _collect(df: DataFrame | None, since: Any) -> list[Row]:
    if df is None:
        return []
    df = df.where(F.col("window_start") >= since)
    df = df.withColumns({c: F.unix_micros(c) for c in ("window_start", "window_end")}).drop("date")
    rows = [r.asDict() for r in df.collect()]
    for r in rows:  # timestamps in UTC whatever the driver's time zone
        for c in ("window_start", "window_end"):
            r[c] = datetime.fromtimestamp(r[c] / 1e6, UTC)
    rows.sort(key=lambda r: (r["window_start"], r.get("topic") or "", r.get("group") or ""))
    return rows


def load(spark: SparkSession, output: str, *, span_s: float = 24 * 3600.0) -> tuple[list[Row], list[Row]]:
    """The windows and per-process rows of the last ``span_s`` before the newest window (either may be empty:
    an output written before per-process rows existed has none)."""
    windows = _read(spark, join(output, "windows"), ["window_start", "topic", "group"])
    processes = _read(spark, join(output, "processes"), ["window_start", "process", "topic", "group"])
    if windows is None:
        return [], []
    newest = windows.agg(F.max(F.unix_micros("window_start"))).first()
    if newest is None or newest[0] is None:
        return [], []
    since = F.timestamp_micros(F.lit(int(newest[0] - span_s * 1e6)))
    return _collect(windows, since), _collect(processes, since)


def analyse(windows: list[Row], processes: list[Row]) -> tuple[health.Timeline | None, A.Advice | None]:
    if not windows:
        return None, None
    t = health.build(windows, processes)
    return t, A.recommend(t)


def render(windows: list[Row], processes: list[Row] | None = None, *, top: int = 5) -> str:
    t, advice = analyse(windows, processes or [])
    return text.render(windows, t, advice, top=top)


def write(
    spark: SparkSession,
    output: str,
    *,
    top: int,
    span_s: float = 24 * 3600.0,
    progress: Callable[..., None] | None = None,
) -> str:
    """Render the report from the output written so far; also save it, the charts and the proxy config fragment
    (adaptive.toml) in ``output`` when that is local (a Hadoop URI gets the report on stdout only)."""
    say = progress or (lambda *_: None)
    windows, processes = load(spark, output, span_s=span_s)
    say("report: %d window rows and %d per-process rows loaded", len(windows), len(processes))
    t, advice = analyse(windows, processes)
    report = text.render(windows, t, advice, top=top)
    local = local_path(output)
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
        _replace(local / "report.txt", report)
        if t is not None and advice is not None:
            first, last = text.when(t)
            _replace(local / "adaptive.toml", A.fragment(advice, first=first, last=last))
        written = charts.write_all(t, advice, local)
        say("report, adaptive.toml and charts written: %s", " ".join(p.name for p in written))
    return report


def _replace(path: Any, content: str) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(content)
    tmp.replace(path)


def _has_output(spark: SparkSession, path: str) -> bool:
    """Whether any Parquet file was written under `path` (a run whose input made no rows writes only
    `_SUCCESS`, and Spark cannot read a schema from that: the report would fail, and with it the streaming
    batch, replayed and failing again on every later run)."""
    fs, hpath = hadoop_fs(spark, path)
    if not fs.exists(hpath):
        return False
    files = fs.listFiles(hpath, True)
    while files.hasNext():
        if files.next().getPath().getName().endswith(".parquet"):
            return True
    return False
