"""A receive answer cut off before its final status: its messages go back to their broker at once."""

from __future__ import annotations

import time

import pytest
from popgate_pb.v2 import definition_pb2 as v2

from sdk import _wire as wire
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster

INVISIBLE_S = 60
BODY = 1024 * 1024
COUNT = 4  # one Pop answer (4 MiB, under the broker's 8 MiB --max-pop-bytes)


@pytest.mark.parametrize("mode", ["longpoll", "notify"])
def test_messages_of_an_answer_its_client_left_mid_stream_are_received_again_at_once(
    make_cluster: MakeCluster, mode: str
) -> None:
    cluster = make_cluster(brokers=1, proxy_args=("--receive-mode", mode))
    # No BDP probing: the client's flow-control window stays small, so the proxy cannot hand the whole answer
    # (4 MiB) to grpc while the client reads only its first frames: the answer is cut before its status.
    leaving = V2Client(cluster.endpoint, options=[("grpc.http2.bdp_probe", 0)])
    other = V2Client(cluster.endpoint)
    try:
        sent = leaving.send("cut", [bytes([65 + i]) * BODY for i in range(COUNT)], timeout_s=30)
        assert [e.status.code for e in sent.entries] == [v2.OK] * COUNT
        request = wire.receive_request("g", wire.Subscription("cut"), max=32, invisible=INVISIBLE_S, wait=5)
        call = leaving.stub.ReceiveMessage(request, timeout=10)
        assert next(call).HasField("delivery_timestamp")
        assert next(call).message.body[:1] == b"A"
        call.cancel()  # the client goes away with one message of four, and no status: it uses none of them

        received: list[v2.Message] = []
        deadline = time.monotonic() + 15  # well below the invisible time
        while len(received) < COUNT and time.monotonic() < deadline:
            status, messages = other.receive("cut", "g", invisible_s=INVISIBLE_S, poll_s=2)
            assert status.code in (v2.OK, v2.MESSAGE_NOT_FOUND), status
            received += messages
        assert sorted(m.body[:1] for m in received) == [bytes([65 + i]) for i in range(COUNT)]
        # Handed back, not redelivered: the attempt count is unchanged.
        assert [m.system_properties.delivery_attempt for m in received] == [1] * COUNT
    finally:
        leaving.close()
        other.close()
