"""Broker discovery: the proxy follows a SRV name (a headless Service) as brokers are added and removed, without
a restart, and reaches them over TLS by their DNS names (the prod overlay's set-up)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from tests.dns_server import DnsServer
from tests.integration.proxy.client import V2Client
from tests.pki import issue
from tests.procs import ServerProcess, broker_args, wait_until

SRV = "_grpc._tcp.popgate-broker.test."
TOPIC, GROUP = "found", "g"


def target(name: str) -> str:
    return f"{name}.popgate-broker.test."


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[dict[str, ServerProcess]]:
    pki = issue(tmp_path / "pki", names=("*.popgate-broker.test",))
    tls = ("--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    started = {
        name: ServerProcess("broker", broker_args(name, tmp_path / name, *tls)).start() for name in ("b1", "b2", "b3")
    }
    (tmp_path / "ca.crt").write_bytes(pki.ca.read_bytes())
    yield started
    for broker in started.values():
        broker.stop()


def routed(client: V2Client) -> set[str]:
    """The brokers a client's route lists (QueryRoute through the proxy)."""
    request = pb.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
    return {queue.broker.name for queue in client.stub.QueryRoute(request, timeout=5).message_queues}


def test_the_proxy_follows_brokers_added_and_removed_behind_a_name(
    brokers: dict[str, ServerProcess], tmp_path: Path
) -> None:
    with DnsServer() as dns:
        publish = {name: (target(name), ("127.0.0.1", b.port)) for name, b in brokers.items()}
        dns.publish(SRV, dict([publish["b1"]]))
        args = ["--broker-srv", SRV, "--broker-dns-server", dns.address, "--broker-tls-ca", str(tmp_path / "ca.crt")]
        args += ["--broker-dns-interval-s", "0.2", "--broker-forget-s", "1", "--listen", "127.0.0.1:0"]
        proxy = ServerProcess("proxy", args).start()
        pid = proxy.proc.pid if proxy.proc else None
        client = V2Client(proxy.address)
        try:
            assert routed(client) == {"b1"}
            dns.publish(SRV, dict([publish["b1"], publish["b2"], publish["b3"]]))  # scaled up
            assert wait_until(lambda: routed(client) == {"b1", "b2", "b3"}, timeout=10)
            bodies = [f"m{i}".encode() for i in range(30)]
            assert all(client.send(TOPIC, [body]).status.code == 20000 for body in bodies)  # one a call: spread

            dns.publish(SRV, dict([publish["b2"], publish["b3"]]))  # b1 gone from DNS: retired after forget_s
            assert wait_until(lambda: routed(client) == {"b2", "b3"}, timeout=10)
            assert client.send(TOPIC, [b"after b1 left"]).status.code == 20000
            received: list[bytes] = []
            while True:
                status, messages = client.receive(TOPIC, GROUP, poll_s=1)
                if not messages:
                    break
                received += [m.body for m in messages]
                client.ack(TOPIC, GROUP, messages)
            assert b"after b1 left" in received
            assert set(received) < {*bodies, b"after b1 left"}  # b1's share is no longer reached

            dns.publish(SRV, dict([publish["b1"], publish["b2"], publish["b3"]]))  # b1 back: its share with it
            assert wait_until(lambda: routed(client) == {"b1", "b2", "b3"}, timeout=10)
            status, messages = client.receive(TOPIC, GROUP, poll_s=2)
            assert messages and {m.body for m in messages} <= set(bodies) - set(received)
            assert proxy.proc is not None and proxy.proc.pid == pid and proxy.alive()
        finally:
            client.close()
            proxy.stop()
