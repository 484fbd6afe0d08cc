"""Namespaces (a v2 resource's `resource_namespace`) keep tenants apart: `orders` in namespace A and `orders` in
namespace B are different topics, as in RocketMQ 5 (whose proxy stores them as `A%orders` and `B%orders`)."""

from __future__ import annotations

import uuid

from popgate_pb.v2 import definition_pb2 as v2

from popgate import Producer, SimpleConsumer
from popgate.cli.cluster import Cluster
from tests.integration.proxy.conftest import MakeCluster
from tests.integration.sdk.conftest import drain


def test_the_same_topic_and_group_in_two_namespaces_are_apart(make_cluster: MakeCluster) -> None:
    cluster: Cluster = make_cluster(brokers=2)
    endpoint = cluster.endpoint
    topic, group = f"orders-{uuid.uuid4().hex[:6]}", "billing"
    with (
        Producer(endpoint, namespace="tenantA") as a,
        Producer(endpoint, namespace="tenantB") as b,
        SimpleConsumer(endpoint, group, topic, namespace="tenantA", wait=1.0) as reads_a,
        SimpleConsumer(endpoint, group, topic, namespace="tenantB", wait=1.0) as reads_b,
        SimpleConsumer(endpoint, group, topic, wait=1.0) as no_namespace,
    ):
        a.send(topic, b"A's order")
        assert reads_b.receive(max=32, wait=1.0) == []  # B's group of the same name sees nothing of A's
        assert no_namespace.receive(max=32, wait=1.0) == []
        got_a = drain(reads_a, 1)
        assert [m.body for m in got_a] == [b"A's order"]
        assert got_a[0].topic == topic  # the client sees its own name back, not the stored one
        b.send(topic, b"B's order")
        assert [m.body for m in drain(reads_b, 1)] == [b"B's order"]
        assert reads_a.receive(max=32, wait=1.0) == []


def test_a_bad_namespace_is_refused_with_a_clear_code(make_cluster: MakeCluster) -> None:
    from tests.integration.proxy.client import V2Client

    cluster = make_cluster(brokers=1)
    client = V2Client(cluster.endpoint)
    try:
        message = v2.Message(topic=v2.Resource(name="orders", resource_namespace="bad ns!"), body=b"x")
        message.system_properties.message_id = uuid.uuid4().hex.upper()
        message.system_properties.body_encoding = v2.IDENTITY
        from popgate_pb.v2 import service_pb2 as pb

        status = client.stub.SendMessage(pb.SendMessageRequest(messages=[message]), timeout=5).status
    finally:
        client.close()
    assert status.code == v2.ILLEGAL_TOPIC and "namespace" in status.message, status
