"""`popgate receive --no-ack` against brokers that dead-letter after 3 attempts: one look, no dead letters."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate import Producer, SimpleConsumer
from popgate.cli.admin import Broker, fetch_stats
from popgate.cli.cluster import Cluster
from popgate.cli.main import main
from tests.integration.sdk.conftest import drain, start_cluster
from tests.integration.sdk.test_cli import name

ATTEMPTS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("few-attempts"), broker_args=("--max-delivery-attempts", str(ATTEMPTS)))
    try:
        yield c
    finally:
        c.stop()


def test_no_ack_shows_each_message_once_and_dead_letters_none(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """--wait longer than --invisible: the messages come round again while the command still reads. It used to
    print them on every round (attempts 1, 2, 3) until the brokers dead-lettered them all."""
    topic, group, endpoint = name("look"), name("g"), cluster.endpoint
    with Producer(endpoint) as producer:
        sent = {r.message_id for r in producer.send_many(topic, [f"m{i}".encode() for i in range(40)])}
    argv = ["receive", "--endpoint", endpoint, topic, "--group", group, "--no-ack", "--format", "json"]
    assert main([*argv, "--invisible", "3", "--wait", "6"]) == 0
    captured = capsys.readouterr()
    shown = [json.loads(line)["message_id"] for line in captured.out.splitlines()]
    assert sorted(shown) == sorted(sent), f"{len(shown)} lines for {len(sent)} messages"
    assert f"received 40 messages from {topic} (group {group}); stopped at the first message shown" in captured.err
    # Still the group's to consume: the look used one attempt of each (the receive that ended it one more of
    # those it fetched again), so they come with attempt 2 or 3 of 3
    with SimpleConsumer(endpoint, group, topic) as consumer:
        consumed = drain(consumer, 40, timeout=30)
    assert {m.message_id for m in consumed} == sent and {m.attempt for m in consumed} <= {2, ATTEMPTS}
    brokers = [Broker(*target.split("=")) for target in cluster.broker_targets()]
    stats = fetch_stats(brokers, bpb.StatsRequest(), timeout=5.0)
    assert len(stats) == 2
    assert sum(q.max_offset for s in stats.values() for q in s.queues if q.topic == f"%DLQ%{group}") == 0
