"""Connections whose handshake is slow (a server far away, TLS): the SDK's channel to a proxy and the proxy's
channel to a broker still connect. A forwarder that answers nothing for 1.5 s stands in for the distance."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import Producer, RetryPolicy, SimpleConsumer
from popgate.cli.cluster import Cluster, ClusterConfig
from tests.forwarder import Forwarder
from tests.integration.sdk.conftest import drain
from tests.procs import ServerProcess, broker_args

SLOW_S = 1.5  # over the 1 s cap of both channels' reconnect back-off


@pytest.fixture
def slow(cluster: Cluster) -> Iterator[Forwarder]:
    forwarder = Forwarder(cluster.endpoint, SLOW_S)
    yield forwarder
    forwarder.close()


def test_the_sdk_reaches_a_proxy_whose_handshake_is_slow(slow: Forwarder) -> None:
    with Producer(slow.address, request_timeout=5) as producer:
        assert producer.send("slow-handshake", b"x").message_id


def test_the_proxy_reaches_a_broker_whose_handshake_is_slow(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:  # everything stopped, whatever fails
        broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1"))
        broker.start()
        stack.callback(broker.stop)
        forwarder = Forwarder(broker.address, SLOW_S)
        stack.callback(forwarder.close)
        (tmp_path / "proxy").mkdir()
        cluster = Cluster(ClusterConfig(brokers=0, listen="127.0.0.1:0", data_dir=tmp_path / "proxy"))
        stack.callback(cluster.stop)
        cluster.add_proxy("127.0.0.1:0", ["--broker", f"b1={forwarder.address}"])
        patient = RetryPolicy(max_attempts=20)
        producer = stack.enter_context(Producer(cluster.endpoint, retry=patient))
        consumer = stack.enter_context(SimpleConsumer(cluster.endpoint, "g", "far", retry=patient))
        producer.send("far", b"over a slow link")
        assert [m.body for m in drain(consumer, 1, timeout=30)] == [b"over a slow link"]
