"""End to end: a real broker exports snapshots while a slow and a fast consumer group work; the Spark job's
lag agrees with the broker's own Stats RPC at the same moments (within one export interval)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

try:  # required, not optional: make test installs it
    import pyspark  # noqa: F401
except ImportError:
    pytest.fail("pyspark is not installed: pip install -e '.[spark]' (make test installs it)", pytrace=False)

from popgate_pb import broker_pb2 as pb  # noqa: E402
from popgate_pb import broker_pb2_grpc as pb_grpc  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from popgate.cli.cluster import Cluster, ClusterConfig  # noqa: E402
from spark_metrics.job import JobSettings, run_batch  # noqa: E402
from tests.integration.proxy.client import V2Client  # noqa: E402
from tests.spark import session  # noqa: E402

spark = session.spark  # the run's one SparkSession fixture

INTERVAL_S = 0.5
WINDOW_S = 2.0
TOPIC = "orders"
STEPS = 50  # about 5 s of traffic
STEP_S = 0.1


@dataclass(frozen=True)
class Sample:
    time: float  # the broker's clock, seconds
    slow: int  # sum over queues of max_offset - consumer_offset
    slow_exact: int  # the broker's own lag figure (ready + in-flight)
    fast: int


def stats(stub: pb_grpc.BrokerStub) -> Sample:
    reply = stub.Stats(pb.StatsRequest(topic=TOPIC), timeout=10)

    def lag(group: str, exact: bool = False) -> int:
        rows = [g for g in reply.groups if g.group == group]
        return sum(g.lag if exact else g.max_offset - g.consumer_offset for g in rows)

    return Sample(reply.now_ms / 1000, lag("slow"), lag("slow", True), lag("fast"))


def consume(stub: pb_grpc.BrokerStub, group: str, n: int) -> None:
    request = pb.PopRequest(topic=TOPIC, group=group, filter="*", max_messages=n, invisible_ms=30000, poll_ms=0)
    popped = stub.Pop(request, timeout=10).messages
    if popped:
        handles = [m.receipt_handle for m in popped]
        assert all(r.ok for r in stub.Ack(pb.AckRequest(topic=TOPIC, group=group, receipt_handles=handles)).results)


def traffic(stub: pb_grpc.BrokerStub) -> list[Sample]:
    """10 messages per step in; the fast group takes up to 32, the slow one 2; Stats after every step."""
    samples = []
    for step in range(STEPS):
        began = time.monotonic()
        messages = [pb.Message(topic=TOPIC, body=f"m{step}-{i}".encode()) for i in range(10)]
        stub.Send(pb.SendRequest(messages=messages), timeout=10)
        consume(stub, "fast", 32)
        consume(stub, "slow", 2)
        samples.append(stats(stub))
        time.sleep(max(0.0, STEP_S - (time.monotonic() - began)))  # pacing the traffic, not synchronisation
    return samples


def snapshot_times(export_dir: Path) -> list[float]:
    times = set()
    for path in export_dir.rglob("*.jsonl"):
        times |= {json.loads(line)["time"] for line in path.read_text().splitlines()}
    return sorted(times)


def test_job_lag_matches_broker_stats(make_broker: Any, spark: SparkSession, tmp_path: Path) -> None:
    export_dir, out = tmp_path / "export", tmp_path / "out"
    broker = make_broker("b1", "--export-dir", str(export_dir), "--export-interval-s", str(INTERVAL_S))
    samples = traffic(broker.stub)
    final = stats(broker.stub)
    broker.close()  # SIGTERM: a last snapshot, and the current file published
    assert not list(export_dir.rglob(".*.tmp"))

    run_batch(spark, JobSettings(input=str(export_dir), output=str(out), window_s=WINDOW_S))
    rows = spark.read.parquet(str(out / "windows")).collect()
    by_window = {(r["window_end"].timestamp(), r["group"]): r for r in rows if r["topic"] == TOPIC}
    # every topic/group row has its lag: none made only of a new counter's value-0 record (METRICS.md §3)
    assert not [(end, g) for (end, g), r in by_window.items() if r["consumer_lag"] is None or r["exact_lag"] is None]
    ends = sorted(end for end, group in by_window if group == "slow" and (end, "fast") in by_window)
    assert len(ends) >= 3
    snaps = snapshot_times(export_dir)
    for end in ends:
        slow, fast = by_window[(end, "slow")], by_window[(end, "fast")]
        last = max(t for t in snaps if end - WINDOW_S <= t < end)  # the snapshot the window reports
        near = [s for s in [*samples, final] if abs(s.time - last) <= INTERVAL_S]
        assert near, f"no Stats sample within {INTERVAL_S} s of the snapshot at {last}"
        assert min(s.slow for s in near) <= slow["consumer_lag"] <= max(s.slow for s in near)
        assert min(s.slow_exact for s in near) <= slow["exact_lag"] <= max(s.slow_exact for s in near)
        assert fast["consumer_lag"] <= 10  # at most the one batch sent before the fast group's pop
    last_window = by_window[(ends[-1], "slow")]
    assert last_window["consumer_lag"] == final.slow > STEPS * 5  # traffic over: the same figure exactly
    assert by_window[(ends[-1], "fast")]["consumer_lag"] == final.fast == 0
    assert "slow" in (out / "report.txt").read_text()
    assert (out / "lag.png").stat().st_size > 0


@pytest.mark.parametrize("mode", ["adaptive", "longpoll"])
def test_popgate_up_exports_every_process_and_the_job_reads_the_proxy(
    spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    """`popgate up --export-dir`: brokers and proxy each write to DIR/<name>; the proxy's receive counters
    reach the job's polling columns, and its polling ratios are known whatever the receive mode (a longpoll
    proxy never counts a notify run; each of its receives is a first-Pop hit — answered at once, messages were
    waiting — or a long poll, held by a broker)."""
    export_dir, out = tmp_path / "export", tmp_path / "out"
    interval = ("--export-interval-s", str(INTERVAL_S))
    config = ClusterConfig(
        brokers=2,
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        export_dir=str(export_dir),
        broker_args=interval,
        proxy_args=("--receive-mode", mode, "--min-invisible-s", "1", *interval),
    )
    hits = empties = received = 0
    with Cluster(config) as cluster:
        client = V2Client(cluster.endpoint)
        try:
            client.send(TOPIC, [f"m{i}".encode() for i in range(20)])
            for _ in range(40):  # bounded: each receive is answered within its 1 s long-polling time
                _, messages = client.receive(TOPIC, "g", poll_s=1)
                if messages:
                    hits += 1
                    received += len(messages)
                    client.ack(TOPIC, "g", messages)
                else:
                    empties += 1
                    if received >= 20:
                        break
        finally:
            client.close()
    assert received == 20 and empties >= 1
    assert sorted(p.name for p in export_dir.iterdir()) == ["b1", "b2", "proxy"]
    kinds = {json.loads(line)["kind"] for line in next((export_dir / "proxy").glob("*.jsonl")).read_text().splitlines()}
    assert kinds == {"proxy"}

    run_batch(spark, JobSettings(input=str(export_dir), output=str(out), window_s=60))
    rows = [r for r in spark.read.parquet(str(out / "windows")).collect() if r["group"] == "g"]
    rows.sort(key=lambda r: r["window_start"])
    counts = ("receives", "empty_responses", "messages_in", "messages_out")
    total = {c: sum(r[c] or 0 for r in rows) for c in counts}
    assert total == {"receives": hits + empties, "empty_responses": empties, "messages_in": 20, "messages_out": 20}
    # the real proxy's polling counters (pop with notify / long polling) reach their columns
    polling = {c: sum(r[c] or 0 for r in rows) for c in ("notify_runs", "long_polling_receives", "first_pop_hits")}
    if mode == "longpoll":  # a coupled long-poll Pop each: answered at once (a hit) or held by its broker
        assert polling["notify_runs"] == 0 and 1 <= polling["first_pop_hits"] <= hits
        assert polling["long_polling_receives"] == hits + empties - polling["first_pop_hits"]
    else:
        assert polling["notify_runs"] + polling["long_polling_receives"] > 0
        assert polling["first_pop_hits"] <= hits
    # and the report's polling ratios are known in every window with receives
    ratios = ("polling_hit_ratio", "notify_share", "empty_rate")
    assert [{c: r[c] for c in ratios} for r in rows if r["receives"] and None in (r[c] for c in ratios)] == []
    assert [r for r in rows if r["topic"] == TOPIC][-1]["consumer_lag"] == 0  # the proxy figures: topic "" rows
