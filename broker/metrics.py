"""The broker's Prometheus metrics: live gauges read from the core at scrape time (broker.core_metrics), plus
histograms."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from prometheus_client import Histogram

from broker.core import BrokerCore
from broker.core_metrics import CoreCollector
from popgate_process.certs import CertificateMetrics
from popgate_process.histogram import BatchHistogram
from popgate_process.staged import StagedRegistry

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Stored -> acked spans consumer processing and queueing: seconds to hours.
ACK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
MAX_LATENCY_PAIRS = 1000  # (topic, group) pairs with their own ack latency series; the others share OTHER
OTHER = "_other"
STORE_READ_EVERY_S = 5.0  # the data directory's size and its disk's room are read at most this often


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = StagedRegistry()  # the core's figures read in slices (broker.core_metrics)
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
        self.registry.register(CoreCollector(core, self.store))


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
