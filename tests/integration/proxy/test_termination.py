"""NotifyClientTermination gives back what the client held: its auto_renew messages are visible again in a second
(RocketMQ's proxy: 1 s), not at the end of their invisible time (a review's probe with the official PushConsumer:
messages its stopped pool would not take came back 57 s later; a FIFO group waited behind one as long)."""

from __future__ import annotations

import time

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import _wire as wire
from proxy.v2.access import CLIENT_ID
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster

GONE = ((CLIENT_ID, "host@4242@0@gone"),)
DEFAULT_INVISIBLE_S = 30  # the auto_renew receive's invisible time (the proxy's default_invisible_s)


def test_a_terminated_clients_auto_renew_messages_come_back_at_once(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=2, proxy_args=("--default-invisible-s", str(DEFAULT_INVISIBLE_S)))
    client = V2Client(cluster.endpoint)
    try:
        client.send("t", [b"held by a client that goes"])
        assert client.stub.Heartbeat(pb.HeartbeatRequest(), metadata=GONE, timeout=5).status.code == v2.OK
        request = wire.receive_request("g", wire.Subscription("t"), max=1, invisible=30, wait=5)
        request.auto_renew = True
        frames = list(client.stub.ReceiveMessage(request, metadata=GONE, timeout=10))
        assert [f.message.body for f in frames if f.HasField("message")] == [b"held by a client that goes"]

        ended = client.stub.NotifyClientTermination(
            pb.NotifyClientTerminationRequest(group=v2.Resource(name="g")), metadata=GONE, timeout=5
        )
        assert ended.status.code == v2.OK
        started = time.monotonic()
        status, messages = client.receive("t", "g", poll_s=10)
        waited = time.monotonic() - started
    finally:
        client.close()
    assert [(m.body, m.system_properties.delivery_attempt) for m in messages] == [(b"held by a client that goes", 2)]
    assert waited < DEFAULT_INVISIBLE_S / 2, f"back after {waited:.1f} s"
