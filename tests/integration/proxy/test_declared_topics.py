"""Brokers with auto-create off serve the topics they were started with (`--topic`), through the proxy, in
every receive mode; a topic no broker has is TOPIC_NOT_FOUND, stored nowhere."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from popgate_pb.v2 import definition_pb2 as v2

from popgate.cli.cluster import Cluster, ClusterConfig
from tests.integration.proxy.client import V2Client


@pytest.mark.parametrize("mode", ["notify", "longpoll", "adaptive"])
def test_declared_topics_work_and_others_are_topic_not_found(tmp_path: Path, mode: str) -> None:
    config = ClusterConfig(
        brokers=2,
        listen="127.0.0.1:0",
        data_dir=tmp_path,
        receive_mode=mode,
        broker_args=("--no-auto-create", "--topic", "orders"),
    )
    with Cluster(config) as cluster:
        client = V2Client(cluster.endpoint)
        try:
            assert client.send("orders", [b"a", b"b"]).status.code == v2.OK
            got: list[v2.Message] = []
            end = time.monotonic() + 20
            while len(got) < 2 and time.monotonic() < end:
                got.extend(client.receive("orders", "g", poll_s=1)[1])
            assert sorted(m.body for m in got) == [b"a", b"b"]

            sent = client.send("nowhere", [b"x"])
            assert sent.status.code == v2.TOPIC_NOT_FOUND, sent.status
            assert "nowhere" in sent.status.message
            status, messages = client.receive("nowhere", "g", poll_s=1)
            assert status.code == v2.TOPIC_NOT_FOUND and messages == []
        finally:
            client.close()
