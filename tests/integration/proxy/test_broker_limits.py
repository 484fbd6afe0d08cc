"""The proxy's batch and long-polling ranges are its own settings, separate from each broker's: a broker whose
limits are smaller than the proxy's serves what it can (fewer messages, a shorter hold). Before, every such receive
failed with a client-error code (BAD_REQUEST "max messages 32 is outside 1..4", ILLEGAL_POLLING_TIME)."""

from __future__ import annotations

import uuid
from pathlib import Path

from popgate_pb.v2 import definition_pb2 as v2

from popgate.cli.cluster import Cluster, ClusterConfig
from tests.integration.proxy.client import V2Client


def test_a_receive_beyond_a_brokers_limits_is_served_within_them(tmp_path: Path) -> None:
    config = ClusterConfig(
        brokers=1,
        listen="127.0.0.1:0",
        data_dir=tmp_path / "c",
        receive_mode="longpoll",
        broker_args=("--max-pop-batch", "4", "--max-poll-s", "300ms"),
    )
    topic, group = f"limits-{uuid.uuid4().hex[:8]}", "g"
    with Cluster(config) as cluster:
        client = V2Client(cluster.endpoint)
        try:
            client.send(topic, [b"m%d" % i for i in range(6)])
            status, first = client.receive(topic, group, batch=32, poll_s=5)
            assert (status.code, len(first)) == (v2.OK, 4), status
            status, rest = client.receive(topic, group, batch=32, poll_s=5)
            assert (status.code, len(rest)) == (v2.OK, 2), status
            client.ack(topic, group, first + rest)
            status, none = client.receive(topic, group, batch=32, poll_s=5)  # held 0.3 s at the broker: empty
            assert (status.code, none) == (v2.MESSAGE_NOT_FOUND, []), status
        finally:
            client.close()
