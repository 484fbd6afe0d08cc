"""The x-mq-client-id a client names itself by is bounded: the proxy remembers the ids it hears from (auto_renew
liveness), and an unbounded id let one client grow the proxy by hundreds of MiB with Heartbeats (a review's probe:
7,000-character ids, 394 MiB in 20 s)."""

from __future__ import annotations

import grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import _wire as wire
from proxy.v2.access import CLIENT_ID, MAX_CLIENT_ID_CHARS
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster

LONG = "h" * (MAX_CLIENT_ID_CHARS + 1)


def test_an_over_long_client_id_is_a_bad_request_and_nothing_is_popped_for_it(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(brokers=1)
    client = V2Client(cluster.endpoint)
    try:
        ok = client.stub.Heartbeat(pb.HeartbeatRequest(), metadata=((CLIENT_ID, "host@1@0@abc"),), timeout=5)
        assert ok.status.code == v2.OK
        refused = client.stub.Heartbeat(pb.HeartbeatRequest(), metadata=((CLIENT_ID, LONG),), timeout=5)
        assert refused.status.code == v2.BAD_REQUEST, refused.status
        assert f"at most {MAX_CLIENT_ID_CHARS}" in refused.status.message

        client.send("t", [b"kept for a client with a proper id"])
        request = wire.receive_request("g", wire.Subscription("t"), max=1, invisible=30, wait=1)
        request.auto_renew = True
        frames = list(client.stub.ReceiveMessage(request, metadata=((CLIENT_ID, LONG),), timeout=5))
        assert [f.status.code for f in frames if f.HasField("status")] == [v2.BAD_REQUEST]
        assert not [f for f in frames if f.HasField("message")]
        status, messages = client.receive("t", "g")
        assert [m.body for m in messages] == [b"kept for a client with a proper id"], status

        telemetry = client.stub.Telemetry(iter([pb.TelemetryCommand()]), metadata=((CLIENT_ID, LONG),), timeout=5)
        assert [c.status.code for c in telemetry if c.HasField("status")] == [v2.BAD_REQUEST]
    except grpc.RpcError as exc:  # a status, not a gRPC error, is the contract
        raise AssertionError(f"gRPC error {exc.code()}: {exc.details()}") from exc
    finally:
        client.close()
