"""A full disk (RLIMIT_FSIZE on the running broker: writes past the limit fail with EFBIG, as on a full
file system): sends are refused with a clear error, stored messages stay readable, the broker keeps
serving, and after the limit is lifted and the broker restarted every acknowledged message is intact."""

from __future__ import annotations

import resource
import sqlite3

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popgate_pb import broker_pb2 as pb

from tests.conftest import BrokerHandle

TOPIC = "full"
BODY = b"x" * 2048
POP = pb.PopRequest(topic=TOPIC, group="g", filter="*", max_messages=8, invisible_ms=30000)


def send(broker: BrokerHandle, n: int, tag: str) -> list[str]:
    messages = [pb.Message(topic=TOPIC, body=BODY, message_id=f"{tag}-{i}") for i in range(n)]
    response = broker.stub.Send(pb.SendRequest(messages=messages), timeout=10)
    return [r.message_id for r in response.results]


def stored_ids(broker: BrokerHandle) -> list[str]:
    ids: list[str] = []
    for queue_id in range(4):
        request = pb.ListMessagesRequest(topic=TOPIC, queue_id=queue_id, from_offset=0, limit=1000)
        ids += [m.message.message_id for m in broker.stub.ListMessages(request, timeout=10).messages]
    return ids


def error_name(exc: grpc.RpcError) -> str:
    return dict(exc.trailing_metadata() or ()).get("popgate-error", "")  # type: ignore[attr-defined]


def test_full_disk_refuses_writes_keeps_reads_and_corrupts_nothing(make_broker: object) -> None:
    broker: BrokerHandle = make_broker("b1")  # type: ignore[operator]
    acked = send(broker, 200, "before")
    assert broker.proc.proc is not None
    pid = broker.proc.proc.pid
    # Every write at or past 1 byte of any file now fails: the data directory is full.
    # (Only the soft limit: raising a hard limit again needs CAP_SYS_RESOURCE.)
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, hard))
    refused = 0
    try:
        for attempt in range(20):
            with pytest.raises(grpc.RpcError) as info:
                send(broker, 10, f"during{attempt}")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
            assert error_name(info.value) == "StoreUnavailable"
            assert "store write failed" in info.value.details()  # type: ignore[attr-defined]
            refused += 1
        # A line for the first refusal, then at most one each 10 s, not one each: the log may be on the full disk.
        assert 1 <= sum("store commit failed" in line for line in broker.proc.child.lines) <= 2
        # Reads keep working: stored messages are listed, stats answer, health says SERVING.
        assert sorted(stored_ids(broker)) == sorted(acked)
        assert sum(q.max_offset for q in broker.stub.Stats(pb.StatsRequest(), timeout=10).queues) == len(acked)
        health = health_pb2_grpc.HealthStub(broker.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # Consumers keep consuming: Pop and Ack work from memory (their records could not be written,
        # so after a restart those messages are delivered again: at least once, nothing lost).
        got = broker.stub.Pop(POP, timeout=10).messages
        assert len(got) == 8
        handles = [m.receipt_handle for m in got]
        results = broker.stub.Ack(pb.AckRequest(topic=TOPIC, group="g", receipt_handles=handles), timeout=10).results
        assert all(r.ok for r in results)
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))
    assert broker.proc.alive()
    acked += send(broker, 50, "after")  # the broker recovers by itself once space is back
    assert len(broker.stub.Pop(POP, timeout=10).messages) == 8
    broker.restart(kill=True)
    conn = sqlite3.connect(broker.data_dir / "broker.sqlite3")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()
    assert sorted(stored_ids(broker)) == sorted(acked)
    print(f"disk full: {refused} sends refused, {len(acked)} acknowledged intact, integrity ok")


def test_messages_popped_while_the_disk_was_full_come_back_after_a_restart(make_broker: object) -> None:
    """Their delivery records could not be written; the next commit that succeeds writes them along with its
    own (a later pull offset stored without them would make those messages count as acked after a restart)."""
    broker: BrokerHandle = make_broker("b1", "--flush", "sync")  # type: ignore[operator]
    sent = send(broker, 16, "m")
    pop = pb.PopRequest(topic=TOPIC, group="g", filter="*", max_messages=8, invisible_ms=2000)
    assert broker.proc.proc is not None
    pid = broker.proc.proc.pid
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, hard))
    try:
        during = broker.stub.Pop(pop, timeout=10).messages  # answered from memory
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))
    after = broker.stub.Pop(pop, timeout=10).messages  # --flush sync: committed before this answer
    assert len(during) == len(after) == 8
    broker.restart(kill=True)
    # Nothing was acked: every message is delivered again once its invisible time has passed.
    again: set[str] = set()
    redeliver = pb.PopRequest(topic=TOPIC, group="g", filter="*", max_messages=32, invisible_ms=60000, poll_ms=2000)
    for _ in range(10):
        again |= {m.stored.message.message_id for m in broker.stub.Pop(redeliver, timeout=10).messages}
        if len(again) == len(sent):
            break
    assert sorted(again) == sorted(sent)
