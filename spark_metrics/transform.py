"""The one transformation both jobs share: export records -> per window and topic/group figures.

Two steps, so the same code runs in batch and in Structured Streaming:

1. `series_windows` (streaming-safe, one stateful aggregation): per tumbling window and series
   (process incarnation, metric, topic, group, queue, labels) the last gauge value and the counter
   increase. A counter's increase needs the last value of the previous window, so each counter
   record is also sent, as a "baseline" copy, into the next window; then increase = last - baseline
   within one incarnation (a restarted process is a new incarnation whose counters start at 0).
   Every aggregate is a max/min/max_by, so a duplicate record changes nothing, and records may
   arrive in any order (up to the watermark, in streaming).
2. `group_metrics` (plain batch, run on complete windows: the whole input in batch, each
   micro-batch of finalized windows in streaming): offsets joined per queue into the three lags,
   sums over queues and processes, proxy ratios, rank of the most lagging groups.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType

from spark_metrics import names as N

SERIES_KEYS = ("process", "kind", "started", "metric", "type", "topic", "group", "queue", "labels")
WINDOW_KEYS = ("window_start", "window_end")
OUTPUT_COLUMNS = (
    "window_start",
    "window_end",
    "topic",
    "group",
    "consumer_lag",
    "inflight",
    "available",
    "exact_lag",
    "lag_seconds",
    "messages_in",
    "messages_out",
    "in_rate",
    "out_rate",
    "dlq_growth",
    "dlq_messages",
    "receives",
    "first_pop_hits",
    "long_polling_receives",
    "notify_runs",
    "empty_responses",
    "polling_hit_ratio",
    "notify_share",
    "empty_rate",
    "lag_rank",
    "date",
)


def clean(records: DataFrame) -> DataFrame:
    """Drop records a reader cannot use (wrong schema version, missing fields)."""
    valid = (
        (F.col("v") == N.SCHEMA_VERSION)
        & F.col("time").isNotNull()
        & F.col("process").isNotNull()
        & F.col("metric").isNotNull()
        & F.col("value").isNotNull()
        & F.col("type").isin("gauge", "counter")
    )
    return records.where(valid).select(
        "time",
        *(c for c in SERIES_KEYS if c not in ("labels", "started")),
        F.coalesce("started", F.lit(0.0)).alias("started"),
        F.coalesce("labels", F.lit("{}")).alias("labels"),
        "value",
    )


def series_windows(records: DataFrame, window_s: float, *, lateness_s: float | None = None) -> DataFrame:
    """Step 1: the last value (gauges) and the increase (counters) of every series in every window.

    ``lateness_s`` sets the watermark (streaming): records older than the newest minus that are dropped.
    """
    copies = F.when(F.col("type") == "counter", F.array(F.lit(False), F.lit(True))).otherwise(F.array(F.lit(False)))
    r = clean(records).withColumn("baseline", F.explode(copies))
    r = r.withColumn("t", F.timestamp_seconds(F.col("time") + F.when(F.col("baseline"), window_s).otherwise(0.0)))
    if lateness_s is not None:
        r = r.withWatermark("t", f"{int(lateness_s * 1000)} milliseconds")
    own = ~F.col("baseline")

    def mine(name: str) -> Column:
        return F.when(own, F.col(name))

    agg = r.groupBy(F.window("t", f"{int(window_s * 1000)} milliseconds"), *SERIES_KEYS).agg(
        F.max_by(mine("value"), mine("time")).alias("value"),
        F.max(mine("value")).alias("own_max"),
        F.min_by(mine("value"), mine("time")).alias("own_first"),
        F.max(F.when(F.col("baseline"), F.col("value"))).alias("base"),
        F.max(mine("time")).alias("last_time"),
    )
    start_s = F.unix_micros(F.col("window.start")) / 1e6
    fresh = F.col("started") >= start_s - window_s  # the incarnation began after the previous window did
    increase = (
        F.when(F.col("type") != "counter", F.lit(None))
        .when(F.col("base").isNull() & fresh, F.col("own_max"))
        .when(F.col("base").isNull(), F.col("own_max") - F.col("own_first"))
        .when(F.col("own_max") >= F.col("base"), F.col("own_max") - F.col("base"))
        .otherwise(F.col("own_max"))  # a reset inside one incarnation: counted from 0
    )
    return agg.where(F.col("last_time").isNotNull()).select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        *SERIES_KEYS,
        "value",
        increase.alias("increase"),
        "last_time",
    )


def _sum_if(cond: Column, col: str = "increase") -> Column:
    return F.sum(F.when(cond, F.col(col)))


def _gauges(series: DataFrame) -> DataFrame:
    """Gauges, one value per window and series: the newest incarnation's last value."""
    keys = (*WINDOW_KEYS, "process", "metric", "topic", "group", "queue", "labels")
    return series.where(F.col("type") == "gauge").groupBy(*keys).agg(F.max_by("value", "last_time").alias("value"))


def _offset_lags(gauges: DataFrame) -> DataFrame:
    """ConsumerLag, Inflight and Available from the per-queue offsets (RocketMQ's definitions)."""
    per_queue = (*WINDOW_KEYS, "process", "topic", "queue")

    def pick(metric: str, alias: str, *extra: str) -> DataFrame:
        return gauges.where(F.col("metric") == metric).select(*per_queue, *extra, F.col("value").alias(alias))

    q = (
        pick(N.CONSUMER_OFFSET, "consumer", "group")
        .join(pick(N.PULL_OFFSET, "pull", "group"), [*per_queue, "group"], "left")
        .join(pick(N.MAX_OFFSET, "max"), list(per_queue), "left")
    )
    pull = F.coalesce("pull", "consumer")
    return q.groupBy(*WINDOW_KEYS, "topic", "group").agg(
        F.sum(F.col("max") - F.col("consumer")).alias("consumer_lag"),
        F.sum(pull - F.col("consumer")).alias("inflight"),
        F.sum(F.col("max") - pull).alias("available"),
    )


def _broker_groups(series: DataFrame, gauges: DataFrame) -> DataFrame:
    m = F.col("metric")
    reported = (
        gauges.where(m.isin(N.LAG_MESSAGES, N.OLDEST_AGE))
        .groupBy(*WINDOW_KEYS, "topic", "group")
        .agg(
            _sum_if(m == N.LAG_MESSAGES, "value").alias("exact_lag"),
            F.max(F.when(m == N.OLDEST_AGE, F.col("value"))).alias("lag_seconds"),
        )
    )
    counted = (
        series.where(m.isin(N.MESSAGES_OUT, N.DEAD_LETTERED))
        .groupBy(*WINDOW_KEYS, "topic", "group")
        .agg(
            _sum_if(m == N.MESSAGES_OUT).alias("messages_out"),
            _sum_if(m == N.DEAD_LETTERED).alias("dlq_growth"),
        )
    )
    topic_in = (
        series.where(m == N.MESSAGES_IN).groupBy(*WINDOW_KEYS, "topic").agg(F.sum("increase").alias("messages_in"))
    )
    keys = [*WINDOW_KEYS, "topic", "group"]
    groups = _offset_lags(gauges).join(reported, keys, "full").join(counted, keys, "full")
    return groups.join(topic_in, [*WINDOW_KEYS, "topic"], "left")


def _proxy_groups(series: DataFrame) -> DataFrame:
    """Polling figures per group, from the proxies' counters (they carry no topic)."""
    m = F.col("metric")
    lbl = F.from_json("labels", MapType(StringType(), StringType()))
    receives = m == N.RECEIVES
    p = series.where((F.col("kind") == "proxy") & (F.col("type") == "counter")).withColumn("lbl", lbl)
    agg = p.groupBy(*WINDOW_KEYS, "group").agg(
        _sum_if(receives).alias("receives"),
        _sum_if(m.isin(*N.FIRST_POP_HITS)).alias("hits_m"),
        _sum_if(receives & (F.col("lbl")[N.SHORT_POLLING_HIT_LABEL] == "true")).alias("hits_l"),
        _sum_if(m.isin(*N.LONG_POLLING)).alias("long_m"),
        _sum_if(receives & (F.col("lbl")[N.LONG_POLLING_LABEL] == "true")).alias("long_l"),
        _sum_if(m.isin(*N.NOTIFY_RUNS)).alias("notify_runs"),
        _sum_if(m.isin(*N.EMPTY_RESPONSES)).alias("empty_m"),
        _sum_if(receives & (F.col("lbl")[N.OUTCOME_LABEL] == N.EMPTY_OUTCOME)).alias("empty_l"),
    )
    # A dedicated metric wins over the same figure read from a label, so nothing is counted twice.
    return agg.select(
        *WINDOW_KEYS,
        "group",
        "receives",
        F.coalesce("hits_m", "hits_l").alias("first_pop_hits"),
        F.coalesce("long_m", "long_l").alias("long_polling_receives"),
        "notify_runs",
        F.coalesce("empty_m", "empty_l").alias("empty_responses"),
    )


def _ratio(num: str, den: str) -> Column:
    return F.when(F.col(den) > 0, F.col(num) / F.col(den))


def group_metrics(series: DataFrame, window_s: float) -> DataFrame:
    """Step 2: per window and topic/group, every figure of docs/METRICS.md ("Job output")."""
    gauges = _gauges(series)
    dlq = (
        gauges.where(F.col("metric") == N.DLQ_MESSAGES)
        .groupBy(*WINDOW_KEYS, "group")
        .agg(F.sum("value").alias("dlq_messages"))
    )
    out = (
        _broker_groups(series, gauges)
        .join(_proxy_groups(series), [*WINDOW_KEYS, "group"], "full")
        .join(dlq, [*WINDOW_KEYS, "group"], "left")
        .where(F.col("group").isNotNull())
        .withColumn("topic", F.coalesce("topic", F.lit("")))
    )
    rank = Window.partitionBy("window_start").orderBy(F.col("consumer_lag").desc_nulls_last(), "topic", "group")
    out = out.select(
        "*",
        (F.col("messages_in") / window_s).alias("in_rate"),
        (F.col("messages_out") / window_s).alias("out_rate"),
        _ratio("first_pop_hits", "receives").alias("polling_hit_ratio"),
        _ratio("notify_runs", "receives").alias("notify_share"),
        _ratio("empty_responses", "receives").alias("empty_rate"),
        F.row_number().over(rank).alias("lag_rank"),
        F.to_date("window_start").alias("date"),
    )
    return out.select(*OUTPUT_COLUMNS)


def aggregate(records: DataFrame, window_s: float) -> DataFrame:
    """The batch form: both steps over a static set of records."""
    return group_metrics(series_windows(records, window_s), window_s)
