"""Batch and Structured Streaming runs over an export directory, writing Parquet, a report and a chart.

Output layout (``--output DIR``):
  DIR/windows/date=YYYY-MM-DD/*.parquet     one row per window and topic/group (transform.OUTPUT_COLUMNS)
  DIR/processes/date=YYYY-MM-DD/*.parquet   one row per window, process and topic/group (transform.PROCESS_COLUMNS)
  DIR/report.txt, DIR/*.png, DIR/adaptive.toml   the report, its charts and the proxy settings it recommends
  DIR/_checkpoint/                          streaming only: the query's progress and state
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from spark_metrics import report
from spark_metrics.names import RECORD_SCHEMA
from spark_metrics.paths import hadoop_fs, join, local_path
from spark_metrics.transform import per_process, processes_from, series_windows, windows_from

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
    report_span_s: float = 24 * 3600.0  # the report, charts and recommendation cover this much before the last window

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.lateness_s < 0 or self.trigger_s <= 0 or self.report_span_s <= 0:
            raise ValueError("window, trigger and report span must be > 0, lateness >= 0")

    @property
    def windows_path(self) -> str:
        return join(self.output, "windows")

    @property
    def processes_path(self) -> str:
        return join(self.output, "processes")


class Progress:
    """Progress lines on the `spark_metrics` logger (INFO), each with the time since the run began."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def __call__(self, message: str, *args: object) -> None:
        log.info("[%5.1f s] " + message, time.monotonic() - self._start, *args)


def session(master: str | None = None, app: str = "popgate-metrics", *, spark_log: Path | None = None) -> SparkSession:
    """A session for the job: ``master`` if given, else whatever spark-submit set, else local[*].

    With ``spark_log``, a JVM this process starts writes its console (Spark's own log lines, the JVM's warnings)
    to that file instead of stderr, and Spark logs errors only — tests/spark/test_cli.py::
    test_a_run_prints_progress_and_no_spark_log_lines. Under spark-submit the JVM is already running: its log4j
    configuration is the submitter's, and only the level is set.
    """
    builder = SparkSession.builder.appName(app)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from pyspark import SparkConf
    from pyspark.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    # Not under spark-submit, pyspark starts the JVM as "pyspark-shell", a shell, whose launcher turns the console
    # progress bar on: that value is the launcher's, not the user's, unless PYSPARK_SUBMIT_ARGS names it.
    own_launch = "PYSPARK_GATEWAY_PORT" not in os.environ
    gateway = None
    if own_launch and spark_log is not None and SparkContext._gateway is None:
        with spark_log.open("ab") as console:
            gateway = launch_gateway(popen_kwargs={"stdout": console, "stderr": console})  # type: ignore[no-untyped-call]
    SparkContext._ensure_initialized(gateway=gateway)  # reads spark-submit's --master/--conf, if any
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
    spark = builder.getOrCreate()
    if spark_log is not None:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


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
    A missing ``path`` is made when streaming, InputNotFound in batch. A file listed and then gone or unreadable
    (Java reports a denied permission as a missing file) is skipped, not a failed run —
    tests/spark/test_transform.py::test_a_file_deleted_after_the_listing_is_skipped."""
    _ensure_dir(spark, path, streaming=streaming)
    reader: Any = spark.readStream if streaming else spark.read
    records: DataFrame = (
        reader.schema(RECORD_SCHEMA)
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.jsonl")
        .option("mode", "PERMISSIVE")
        .option("ignoreMissingFiles", "true")
        .json(path)
    )
    return records


def write_windows(df: DataFrame, path: str, *, append: bool) -> None:
    writer = df.write.partitionBy("date")
    if append:
        writer.mode("append").parquet(path)
    else:
        writer.mode("overwrite").option("partitionOverwriteMode", "dynamic").parquet(path)


def _write_report(spark: SparkSession, settings: JobSettings, progress: Progress) -> str:
    return report.write(spark, settings.output, top=settings.top, span_s=settings.report_span_s, progress=progress)


def write_outputs(series: DataFrame, settings: JobSettings, *, append: bool) -> None:
    """Step 2 over complete windows: the windows and the per-process outputs, from one aggregation."""
    # both outputs read the per-process figures in several branches: keep them rather than aggregate again
    pp = per_process(series).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        write_windows(windows_from(pp, settings.window_s), settings.windows_path, append=append)
        write_windows(processes_from(pp), settings.processes_path, append=append)
    finally:
        pp.unpersist()


def run_batch(spark: SparkSession, settings: JobSettings, progress: Progress | None = None) -> str:
    """Aggregate everything under the input; rewrite the output's date partitions it covers.

    Returns the report (also saved next to the output when that is a local path).
    """
    progress = progress or Progress()
    progress("reading %s, aggregating %g s windows", settings.input, settings.window_s)
    write_outputs(series_windows(read_records(spark, settings.input), settings.window_s), settings, append=False)
    progress("windows written to %s", settings.output)
    return _write_report(spark, settings, progress)


def start_streaming(spark: SparkSession, settings: JobSettings, progress: Progress | None = None) -> Any:
    """Start the streaming query; each micro-batch appends the windows the watermark closed."""
    progress = progress or Progress()
    records = read_records(spark, settings.input, streaming=True)
    series = series_windows(records, settings.window_s, lateness_s=settings.lateness_s)

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            if not batch.isEmpty():
                write_outputs(batch, settings, append=True)
                progress("micro-batch %d: final windows written", batch_id)
                _write_report(spark, settings, progress)
            else:
                progress("micro-batch %d: no window final yet", batch_id)
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


def run(settings: JobSettings, *, master: str | None = None, spark_log: Path | None = None) -> None:
    """Run the job, then print the report (whatever the output's file system). JobError: nothing was run.

    ``spark_log``: where a JVM this run starts writes its own log (session()); None leaves it on stderr.
    """
    check_input(settings)
    progress = Progress()
    progress("starting Spark%s", f" (its own log: {spark_log})" if spark_log else "")
    spark = session(master, spark_log=spark_log)
    progress("Spark %s on %s", spark.version, spark.sparkContext.master)
    if settings.streaming:
        query = start_streaming(spark, settings, progress)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        text = _write_report(spark, settings, progress)  # from everything written so far, this run or earlier ones
    else:
        text = run_batch(spark, settings, progress)
    progress("done")
    print(text, end="")


def default_spark_log() -> Path:
    """A new file for the JVM's own log (the command line deletes it after a run that succeeded)."""
    fd, name = tempfile.mkstemp(prefix="spark_metrics-", suffix=".log")
    os.close(fd)
    return Path(name)
