"""Periodic JSON-lines snapshots of a Prometheus registry, for the Spark job (docs/METRICS.md).

Used by the broker and the proxy alike. It reads anything with a ``collect()`` method (a
``prometheus_client.CollectorRegistry``) and never imports Spark.

Each snapshot appends one record per sample to a hidden in-progress file
``.<kind>-<process>-<start>.jsonl.tmp`` in the export directory; when its roll period has passed
(and on close) that file is fsynced and renamed to its final ``.jsonl`` name, so a reader listing
``*.jsonl`` only ever sees whole, finished files, which are never written again. A roll period has
passed when the wall clock enters the next one, or when a roll period's time has passed on the
monotonic clock since the file was begun: a wall clock stepped back does not hold files back.
Live state is read on the event loop (collectors read it without locks; a broker's per-pair figures in
slices, popgate_process.staged); building the families, encoding and file I/O run on a one-thread executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import os
import socket
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from popgate_process.export_files import RollingFile, salvage
from popgate_process.staged import Build, gather
from popgate_process.throttled import Throttled

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
KINDS = ("broker", "proxy")
_COUNTER_TYPES = ("counter", "histogram", "summary")  # their _total, _count, _sum, _bucket only grow


class Registry(Protocol):
    def collect(self) -> Iterable[Any]: ...


@dataclass(frozen=True, slots=True)
class ExportSettings:
    export_dir: Path
    process: str
    kind: str
    interval_s: float = 10.0
    roll_s: float = 60.0  # one finished file per process per roll period (at least one interval)
    buckets: bool = False  # histogram _bucket samples (one record per bucket) are left out by default
    started: float = field(default_factory=time.time)  # process incarnation: a new one means counters restarted

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not self.process:
            raise ValueError("process name must not be empty")
        if not (self.interval_s > 0 and self.roll_s > 0):
            raise ValueError("export interval and roll period must be > 0")

    @property
    def roll_period_s(self) -> float:
        return max(self.roll_s, self.interval_s)


def records(registry: Registry, settings: ExportSettings, now: float) -> Iterator[dict[str, Any]]:
    """One schema-v1 record per sample of the registry (counters as running totals)."""
    for metric in registry.collect():
        counter = metric.type in _COUNTER_TYPES
        for sample in metric.samples:
            name: str = sample.name
            if name.endswith("_created") or (name.endswith("_bucket") and not settings.buckets):
                continue
            value = float(sample.value)
            if math.isnan(value) or math.isinf(value):
                continue
            labels = dict(sample.labels)  # topic, group and queue get fields of their own; the others stay here
            queue = labels.pop("queue", None)
            yield {
                "v": SCHEMA_VERSION,
                "time": round(now, 3),
                "process": settings.process,
                "kind": settings.kind,
                "started": round(settings.started, 3),
                "topic": labels.pop("topic", None),
                "group": labels.pop("group", None),
                "queue": int(queue) if queue is not None and queue.lstrip("-").isdigit() else None,
                "metric": name,
                "type": "counter" if counter else "gauge",
                "value": value,
                "labels": labels,
            }


def _series(record: dict[str, Any]) -> tuple[Any, ...]:
    return (
        record["metric"],
        record["topic"],
        record["group"],
        record["queue"],
        tuple(sorted(record["labels"].items())),
    )


class RunSnapshots:
    """The records of one process run's successive snapshots, with the counter series this run has written.

    A counter series that first appears after the run's first snapshot (a new topic's ``messages_in``, a
    new label set) was 0 when the previous snapshot was taken: its first snapshot also carries a record of
    value 0 at the previous snapshot's time, so a reader sees its whole increase (docs/METRICS.md §3).
    That record is marked ``"initial": true``: it is the series' starting point, not a sample of it taken
    at that snapshot (the series did not exist then), so a reader makes no row of its own from it.
    """

    def __init__(self, settings: ExportSettings) -> None:
        self.settings = settings
        self._counters: set[tuple[Any, ...]] = set()
        self._previous: float | None = None  # time of the last snapshot written

    def take(self, registry: Registry, now: float) -> list[dict[str, Any]]:
        batch = list(records(registry, self.settings, now))
        if self._previous is None:
            return batch
        zeros = [
            {**r, "time": self._previous, "value": 0.0, "initial": True}
            for r in batch
            if r["type"] == "counter" and _series(r) not in self._counters
        ]
        return zeros + batch

    def written(self, batch: Iterable[dict[str, Any]], now: float) -> None:
        """Call once ``batch`` (from `take`) is written; a snapshot that failed to write is not remembered. The
        counters it held are those the next snapshot compares with: a series gone from one snapshot (its topic or
        group deleted) and back later (made again, from 0) gets its value-0 record too —
        tests/spark/test_new_series.py::test_a_series_deleted_and_made_again_counts_from_0_again."""
        self._counters = {_series(r) for r in batch if r["type"] == "counter"}
        self._previous = round(now, 3)


def encode(batch: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":"), sort_keys=True) + "\n" for r in batch).encode()


def default_proxy_name(port: int) -> str:
    """A proxy has no --name: host name and port tell proxies apart (a pod name on Kubernetes)."""
    return f"{socket.gethostname()}-{port}"


def check_dir(export_dir: Path) -> None:
    """Raise NotADirectoryError when `export_dir` can never be a directory (it, or a directory above it, is a
    file): a setting the operator must fix. Other trouble making it (permissions, a read-only or full file system)
    is a condition of the moment, left to the snapshots, which log it and retry —
    tests/unit/process/test_export.py::test_a_start_on_a_full_disk_serves_and_exports_once_there_is_room."""
    try:
        export_dir.mkdir(parents=True, exist_ok=True)
    except (NotADirectoryError, FileExistsError):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(export_dir)) from None
    except OSError as exc:
        log.warning("cannot make the export directory %s: %s; retrying at each snapshot", export_dir, exc.strerror)


class MetricsExporter:
    """Snapshots ``registry`` every ``interval_s`` (aligned to the wall clock) until closed.

    An async context manager; `close` takes a last snapshot and publishes the current file.
    """

    def __init__(self, registry: Registry, settings: ExportSettings) -> None:
        self.registry = registry
        self.settings = settings
        self._file = RollingFile(settings)
        self._snapshots = RunSnapshots(settings)  # used on the writer thread only
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="metrics-export")
        self._task: asyncio.Task[None] | None = None
        self._last = 0.0
        # Export failures (OSError) are logged at most every FAILURE_LOG_EVERY_S, without a traceback, and the first
        # snapshot written after them says so — test_export.py::test_a_failing_export_logs_one_line_then_its_recovery.
        self._failed_log = Throttled(log.error)
        self._failing = False

    def _failed(self, exc: OSError, when: str = "") -> None:
        self._failing = True
        self._failed_log("metrics export failed%s: %s; retrying at each interval", when, exc.strerror or exc)

    async def start(self) -> MetricsExporter:
        loop = asyncio.get_running_loop()
        s = self.settings
        await loop.run_in_executor(self._pool, check_dir, s.export_dir)  # the only start error: a wrong setting
        try:
            salvaged = await loop.run_in_executor(self._pool, salvage, s.export_dir, s.kind, s.process)
            if salvaged:
                log.info("published %d export file(s) left in progress by an earlier run", len(salvaged))
            await self.snapshot()
        except OSError as exc:  # metrics never keep a process from serving: as at runtime, logged and retried (`_run`)
            self._failed(exc, " at start")
        except Exception:
            log.exception("metrics export failed at start; retrying at the next interval")
        self._task = loop.create_task(self._run(), name="metrics-export")
        log.info("exporting metrics to %s every %g s", s.export_dir, s.interval_s)
        return self

    async def _run(self) -> None:
        interval = self.settings.interval_s
        while True:
            now = time.time()
            await asyncio.sleep((math.floor(now / interval) + 1) * interval - now)
            try:
                await self.snapshot()
            except OSError as exc:  # a full disk, a directory gone read-only: no traceback, the line throttled
                self._failed(exc)
            except Exception:
                log.exception("metrics export failed; retrying at the next interval")

    async def snapshot(self) -> None:
        # strictly increasing at the 1 ms the records carry: (process, started, time) names one snapshot
        now = self._last = round(max(time.time(), self._last + 0.001), 3)
        monotonic = time.monotonic()
        build = await gather(self.registry)  # live state read on the loop (large states in slices)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._write, build, now, monotonic)
        if self._failing:
            self._failing = False
            log.info("metrics export recovered: writing to %s again", self.settings.export_dir)

    def _write(self, build: Build, now: float, monotonic: float) -> None:
        batch = self._snapshots.take(_Frozen(build()), now)
        self._file.append(encode(batch), now, monotonic)
        self._snapshots.written(batch, now)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            try:
                await self.snapshot()
                await asyncio.get_running_loop().run_in_executor(self._pool, self._file.publish)
            except OSError as exc:  # the process still stops cleanly; the next start publishes what is left
                log.error("last metrics snapshot failed: %s", exc.strerror or exc)
        self._pool.shutdown(wait=True)

    async def __aenter__(self) -> MetricsExporter:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


@dataclass(frozen=True, slots=True)
class _Frozen:
    """Metric families already collected, on the writer thread."""

    families: list[Any]

    def collect(self) -> Iterable[Any]:
        return self.families
