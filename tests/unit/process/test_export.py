"""The metrics exporter: record schema, atomic publication, rollover by time, salvage after a kill."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from popgate_process.export import ExportSettings, MetricsExporter, RunSnapshots, encode, records
from popgate_process.export_files import RollingFile, salvage


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Gauge("popgate_broker_max_offset", "x", ["topic", "queue"], registry=reg).labels("orders", "3").set(42)
    Counter("popgate_proxy_receives", "x", ["group", "mode", "outcome"], registry=reg).labels("g", "notify", "hit").inc(
        5
    )
    Histogram("popgate_broker_rpc_duration_seconds", "x", ["method"], buckets=(0.1, 1), registry=reg).labels(
        "Pop"
    ).observe(0.5)
    return reg


def settings(tmp_path: Path, **kw: Any) -> ExportSettings:
    return ExportSettings(tmp_path, "b1", "broker", started=1000.0, **kw)


def by_metric(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["metric"]: r for r in rows}


def test_one_record_per_sample_in_schema_v1(tmp_path: Path) -> None:
    rows = by_metric(list(records(registry(), settings(tmp_path), 1234.5)))
    assert set(rows) == {
        "popgate_broker_max_offset",
        "popgate_proxy_receives_total",  # a counter is its running total; _created is left out
        "popgate_broker_rpc_duration_seconds_count",  # histograms: _count and _sum, no buckets by default
        "popgate_broker_rpc_duration_seconds_sum",
    }
    assert rows["popgate_broker_max_offset"] == {
        "v": 1,
        "time": 1234.5,
        "process": "b1",
        "kind": "broker",
        "started": 1000.0,
        "topic": "orders",
        "group": None,
        "queue": 3,
        "metric": "popgate_broker_max_offset",
        "type": "gauge",
        "value": 42.0,
        "labels": {},
    }
    rx = rows["popgate_proxy_receives_total"]
    assert (rx["type"], rx["value"], rx["group"], rx["labels"]) == (
        "counter",
        5.0,
        "g",
        {"mode": "notify", "outcome": "hit"},
    )
    assert rows["popgate_broker_rpc_duration_seconds_count"]["type"] == "counter"
    with_buckets = list(records(registry(), settings(tmp_path, buckets=True), 1.0))
    assert sum(r["metric"].endswith("_bucket") for r in with_buckets) == 3


def test_encoding_is_one_sorted_compact_json_object_per_line(tmp_path: Path) -> None:
    data = encode(records(registry(), settings(tmp_path), 1.0)).decode()
    lines = data.splitlines()
    assert data.endswith("\n") and len(lines) == 4
    for line in lines:
        assert line == json.dumps(json.loads(line), separators=(",", ":"), sort_keys=True)


def test_files_roll_over_by_time_and_appear_whole(tmp_path: Path) -> None:
    f = RollingFile(settings(tmp_path, interval_s=10, roll_s=60))
    f.append(b'{"a":1}\n', 120.0, 120.0)
    f.append(b'{"a":2}\n', 130.0, 130.0)
    assert list(tmp_path.glob("*.jsonl")) == []  # in progress: only a hidden temporary file
    assert [p.name.startswith(".") and p.name.endswith(".tmp") for p in tmp_path.iterdir()] == [True]
    f.append(b'{"a":3}\n', 180.0, 180.0)  # next roll period: the first file is published
    (first,) = tmp_path.glob("*.jsonl")
    assert first.read_bytes() == b'{"a":1}\n{"a":2}\n'
    assert first.name == "broker-b1-1000000-19700101T000200Z-000000.jsonl"
    before = first.stat()
    f.append(b'{"a":4}\n', 190.0, 190.0)
    assert f.publish() is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name, "broker-b1-1000000-19700101T000300Z-000001.jsonl"]
    assert first.stat().st_mtime_ns == before.st_mtime_ns  # never rewritten
    assert f.publish() is None


def test_files_roll_over_each_roll_period_of_the_monotonic_clock_whatever_step_the_wall_clock_took(
    tmp_path: Path,
) -> None:
    """After the wall clock steps back, snapshot stamps only creep on by 1 ms (`MetricsExporter.snapshot`): the
    file still rolls once a roll period has passed on the monotonic clock, so a reader gets it on time."""
    f = RollingFile(settings(tmp_path, interval_s=10, roll_s=60))
    f.append(b'{"a":1}\n', 120.0, 5_000.0)
    f.append(b'{"a":2}\n', 120.001, 5_010.0)  # the wall clock stepped back an hour
    f.append(b'{"a":3}\n', 120.002, 5_059.0)
    assert list(tmp_path.glob("*.jsonl")) == []
    f.append(b'{"a":4}\n', 120.003, 5_060.0)  # a roll period after the file's start on the monotonic clock
    (first,) = tmp_path.glob("*.jsonl")
    assert first.read_bytes() == b'{"a":1}\n{"a":2}\n{"a":3}\n'
    f.append(b'{"a":5}\n', 120.004, 5_119.0)
    assert len(list(tmp_path.glob("*.jsonl"))) == 1
    f.append(b'{"a":6}\n', 120.005, 5_120.0)
    assert len(list(tmp_path.glob("*.jsonl"))) == 2


def test_leftovers_of_a_killed_run_are_published_with_whole_lines_only(tmp_path: Path) -> None:
    (tmp_path / ".broker-b1-5-19700101T000000Z-000000.jsonl.tmp").write_bytes(b'{"a":1}\n{"a":2}\n{"a":')
    (tmp_path / ".broker-b2-5-19700101T000000Z-000000.jsonl.tmp").write_bytes(b'{"a":1}\n')  # not ours
    (tmp_path / ".broker-b1-2-5-19700101T000000Z-000000.jsonl.tmp").write_bytes(b'{"a":1}\n')  # broker "b1-2"'s
    (published,) = salvage(tmp_path, "broker", "b1")
    assert published.name == "broker-b1-5-19700101T000000Z-000000.jsonl"
    assert published.read_bytes() == b'{"a":1}\n{"a":2}\n'
    assert (tmp_path / ".broker-b2-5-19700101T000000Z-000000.jsonl.tmp").exists()
    assert (tmp_path / ".broker-b1-2-5-19700101T000000Z-000000.jsonl.tmp").exists()


def test_a_file_a_running_process_still_writes_is_not_taken(tmp_path: Path) -> None:
    """A second process of the same name (started by mistake, or by a supervisor while the first is still in its
    shutdown grace) must not publish the first one's file, which would then be written after it is final."""
    live = RollingFile(ExportSettings(tmp_path, "b1", "broker", started=1000.0))
    live.append(b'{"a":1}\n', 100.0, 100.0)
    assert salvage(tmp_path, "broker", "b1") == []
    live.append(b'{"a":2}\n', 110.0, 110.0)
    final = live.publish()
    assert final is not None and final.read_bytes() == b'{"a":1}\n{"a":2}\n'


def test_a_file_is_locked_until_it_is_renamed_and_one_published_meanwhile_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two moments a same-named process's salvage could meet a live writer's file: in the middle of its
    publication (after its fsync, before its rename) and after salvage listed the file (published since)."""
    live = RollingFile(ExportSettings(tmp_path, "b1", "broker", started=1000.0))
    live.append(b'{"a":1}\n', 100.0, 100.0)
    real_replace = os.replace
    seen: list[list[Path]] = []

    def replace(src: Any, dst: Any, **dir_fds: Any) -> None:
        if not seen:
            seen.append([])
            seen[0] = salvage(tmp_path, "broker", "b1")  # another process salvages in the middle of `publish`
        real_replace(src, dst, **dir_fds)

    monkeypatch.setattr(os, "replace", replace)
    final = live.publish()
    monkeypatch.setattr(os, "replace", real_replace)
    assert seen == [[]] and final is not None and final.read_bytes() == b'{"a":1}\n'

    live.append(b'{"a":2}\n', 200.0, 200.0)
    real_glob = Path.glob

    def glob(self: Path, pattern: str) -> Iterator[Path]:
        listed = list(real_glob(self, pattern))
        live.publish()  # the live writer rolls its file right after salvage listed it
        return iter(listed)

    monkeypatch.setattr(Path, "glob", glob)
    assert salvage(tmp_path, "broker", "b1") == []


class CountingExporter(MetricsExporter):
    """Counts the snapshots written; `enough` is set at the fourth."""

    def __init__(self, registry: Any, settings: ExportSettings) -> None:
        super().__init__(registry, settings)
        self.snapshots = 0
        self.enough = asyncio.Event()

    async def snapshot(self) -> None:
        await super().snapshot()
        self.snapshots += 1
        if self.snapshots >= 4:
            self.enough.set()


def test_exporter_snapshots_periodically_and_publishes_on_close(tmp_path: Path) -> None:
    reg = registry()

    async def run() -> int:
        exporter = CountingExporter(reg, ExportSettings(tmp_path, "px-1", "proxy", interval_s=0.02))
        async with exporter, asyncio.timeout(10):
            await exporter.enough.wait()
        return exporter.snapshots

    snapshots = asyncio.run(run())
    assert snapshots >= 5  # the first at start, at least three on the interval, the last at close
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    rows = [json.loads(line) for p in tmp_path.glob("*.jsonl") for line in p.read_text().splitlines()]
    assert len(rows) == 4 * snapshots
    assert {r["kind"] for r in rows} == {"proxy"} and {r["process"] for r in rows} == {"px-1"}
    times = sorted({r["time"] for r in rows})
    assert len(times) == snapshots


def test_settings_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kind"):
        ExportSettings(tmp_path, "b1", "consumer")
    with pytest.raises(ValueError, match="> 0"):
        ExportSettings(tmp_path, "b1", "broker", interval_s=0)
    assert ExportSettings(tmp_path, "b1", "broker", interval_s=120).roll_period_s == 120


def test_a_snapshot_a_full_disk_cut_leaves_nothing_of_itself_then_or_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = RollingFile(settings(tmp_path))
    f.append(b'{"a":1}\n', 0.0, 0.0)
    real_write = os.write
    calls = [0]

    def disk_fills_up(fd: int, data: Any) -> int:  # part of the snapshot fits, then the disk is full
        calls[0] += 1
        if calls[0] == 1:
            return real_write(fd, bytes(data[:5]))
        if calls[0] == 2:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", disk_fills_up)
    with pytest.raises(OSError):
        f.append(b'{"a":2}\n{"a":22}\n', 1.0, 1.0)
    f.append(b'{"a":3}\n', 2.0, 2.0)  # room again
    published = f.publish()
    assert published is not None and published.read_bytes() == b'{"a":1}\n{"a":3}\n'


def test_a_counter_series_new_after_the_first_snapshot_also_gets_its_zero_at_the_previous_snapshot(
    tmp_path: Path,
) -> None:
    reg = CollectorRegistry()
    msg_in = Counter("popgate_broker_messages_in", "x", ["topic"], registry=reg)
    offset = Gauge("popgate_broker_max_offset", "x", ["topic", "queue"], registry=reg)
    msg_in.labels("old").inc(5000)
    run = RunSnapshots(settings(tmp_path))

    def take(now: float) -> list[tuple[float, str, str, float]]:
        return [(r["time"], r["metric"], r["topic"], r["value"]) for r in run.take(reg, now)]

    first = run.take(reg, 10.0)  # the run's first snapshot: no earlier one to put a zero at
    assert [(r["topic"], r["value"]) for r in first] == [("old", 5000.0)]
    run.written(first, 10.0)
    msg_in.labels("new").inc(1000)  # a new topic: 1000 messages between two snapshots
    offset.labels("new", "0").set(1000)
    batch = run.take(reg, 20.0)
    assert [(r["time"], r["topic"], r["value"]) for r in batch if r["type"] == "counter"] == [
        (10.0, "new", 0.0),  # its value at the previous snapshot, written with this one
        (20.0, "old", 5000.0),
        (20.0, "new", 1000.0),
    ]
    assert [r["time"] for r in batch if r["type"] == "gauge"] == [20.0]  # gauges: never
    # not written (a failed write): the next snapshot still carries the zero, at the last written one's time
    assert (10.0, "popgate_broker_messages_in_total", "new", 0.0) in take(30.0)
    run.written(batch, 20.0)
    assert all(r["time"] == 30.0 for r in run.take(reg, 30.0))  # known now: no zero any more


def test_the_exporter_writes_the_zero_of_a_new_counter_series(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    receives = Counter("popgate_proxy_receives", "x", ["group"], registry=reg)
    Gauge("popgate_proxy_up", "x", registry=reg).set(1)  # every snapshot has a record

    async def run() -> None:
        async with MetricsExporter(reg, ExportSettings(tmp_path, "px-1", "proxy", interval_s=3600)) as exporter:
            receives.labels("g2").inc(3)
            await exporter.snapshot()

    asyncio.run(run())
    rows = [json.loads(line) for p in tmp_path.glob("*.jsonl") for line in p.read_text().splitlines()]
    times = sorted({r["time"] for r in rows})  # start, the snapshot above, the last at close
    assert sorted((r["time"], r["value"]) for r in rows if r["group"] == "g2") == [
        (times[0], 0.0),
        (times[1], 3.0),
        (times[2], 3.0),
    ]


def rows_of(export_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in export_dir.glob("*.jsonl") for line in p.read_text().splitlines()]


def test_a_leftover_it_cannot_open_is_skipped_and_the_others_are_published(tmp_path: Path) -> None:
    cannot = tmp_path / ".broker-b1-5-19700101T000000Z-000000.jsonl.tmp"
    cannot.mkdir()  # open() fails on it as on another user's file
    (tmp_path / ".broker-b1-5-19700101T000000Z-000001.jsonl.tmp").write_bytes(b'{"a":1}\n')

    async def run() -> None:
        async with MetricsExporter(registry(), settings(tmp_path, interval_s=60)):
            pass

    asyncio.run(run())  # starts: a leftover never keeps a process from serving
    assert (tmp_path / "broker-b1-5-19700101T000000Z-000001.jsonl").read_bytes() == b'{"a":1}\n'
    assert cannot.is_dir()  # left for a later start
    assert {r["process"] for r in rows_of(tmp_path) if "v" in r} == {"b1"}  # and this run exports


def test_a_start_on_a_full_disk_serves_and_exports_once_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    full = [True]

    def write(fd: int, data: Any) -> int:
        if full[0]:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)

    async def run() -> None:
        exporter = CountingExporter(registry(), ExportSettings(tmp_path, "px-1", "proxy", interval_s=0.02))
        async with exporter, asyncio.timeout(10):  # the failed first snapshot is logged, not raised
            full[0] = False
            await exporter.enough.wait()

    asyncio.run(run())
    assert len({r["time"] for r in rows_of(tmp_path)}) >= 3


def test_a_failing_export_logs_one_line_then_its_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full export disk fails every snapshot: one ERROR line without a traceback (then at most one every 10 s),
    not one with a traceback each interval; the first snapshot written again says exports recovered."""
    real_write = os.write
    failed = [0]

    def write(fd: int, data: Any) -> int:
        if failed[0] < 20:
            failed[0] += 1
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    caplog.set_level(logging.INFO, logger="popgate_process.export")

    async def run() -> None:
        exporter = CountingExporter(registry(), ExportSettings(tmp_path, "px-1", "proxy", interval_s=0.01))
        async with exporter, asyncio.timeout(10):
            await exporter.enough.wait()

    asyncio.run(run())
    assert failed[0] == 20
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        "metrics export failed at start: No space left on device; retrying at each interval"
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert len([r for r in caplog.records if "recovered" in r.getMessage()]) == 1


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_an_export_dir_deleted_or_replaced_is_made_again_and_written_in_a_new_file(tmp_path: Path, how: str) -> None:
    """The in-progress file's directory deleted (or moved away and another made in its place): the next snapshot
    does not go into the unlinked file, lost, but into a new file in the directory at the export path."""
    export_dir = tmp_path / "export"
    f = RollingFile(settings(export_dir))
    f.append(b'{"a":1}\n', 0.0, 0.0)
    if how == "deleted":
        shutil.rmtree(export_dir)
    else:
        export_dir.rename(tmp_path / "old")
        export_dir.mkdir()
    f.append(b'{"a":2}\n', 1.0, 1.0)
    published = f.publish()
    assert published is not None and published.parent == export_dir and published.read_bytes() == b'{"a":2}\n'


def test_an_export_dir_rotated_away_has_its_in_progress_file_published_where_it_went(tmp_path: Path) -> None:
    """The export directory renamed away (a rotation): the next snapshot publishes the in-progress file in the
    moved directory, every snapshot kept, and goes on in a new file at the export path."""
    export_dir, rotated = tmp_path / "export", tmp_path / "export.1"
    f = RollingFile(settings(export_dir))
    f.append(b'{"a":1}\n', 0.0, 0.0)
    f.append(b'{"a":2}\n', 1.0, 1.0)
    export_dir.rename(rotated)
    f.append(b'{"a":3}\n', 2.0, 2.0)
    (moved,) = rotated.iterdir()
    assert moved.name == "broker-b1-1000000-19700101T000000Z-000000.jsonl"
    assert moved.read_bytes() == b'{"a":1}\n{"a":2}\n'
    published = f.publish()
    assert published is not None and published.parent == export_dir and published.read_bytes() == b'{"a":3}\n'


def test_an_in_progress_file_it_cannot_publish_after_a_rotation_is_named_in_the_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    export_dir, rotated = tmp_path / "export", tmp_path / "export.1"
    f = RollingFile(settings(export_dir))
    f.append(b'{"a":1}\n', 0.0, 0.0)
    export_dir.rename(rotated)

    def refused(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refused)
    with caplog.at_level(logging.WARNING, logger="popgate_process.export"):
        f.append(b'{"a":2}\n', 1.0, 1.0)
    (left,) = rotated.iterdir()
    assert left.read_bytes() == b'{"a":1}\n'
    assert any(str(left) in r.getMessage() and "Permission denied" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    published = f.publish()
    assert published is not None and published.parent == export_dir and published.read_bytes() == b'{"a":2}\n'


def test_an_export_dir_that_can_never_be_a_directory_is_a_start_error(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")

    async def start(path: Path) -> None:
        async with MetricsExporter(registry(), ExportSettings(path, "b1", "broker")):
            pass

    for path in (a_file, a_file / "x"):
        with pytest.raises(NotADirectoryError):
            asyncio.run(start(path))
