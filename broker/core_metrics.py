"""The broker core's figures on /metrics and in the export, collected in two stages (popgate_process.staged).

`CoreCollector.read` works out each (group, topic, queue)'s lag on the event loop, `LAGS_PER_SLICE` per loop turn
(RPCs are served between slices), then copies the counters and offsets in one go; `build` makes the families of
that `CoreReading` on a worker thread. A reading's pairs are each whole, read a few loop turns apart at most —
tests/unit/broker/test_metrics_slices.py.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from broker.core import BrokerCore
from broker.longpoll import Kind
from broker.model import GroupQueueLag
from popgate_contract.lag import lag_seconds
from popgate_contract.validation import DLQ_PREFIX, DLQ_RESEND_GROUP
from popgate_process.staged import StagedCollector

if TYPE_CHECKING:
    from broker.metrics import StoreFigures, StoreReadings

LAGS_PER_SLICE = 1000  # queue lags worked out per loop turn

Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class CoreReading:
    """Copies of the core's figures: nothing in it is shared with the live state."""

    now_ms: int
    per_queue: bool  # --metrics-queue-offsets
    queues: list[tuple[str, int, int, int]]  # topic, queue id, max offset, min offset
    lags: list[GroupQueueLag]
    dlq: list[tuple[str, int]]  # a %DLQ% topic and the messages it stores
    groups: list[tuple[str, str, int, int]]  # topic, group, dead-lettered, filtered redeliveries
    held: tuple[int, int]  # Pops, Notifications
    messages_in: dict[str, int]
    bytes_in: dict[str, int]
    retained: dict[str, int]
    messages_out: dict[Pair, int]
    first_out: dict[Pair, int]
    acked: dict[Pair, int]
    small: list[Metric]  # a few single values (schedule, store), made on the loop


class CoreCollector(StagedCollector):
    def __init__(self, core: BrokerCore, store: StoreReadings) -> None:
        self.core = core
        self.store = store

    def read(self) -> Generator[None, None, CoreReading]:
        core = self.core
        lags: list[GroupQueueLag] = []
        for row in core.iter_lags():
            lags.append(row)
            if len(lags) % LAGS_PER_SLICE == 0:
                yield
        return CoreReading(
            core.clock.now_ms(),  # after the lags: no un-acked message is younger than it
            core.settings.metrics_queue_offsets,
            [(t.name, q.queue_id, q.max_offset, q.min_offset) for t in core.topics.values() for q in t.queues],
            lags,
            [
                (name, sum(q.max_offset - q.min_offset for q in log.queues))
                for name, log in core.topics.items()
                if name.startswith(DLQ_PREFIX)
            ],
            [(t, g, state.dead_lettered, state.filtered) for (g, t), state in core.groups.items()],
            (core.hold.held[Kind.POP], core.hold.held[Kind.NOTIFICATION]),
            dict(core.messages_in),
            dict(core.bytes_in),
            dict(core.retention.deleted),
            dict(core.messages_out),
            dict(core.first_out),
            dict(core.messages_acked),
            [*_schedule_metrics(core), *_store_metrics(self.store.get())],
        )

    def build(self, reading: CoreReading) -> list[Metric]:
        tq = ["topic", "queue"]
        max_offset = GaugeMetricFamily("popgate_broker_max_offset", "Next offset of each queue", labels=tq)
        min_offset = GaugeMetricFamily(
            "popgate_broker_min_offset", "First offset each queue keeps (retention deletes below)", labels=tq
        )
        for topic, queue_id, high, low in reading.queues:
            max_offset.add_metric([topic, str(queue_id)], high)
            min_offset.add_metric([topic, str(queue_id)], low)
        (consumer, pull, lag, ready, inflight, age), totals = _lag_metrics(reading)
        dlq, dlq_stored = _dlq_metrics(reading.dlq, totals)
        dead, filtered, held, msg_in, msg_out, retained = _count_metrics(reading)
        return [
            *_flow_metrics(reading),
            *(max_offset, consumer, pull, lag, ready, inflight, age, dlq, dlq_stored, dead, held, msg_in, msg_out),
            *(filtered, min_offset, retained),
            *reading.small,
        ]


def _count_metrics(reading: CoreReading) -> tuple[Metric, ...]:
    tg = ["topic", "group"]
    dead = CounterMetricFamily("popgate_broker_dead_lettered", "Messages moved to a DLQ", labels=tg)
    filtered = CounterMetricFamily(
        "popgate_broker_filtered_redeliveries",
        "Redeliveries acked, not delivered: the Pop's filter does not take their tag",
        labels=tg,
    )
    for topic_name, group, dead_lettered, filtered_out in reading.groups:
        dead.add_metric([topic_name, group], dead_lettered)
        filtered.add_metric([topic_name, group], filtered_out)
    held = GaugeMetricFamily("popgate_broker_held_requests", "Long polls held now", labels=["kind"])
    held.add_metric(["pop"], reading.held[0])
    held.add_metric(["notification"], reading.held[1])
    msg_in = CounterMetricFamily("popgate_broker_messages_in", "Messages stored", labels=["topic"])
    for topic_name, count in reading.messages_in.items():
        msg_in.add_metric([topic_name], count)
    msg_out = CounterMetricFamily("popgate_broker_messages_out", "Messages delivered (pops)", labels=tg)
    for (topic_name, group), count in reading.messages_out.items():
        msg_out.add_metric([topic_name, group], count)
    retained = CounterMetricFamily(
        "popgate_broker_retention_deleted_messages",
        "Messages deleted by retention (older than --retention-s), consumed or not",
        labels=["topic"],
    )
    for topic_name, count in reading.retained.items():
        retained.add_metric([topic_name], count)
    return dead, filtered, held, msg_in, msg_out, retained


def _lag_metrics(reading: CoreReading) -> tuple[tuple[Metric, ...], dict[Pair, int]]:
    """The consumer and pull offsets, lag, ready, in-flight and oldest age of each (topic, group), and its lag.

    The offsets are one series per (topic, group) summed over its queues unless --metrics-queue-offsets: /metrics
    grows with pairs, not pairs × queues, and a sum over queues reads the same either way
    (tests/unit/broker/test_metrics.py::test_offsets_are_one_series_per_topic_and_group_unless_queue_offsets_are_asked_for).
    """
    tg = ["topic", "group"]
    per_queue = reading.per_queue
    offset_labels = [*tg, "queue"] if per_queue else tg
    consumer = GaugeMetricFamily("popgate_broker_consumer_offset", "All below is acked", labels=offset_labels)
    pull = GaugeMetricFamily("popgate_broker_pull_offset", "Next message never popped", labels=offset_labels)
    lag = GaugeMetricFamily("popgate_broker_consumer_lag_messages", "Ready plus in-flight messages", labels=tg)
    ready = GaugeMetricFamily("popgate_broker_ready_messages", "Messages ready to pop (Available)", labels=tg)
    inflight = GaugeMetricFamily("popgate_broker_inflight_messages", "Popped, not acked", labels=tg)
    age = GaugeMetricFamily(
        "popgate_broker_oldest_unacked_age_seconds", "Age of the oldest un-acked message", labels=tg
    )
    totals: dict[Pair, list[int]] = {}
    now = reading.now_ms
    for row in reading.lags:
        if per_queue:
            labels = [row.topic, row.group, str(row.queue_id)]
            consumer.add_metric(labels, row.lag.consumer_offset)
            pull.add_metric(labels, row.lag.pull_offset)
        t = totals.setdefault((row.topic, row.group), [0, 0, 0, 0, 0, 0])
        t[0] += row.lag.lag
        t[1] += row.lag.ready
        t[2] += row.lag.inflight
        if row.lag.oldest_unacked_store_ms:
            t[3] = min(t[3] or now, row.lag.oldest_unacked_store_ms)
        t[4] += row.lag.consumer_offset
        t[5] += row.lag.pull_offset
    for (topic_name, group), (lg, rd, inf, oldest, consumed, pulled) in totals.items():
        labels = [topic_name, group]
        if not per_queue:
            consumer.add_metric(labels, consumed)
            pull.add_metric(labels, pulled)
        lag.add_metric(labels, lg)
        ready.add_metric(labels, rd)
        inflight.add_metric(labels, inf)
        age.add_metric(labels, lag_seconds(oldest, now))
    return (consumer, pull, lag, ready, inflight, age), {pair: t[0] for pair, t in totals.items()}


def _dlq_metrics(dlq: list[tuple[str, int]], lags: dict[Pair, int]) -> tuple[Metric, Metric]:
    """Per %DLQ%<group>: the dead letters not yet re-sent, and all it stores (retention deletes them as any message).

    Not yet re-sent = the backlog (ready + in flight) of `popgate dlq resend`'s group on the DLQ once that
    group has read it, else every stored letter: `lags` holds (topic, group) -> lag of the groups with state.
    """
    pending = GaugeMetricFamily(
        "popgate_broker_dlq_messages",
        f"Dead letters in each %DLQ% topic not yet re-sent by `popgate dlq resend` (group {DLQ_RESEND_GROUP})",
        labels=["group"],
    )
    stored = GaugeMetricFamily(
        "popgate_broker_dlq_stored_messages", "Messages stored in each %DLQ% topic, re-sent or not", labels=["group"]
    )
    for name, count in dlq:
        group = name[len(DLQ_PREFIX) :]
        pending.add_metric([group], lags.get((name, DLQ_RESEND_GROUP), count))
        stored.add_metric([group], count)
    return pending, stored


def _schedule_metrics(core: BrokerCore) -> Iterator[Metric]:
    scheduler = core.scheduler
    stats = core.transactions.stats
    yield GaugeMetricFamily(
        "popgate_broker_half_messages",
        "Half messages waiting for their transaction's resolution",
        value=len(core.transactions.schedule),
    )
    resolved = CounterMetricFamily(
        "popgate_broker_transactions_resolved", "Half messages resolved, by outcome", labels=["outcome"]
    )
    resolved.add_metric(["committed"], stats.committed)
    resolved.add_metric(["rolled_back"], stats.rolled_back)
    resolved.add_metric(["expired"], stats.expired)  # rolled back by the broker after the last check
    yield resolved
    yield CounterMetricFamily(
        "popgate_broker_transaction_checks", "Checks of half messages handed to proxies", value=stats.checks
    )
    yield GaugeMetricFamily(
        "popgate_broker_scheduled_messages", "Messages waiting for their delivery time", value=len(core.schedule)
    )
    yield GaugeMetricFamily(
        "popgate_broker_scheduled_due_pending",
        "Scheduled messages due but not yet delivered",
        value=scheduler.due_pending(),
    )
    yield CounterMetricFamily(
        "popgate_broker_scheduled_delivery_retries",
        "Failed scheduled deliveries retried",
        value=scheduler.stats.retries,
    )
    yield CounterMetricFamily(
        "popgate_broker_scheduled_blocked_seconds",
        "Time scheduled delivery spent blocked on a failing batch",
        value=scheduler.stats.blocked_s,
    )


def _store_metrics(figures: StoreFigures | None) -> Iterator[Metric]:
    """The data directory's files and the room left on their file system (`StoreReadings`)."""
    if figures is None:  # the directory went away under a running broker: no value rather than a wrong one
        return
    yield GaugeMetricFamily(
        "popgate_broker_store_size_bytes",
        "Bytes of the files in the broker's data directory (store and WAL)",
        value=figures.size,
    )
    yield GaugeMetricFamily(
        "popgate_broker_disk_free_bytes",
        "Bytes free for the broker on the file system of its data directory",
        value=figures.free,
    )
    yield GaugeMetricFamily(
        "popgate_broker_disk_size_bytes",
        "Size of the file system of the broker's data directory",
        value=figures.total,
    )


def _flow_metrics(reading: CoreReading) -> Iterator[Metric]:
    """What on-call asks beside lag: bytes stored, first deliveries (redeliveries apart) and acks."""
    tg = ["topic", "group"]
    bytes_in = CounterMetricFamily("popgate_broker_bytes_in", "Bytes stored (encoded messages)", labels=["topic"])
    for topic_name, count in reading.bytes_in.items():
        bytes_in.add_metric([topic_name], count)
    first = CounterMetricFamily(
        "popgate_broker_messages_first_delivered", "Messages delivered for the first time (attempt 1)", labels=tg
    )
    for (topic_name, group), count in reading.first_out.items():
        first.add_metric([topic_name, group], count)
    acked = CounterMetricFamily("popgate_broker_messages_acked", "Messages acked", labels=tg)
    for (topic_name, group), count in reading.acked.items():
        acked.add_metric([topic_name, group], count)
    yield from (bytes_in, first, acked)
