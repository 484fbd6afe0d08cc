"""A broker that comes up after a group's first receive (discovery adds it, or it comes back on an empty data
directory under the same name) is told of the group by the proxy at once (proxy/receive/announce.py): under
`--consume-from latest` the group then gets every message sent there from then on, not only those sent after its
first receive reached that broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from tests.dns_server import DnsServer
from tests.integration.proxy.client import V2Client
from tests.procs import ServerProcess, wait_until

SRV = "_grpc._tcp.popgate-broker.test."
TOPIC, GROUP = "orders", "billing"


def latest_broker(name: str, data_dir: Path, listen: str = "127.0.0.1:0") -> ServerProcess:
    args = ["--name", name, "--listen", listen, "--data-dir", str(data_dir), "--topic", TOPIC]
    return ServerProcess("broker", [*args, "--consume-from", "latest"]).start()


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    processes: list[ServerProcess] = []
    yield processes
    for process in reversed(processes):
        process.stop()


def routed(client: V2Client) -> set[str]:
    request = pb.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
    return {queue.broker.name for queue in client.stub.QueryRoute(request, timeout=5).message_queues}


def sent_then_received(client: V2Client, count: int) -> set[bytes]:
    """Send `count` messages one by one, then receive (and ack) until three receives in a row are empty."""
    for i in range(count):
        assert client.send(TOPIC, [f"m{i}".encode()]).status.code == v2.Code.OK
    got: set[bytes] = set()
    empty = 0
    while empty < 3:
        _, messages = client.receive(TOPIC, GROUP, poll_s=1)
        empty = 0 if messages else empty + 1
        if messages:
            got |= {m.body for m in messages}
            client.ack(TOPIC, GROUP, messages)
    return got


def test_a_broker_discovery_adds_after_a_groups_first_receive_starts_it_where_the_others_did(
    tmp_path: Path, started: list[ServerProcess]
) -> None:
    b1 = latest_broker("b1", tmp_path / "b1")
    started.append(b1)
    with DnsServer() as dns:
        target = {"b1": ("b1.popgate-broker.test.", ("127.0.0.1", b1.port))}
        dns.publish(SRV, dict(target.values()))
        args = ["--broker-srv", SRV, "--broker-dns-server", dns.address, "--broker-dns-interval-s", "0.2"]
        proxy = ServerProcess("proxy", [*args, "--listen", "127.0.0.1:0"]).start()
        started.append(proxy)
        client = V2Client(proxy.address)
        try:
            assert client.receive(TOPIC, GROUP, poll_s=1)[1] == []  # the group consumes: nothing yet
            b2 = latest_broker("b2", tmp_path / "b2")
            started.append(b2)
            target["b2"] = ("b2.popgate-broker.test.", ("127.0.0.1", b2.port))
            dns.publish(SRV, dict(target.values()))  # scaled out
            assert wait_until(lambda: routed(client) == {"b1", "b2"}, timeout=10)
            assert sent_then_received(client, 20) == {f"m{i}".encode() for i in range(20)}
        finally:
            client.close()


def test_a_broker_back_on_an_empty_data_dir_under_its_name_starts_the_group_where_the_others_did(
    tmp_path: Path, started: list[ServerProcess]
) -> None:
    b1 = latest_broker("b1", tmp_path / "b1")
    b2 = latest_broker("b2", tmp_path / "b2")
    started += [b1, b2]
    brokers = ["--broker", f"b1={b1.address}", "--broker", f"b2={b2.address}"]
    proxy = ServerProcess("proxy", [*brokers, "--listen", "127.0.0.1:0"]).start()
    started.append(proxy)
    client = V2Client(proxy.address)
    try:
        assert client.receive(TOPIC, GROUP, poll_s=1)[1] == []
        b2.stop()
        assert wait_until(lambda: routed(client) == {"b1"}, timeout=10)
        b2 = latest_broker("b2", tmp_path / "b2-new", listen=b2.address)  # its volume lost, same name and address
        started.append(b2)
        assert wait_until(lambda: routed(client) == {"b1", "b2"}, timeout=10)
        assert sent_then_received(client, 20) == {f"m{i}".encode() for i in range(20)}
    finally:
        client.close()
