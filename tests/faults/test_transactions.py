"""kill -9 of the broker holding a transaction's messages, through the proxy with popgate's SDK: between the half
messages and their resolution, and between the commit and the delivery. The committed message is delivered once,
the rolled-back one never (docs/BROKER.md, "Transactions")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import Producer, SimpleConsumer
from popgate.cli.cluster import Cluster, ClusterConfig
from popgate.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=40, initial_backoff=0.1, max_backoff=0.5)  # across a broker restart


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    config = ClusterConfig(brokers=1, listen="127.0.0.1:0", data_dir=tmp_path, proxy_args=("--min-invisible-s", "1"))
    with Cluster(config) as started:
        yield started


def kill_9_and_restart(cluster: Cluster) -> None:
    cluster.child("b1").kill()
    cluster.restart_child("b1")


def test_kill_9_between_half_and_commit_and_between_commit_and_delivery(cluster: Cluster) -> None:
    with Producer(cluster.endpoint, retry=RETRY) as producer:
        committed, rolled_back = producer.transaction(), producer.transaction()
        kept = committed.send("fault_tx", b"committed")
        rolled_back.send("fault_tx", b"rolled back")
        kill_9_and_restart(cluster)  # between the half messages and their resolution
        committed.commit()
        rolled_back.rollback()
        kill_9_and_restart(cluster)  # between the commit and the delivery
    got = []
    with SimpleConsumer(cluster.endpoint, "g_fault_tx", "fault_tx", retry=RETRY) as consumer:
        until = time.monotonic() + 4
        while time.monotonic() < until:
            batch = consumer.receive(max=32, wait=0.5)
            consumer.ack_many(batch)
            got += batch
    assert [(m.message_id, m.body) for m in got] == [(kept.message_id, b"committed")]
