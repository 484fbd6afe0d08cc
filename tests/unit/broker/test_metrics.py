"""The broker's /metrics figures read from a real core (no sockets): what a dashboard or alert would show."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin
from broker.metrics import BrokerMetrics
from popgate_contract.validation import DLQ_RESEND_GROUP
from tests.unit.broker.cores import ManualClock, broker


def samples(metrics: BrokerMetrics, name: str) -> dict[str, float]:
    """A gauge's samples by their group label."""
    return {s.labels["group"]: s.value for m in metrics.registry.collect() for s in m.samples if s.name == name}


async def test_a_drained_dlq_stops_counting_as_a_backlog(tmp_path: Path) -> None:
    seen = []
    async with broker(tmp_path) as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)

        def look() -> None:
            pending = samples(metrics, "popgate_broker_dlq_messages")
            seen.append((pending, samples(metrics, "popgate_broker_dlq_stored_messages")))

        await core.send([pb.Message(topic="orders", message_id=f"m{i}", body=b"x") for i in range(4)])
        for m in (await core.pop("orders", "billing", "*", 32, 30_000, 0)).messages:
            await core.dead_letter("orders", "billing", m.handle)
        look()  # 4 dead letters, nobody has re-sent any
        resend = (await core.pop("%DLQ%billing", DLQ_RESEND_GROUP, "*", 3, 30_000, 0)).messages
        look()  # 3 popped by `dlq resend`, not acked yet: still not re-sent
        await core.ack("%DLQ%billing", DLQ_RESEND_GROUP, [m.handle for m in resend])
        look()  # 3 re-sent
        other = await core.pop("%DLQ%billing", "some-reader", "*", 32, 30_000, 0)
        await core.ack("%DLQ%billing", "some-reader", [m.handle for m in other.messages])
        look()  # another group reading the DLQ re-sends nothing
    assert [pending["billing"] for pending, _ in seen] == [4, 4, 1, 1]
    assert [stored["billing"] for _, stored in seen] == [4, 4, 4, 4]


async def test_held_long_polls_are_counted_by_kind(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)
        held = [asyncio.create_task(core.pop("t", f"g{i}", "*", 1, 30_000, 20_000)) for i in range(2)]
        held.append(asyncio.create_task(core.notification("t", "n", "*", 20_000)))
        async with asyncio.timeout(5):
            while core.hold.total_held < 3:  # noqa: ASYNC110  # the hold has no event for "one more held"
                await asyncio.sleep(0.001)
        found = {
            s.labels["kind"]: s.value
            for m in metrics.registry.collect()
            for s in m.samples
            if s.name == "popgate_broker_held_requests"
        }
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
    assert found == {"pop": 2, "notification": 1}


async def test_oldest_unacked_age_is_seconds_since_the_oldest_un_acked_message_was_stored(tmp_path: Path) -> None:
    clock = ManualClock(1_800_000_000_000)

    async with broker(tmp_path, clock=clock) as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)
        await core.send([pb.Message(topic="orders", message_id=f"m{i}", body=b"x") for i in range(2)])
        popped = (await core.pop("orders", "billing", "*", 1, 30_000, 0)).messages  # the other one stays ready
        audited = (await core.pop("orders", "audit", "*", 2, 30_000, 0)).messages
        await core.ack("orders", "audit", [m.handle for m in audited])  # nothing un-acked
        stored = popped[0].store_ms
        clock.now = stored + 7_500
        ages = samples(metrics, "popgate_broker_oldest_unacked_age_seconds")
    assert ages == {"billing": 7.5, "audit": 0.0}  # billing's oldest (popped, not acked) was stored 7.5 s "ago"


def counted(metrics: BrokerMetrics, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels.values()): s.value for m in metrics.registry.collect() for s in m.samples if s.name == name}


async def test_first_deliveries_acks_bytes_and_ack_latency(tmp_path: Path) -> None:
    """Redeliveries are not first deliveries; an ack counts once and observes the time since its message's store."""
    clock = ManualClock(1_000_000)
    async with broker(tmp_path, clock=clock) as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)
        await core.send([pb.Message(topic="orders", message_id=f"m{i}", body=b"x" * 100) for i in range(3)])
        first = (await core.pop("orders", "billing", "*", 32, 30_000, 0)).messages
        clock.now += 10
        await core.change_invisible("orders", "billing", first[0].handle, 0)  # back at once: a redelivery
        again = (await core.pop("orders", "billing", "*", 32, 30_000, 0)).messages
        clock.now += 2_500
        await core.ack("orders", "billing", [m.handle for m in again] + [m.handle for m in first[1:]])
        await core.ack("orders", "billing", [first[1].handle])  # stale: not counted again
    assert counted(metrics, "popgate_broker_messages_first_delivered_total") == {("orders", "billing"): 3}
    assert counted(metrics, "popgate_broker_messages_out_total") == {("orders", "billing"): 4}
    assert counted(metrics, "popgate_broker_messages_acked_total") == {("orders", "billing"): 3}
    assert counted(metrics, "popgate_broker_bytes_in_total")[("orders",)] >= 300
    latency = counted(metrics, "popgate_broker_ack_latency_seconds_sum")
    assert latency == {("orders", "billing"): 3 * 2.51}


def test_ack_latency_labels_are_bounded() -> None:
    metrics = BrokerMetrics()
    for i in range(1005):
        metrics.acked("t", f"g{i}", [1.0])
    groups = {labels[1] for labels in counted(metrics, "popgate_broker_ack_latency_seconds_count")}
    assert len(groups) == 1001 and "_other" in groups


async def test_the_store_figures_are_read_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.current_thread()
    async with broker(tmp_path) as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)
        readers: list[threading.Thread] = []  # the threads that read the data directory or its file system

        def on_thread(real: Callable[..., Any]) -> Callable[..., Any]:
            def read(*args: Any) -> Any:
                readers.append(threading.current_thread())
                return real(*args)

            return read

        monkeypatch.setattr(os, "statvfs", on_thread(os.statvfs))
        monkeypatch.setattr(os, "scandir", on_thread(os.scandir))
        metrics.store.every_s = 0  # each scrape wants a new reading
        assert counted(metrics, "popgate_broker_disk_free_bytes")[()] > 0  # the last reading, at once
        async with asyncio.timeout(5):
            while len(readers) < 2:  # noqa: ASYNC110  # the reading has no event of its own
                await asyncio.sleep(0.01)
        assert loop_thread not in readers


async def test_a_deleted_group_or_topic_loses_its_ack_latency_series(tmp_path: Path) -> None:
    async with broker(tmp_path) as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)
        for topic in ("a", "b"):
            await core.send([pb.Message(topic=topic, body=b"x", queue_id=0)])
            for group in ("g1", "g2"):
                popped = await core.pop(topic, group, "*", 32, 30_000, 0)
                await core.ack(topic, group, [m.handle for m in popped.messages])
        assert len(counted(metrics, "popgate_broker_ack_latency_seconds_count")) == 4
        await admin.delete_group(core, pb.DeleteGroupRequest(group="g1"), pb.DeleteGroupResponse())
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="b"), pb.DeleteTopicResponse())
        assert set(counted(metrics, "popgate_broker_ack_latency_seconds_count")) == {("a", "g2")}


async def test_offsets_are_one_series_per_topic_and_group_unless_queue_offsets_are_asked_for(tmp_path: Path) -> None:
    """/metrics grows with (topic, group) pairs, not pairs × queues: the offsets are summed over a pair's queues
    (what the Spark job and a `sum by (topic, group)` read) unless --metrics-queue-offsets is on."""
    names = ("popgate_broker_consumer_offset", "popgate_broker_pull_offset")

    def offsets(metrics: BrokerMetrics) -> list[tuple[str, dict[str, str], float]]:
        return [(s.name, s.labels, s.value) for m in metrics.registry.collect() for s in m.samples if s.name in names]

    for per_queue in (False, True):
        async with broker(tmp_path / str(per_queue), queues_per_topic=16, metrics_queue_offsets=per_queue) as (core, _):
            metrics = BrokerMetrics()
            metrics.watch(core)
            await core.send([pb.Message(topic="t", body=b"x") for _ in range(64)])  # 4 in each queue
            for i in range(10):
                popped = (await core.pop("t", f"g{i}", "*", 2 + i, 30_000, 0)).messages
                await core.ack("t", f"g{i}", [m.handle for m in popped[: 1 + i // 2]])
            series = offsets(metrics)
            sums: dict[tuple[str, str], float] = {}
            for name, labels, value in series:
                sums[(name, labels["group"])] = sums.get((name, labels["group"]), 0) + value
            assert len(series) == 2 * 10 * (16 if per_queue else 1)
            assert all(("queue" in labels) is per_queue for _, labels, _ in series)
            rows = core.lags("t")
            for i in range(10):  # the same figures either way
                group = [r.lag for r in rows if r.group == f"g{i}"]
                assert sums[(names[0], f"g{i}")] == sum(lag.consumer_offset for lag in group)
                assert sums[(names[1], f"g{i}")] == sum(lag.pull_offset for lag in group)
