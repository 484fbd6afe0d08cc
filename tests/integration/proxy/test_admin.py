"""The proxy's admin service: the brokers it routes to, everyone's Stats with the ones that did not answer named,
a page of one broker's queue; admin accounts only when the proxy has accounts."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import admin_pb2 as apb
from popgate_pb.ext import admin_pb2_grpc as apb_grpc

from popgate.cli.cluster import Cluster
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster
from tests.procs import ACCOUNTS, secured_cluster, signed

TOPIC = "admin-topic"


def admin(endpoint: str) -> apb_grpc.AdminStub:
    return apb_grpc.AdminStub(grpc.insecure_channel(endpoint))  # type: ignore[no-untyped-call]


def test_stats_of_every_broker_and_the_one_that_does_not_answer_is_named(make_cluster: MakeCluster) -> None:
    cluster: Cluster = make_cluster(brokers=2)
    client = V2Client(cluster.endpoint)
    for i in range(20):
        assert client.send(TOPIC, [f"m{i}".encode()]).status.code == 20000
    stub = admin(cluster.endpoint)
    brokers = stub.ListBrokers(apb.ListBrokersRequest(), timeout=5).brokers
    assert [(b.name, b.up) for b in brokers] == [("b1", True), ("b2", True)]
    assert all(b.address.startswith("127.0.0.1:") for b in brokers)

    answer = stub.Stats(bpb.StatsRequest(topic=TOPIC), timeout=5)
    assert sorted(a.broker for a in answer.answers) == ["b1", "b2"] and not answer.failures
    stored = sum(q.max_offset - q.min_offset for a in answer.answers for q in a.queues)
    assert stored == 20

    (queue,) = [q for q in answer.answers[0].queues if q.max_offset > q.min_offset][:1]
    page = stub.ListMessages(
        apb.ListMessagesRequest(
            broker=answer.answers[0].broker,
            request=bpb.ListMessagesRequest(topic=TOPIC, queue_id=queue.queue_id, from_offset=0, limit=100),
        ),
        timeout=5,
    )
    assert len(page.messages) == queue.max_offset - queue.min_offset
    with pytest.raises(grpc.RpcError) as unknown:
        stub.ListMessages(apb.ListMessagesRequest(broker="nope", request=bpb.ListMessagesRequest(topic=TOPIC)))
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "b1, b2" in unknown.value.details()

    cluster.brokers["b2"].signal(signal.SIGSTOP)  # hung: its Stats call runs into the deadline
    try:
        answer = stub.Stats(bpb.StatsRequest(topic=TOPIC), timeout=10)
        assert [a.broker for a in answer.answers] == ["b1"]
        assert [(f.broker, f.code) for f in answer.failures] in (
            [("b2", "UNAVAILABLE")],
            [("b2", "DEADLINE_EXCEEDED")],
        )
    finally:
        cluster.brokers["b2"].signal(signal.SIGCONT)
    client.close()


def test_only_admin_accounts_may_use_it(tmp_path: Path) -> None:
    with secured_cluster(tmp_path, ACCOUNTS) as cluster:
        stub = admin(cluster.endpoint)

        assert (
            len(stub.ListBrokers(apb.ListBrokersRequest(), metadata=signed("ops", "ops-secret-0123456")).brokers) == 2
        )
        with pytest.raises(grpc.RpcError) as denied:
            stub.Stats(bpb.StatsRequest(), metadata=signed("app", "app-secret-0123456"))
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED and "admin" in denied.value.details()
        with pytest.raises(grpc.RpcError) as anonymous:
            stub.Stats(bpb.StatsRequest())
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
