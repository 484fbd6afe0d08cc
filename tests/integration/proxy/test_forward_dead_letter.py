"""ForwardMessageToDeadLetterQueue sent again with the same handle (its first answer lost: the official clients
retry a forward until it is answered OK, with no limit) through a real proxy and broker: OK both times, and the
group's DLQ holds the message once. A stale forward moves its message only when the request's message id is the
stored message's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.protobuf.duration_pb2 import Duration
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate.cli.cluster import Cluster, ClusterConfig
from tests.integration.proxy.client import V2Client


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Client]:
    """One broker and a proxy for the file's tests (each its own topic and group)."""
    config = ClusterConfig(brokers=1, listen="127.0.0.1:0", data_dir=tmp_path_factory.mktemp("fwd"))
    with Cluster(config) as cluster:
        v2_client = V2Client(cluster.endpoint)
        try:
            yield v2_client
        finally:
            v2_client.close()


def test_the_same_forward_sent_twice_is_ok_twice_and_dead_letters_the_message_once(client: V2Client) -> None:
    topic, group = "fwd-twice", "g-fwd"
    assert client.send(topic, [b"poison"]).status.code == v2.OK
    [m] = received(client, topic, group)
    forward = forward_of(topic, group, m)
    answers = [client.stub.ForwardMessageToDeadLetterQueue(forward, timeout=5).status for _ in range(2)]
    assert [a.code for a in answers] == [v2.OK, v2.OK], answers
    _, dead = client.receive(f"%DLQ%{group}", "inspect", batch=32, poll_s=3)
    assert [d.body for d in dead] == [b"poison"]


def test_a_stale_forward_naming_another_message_is_ok_and_leaves_the_message_at_its_offset(client: V2Client) -> None:
    topic, group = "fwd-other", "g-other"
    assert client.send(topic, [b"innocent"]).status.code == v2.OK
    [m] = received(client, topic, group)
    changed = client.stub.ChangeInvisibleDuration(
        pb.ChangeInvisibleDurationRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=topic),
            receipt_handle=m.system_properties.receipt_handle,
            invisible_duration=Duration(seconds=30),
            message_id=m.system_properties.message_id,
        ),
        timeout=5,
    )
    assert changed.status.code == v2.OK, changed.status
    stale = forward_of(topic, group, m)
    stale.message_id = "01" + "0" * 30  # what a topic deleted and made again held at this offset
    assert client.stub.ForwardMessageToDeadLetterQueue(stale, timeout=5).status.code == v2.OK
    m.system_properties.receipt_handle = changed.receipt_handle
    ack = client.ack(topic, group, [m])
    assert [e.status.code for e in ack.entries] == [v2.OK], ack
    _, dead = client.receive(f"%DLQ%{group}", "inspect", batch=32, poll_s=2)
    assert dead == []


def received(client: V2Client, topic: str, group: str) -> list[v2.Message]:
    messages: list[v2.Message] = []
    for _ in range(10):  # bounded: the topic's first messages reach the route within a poll or two
        _, messages = client.receive(topic, group, batch=1, invisible_s=30, poll_s=2)
        if messages:
            break
    return messages


def forward_of(topic: str, group: str, m: v2.Message) -> pb.ForwardMessageToDeadLetterQueueRequest:
    return pb.ForwardMessageToDeadLetterQueueRequest(
        group=v2.Resource(name=group),
        topic=v2.Resource(name=topic),
        receipt_handle=m.system_properties.receipt_handle,
        message_id=m.system_properties.message_id,
        delivery_attempt=1,
        max_delivery_attempts=4,
    )
