"""Collection in two stages, for a collector of a large live state (a broker's per-(topic, group) figures).

Collectors read live state without locks, so they are read on the event loop; a `StagedCollector` reads its state
one slice per loop turn (the loop serves RPCs between slices) and makes its families from that reading on a
worker thread. `gather` is what /metrics and the export both call: the loop is never held for a whole
collection of many pairs — tests/unit/broker/test_metrics_slices.py.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

Build = Callable[[], list[Metric]]


class Registry(Protocol):
    def collect(self) -> Iterable[Any]: ...


class StagedCollector(Collector, ABC):
    """`read` takes the live state on the loop, yielding between slices, and returns it; `build` makes families of
    that reading on any thread. `collect` does both at once (a caller that holds no loop: a test, a sync scrape)."""

    @abstractmethod
    def read(self) -> Generator[None, None, Any]: ...

    @abstractmethod
    def build(self, reading: Any) -> list[Metric]: ...

    def collect(self) -> Iterator[Metric]:
        steps = self.read()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return iter(self.build(done.value))


class StagedRegistry(CollectorRegistry):
    """A registry whose `StagedCollector`s `gather` reads in slices."""

    async def gather(self) -> Build:
        with self._lock:
            collectors = list(self._collector_to_names)
        parts: list[Build] = []
        for collector in collectors:
            if isinstance(collector, StagedCollector):
                steps = collector.read()
                while True:
                    try:
                        next(steps)
                    except StopIteration as done:
                        parts.append(_later(collector, done.value))
                        break
                    await asyncio.sleep(0)  # the loop serves what is ready, then the next slice
            else:
                parts.append(_built(list(collector.collect())))
        return lambda: [family for part in parts for family in part()]


def _built(families: list[Metric]) -> Build:
    return lambda: families


def _later(collector: StagedCollector, reading: Any) -> Build:
    return lambda: collector.build(reading)


async def gather(registry: Registry) -> Build:
    """Call on the event loop: reads `registry` there (a `StagedRegistry` in slices) and returns the function that
    makes its families, to call on a worker thread."""
    if isinstance(registry, StagedRegistry):
        return await registry.gather()
    return _built(list(registry.collect()))
