"""The admin service's operations through the proxy, fanned out to every broker (issue 30, point 2): an offset
reset to a time delivers exactly the messages stored after it and lasts a kill -9; groups and topics are deleted
on every broker, also across a kill -9; messages are found by id and key, newest first; a group's live consumers
are listed the same by any proxy; a broker down is named, and a reset applied without it is safe to repeat; admin
accounts only."""

from __future__ import annotations

import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import admin_pb2 as apb
from popgate_pb.ext import admin_pb2_grpc as apb_grpc

from popgate import Producer, SimpleConsumer
from popgate.cli.cluster import Cluster, ClusterConfig
from tests.integration.sdk.conftest import drain, eventually
from tests.procs import ACCOUNTS, secured_cluster, signed

To = bpb.ResetOffsetRequest.To


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(
        brokers=2,
        listen="127.0.0.1:0",
        data_dir=tmp_path_factory.mktemp("ops"),
        proxy_args=("--min-invisible-s", "1", "--broker-timeout-s", "1"),
    )
    with Cluster(config) as started:
        yield started


def admin(endpoint: str) -> apb_grpc.AdminStub:
    return apb_grpc.AdminStub(grpc.insecure_channel(endpoint))  # type: ignore[no-untyped-call]


def stats_of(stub: apb_grpc.AdminStub, topic: str) -> apb.StatsResponse:
    """Every broker's Stats of the topic, once each answers (a broker just restarted comes back within seconds)."""
    request = bpb.StatsRequest(topic=topic)

    def answered() -> apb.StatsResponse | None:
        answer = stub.Stats(request)
        return None if answer.failures else answer

    return eventually(answered, timeout=15, what="every broker's stats")


def names(prefix: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"{prefix}-{tag}", f"g-{tag}"


def test_a_reset_to_a_time_delivers_exactly_the_messages_stored_after_it(cluster: Cluster) -> None:
    topic, group = names("reset")
    stub = admin(cluster.endpoint)
    with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, group, topic) as consumer:
        for _ in range(10):  # one send at a time: round robin spreads them over both brokers
            producer.send(topic, b"old")
        assert len(drain(consumer, 10)) == 10
        time.sleep(0.05)  # store times are milliseconds: the cut lies between the two batches
        cut_ms = int(time.time() * 1000)
        time.sleep(0.05)
        new = {producer.send(topic, f"new{i}".encode()).message_id for i in range(10)}
        assert {m.message_id for m in drain(consumer, 10)} == new  # all consumed and acked
        answer = stub.ResetOffset(
            bpb.ResetOffsetRequest(topic=topic, group=group, to=To.TIMESTAMP, timestamp_ms=cut_ms)
        )
        assert sorted(a.broker for a in answer.answers) == ["b1", "b2"] and not answer.failures
        assert all(a.queues for a in answer.answers)  # the topic lives on both brokers

        cluster.brokers["b1"].kill()  # kill -9 after the answer: the reset was committed before it
        cluster.restart_child("b1")
        again = drain(consumer, 10, timeout=20)
        assert {m.message_id for m in again} == new and {m.body[:3] for m in again} == {b"new"}
        assert {m.receipt_handle.split("~")[1] for m in again} == {"b1", "b2"}  # from both brokers
        assert consumer.receive(max=32, wait=0.5) == []  # exactly those: nothing stored before the cut

        got: list[object] = []
        waiting = threading.Thread(target=lambda: got.extend(consumer.receive(max=32, wait=15)))
        waiting.start()  # a held receive of the group sees the reset
        time.sleep(0.5)
        started = time.monotonic()
        stub.ResetOffset(bpb.ResetOffsetRequest(topic=topic, group=group, to=To.EARLIEST))
        waiting.join(20)
        assert got and time.monotonic() - started < 5


def test_groups_and_topics_are_deleted_on_every_broker(cluster: Cluster) -> None:
    topic, group = names("delete")
    stub = admin(cluster.endpoint)
    with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, group, topic) as consumer:
        for _ in range(8):  # one send at a time: round robin puts the topic on both brokers
            producer.send(topic, b"m")
        drain(consumer, 4, ack=False)
    stats = stub.Stats(bpb.StatsRequest(topic=topic))
    assert {g.group for a in stats.answers for g in a.groups} == {group}

    deleted = stub.DeleteGroup(bpb.DeleteGroupRequest(group=group))
    assert {a.broker: list(a.topics) for a in deleted.answers} == {"b1": [topic], "b2": [topic]}
    cluster.brokers["b2"].kill()  # kill -9 right after the answer: the deletion was committed before it
    cluster.restart_child("b2")
    assert not [g for a in stats_of(stub, topic).answers for g in a.groups]
    again = stub.DeleteGroup(bpb.DeleteGroupRequest(group=group))  # safe to repeat
    assert not [t for a in again.answers for t in a.topics] and not again.failures

    gone = stub.DeleteTopic(bpb.DeleteTopicRequest(topic=topic))
    assert sum(a.messages for a in gone.answers) == 8 and all(a.existed for a in gone.answers)
    cluster.brokers["b1"].kill()
    cluster.restart_child("b1")
    assert not [q for a in stats_of(stub, topic).answers for q in a.queues]

    with pytest.raises(grpc.RpcError) as bad:  # refused by every broker as bad input: the call's error
        stub.DeleteTopic(bpb.DeleteTopicRequest(topic="no spaces"))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_messages_are_found_by_id_and_key_newest_first(cluster: Cluster) -> None:
    topic, _ = names("lookup")
    stub = admin(cluster.endpoint)
    with Producer(cluster.endpoint) as producer:
        sent = [producer.send(topic, f"order {i}".encode(), keys=["customer-7", f"order-{i}"]) for i in range(6)]
    by_key = stub.QueryMessages(bpb.QueryMessagesRequest(topic=topic, key="customer-7", max_messages=4))
    assert [m.stored.message.message_id for m in by_key.messages] == [r.message_id for r in reversed(sent)][:4]
    assert {m.broker for m in by_key.messages} <= {"b1", "b2"} and not by_key.failures
    assert all(m.body_size == 7 and not m.stored.message.body for m in by_key.messages)
    (one,) = stub.QueryMessages(
        bpb.QueryMessagesRequest(topic=topic, message_id=sent[2].message_id, max_messages=10, with_body=True)
    ).messages
    assert one.stored.message.body == b"order 2" and list(one.stored.message.keys) == ["customer-7", "order-2"]


def test_a_groups_live_consumers_are_the_same_from_any_proxy(cluster: Cluster) -> None:
    """Two replicas behind one Service advertise the same address: each reports its own consumers still (named by
    host and port), so both are listed."""
    topic, group = names("live")
    second = cluster.add_proxy(extra=["--advertise", cluster.endpoint])
    with SimpleConsumer(cluster.endpoint, group, topic) as one, SimpleConsumer(second, group, topic) as two:
        one.receive(max=1, wait=0)
        two.receive(max=1, wait=0)

        def listed(endpoint: str) -> list[tuple[str, str]] | None:
            consumers = admin(endpoint).ListConsumers(bpb.ListConsumersRequest(group=group)).consumers
            found = sorted((c.proxy, c.client_id) for c in consumers)
            return found if len(found) == 2 else None

        first = eventually(lambda: listed(cluster.endpoint), timeout=10, what="both consumers listed")
        assert eventually(lambda: listed(second), timeout=5) == first
        ports = [endpoint.rpartition(":")[2] for endpoint in (cluster.endpoint, second)]
        assert sorted(p for p, _ in first) == sorted(f"{socket.gethostname()}:{port}" for port in ports)
        assert len({c for _, c in first}) == 2


def test_a_broker_down_is_named_and_a_reset_without_it_is_safe_to_repeat(cluster: Cluster) -> None:
    topic, group = names("down")
    stub = admin(cluster.endpoint)
    with Producer(cluster.endpoint) as producer:
        for _ in range(6):
            producer.send(topic, b"m")
    request = bpb.ResetOffsetRequest(topic=topic, group=group, to=To.LATEST)
    cluster.brokers["b2"].signal(signal.SIGSTOP)
    try:
        partial = stub.ResetOffset(request, timeout=10)
        assert [a.broker for a in partial.answers] == ["b1"]
        assert [(f.broker, f.code) for f in partial.failures] in (
            [("b2", "DEADLINE_EXCEEDED")],
            [("b2", "UNAVAILABLE")],
        )
    finally:
        cluster.brokers["b2"].signal(signal.SIGCONT)
    whole = eventually(
        lambda: (r := stub.ResetOffset(request, timeout=10)) and not r.failures and r or None, timeout=15
    )
    assert sorted(a.broker for a in whole.answers) == ["b1", "b2"]
    stats = stub.Stats(bpb.StatsRequest(topic=topic, group=group))
    assert sum(g.lag for a in stats.answers for g in a.groups) == 0  # at the end on both: nothing to consume


def test_only_admin_accounts_may_operate(tmp_path: Path) -> None:
    with secured_cluster(tmp_path, ACCOUNTS) as secured:
        stub = admin(secured.endpoint)
        created = stub.CreateTopic(bpb.CreateTopicRequest(topic="t"), metadata=signed("ops", "ops-secret-0123456"))
        assert sorted(a.broker for a in created.answers) == ["b1", "b2"]
        for call, request in (
            (stub.ResetOffset, bpb.ResetOffsetRequest(topic="t", group="g", to=To.EARLIEST)),
            (stub.DeleteTopic, bpb.DeleteTopicRequest(topic="t")),
            (stub.ListConsumers, bpb.ListConsumersRequest(group="g")),
        ):
            with pytest.raises(grpc.RpcError) as denied:
                call(request, metadata=signed("app", "app-secret-0123456"))
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        gone = stub.DeleteTopic(bpb.DeleteTopicRequest(topic="t"), metadata=signed("ops", "ops-secret-0123456"))
        assert all(a.existed for a in gone.answers) and not gone.failures
