"""A labelled histogram counted many amounts at a time (one update per answer or request, not one per message: the
proxy's first-delivery latency, the broker's ack latency), exported as prometheus_client's `Histogram` would be."""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate

from prometheus_client import Counter
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class BatchHistogram(Collector):
    """A labelled histogram that exports what prometheus_client's `Histogram` would after the same `observe`s, in
    the same order: a series from its first `observe` (even of no amounts) until its `remove`, its cumulative
    `_bucket`s, `_count`, `_sum` (the amounts added one by one, so the same float), and `_created` unless
    prometheus_client exports none — tests/unit/process/test_histogram.py::
    test_a_batch_histogram_exports_what_a_prometheus_histogram_does, and for each use
    tests/unit/proxy/test_delivery_metrics.py::test_the_latency_histogram_exports_what_a_prometheus_histogram_does,
    tests/unit/broker/test_ack_latency.py. One lock, taken once per `observe` of many amounts and by a scrape to
    copy the counts: a scrape (from another thread) sees each `observe` whole or not at all —
    tests/unit/proxy/test_delivery_metrics.py::test_a_scrape_sees_whole_answers_counted."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = [float(bound) for bound in buckets] + [math.inf]
        self._les = [floatToGoString(bound) for bound in self._bounds]  # type: ignore[no-untyped-call]
        self._series: dict[tuple[str, ...], Series] = {}
        self._lock = threading.Lock()
        # Whether prometheus_client exports `_created` series now (disable_created_metrics() turns them off for
        # the process): a metric of its own, in no registry, shows it by what it collects.
        self._created_probe = Counter(f"{name}_probe", documentation, registry=None)

    def observe(self, labels: tuple[str, ...], amounts: Iterable[float]) -> None:
        """Each amount counted in the first bucket whose bound is >= it, as `Histogram.observe` does."""
        bounds = self._bounds
        with self._lock:
            series = self._series.get(labels)
            if series is None:
                series = self._series[labels] = Series(len(bounds))
            counts = series.counts
            total = series.sum
            for amount in amounts:
                counts[bisect_left(bounds, amount)] += 1
                total += amount
            series.sum = total

    def remove(self, labels: tuple[str, ...]) -> None:
        """The series of these label values goes (as `Histogram.remove`); a later `observe` starts it anew, with
        a new `_created`. None to remove is no error."""
        with self._lock:
            self._series.pop(labels, None)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            series = [(labels, s.counts[:], s.sum, s.created) for labels, s in self._series.items()]
        created = any(
            sample.name.endswith("_created") for metric in self._created_probe.collect() for sample in metric.samples
        )
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for labels, counts, total, created_s in series:
            family.add_metric(labels, list(zip(self._les, map(float, accumulate(counts)), strict=True)), total)
            if created:
                family.samples.append(
                    Sample(f"{self._name}_created", dict(zip(self._labelnames, labels, strict=True)), created_s)
                )
        yield family


class Series:
    __slots__ = ("counts", "sum", "created")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets  # per bucket, not cumulative
        self.sum = 0.0
        self.created = time.time()
