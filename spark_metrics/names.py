"""What the job reads: the export record schema (docs/METRICS.md) and the metric names it knows.

The names are those ``broker/metrics.py`` and ``proxy/metrics.py`` export (tests/spark/test_names.py
checks them against the real collectors): one metric per figure.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

SCHEMA_VERSION = 1

RECORD_SCHEMA = StructType(
    [
        StructField("v", IntegerType()),
        StructField("time", DoubleType()),
        StructField("process", StringType()),
        StructField("kind", StringType()),
        StructField("started", DoubleType()),
        StructField("topic", StringType()),
        StructField("group", StringType()),
        StructField("queue", LongType()),
        StructField("metric", StringType()),
        StructField("type", StringType()),
        StructField("value", DoubleType()),
        StructField("labels", MapType(StringType(), StringType())),
        StructField("initial", BooleanType()),  # a new counter series' value-0 record (METRICS.md §3)
        # Spark's PERMISSIVE reader puts a line here when it is not JSON or a field does not fit its type
        # (the field is then null): such a record is skipped, not read as a series without that field.
        StructField("_corrupt_record", StringType()),
    ]
)

# Snapshot times the job accepts (epoch seconds): a writer's nanoseconds or garbage would otherwise make an
# out-of-range timestamp, an overflow error under Spark's ANSI mode that stops the job (and, replayed from a
# streaming checkpoint, every run after it).
MIN_TIME_S = 0.0
MAX_TIME_S = 4_102_444_800.0  # 2100-01-01

# Broker gauges
MAX_OFFSET = "popgate_broker_max_offset"
CONSUMER_OFFSET = "popgate_broker_consumer_offset"
PULL_OFFSET = "popgate_broker_pull_offset"
LAG_MESSAGES = "popgate_broker_consumer_lag_messages"
READY = "popgate_broker_ready_messages"
OLDEST_AGE = "popgate_broker_oldest_unacked_age_seconds"
DLQ_MESSAGES = "popgate_broker_dlq_messages"
# Broker counters
MESSAGES_IN = "popgate_broker_messages_in_total"
MESSAGES_OUT = "popgate_broker_messages_out_total"
DEAD_LETTERED = "popgate_broker_dead_lettered_total"
# Proxy counters, each with a group label
RECEIVES = "popgate_proxy_receives_total"  # labels mode, outcome
FIRST_POP_HITS = "popgate_proxy_receive_first_pop_hits_total"
LONG_POLLING = "popgate_proxy_long_polling_receives_total"
NOTIFY_RUNS = "popgate_proxy_notify_runs_total"
NOTIFY_POPS = "popgate_proxy_notify_pops_total"  # label kind; a "lost" Pop is also counted as a "consume" one
NOTIFICATIONS = "popgate_proxy_notifications_total"  # label outcome: every Notification sent, answered or not
LONG_POLLS_MOVED = "popgate_proxy_long_polls_moved_total"  # each move is one more Pop
# An empty response is a receive with this outcome
OUTCOME_LABEL = "outcome"
EMPTY_OUTCOME = "empty"
# Receives refused before a strategy ran (docs/METRICS.md §4): they made no broker call
REFUSED_OUTCOMES = ("behind", "illegal_polling_time")
KIND_LABEL = "kind"
LOST_KIND = "lost"

# Every metric a figure uses; the job drops the rest before aggregating.
USED = (
    MAX_OFFSET,
    CONSUMER_OFFSET,
    PULL_OFFSET,
    LAG_MESSAGES,
    READY,
    OLDEST_AGE,
    DLQ_MESSAGES,
    MESSAGES_IN,
    MESSAGES_OUT,
    DEAD_LETTERED,
    RECEIVES,
    FIRST_POP_HITS,
    LONG_POLLING,
    NOTIFY_RUNS,
    NOTIFY_POPS,
    NOTIFICATIONS,
    LONG_POLLS_MOVED,
)
