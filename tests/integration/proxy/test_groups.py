"""A consumer group is known to every live broker from its first receive through a proxy: its lag there counts
messages it has not popped yet, even on a broker no receive of it has reached (a receive answered by its first
Pop contacts one broker only)."""

from __future__ import annotations

import uuid

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc

from popgate.cli.admin import Broker, fetch_stats, lag_rows
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster


def test_a_group_is_known_to_every_broker_from_its_first_receive(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=3)
    topic, group = f"known-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:6]}"
    for name, child in cluster.brokers.items():  # three messages stored on each broker
        with grpc.insecure_channel(child.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
            messages = [bpb.Message(topic=topic, body=f"{name}-{i}".encode()) for i in range(3)]
            stub.Send(bpb.SendRequest(messages=messages), timeout=5)
    client = V2Client(cluster.endpoint)
    try:
        _, received = client.receive(topic, group, batch=32, poll_s=1)  # served by the first broker it asks
        assert len(received) == 3
        client.ack(topic, group, received)
    finally:
        client.close()
    brokers = [Broker(name, child.address) for name, child in cluster.brokers.items()]
    responses = fetch_stats(brokers, bpb.StatsRequest(topic=topic), timeout=5)
    lags = {}
    for name, response in responses.items():
        rows = lag_rows({name: response}).get((topic, group))
        lags[name] = None if rows is None else rows.lag
    assert sorted(lags.values(), key=str) == [0, 3, 3], lags  # the two brokers not asked hold 3 each for it
