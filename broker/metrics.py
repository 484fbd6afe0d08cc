"""The broker's Prometheus metrics: live gauges read from the core at scrape time, plus histograms."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from broker.core import BrokerCore
from broker.longpoll import Kind
from popgate_contract.lag import lag_seconds
from popgate_contract.validation import DLQ_PREFIX, DLQ_RESEND_GROUP
from popgate_process.certs import CertificateMetrics
from popgate_process.histogram import BatchHistogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Stored -> acked spans consumer processing and queueing: seconds to hours.
ACK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
MAX_LATENCY_PAIRS = 1000  # (topic, group) pairs with their own ack latency series; the others share OTHER
OTHER = "_other"
STORE_READ_EVERY_S = 5.0  # the data directory's size and its disk's room are read at most this often


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tls = CertificateMetrics(self.registry, "broker")
        self.rpc_duration = Histogram(
            "popgate_broker_rpc_duration_seconds",
            "Broker RPC latency by method and gRPC status code",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.commit_duration = Histogram(
            "popgate_broker_store_commit_duration_seconds",
            "Time to apply and commit one group-commit transaction",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

        self.lateness = Histogram(
            "popgate_broker_scheduled_lateness_seconds",
            "How late scheduled messages became visible after their due time",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300),
            registry=self.registry,
        )

        # Exported as a prometheus_client Histogram of these names, labels and buckets would be, counted one
        # update per Ack and topic (popgate_process.histogram) — tests/unit/broker/test_ack_latency.py.
        self.ack_latency = BatchHistogram(
            "popgate_broker_ack_latency_seconds",
            f"Time from a message's store to its ack, per topic and group (beyond {MAX_LATENCY_PAIRS} pairs: "
            f"topic and group {OTHER})",
            ("topic", "group"),
            ACK_BUCKETS,
        )
        self.registry.register(self.ack_latency)
        self._latency_pairs: set[tuple[str, str]] = set()
        self.store: StoreReadings | None = None  # made by `watch`

    def acked(self, topic: str, group: str, seconds: Sequence[float]) -> None:
        """Acks of the group on the topic, `seconds` after each one's message was stored, counted at once (a
        scrape sees all or none of them) — tests/unit/broker/test_metrics.py. The core calls it with at least
        one."""
        pair = (topic, group)
        if pair not in self._latency_pairs:
            if len(self._latency_pairs) >= MAX_LATENCY_PAIRS:
                pair = (OTHER, OTHER)
            else:
                self._latency_pairs.add(pair)
        self.ack_latency.observe(pair, seconds)

    def forget(self, topic: str, group: str) -> None:
        """The broker forgot the group's state on the topic (deleted, broker.admin): its ack latency series go,
        and its place among the MAX_LATENCY_PAIRS — tests/unit/broker/test_metrics.py::
        test_a_deleted_group_or_topic_loses_its_ack_latency_series."""
        if (topic, group) in self._latency_pairs:
            self._latency_pairs.discard((topic, group))
            self.ack_latency.remove((topic, group))

    def watch(self, core: BrokerCore) -> None:
        core.sends.on_lateness = self.lateness.observe
        core.on_acked = self.acked
        core.on_forgotten = self.forget
        self.store = StoreReadings(core.settings.data_dir)
        self.registry.register(_CoreCollector(core, self.store))


class StoreFigures(NamedTuple):
    size: int  # bytes of the data directory's files
    free: int  # bytes free for the broker on their file system
    total: int  # that file system's size


def read_store(data_dir: Path) -> StoreFigures | None:
    """A few stat calls (blocking); None when the directory went away under a running broker."""
    try:
        with os.scandir(data_dir) as entries:
            size = sum(e.stat().st_size for e in entries if e.is_file(follow_symlinks=False))
        disk = os.statvfs(data_dir)
    except OSError:
        return None
    return StoreFigures(size, disk.f_bavail * disk.f_frsize, disk.f_blocks * disk.f_frsize)


class StoreReadings:
    """The data directory's figures, read off the event loop: a scrape gets the last reading and, when it is older
    than `every_s`, starts the next one on a worker thread (one at a time), so a stalled disk holds that thread,
    never the broker — tests/unit/broker/test_metrics.py::test_the_store_figures_are_read_off_the_event_loop.
    The first reading is made at start, before the broker serves."""

    def __init__(self, data_dir: Path, every_s: float = STORE_READ_EVERY_S) -> None:
        self.data_dir = data_dir
        self.every_s = every_s
        self.last = read_store(data_dir)
        self._read_at = time.monotonic()
        self._reading: asyncio.Future[StoreFigures | None] | None = None

    def get(self) -> StoreFigures | None:
        if self._reading is None and time.monotonic() - self._read_at >= self.every_s:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a scrape outside the broker's loop (a test): read here
                self.last, self._read_at = read_store(self.data_dir), time.monotonic()
                return self.last
            self._reading = loop.run_in_executor(None, read_store, self.data_dir)
            self._reading.add_done_callback(self._read)
        return self.last

    def _read(self, reading: asyncio.Future[StoreFigures | None]) -> None:
        self._reading = None
        self._read_at = time.monotonic()
        if not reading.cancelled():
            self.last = None if reading.exception() is not None else reading.result()


class _CoreCollector(Collector):
    def __init__(self, core: BrokerCore, store: StoreReadings) -> None:
        self.core = core
        self.store = store

    def collect(self) -> Iterator[Metric]:
        core = self.core
        tq = ["topic", "queue"]
        tg = ["topic", "group"]
        max_offset = GaugeMetricFamily("popgate_broker_max_offset", "Next offset of each queue", labels=tq)
        min_offset = GaugeMetricFamily(
            "popgate_broker_min_offset", "First offset each queue keeps (retention deletes below)", labels=tq
        )
        for topic in core.topics.values():
            for q in topic.queues:
                max_offset.add_metric([topic.name, str(q.queue_id)], q.max_offset)
                min_offset.add_metric([topic.name, str(q.queue_id)], q.min_offset)
        (consumer, pull, lag, ready, inflight, age), totals = _lag_metrics(core)
        dlq, dlq_stored = _dlq_metrics(core, totals)
        dead = CounterMetricFamily("popgate_broker_dead_lettered", "Messages moved to a DLQ", labels=tg)
        filtered = CounterMetricFamily(
            "popgate_broker_filtered_redeliveries",
            "Redeliveries acked, not delivered: the Pop's filter does not take their tag",
            labels=tg,
        )
        for (group, topic_name), state in core.groups.items():
            dead.add_metric([topic_name, group], state.dead_lettered)
            filtered.add_metric([topic_name, group], state.filtered)
        held = GaugeMetricFamily("popgate_broker_held_requests", "Long polls held now", labels=["kind"])
        held.add_metric(["pop"], core.hold.held[Kind.POP])
        held.add_metric(["notification"], core.hold.held[Kind.NOTIFICATION])
        msg_in = CounterMetricFamily("popgate_broker_messages_in", "Messages stored", labels=["topic"])
        for topic_name, count in core.messages_in.items():
            msg_in.add_metric([topic_name], count)
        msg_out = CounterMetricFamily("popgate_broker_messages_out", "Messages delivered (pops)", labels=tg)
        for (topic_name, group), count in core.messages_out.items():
            msg_out.add_metric([topic_name, group], count)
        yield from _flow_metrics(core)
        retained = CounterMetricFamily(
            "popgate_broker_retention_deleted_messages",
            "Messages deleted by retention (older than --retention-s), consumed or not",
            labels=["topic"],
        )
        for topic_name, count in core.retention.deleted.items():
            retained.add_metric([topic_name], count)
        yield from (max_offset, consumer, pull, lag, ready, inflight, age, dlq, dlq_stored, dead, held, msg_in, msg_out)
        yield filtered
        yield min_offset
        yield retained
        yield from _schedule_metrics(core)
        yield from _store_metrics(self.store.get())


def _lag_metrics(core: BrokerCore) -> tuple[tuple[Metric, ...], dict[tuple[str, str], int]]:
    """The consumer and pull offsets, lag, ready, in-flight and oldest age of each (topic, group), and its lag.

    The offsets are one series per (topic, group) summed over its queues unless --metrics-queue-offsets: /metrics
    grows with pairs, not pairs × queues, and a sum over queues reads the same either way
    (tests/unit/broker/test_metrics.py::test_offsets_are_one_series_per_topic_and_group_unless_queue_offsets_are_asked_for).
    """
    tg = ["topic", "group"]
    per_queue = core.settings.metrics_queue_offsets
    offset_labels = [*tg, "queue"] if per_queue else tg
    consumer = GaugeMetricFamily("popgate_broker_consumer_offset", "All below is acked", labels=offset_labels)
    pull = GaugeMetricFamily("popgate_broker_pull_offset", "Next message never popped", labels=offset_labels)
    lag = GaugeMetricFamily("popgate_broker_consumer_lag_messages", "Ready plus in-flight messages", labels=tg)
    ready = GaugeMetricFamily("popgate_broker_ready_messages", "Messages ready to pop (Available)", labels=tg)
    inflight = GaugeMetricFamily("popgate_broker_inflight_messages", "Popped, not acked", labels=tg)
    age = GaugeMetricFamily(
        "popgate_broker_oldest_unacked_age_seconds", "Age of the oldest un-acked message", labels=tg
    )
    totals: dict[tuple[str, str], list[int]] = {}
    now = core.clock.now_ms()
    for row in core.iter_lags():
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


def _dlq_metrics(core: BrokerCore, lags: dict[tuple[str, str], int]) -> tuple[Metric, Metric]:
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
    for name, log in core.topics.items():
        if name.startswith(DLQ_PREFIX):
            group = name[len(DLQ_PREFIX) :]
            count = sum(q.max_offset - q.min_offset for q in log.queues)
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


def _flow_metrics(core: BrokerCore) -> Iterator[Metric]:
    """What on-call asks beside lag: bytes stored, first deliveries (redeliveries apart) and acks."""
    tg = ["topic", "group"]
    bytes_in = CounterMetricFamily("popgate_broker_bytes_in", "Bytes stored (encoded messages)", labels=["topic"])
    for topic_name, count in core.bytes_in.items():
        bytes_in.add_metric([topic_name], count)
    first = CounterMetricFamily(
        "popgate_broker_messages_first_delivered", "Messages delivered for the first time (attempt 1)", labels=tg
    )
    for (topic_name, group), count in core.first_out.items():
        first.add_metric([topic_name, group], count)
    acked = CounterMetricFamily("popgate_broker_messages_acked", "Messages acked", labels=tg)
    for (topic_name, group), count in core.messages_acked.items():
        acked.add_metric([topic_name, group], count)
    yield from (bytes_in, first, acked)
