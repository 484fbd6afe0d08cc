"""A counter series that first appears while its process run is long under way (a new topic on a broker
that has run for a while, a new group on a proxy) counts from 0: the exporter writes its value 0 at the
previous snapshot, and the job, batch or streaming, counts the whole first value."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from pyspark.sql import SparkSession

import popgate_process.export
from popgate_process.export import ExportSettings, MetricsExporter
from spark_metrics.job import JobSettings, read_records, start_streaming
from spark_metrics.transform import aggregate
from tests.spark import scenario as S
from tests.spark.test_transform import Key, by_key, comparable


class Clock:
    """Stands in for the `time` module in popgate_process.export: snapshots at chosen times, nothing else changes."""

    strftime = staticmethod(time.strftime)
    gmtime = staticmethod(time.gmtime)

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


class BrokerTopics:
    """A broker's per-topic families as the tests export them: messages in, the queue's end, g1's offset."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.msg_in = Counter("popgate_broker_messages_in", "x", ["topic"], registry=registry)
        self.max_offset = Gauge("popgate_broker_max_offset", "x", ["topic", "queue"], registry=registry)
        self.consumer = Gauge("popgate_broker_consumer_offset", "x", ["topic", "group", "queue"], registry=registry)

    def made(self, name: str, messages: int) -> None:
        """The topic holds `messages` more, and group g1 its offset 0 there."""
        self.msg_in.labels(name).inc(messages)
        self.max_offset.labels(name, "0").set(messages)
        self.consumer.labels(name, "g1", "0").set(0)


def export(directory: Path) -> None:
    """One broker and one proxy, both started long before T0, snapshotted every 10 s from T0 to T0+170.

    broker: topic "old" +10 per snapshot; topic "new" appears between T0+50 and T0+60 with 1000 messages
      (its 0 lands at T0+50: window 0); topic "newer" between T0+70 and T0+80 with 500, +5 before T0+100
      (its 0 at T0+70: window 1). Group g1 has offsets on all three, and on each new topic pops 10 messages
      and gets its dead-letter count (0) at once, as the broker exports them: for g1 on "new" those two
      counters' 0 lands at T0+50 too, in window 0, where g1 has no offsets on "new" yet.
    proxy: g1 receives +1 per snapshot; g2 first receives 3 between T0+60 and T0+70 (its 0 at T0+60);
      g3 first receives 2 between T0+50 and T0+60 (its 0 at T0+50: window 0).
    """
    broker_reg, proxy_reg = CollectorRegistry(), CollectorRegistry()
    topics = BrokerTopics(broker_reg)
    msg_in = topics.msg_in
    msg_out = Counter("popgate_broker_messages_out", "x", ["topic", "group"], registry=broker_reg)
    dead = Counter("popgate_broker_dead_lettered", "x", ["topic", "group"], registry=broker_reg)
    receives = Counter("popgate_proxy_receives", "x", ["group", "mode", "outcome"], registry=proxy_reg)

    def topic(name: str, messages: int) -> None:
        topics.made(name, messages)
        if name != "old":
            msg_out.labels(name, "g1").inc(10)
            dead.labels(name, "g1")  # exported at 0

    def received(group: str, n: int) -> None:
        receives.labels(group, "notify", "messages").inc(n)

    topic("old", 5000)
    received("g1", 50)
    changes = {6: lambda: (topic("new", 1000), received("g3", 2)), 7: lambda: received("g2", 3)}
    changes[8] = lambda: topic("newer", 500)
    changes[10] = lambda: msg_in.labels("newer").inc(5)
    clock = Clock(S.T0)

    async def run() -> None:
        settings: dict[str, Any] = {"started": S.OLD, "interval_s": 3600}  # the test takes every snapshot
        async with (
            MetricsExporter(broker_reg, ExportSettings(directory, "b1", "broker", **settings)) as b,
            MetricsExporter(proxy_reg, ExportSettings(directory, "px", "proxy", **settings)) as p,
        ):
            for step in range(1, 18):
                clock.now = S.T0 + 10 * step
                msg_in.labels("old").inc(10)
                received("g1", 1)
                changes.get(step, lambda: None)()
                await b.snapshot()
                await p.snapshot()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(popgate_process.export, "time", clock)
        asyncio.run(run())


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("new-series")
    export(d)
    return d


@pytest.fixture(scope="module")
def batch(spark: SparkSession, export_dir: Path) -> dict[Key, dict[str, Any]]:
    return by_key(aggregate(read_records(spark, str(export_dir)), S.WINDOW_S))


def check(rows: dict[Key, dict[str, Any]]) -> None:
    window1 = {k[1:]: r for k, r in rows.items() if k[0] == 1}
    assert {t: window1[(t, "g1")]["messages_in"] for t in ("old", "new", "newer")} == {
        "old": 60,
        "new": 1000,
        "newer": 505,
    }
    assert {g: window1[("", g)]["receives"] for g in ("g1", "g2", "g3")} == {"g1": 6, "g2": 3, "g3": 2}
    assert {t: (window1[(t, "g1")]["messages_out"], window1[(t, "g1")]["dlq_growth"]) for t in ("new", "newer")} == {
        "new": (10, 0),
        "newer": (10, 0),
    }
    # A value-0 record is a starting point, not a sample: g1 on "new" and the group g3, whose 0 lands in
    # window 0, have no row there (no snapshot of theirs is in it); every topic/group row has its lag.
    assert {k[1:] for k in rows if k[0] == 0} == {("old", "g1"), ("", "g1")}
    assert all(r["consumer_lag"] is not None for (_, t, _), r in rows.items() if t)


def test_batch_counts_the_first_value_of_a_new_series(batch: dict[Key, dict[str, Any]]) -> None:
    check(batch)


def test_streaming_once_counts_it_too(
    spark: SparkSession, export_dir: Path, tmp_path: Path, batch: dict[Key, dict[str, Any]]
) -> None:
    settings = JobSettings(input=str(export_dir), output=str(tmp_path), lateness_s=20, streaming=True, once=True)
    query = start_streaming(spark, settings)
    try:
        assert query.awaitTermination(timeout=100)  # --once: stops by itself
    finally:
        query.stop()
    streamed = by_key(spark.read.parquet(str(tmp_path / "windows")))
    check(streamed)
    assert {k[0] for k in streamed} == {0, 1}  # data up to T0+170, 20 s lateness: windows 0 and 1 are final
    assert comparable(streamed) == comparable({k: r for k, r in batch.items() if k[0] < 2})


def export_remade(directory: Path) -> None:
    """One broker, started long before T0, snapshotted every 10 s from T0+10 to T0+170. Topic "gone" (+20 a
    snapshot from 100) is deleted after the T0+50 snapshot and made again at T0+125 with 500 messages, +20 a
    snapshot after (580 by T0+170). Topic "remade" (60 at T0+10, +10 a snapshot) is deleted and made again between
    the T0+40 and T0+50 snapshots with 5 messages, +20 a snapshot after (125 by T0+110): no snapshot misses it."""
    registry = CollectorRegistry()
    topics = BrokerTopics(registry)
    msg_in, made = topics.msg_in, topics.made
    made("gone", 100)
    made("remade", 50)
    clock = Clock(S.T0)

    async def run() -> None:
        settings: dict[str, Any] = {"started": S.OLD, "interval_s": 3600}
        async with MetricsExporter(registry, ExportSettings(directory, "b1", "broker", **settings)) as b:
            for step in range(1, 18):
                clock.now = S.T0 + 10 * step
                if step <= 5 or step >= 13:
                    msg_in.labels("gone").inc(20 if step != 13 else 0)
                if step == 13:
                    made("gone", 500)
                if step == 5:
                    msg_in.remove("remade")
                    made("remade", 5)
                else:
                    msg_in.labels("remade").inc(10 if step < 5 else 20)
                await b.snapshot()
                if step == 5:
                    msg_in.remove("gone")
                    topics.max_offset.remove("gone", "0")
                    topics.consumer.remove("gone", "g1", "0")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(popgate_process.export, "time", clock)
        asyncio.run(run())


def test_a_series_deleted_and_made_again_counts_from_0_again(spark: SparkSession, tmp_path: Path) -> None:
    """A topic deleted and made again (its counters gone, then back from 0): the window it comes back in counts
    what it holds, not that less its first value; one reset between two snapshots counts from the previous window's
    last value, not its largest, and never goes negative."""
    export_remade(tmp_path)
    rows = by_key(aggregate(read_records(spark, str(tmp_path)), S.WINDOW_S))
    assert rows[(2, "gone", "g1")]["messages_in"] == 580
    assert rows[(1, "remade", "g1")]["messages_in"] == 120  # 125 at T0+110 less 5 at T0+50
    assert rows[(0, "remade", "g1")]["messages_in"] >= 0
