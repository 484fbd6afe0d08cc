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
import fcntl
import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from popgate_process.staged import Build, gather

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
KINDS = ("broker", "proxy")
_COUNTER_TYPES = ("counter", "histogram", "summary")  # their _total, _count, _sum, _bucket only grow
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


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


OPEN_TRIES = 5


class _RollingFile:
    """The in-progress hidden file of one roll period; `publish` makes it a final ``.jsonl`` file."""

    def __init__(self, settings: ExportSettings) -> None:
        self.settings = settings
        self.dir = Path(settings.export_dir)
        self.stem = f"{settings.kind}-{_UNSAFE.sub('_', settings.process)}-{int(settings.started * 1000)}"
        self.period: int | None = None
        self.seq = 0
        self._begun = 0.0  # the monotonic time the in-progress file was begun at
        self._fd: int | None = None  # the in-progress file, written unbuffered (see `append`)

    def _names(self) -> tuple[Path, Path]:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime((self.period or 0) * self.settings.roll_period_s))
        name = f"{self.stem}-{stamp}-{self.seq:06d}.jsonl"
        return self.dir / f".{name}.tmp", self.dir / name

    def append(self, data: bytes, now: float, monotonic: float) -> None:
        """Append one snapshot's lines whole, or raise and leave none of them in the file. `now` is the
        snapshot's wall time, `monotonic` the monotonic clock then: the file is published first when `now`
        is in another roll period, or a roll period has passed on the monotonic clock since it was begun —
        tests/unit/process/test_export.py::
        test_files_roll_over_each_roll_period_of_the_monotonic_clock_whatever_step_the_wall_clock_took.

        Written with os.write, no buffer: a write that fails (disk full) leaves nothing behind to be
        written later, after the part already on disk is cut off, in the middle of a line."""
        roll_s = self.settings.roll_period_s
        period = int(now // roll_s)
        if self._fd is not None and (period != self.period or monotonic - self._begun >= roll_s):
            self.publish()
        if self._fd is None:
            self.period, self._begun = period, monotonic
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = self._open_locked()
        fd = self._fd
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            try:
                os.ftruncate(fd, end)  # no half snapshot (nor half line) before the next one
            except OSError:  # it stays cut in this file: go on in a new one (`salvage` keeps its whole lines)
                os.close(fd)
                self._fd = None
                self.seq += 1
            raise

    def _open_locked(self) -> int:
        """The in-progress file, open and locked (`flock`: "being written", so `salvage` leaves it alone; held
        until it is renamed). Another process of the same name may take a file in the moment between its
        creation and the lock: then the next name is used (a few times at most)."""
        for _ in range(OPEN_TRIES):
            tmp = self._names()[0]
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)  # a salvaging process holds it for a moment at most
            try:
                if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)
            self.seq += 1
        raise OSError(f"export files in {self.dir} are taken as soon as made: another process of this name?")

    def publish(self) -> Path | None:
        """fsync the in-progress file and rename it to its final name (atomic within the directory), the lock
        held until the rename is done."""
        if self._fd is None:
            return None
        tmp, final = self._names()
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
            os.replace(tmp, final)
        finally:
            os.close(fd)
        _fsync_dir(self.dir)
        self.seq += 1
        return final


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def salvage(export_dir: Path, kind: str, process: str) -> list[Path]:
    """Publish what an earlier incarnation of this process left in progress (killed before rolling).

    Only whole lines are kept; the files are then renamed like any finished file. A file a running process
    still writes (it holds a lock on it until it publishes it or dies) is left alone: another process of the
    same name, started by mistake or while the first one is still stopping, must not make it final. A file it
    cannot open or rename (another user's, a read-only file system) is logged and left for a later start —
    tests/unit/process/test_export.py::test_a_leftover_it_cannot_open_is_skipped_and_the_others_are_published.
    """
    out: list[Path] = []
    prefix = f".{kind}-{_UNSAFE.sub('_', process)}-"
    # This process's files exactly: broker "b" must not take running broker "b-2"'s file (".broker-b-2-...").
    ours = re.compile(re.escape(prefix) + r"\d+-\d{8}T\d{6}Z-\d+\.jsonl\.tmp")
    for tmp in sorted(Path(export_dir).glob(f"{prefix}*.jsonl.tmp")):
        if not ours.fullmatch(tmp.name):
            continue
        try:
            final = _salvage_one(tmp)
        except OSError as exc:
            log.warning("cannot publish %s, left by an earlier run: %s", tmp, exc.strerror or exc)
            continue
        if final is not None:
            out.append(final)
    if out:
        _fsync_dir(Path(export_dir))
    return out


def _salvage_one(tmp: Path) -> Path | None:
    """`tmp` cut after its last whole line and published; None when a live writer holds it or published it."""
    try:
        f = tmp.open("r+b")
    except FileNotFoundError:
        return None  # its writer published it meanwhile
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # its writer is alive
        try:
            if os.stat(tmp).st_ino != os.fstat(f.fileno()).st_ino:
                return None  # published (renamed) between the open and the lock
        except FileNotFoundError:
            return None
        data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        if whole != data:
            f.truncate(len(whole))
            os.fsync(f.fileno())
        final = tmp.with_name(tmp.name[1 : -len(".tmp")])
        os.replace(tmp, final)
    return final


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
        self._file = _RollingFile(settings)
        self._snapshots = RunSnapshots(settings)  # used on the writer thread only
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="metrics-export")
        self._task: asyncio.Task[None] | None = None
        self._last = 0.0

    async def start(self) -> MetricsExporter:
        loop = asyncio.get_running_loop()
        s = self.settings
        await loop.run_in_executor(self._pool, check_dir, s.export_dir)  # the only start error: a wrong setting
        try:
            salvaged = await loop.run_in_executor(self._pool, salvage, s.export_dir, s.kind, s.process)
            if salvaged:
                log.info("published %d export file(s) left in progress by an earlier run", len(salvaged))
            await self.snapshot()
        except Exception:  # metrics never keep a process from serving: as at runtime, logged and retried (`_run`)
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
            except Exception:
                log.exception("metrics export failed; retrying at the next interval")

    async def snapshot(self) -> None:
        # strictly increasing at the 1 ms the records carry: (process, started, time) names one snapshot
        now = self._last = round(max(time.time(), self._last + 0.001), 3)
        monotonic = time.monotonic()
        build = await gather(self.registry)  # live state read on the loop (large states in slices)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._write, build, now, monotonic)

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
            except OSError:  # the process still stops cleanly; the next start publishes what is left
                log.exception("last metrics snapshot failed")
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
