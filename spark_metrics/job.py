"""Batch and Structured Streaming runs over an export directory, writing Parquet, a report and a chart.

Output layout (``--output DIR``):
  DIR/windows/date=YYYY-MM-DD/*.parquet   one row per window and topic/group (transform.OUTPUT_COLUMNS)
  DIR/report.txt                          the short text report
  DIR/lag.png                             consumer lag over time, one line per group
  DIR/_checkpoint/                        streaming only: the query's progress and state
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from spark_metrics import report
from spark_metrics.names import RECORD_SCHEMA
from spark_metrics.paths import hadoop_fs, join, local_path
from spark_metrics.transform import group_metrics, series_windows

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobSettings:
    input: str
    output: str
    window_s: float = 60.0
    # Streaming: how late a record may arrive (by its own time, against the newest seen) and still count.
    # Export files appear once per roll period (60 s), so this must exceed it.
    lateness_s: float = 180.0
    streaming: bool = False
    once: bool = False  # streaming: process what is there now, then stop (Trigger.AvailableNow)
    trigger_s: float = 10.0
    top: int = 5

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.lateness_s < 0 or self.trigger_s <= 0:
            raise ValueError("window and trigger must be > 0, lateness >= 0")

    @property
    def windows_path(self) -> str:
        return join(self.output, "windows")


def session(master: str | None = None, app: str = "popgate-metrics") -> SparkSession:
    """A session for the job: ``master`` if given, else whatever spark-submit set, else local[*]."""
    builder = SparkSession.builder.appName(app)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from pyspark import SparkConf
    from pyspark.context import SparkContext

    # Not under spark-submit, pyspark starts the JVM as "pyspark-shell", a shell, whose launcher turns the console
    # progress bar on: that value is the launcher's, not the user's, unless PYSPARK_SUBMIT_ARGS names it.
    own_launch = "PYSPARK_GATEWAY_PORT" not in os.environ
    SparkContext._ensure_initialized()  # reads spark-submit's --master/--conf, if any
    conf = SparkConf()
    if master or not conf.contains("spark.master"):
        builder = builder.master(master or "local[*]")
    defaults = {
        "spark.sql.session.timeZone": "UTC",  # window bounds and date partitions in UTC
        "spark.sql.shuffle.partitions": "8",  # small aggregates; state-store count in streaming
        "spark.ui.showConsoleProgress": "false",
    }
    user_set = {key for key in defaults if conf.contains(key)}
    if own_launch and "spark.ui.showConsoleProgress" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        user_set.discard("spark.ui.showConsoleProgress")
    for key, value in defaults.items():
        if key not in user_set:
            builder = builder.config(key, value)
    return builder.getOrCreate()


class JobError(Exception):
    """What stops the job before it reads anything; the command line prints it as one line."""


class InputNotFound(JobError):
    def __init__(self, path: str) -> None:
        super().__init__(
            f"input {path} does not exist: a batch run reads what is there (--streaming waits for it to appear)"
        )
        self.path = path


def check_input(settings: JobSettings) -> None:
    """Before Spark starts: a batch run over a local input that does not exist is an error (a typo in
    --input must not pass as an empty report). Other file systems are checked by read_records."""
    local = local_path(settings.input)
    if not settings.streaming and local is not None and not local.exists():
        raise InputNotFound(settings.input)


def _ensure_dir(spark: SparkSession, path: str, *, streaming: bool) -> None:
    """Streaming: make ``path`` (any Hadoop file system) when it does not exist yet: on a fresh volume no
    exporter has written yet, and the query needs the directory to watch. Batch: InputNotFound."""
    fs, hadoop_path = hadoop_fs(spark, path)
    if not fs.exists(hadoop_path):
        if not streaming:
            raise InputNotFound(path)
        log.info("input %s does not exist yet: made empty, waiting for files", path)
        fs.mkdirs(hadoop_path)


def read_records(spark: SparkSession, path: str, *, streaming: bool = False) -> DataFrame:
    """Every finished ``*.jsonl`` file under ``path`` (any depth); in-progress files are hidden.
    A missing ``path`` is made when streaming, InputNotFound in batch."""
    _ensure_dir(spark, path, streaming=streaming)
    reader: Any = spark.readStream if streaming else spark.read
    records: DataFrame = (
        reader.schema(RECORD_SCHEMA)
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.jsonl")
        .option("mode", "PERMISSIVE")
        .json(path)
    )
    return records


def write_windows(df: DataFrame, path: str, *, append: bool) -> None:
    writer = df.write.partitionBy("date")
    if append:
        writer.mode("append").parquet(path)
    else:
        writer.mode("overwrite").option("partitionOverwriteMode", "dynamic").parquet(path)


def _write_report(spark: SparkSession, settings: JobSettings) -> str:
    return report.write(spark, settings.windows_path, output=settings.output, top=settings.top)


def run_batch(spark: SparkSession, settings: JobSettings) -> str:
    """Aggregate everything under the input; rewrite the output's date partitions it covers.

    Returns the report (also saved next to the output when that is a local path).
    """
    series = series_windows(read_records(spark, settings.input), settings.window_s)
    # step 2 reads step 1 in several branches: keep it rather than parse the JSON once per branch
    series = series.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        write_windows(group_metrics(series, settings.window_s), settings.windows_path, append=False)
    finally:
        series.unpersist()
    return _write_report(spark, settings)


def start_streaming(spark: SparkSession, settings: JobSettings) -> Any:
    """Start the streaming query; each micro-batch appends the windows the watermark closed."""
    records = read_records(spark, settings.input, streaming=True)
    series = series_windows(records, settings.window_s, lateness_s=settings.lateness_s)

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist(StorageLevel.MEMORY_AND_DISK)  # step 2 reads it in several branches
        try:
            if not batch.isEmpty():
                write_windows(group_metrics(batch, settings.window_s), settings.windows_path, append=True)
                _write_report(spark, settings)
                log.info("batch %d: windows written", batch_id)
        finally:
            batch.unpersist()

    writer = (
        series.writeStream.outputMode("append")
        .foreachBatch(each_batch)
        .option("checkpointLocation", join(settings.output, "_checkpoint"))
        .queryName("popgate-metrics")
    )
    if settings.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(settings.trigger_s * 1000)} milliseconds")
    return writer.start()


def run(settings: JobSettings, *, master: str | None = None) -> None:
    """Run the job, then print the report (whatever the output's file system). JobError: nothing was run."""
    check_input(settings)
    spark = session(master)
    if settings.streaming:
        query = start_streaming(spark, settings)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        text = _write_report(spark, settings)  # from everything written so far, this run or earlier ones
    else:
        text = run_batch(spark, settings)
    print(text, end="")
