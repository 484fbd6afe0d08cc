"""The one transformation both jobs share: export records -> per window and topic/group figures.

Two steps, so the same code runs in batch and in Structured Streaming:

1. `series_windows` (streaming-safe, one stateful aggregation): per tumbling window and series
   (process, metric, topic, group, queue, labels; for counters also the process run) the last gauge
   value and the counter increase. A counter's increase needs the last value of the previous window,
   so each counter record is also sent, as a "baseline" copy, into the next window; then increase =
   last - baseline within one run (a restarted process is a new run whose counters start at 0).
   Every aggregate is a max/min/max_by, so a duplicate record changes nothing, and records may
   arrive in any order (up to the watermark, in streaming).
2. `per_process` (plain batch, run on complete windows: the whole input in batch, each
   micro-batch of finalized windows in streaming): one aggregation per window, process, topic and
   group. From it, `windows_from`: per process the topic's max offsets against the group's consumer
   and pull offsets give the three lags; sums over processes, proxy ratios, rank of the most lagging
   groups; and `processes_from`: the same figures per process (which brokers exported each window,
   each broker's lag, each proxy's receives and broker calls), which the report needs for missing
   brokers, per-broker skew and the adaptive recommendation.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_metrics import names as N

# A series: one metric with one label set in one process; counters also per run (a restart starts at 0),
# gauges not (with a restart inside a window, the newest sample wins).
SERIES_KEYS = ("process", "metric", "topic", "group", "queue", "labels", "run")  # run: null for a gauge
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
# One row per window and process: topic and group null (the process exported in this window), a topic/group pair
# (a broker's figures for it), or a group alone (a proxy's figures for it). docs/SPARK.md "Output".
PROCESS_COLUMNS = (
    "window_start",
    "window_end",
    "process",
    "kind",
    "topic",
    "group",
    "consumer_lag",
    "exact_lag",
    "ready",
    "lag_seconds",
    "consumer_offset",
    "messages_in",
    "messages_out",
    "receives",
    "notify_runs",
    "lost_races",
    "broker_calls",
    "date",
)


def clean(records: DataFrame) -> DataFrame:
    """The records the job uses: known schema version, well-formed, complete, times in range, and a metric the
    figures need."""
    valid = (
        (F.col("v") == N.SCHEMA_VERSION)
        & F.col("_corrupt_record").isNull()
        & F.col("time").between(N.MIN_TIME_S, N.MAX_TIME_S)
        & (F.col("started").isNull() | F.col("started").between(N.MIN_TIME_S, N.MAX_TIME_S))
        & F.col("process").isNotNull()
        & F.col("value").isNotNull()
        & F.col("type").isin("gauge", "counter")
        & F.col("metric").isin(*N.USED)
    )
    counter = F.col("type") == "counter"
    return records.where(valid).select(
        "time",
        *(c for c in SERIES_KEYS if c not in ("labels", "run")),
        "type",
        # sorted entries: a cheap, order-proof grouping key for the label set
        F.array_sort(F.map_entries("labels")).alias("labels"),
        F.when(counter, F.coalesce("started", F.lit(0.0))).alias("run"),
        "value",
        # a new counter series' value-0 record at the previous snapshot (METRICS.md §3): a starting point only
        (counter & F.coalesce(F.col("initial"), F.lit(False))).alias("initial"),
    )


def series_windows(records: DataFrame, window_s: float, *, lateness_s: float | None = None) -> DataFrame:
    """Step 1: the last value (gauges) and the increase (counters) of every series in every window.

    ``lateness_s`` sets the watermark (streaming): a record less than that behind the newest record's
    time still counts; older ones are dropped.
    """
    copies = F.when(F.col("type") == "counter", F.array(F.lit(False), F.lit(True))).otherwise(F.array(F.lit(False)))
    r = clean(records).withColumn("baseline", F.explode(copies))
    r = r.withColumn("t", F.timestamp_seconds(F.col("time") + F.when(F.col("baseline"), window_s).otherwise(0.0)))
    if lateness_s is not None:
        # The watermark follows the newest `t`, and a baseline copy's `t` is its record's time + one window:
        # the delay must cover that window too, or a record would be dropped up to `window_s` early.
        delay_ms = int((lateness_s + window_s) * 1000)
        r = r.withWatermark("t", f"{delay_ms} milliseconds")
    own = ~F.col("baseline")
    sample = own & ~F.col("initial")

    def mine(name: str, records: Column = own) -> Column:
        return F.when(records, F.col(name))

    agg = r.groupBy(F.window("t", f"{int(window_s * 1000)} milliseconds"), *SERIES_KEYS).agg(
        # null: no snapshot of the series fell here, only a baseline copy or its value-0 record, which
        # are the starting point of a later window's increase and never make a series-window (a row) alone
        F.max_by(mine("value", sample), mine("time", sample)).alias("value"),
        F.min_by(mine("value"), mine("time")).alias("first"),  # the value-0 record, if here, is the first
        # The previous window's last value (not its largest: the counter may have been reset within it).
        F.max_by(F.when(F.col("baseline"), F.col("value")), F.when(F.col("baseline"), F.col("time"))).alias("base"),
        F.max(own & F.col("initial")).alias("restart"),  # a value-0 record here: the series (re)started at 0
    )
    start_s = F.unix_micros(F.col("window.start")) / 1e6
    last, first, base = F.col("value"), F.col("first"), F.col("base")
    fresh = F.col("run") >= start_s - window_s  # the run began after the previous window did
    increase = (
        F.when(F.col("run").isNull(), F.lit(None))  # a gauge
        .when(F.col("restart") | (base.isNull() & fresh), last)
        .when(base.isNull() & (last >= first), last - first)
        .when(base.isNull(), last)  # reset within its first window: counted from 0
        .when(last >= base, last - base)
        .otherwise(last)  # it went down within one run: a reset, counted from 0 (as Prometheus does)
    )
    return agg.where(last.isNotNull()).select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        *SERIES_KEYS,
        "value",
        increase.alias("increase"),
    )


def _sum_if(cond: Column, col: str = "increase") -> Column:
    return F.sum(F.when(cond, F.col(col)))


def per_process(series: DataFrame) -> DataFrame:
    """One pass over the series: every figure per window, process, topic and group (either may be null).

    Rows with a topic and no group carry the topic's figures (max offsets, messages in); rows with a
    group and no topic the proxies' and the DLQ's; rows with both the group's on that topic.
    """
    m, gauge = F.col("metric"), F.col("value")
    lbl = F.map_from_entries("labels")
    receives = m == N.RECEIVES
    notify_pops, lost = m == N.NOTIFY_POPS, lbl[N.KIND_LABEL] == N.LOST_KIND
    return series.groupBy(*WINDOW_KEYS, "process", "topic", "group").agg(
        F.max(F.when(m.startswith("popgate_broker_"), "broker").otherwise("proxy")).alias("kind"),
        _sum_if(m == N.MAX_OFFSET, "value").alias("max_sum"),
        _sum_if(m == N.CONSUMER_OFFSET, "value").alias("consumer_sum"),
        _sum_if(m == N.PULL_OFFSET, "value").alias("pull_sum"),
        _sum_if(m == N.LAG_MESSAGES, "value").alias("exact_lag"),
        _sum_if(m == N.READY, "value").alias("ready"),
        F.max(F.when(m == N.OLDEST_AGE, gauge)).alias("lag_seconds"),
        _sum_if(m == N.DLQ_MESSAGES, "value").alias("dlq_messages"),
        _sum_if(m == N.MESSAGES_IN).alias("messages_in"),
        _sum_if(m == N.MESSAGES_OUT).alias("messages_out"),
        _sum_if(m == N.DEAD_LETTERED).alias("dlq_growth"),
        _sum_if(receives).alias("receives"),
        _sum_if(m == N.FIRST_POP_HITS).alias("first_pop_hits"),
        _sum_if(m == N.LONG_POLLING).alias("long_polling_receives"),
        _sum_if(m == N.NOTIFY_RUNS).alias("notify_runs"),
        _sum_if(receives & (lbl[N.OUTCOME_LABEL] == N.EMPTY_OUTCOME)).alias("empty_responses"),
        _sum_if(receives & lbl[N.OUTCOME_LABEL].isin(*N.REFUSED_OUTCOMES)).alias("refused"),
        _sum_if(notify_pops & ~lost).alias("notify_pops"),  # a lost Pop is one of the consume Pops
        _sum_if(notify_pops & lost).alias("lost_races"),
        _sum_if(m == N.NOTIFICATIONS).alias("notifications"),
        _sum_if(m == N.LONG_POLLS_MOVED).alias("moved"),
    )


def _broker_groups(pp: DataFrame) -> DataFrame:
    """The three lags per topic/group: per process, the topic's summed max offsets against the group's
    summed consumer and pull offsets (a broker exports them summed over the topic's queues, or per queue:
    tests/spark/test_transform.py::test_offsets_summed_per_group_give_the_same_figures_as_per_queue)."""
    topic_level = pp.where(F.col("group").isNull() & F.col("topic").isNotNull())
    per_topic = topic_level.select(*WINDOW_KEYS, "process", "topic", "max_sum")
    pairs = pp.where(F.col("group").isNotNull() & F.col("topic").isNotNull()).drop("max_sum", "messages_in")
    pull = F.coalesce("pull_sum", "consumer_sum")
    joined = pairs.join(per_topic, [*WINDOW_KEYS, "process", "topic"], "left")
    groups = joined.groupBy(*WINDOW_KEYS, "topic", "group").agg(
        F.sum(F.col("max_sum") - F.col("consumer_sum")).alias("consumer_lag"),
        F.sum(pull - F.col("consumer_sum")).alias("inflight"),
        F.sum(F.col("max_sum") - pull).alias("available"),
        F.sum("exact_lag").alias("exact_lag"),
        F.max("lag_seconds").alias("lag_seconds"),
        F.sum("messages_out").alias("messages_out"),
        F.sum("dlq_growth").alias("dlq_growth"),
    )
    topic_in = topic_level.groupBy(*WINDOW_KEYS, "topic").agg(F.sum("messages_in").alias("messages_in"))
    return groups.join(topic_in, [*WINDOW_KEYS, "topic"], "left")


_KINDS = ("first_pop_hits", "long_polling_receives", "notify_runs", "empty_responses")  # kinds of receive


def _group_level(pp: DataFrame) -> DataFrame:
    """Per group, from rows with no topic: the proxies' polling counts and the DLQ size."""
    agg = (
        pp.where(F.col("topic").isNull() & F.col("group").isNotNull())
        .groupBy(*WINDOW_KEYS, "group")
        .agg(*(F.sum(c).alias(c) for c in ("receives", *_KINDS, "dlq_messages")))
    )
    # A group with receives but no series for a kind of receive (it never had one: a series appears at its
    # first count, e.g. no notify run ever in the longpoll mode) had 0 of them, not "no value", so its rates
    # are 0, not undefined.
    zero = F.when(F.col("receives").isNotNull(), F.lit(0.0))
    return agg.select(
        *WINDOW_KEYS,
        "group",
        "receives",
        *(F.coalesce(c, zero).alias(c) for c in _KINDS),
        "dlq_messages",
    )


def _ratio(num: str, den: str) -> Column:
    return F.when(F.col(den) > 0, F.col(num) / F.col(den))


def group_metrics(series: DataFrame, window_s: float) -> DataFrame:
    """Step 2: per window and topic/group, every figure of docs/METRICS.md ("Job output")."""
    return windows_from(per_process(series), window_s)


def windows_from(pp: DataFrame, window_s: float) -> DataFrame:
    """Step 2 from `per_process`: the windows output (transform.OUTPUT_COLUMNS).

    A group's figures that know no topic (the proxies' counts, the DLQ size) are on one row of their own,
    topic "", never repeated on each of the group's topics: a sum over rows is a true total.
    """
    group_level = _group_level(pp).withColumn("topic", F.lit(""))
    out = _broker_groups(pp).unionByName(group_level, allowMissingColumns=True)
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


def _coalesce0(name: str) -> Column:
    return F.coalesce(F.col(name), F.lit(0.0))


def processes_from(pp: DataFrame) -> DataFrame:
    """Step 2 from `per_process`: the per-process output (transform.PROCESS_COLUMNS).

    Every process that exported a figure in a window has a presence row (topic and group null), so a broker
    absent from a window is one with no such row —
    tests/spark/test_history.py::test_per_process_rows_say_which_broker_exported_each_window.
    A broker's pair rows carry its own lag (its topic's max offsets against the group's consumer offsets on that
    broker); a proxy's group rows its receives and the broker calls they made: every notify Pop and Notification,
    one Pop per receive not served by pop with notify (less those refused before any strategy ran), one more per
    long poll moved.
    """
    topics = pp.where(F.col("group").isNull() & F.col("topic").isNotNull())
    topics = topics.select(*WINDOW_KEYS, "process", "topic", "max_sum", "messages_in")
    pairs = pp.where(F.col("group").isNotNull() & F.col("topic").isNotNull()).drop("max_sum", "messages_in")
    pairs = pairs.join(topics, [*WINDOW_KEYS, "process", "topic"], "left").select(
        *WINDOW_KEYS,
        "process",
        "kind",
        "topic",
        "group",
        (F.col("max_sum") - F.col("consumer_sum")).alias("consumer_lag"),
        "exact_lag",
        "ready",
        "lag_seconds",
        F.col("consumer_sum").alias("consumer_offset"),
        "messages_in",
        "messages_out",
    )
    calls = (
        _coalesce0("notify_pops")
        + _coalesce0("notifications")
        + F.greatest(F.col("receives") - _coalesce0("notify_runs") - _coalesce0("refused"), F.lit(0.0))
        + _coalesce0("moved")
    )
    proxies = pp.where(F.col("topic").isNull() & F.col("group").isNotNull() & (F.col("kind") == "proxy")).select(
        *WINDOW_KEYS,
        "process",
        "kind",
        "topic",
        "group",
        "receives",
        _coalesce0("notify_runs").alias("notify_runs"),
        _coalesce0("lost_races").alias("lost_races"),
        F.when(F.col("receives").isNotNull(), calls).alias("broker_calls"),
    )
    present = pp.groupBy(*WINDOW_KEYS, "process").agg(F.max("kind").alias("kind"))
    out = pairs.unionByName(proxies, allowMissingColumns=True).unionByName(present, allowMissingColumns=True)
    return out.withColumn("date", F.to_date("window_start")).select(*PROCESS_COLUMNS)


def aggregate(records: DataFrame, window_s: float) -> DataFrame:
    """The batch form: both steps over a static set of records."""
    return group_metrics(series_windows(records, window_s), window_s)
