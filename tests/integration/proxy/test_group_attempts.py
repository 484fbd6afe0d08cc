"""A consumer group's max delivery attempts, set at the brokers (--group-max-attempts), hold end to end: its
messages reach its DLQ after that many deliveries, another group's after the brokers' default, and Telemetry
through the proxy tells each group's consumers their number (the official client's FIFO retries and
ForwardMessageToDeadLetterQueue use it); real brokers and proxy."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate.cli.cluster import Cluster, ClusterConfig
from tests.integration.proxy.client import V2Client

BROKER_ARGS = ("--max-delivery-attempts", "3", "--group-max-attempts", "fast=1")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[V2Client]:
    config = ClusterConfig(
        brokers=2,
        listen="127.0.0.1:0",
        data_dir=tmp_path,
        broker_args=BROKER_ARGS,
        proxy_args=("--min-invisible-s", "1"),
    )
    with Cluster(config) as cluster:
        v2_client = V2Client(cluster.endpoint)
        try:
            yield v2_client
        finally:
            v2_client.close()


def deliveries(client: V2Client, topic: str, group: str) -> list[int]:
    """Receive and nack (invisible 0: due again at once) the group's message until none comes within 2 s."""
    attempts = []
    while True:
        _, messages = client.receive(topic, group, batch=1, poll_s=2)
        if not messages:
            return attempts
        [m] = messages
        attempts.append(m.system_properties.delivery_attempt)
        nack = pb.ChangeInvisibleDurationRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=topic),
            receipt_handle=m.system_properties.receipt_handle,
            message_id=m.system_properties.message_id,
            invisible_duration=Duration(seconds=0),
        )
        assert client.stub.ChangeInvisibleDuration(nack, timeout=5).status.code == v2.OK


def test_a_groups_messages_reach_its_dlq_after_its_own_attempts_the_others_after_the_default(
    client: V2Client,
) -> None:
    topic = f"pay-{uuid.uuid4().hex[:8]}"
    assert client.send(topic, [b"poison"]).status.code == v2.OK
    assert deliveries(client, topic, "fast") == [1]
    assert deliveries(client, topic, "slow") == [1, 2, 3]
    for group, attempts in (("fast", "1"), ("slow", "3")):
        _, [dead] = client.receive(f"%DLQ%{group}", "inspect", poll_s=5)
        assert dead.body == b"poison"
        assert dead.user_properties["DELIVERY_ATTEMPTS"] == attempts


def test_telemetry_tells_each_groups_consumers_its_max_attempts(client: V2Client) -> None:
    def consumer(group: str) -> pb.TelemetryCommand:
        subscription = v2.Subscription(group=v2.Resource(name=group))
        return pb.TelemetryCommand(settings=v2.Settings(client_type=v2.PUSH_CONSUMER, subscription=subscription))

    started = time.monotonic()
    replies = list(client.stub.Telemetry(iter([consumer("fast"), consumer("slow"), consumer("fast")]), timeout=10))
    assert [r.settings.backoff_policy.max_attempts for r in replies] == [1, 3, 1]
    assert time.monotonic() - started < 5  # the official client waits for it at start (10 s at most)


def test_an_ack_under_another_groups_name_says_that_group_has_no_such_delivery(client: V2Client) -> None:
    topic = f"pay-{uuid.uuid4().hex[:8]}"
    client.send(topic, [b"x"])
    _, [m] = client.receive(topic, "workers", batch=1, poll_s=2)
    [wrong] = client.ack(topic, "billing", [m]).entries
    assert wrong.status.code == v2.INVALID_RECEIPT_HANDLE
    assert "consumer group billing has no in-flight delivery" in wrong.status.message
    [right] = client.ack(topic, "workers", [m]).entries
    assert right.status.code == v2.OK
