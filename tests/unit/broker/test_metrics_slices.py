"""A broker's figures with many (topic, group) pairs: /metrics and the export read them without holding the event
loop (popgate_process.staged), and read them the same as a plain collection."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker import core_metrics
from broker.metrics import BrokerMetrics
from popgate_process import metrics_http
from popgate_process.export import ExportSettings, MetricsExporter
from popgate_process.staged import gather
from tests.unit.broker.cores import broker

GROUPS = 30


async def consumed(core: Any) -> None:
    """GROUPS groups on one topic, each having popped and acked one message."""
    await core.send([pb.Message(topic="orders", body=b"x") for _ in range(GROUPS)])
    for i in range(GROUPS):
        popped = (await core.pop("orders", f"g{i}", "*", 1, 30_000, 0)).messages
        await core.ack("orders", f"g{i}", [m.handle for m in popped])


def figures(families: Any) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for m in families
        for s in m.samples
        if s.name.startswith("popgate_broker_") and "seconds" not in s.name
    }


async def test_many_pairs_are_read_in_slices_the_loop_serving_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core_metrics, "LAGS_PER_SLICE", 10)  # GROUPS pairs x their queues: many slices
    async with broker(tmp_path) as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)
        await consumed(core)
        served = 0
        done = False

        async def other_work() -> None:  # an RPC's turn of the loop
            nonlocal served
            while not done:
                served += 1
                await asyncio.sleep(0)

        probe = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = served
        build = await gather(metrics.registry)
        done = True
        await probe
        assert served - before >= 3  # the loop ran other work while the pairs were read
        assert figures(build()) == figures(metrics.registry.collect())  # what a one-step collection reads


async def test_the_families_of_a_snapshot_or_a_scrape_are_built_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built_on: list[int] = []
    real_build = core_metrics.CoreCollector.build

    def build(self: core_metrics.CoreCollector, reading: core_metrics.CoreReading) -> Any:
        built_on.append(threading.get_ident())
        return real_build(self, reading)

    monkeypatch.setattr(core_metrics.CoreCollector, "build", build)
    async with broker(tmp_path / "data") as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)
        await consumed(core)
        async with MetricsExporter(metrics.registry, ExportSettings(tmp_path / "export", "b1", "broker")):
            pass  # a snapshot at start and one at close
        page = await metrics_http._exposition(metrics.registry)
    assert b'popgate_broker_consumer_lag_messages{group="g0",topic="orders"}' in page
    assert len(built_on) == 3 and threading.get_ident() not in built_on
    assert list((tmp_path / "export").glob("broker-b1-*.jsonl"))
