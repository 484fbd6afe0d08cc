"""Spark bench: N synthetic export records (default 10 million) aggregated by the batch job on local[2].

    .venv/bin/python bench/spark_bench.py [--records 10000000] [--data /tmp/popgate-spark-bench] [--master local[2]]

The records are written once (by Spark, as JSON lines in the export schema, 16 files) and reused by later
runs; the timed part is exactly what `python -m spark_metrics --input DATA --output OUT` does in batch:
read the JSON, both aggregation steps, write the Parquet, the report and the chart. A second timing runs
the transformation alone over the records already parsed and cached in memory (no JSON, no output).

Synthetic cluster: 4 brokers x 20 topics x 4 queues, 2 groups per topic, 2 proxies; one snapshot every
10 s per process, with every process restarting every 3000 snapshots (counter resets).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from spark_metrics.job import JobSettings, read_records, run_batch  # noqa: E402
from spark_metrics.transform import group_metrics, series_windows  # noqa: E402

T0 = 1_800_000_000
INTERVAL_S = 10
RESTART_EVERY = 3000
BROKERS, TOPICS, QUEUES, GROUPS, PROXIES = 4, 20, 4, 2, 2


def catalogue() -> list[dict[str, Any]]:
    """Every series one snapshot holds, with its growth rates."""
    rows: list[dict[str, Any]] = []

    def add(process: str, kind: str, metric: str, type_: str, **kw: Any) -> None:
        rows.append(
            {"process": process, "kind": kind, "metric": metric, "type": type_, "topic": None, "group": None,
             "queue": None, "labels": "{}", "rate": 1.0 + len(rows) % 7, **kw}
        )  # fmt: skip

    for b in range(BROKERS):
        p = f"b{b + 1}"
        for t in range(TOPICS):
            topic = f"topic{t}"
            r = 1.0 + t % 7  # one growth rate per topic, so offsets stay ordered (consumer <= pull <= max)
            add(p, "broker", "popgate_broker_messages_in_total", "counter", topic=topic, rate=r)
            for q in range(QUEUES):
                add(p, "broker", "popgate_broker_max_offset", "gauge", topic=topic, queue=q, rate=r)
            for g in range(GROUPS):
                group = f"{topic}-g{g}"
                for q in range(QUEUES):
                    for m in ("consumer_offset", "pull_offset"):
                        add(p, "broker", f"popgate_broker_{m}", "gauge", topic=topic, group=group, queue=q, rate=r)
                for m in ("consumer_lag_messages", "oldest_unacked_age_seconds"):
                    add(p, "broker", f"popgate_broker_{m}", "gauge", topic=topic, group=group)
                for m in ("messages_out_total", "dead_lettered_total"):
                    add(p, "broker", f"popgate_broker_{m}", "counter", topic=topic, group=group)
    for x in range(PROXIES):
        p = f"proxy-{x}"
        for t in range(TOPICS):
            for g in range(GROUPS):
                group = f"topic{t}-g{g}"
                # per group and snapshot: 4 receives with messages + 1 empty, 2.5 first-Pop hits, 2 notify runs
                for outcome, r in (("messages", 4.0), ("empty", 1.0)):
                    labels = f'{{"mode":"notify","outcome":"{outcome}"}}'
                    add(p, "proxy", "popgate_proxy_receives_total", "counter", group=group, labels=labels, rate=r)
                add(p, "proxy", "popgate_proxy_receive_first_pop_hits_total", "counter", group=group, rate=2.5)
                add(p, "proxy", "popgate_proxy_notify_runs_total", "counter", group=group, rate=2.0)
    return rows


def generate(spark: SparkSession, records: int, path: Path) -> None:
    series = spark.createDataFrame(catalogue()).withColumn("sid", F.monotonically_increasing_id())
    n = series.count()
    snapshots = spark.range(-(-records // n)).withColumnRenamed("id", "k")  # at least `records` in all
    k, life = F.col("k"), F.col("k") % RESTART_EVERY
    offset = life * 5 * F.col("rate")
    behind = (life % 50) * (F.hash("group") % 3 + 3)  # each group its own lag, the same on every queue
    value = (
        F.when(F.col("metric") == "popgate_broker_consumer_offset", offset - behind)
        .when(F.col("metric") == "popgate_broker_pull_offset", offset - behind + life % 5)
        .when(F.col("metric") == "popgate_broker_consumer_lag_messages", behind * QUEUES)
        .when(F.col("metric") == "popgate_broker_oldest_unacked_age_seconds", (life % 30) * 1.5)
        .otherwise(offset)
    )
    df = snapshots.crossJoin(series).select(
        F.lit(1).alias("v"),
        (F.lit(T0) + k * INTERVAL_S + (F.col("sid") % 10) / 100).alias("time"),
        "process",
        "kind",
        (F.lit(T0) + (k - life) * INTERVAL_S).cast("double").alias("started"),
        "topic",
        "group",
        "queue",
        "metric",
        "type",
        value.cast("double").alias("value"),
        F.col("labels"),
    )
    text = F.to_json(F.struct(*[c for c in df.columns if c != "labels"]))
    # labels is already JSON text: splice it in as an object
    json_line = F.concat(F.expr("left(j, length(j) - 1)"), F.lit(',"labels":'), F.col("labels"), F.lit("}"))
    # laid out like real exports: each file holds consecutive snapshots of one process
    out = df.repartitionByRange(16, "process", "time").select(text.alias("j"), "labels")
    out.select(json_line.alias("value")).write.mode("overwrite").text(str(path / "tmp"))
    for part in (path / "tmp").glob("part-*"):
        part.rename(path / (part.name.split(".")[0] + ".jsonl"))
    shutil.rmtree(path / "tmp")


class JvmCpu:
    """CPU seconds of the Spark JVM (driver and local executors), from /proc: less sensitive than wall
    time to other load on a shared machine."""

    def __init__(self, spark: SparkSession) -> None:
        self.pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

    def __call__(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(label: str, fn: Any, cpu: JvmCpu) -> tuple[str, float, float]:
    began, cpu0 = time.perf_counter(), cpu()
    fn()
    return label, time.perf_counter() - began, cpu() - cpu0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--data", type=Path, default=Path("/tmp/popgate-spark-bench"))
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--window", type=float, default=60.0)
    args = ap.parse_args()

    spark = (
        SparkSession.builder.master(args.master)
        .appName("popgate-spark-bench")
        .config("spark.driver.memory", "3g")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    cpu = JvmCpu(spark)
    data = args.data / f"records-{args.records}"
    if not (data / "_done").exists():
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        _, seconds, _ = timed("generate", lambda: generate(spark, args.records, data), cpu)
        (data / "_done").write_text("")
        print(f"generated {args.records:,} records in {seconds:.1f} s (not timed below)")
    size = sum(p.stat().st_size for p in data.glob("*.jsonl"))
    out = args.data / "out"
    shutil.rmtree(out, ignore_errors=True)
    settings = JobSettings(input=str(data), output=str(out), window_s=args.window)

    results = [timed("batch job: JSON in, Parquet + report out", lambda: run_batch(spark, settings), cpu)]
    rows = spark.read.parquet(str(out / "windows")).count()
    parsed: DataFrame = read_records(spark, str(data)).cache()
    count = parsed.count()

    def transform_only() -> int:
        series = series_windows(parsed, args.window).persist()
        try:
            return int(group_metrics(series, args.window).count())
        finally:
            series.unpersist()

    results.append(timed("transformation alone (records cached)", transform_only, cpu))
    load = os.getloadavg()[0]
    print(f"\n{count:,} records, {size / 1e9:.2f} GB of JSON lines, {args.window:g} s windows -> {rows:,} rows")
    print(f"load average (1 min) at the end: {load:.1f}")
    print(f"| {'run':<42} | {'wall s':>7} | {'JVM cpu s':>9} | {'records/s':>10} |")
    print(f"|{'-' * 44}|{'-' * 8}:|{'-' * 10}:|{'-' * 11}:|")
    for label, seconds, cpu_s in results:
        print(f"| {label:<42} | {seconds:7.1f} | {cpu_s:9.1f} | {count / seconds:10,.0f} |")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
