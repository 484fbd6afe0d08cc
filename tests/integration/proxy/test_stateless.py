"""Any proxy instance can ack what another delivered; a restarted proxy loses nothing."""

from __future__ import annotations

import time

from popgate_pb.v2 import definition_pb2 as v2

from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster


def receive_all(
    client: V2Client, topic: str, group: str, want: int, *, limit_s: float = 30, invisible_s: int = 30
) -> list[v2.Message]:
    got: list[v2.Message] = []
    end = time.monotonic() + limit_s
    while len(got) < want and time.monotonic() < end:
        got.extend(client.receive(topic, group, poll_s=1, invisible_s=invisible_s)[1])
    return got


def test_message_received_through_one_proxy_is_acked_through_another(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=2)
    other = cluster.add_proxy(extra=("--min-invisible-s", "1"))
    first, second = V2Client(cluster.endpoint), V2Client(other)
    try:
        assert first.send("stateless", [b"a", b"b", b"c", b"d"]).status.code == v2.OK
        got = receive_all(first, "stateless", "g", 4, invisible_s=1)
        assert sorted(m.body for m in got) == [b"a", b"b", b"c", b"d"]
        reply = second.ack("stateless", "g", got)
        assert reply.status.code == v2.OK, reply
        # Acked: nothing comes back on either proxy, though un-acked messages would after 1 s.
        assert receive_all(second, "stateless", "g", 1, limit_s=3) == []
        # A second ack of the same handles is refused (already acked), never silently "OK".
        assert first.ack("stateless", "g", got[:1]).status.code == v2.INVALID_RECEIPT_HANDLE
    finally:
        first.close()
        second.close()


def test_unacked_message_returns_through_any_proxy_with_attempt_2(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=1)
    other = cluster.add_proxy(extra=("--min-invisible-s", "1"))
    first, second = V2Client(cluster.endpoint), V2Client(other)
    try:
        first.send("again", [b"x"])
        status, got = first.receive("again", "g", invisible_s=1, poll_s=2)
        assert [m.body for m in got] == [b"x"], status
        back = receive_all(second, "again", "g", 1, limit_s=10)
        assert [m.system_properties.delivery_attempt for m in back] == [2]
        assert second.ack("again", "g", back).status.code == v2.OK
    finally:
        first.close()
        second.close()
