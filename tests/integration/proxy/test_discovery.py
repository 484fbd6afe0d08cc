"""Broker discovery: the proxy follows a SRV name (a headless Service) as brokers are added and removed, without
a restart, and reaches them over TLS by their DNS names (the prod overlay's set-up)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from tests.dns_server import DnsServer
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.test_broker_failure import first_waiting_consumer_gets
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


def test_a_broker_that_moves_while_down_is_watched_again_at_its_new_address(tmp_path: Path) -> None:
    """Adaptive long polls, 2 Pops over 3 brokers, the third watched. That broker stops, is awaited while down, and
    comes back at another address (a rescheduled pod): it is watched there, so a message stored on it reaches a
    waiting consumer, not the end of both long polls."""
    brokers = {name: ServerProcess("broker", broker_args(name, tmp_path / name)).start() for name in ("b1", "b2", "b3")}
    stubs: dict[str, broker_pb2_grpc.BrokerStub] = {}

    def held() -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for name, broker in brokers.items():
            stub = stubs.get(broker.address) or broker_pb2_grpc.BrokerStub(grpc.insecure_channel(broker.address))  # type: ignore[no-untyped-call]
            stubs[broker.address] = stub
            try:
                stats = stub.Stats(bpb.StatsRequest(), timeout=2)
            except grpc.RpcError:
                out[name] = None
                continue
            out[name] = (stats.held_pops, stats.held_notifications)
        return out

    with DnsServer() as dns:

        def publish() -> None:
            dns.publish(SRV, {target(name): ("127.0.0.1", b.port) for name, b in brokers.items()})

        publish()
        args = ["--broker-srv", SRV, "--broker-dns-server", dns.address, "--broker-dns-interval-s", "0.2"]
        args += ["--broker-forget-s", "60", "--listen", "127.0.0.1:0", "--receive-mode", "adaptive"]
        args += [
            "--min-invisible-s",
            "1",
            "--adaptive-concurrency-per-broker",
            "0",
            "--adaptive-rate-threshold",
            "0.01",
        ]
        proxy = ServerProcess("proxy", args).start()
        clients = [V2Client(proxy.address) for _ in range(2)]
        try:
            with ThreadPoolExecutor(2) as pool:
                waiting = [pool.submit(c.receive, TOPIC, GROUP, batch=1, invisible_s=30, poll_s=20) for c in clients]
                assert wait_until(lambda: sorted(c or (-1, -1) for c in held().values()) == [(0, 1), (1, 0), (1, 0)])
                watched = next(name for name, counts in held().items() if counts == (0, 1))
                brokers[watched].stop()
                # its watch fails; coverage looks again WATCH_RETRY_S later, finds it down and waits for it to be up
                time.sleep(2.0)
                moved = broker_args(watched, tmp_path / watched, listen="127.0.0.1:0")
                brokers[watched] = ServerProcess("broker", moved).start()
                publish()
                assert wait_until(lambda: held()[watched] == (0, 1), timeout=6), held()
                stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(brokers[watched].address))  # type: ignore[no-untyped-call]
                stub.Send(
                    bpb.SendRequest(messages=[bpb.Message(topic=TOPIC, message_id="M", body=b"moved")]), timeout=5
                )
                first_waiting_consumer_gets(waiting, b"moved", sent=time.monotonic())
        finally:
            for client in clients:
                client.close()
            proxy.stop()
            for broker in brokers.values():
                broker.stop()


def test_a_broker_discovery_adds_is_routed_only_once_its_health_check_passes(
    brokers: dict[str, ServerProcess], tmp_path: Path
) -> None:
    """A name DNS lists where nothing listens never appears in QueryRoute; a live one appears well within a health
    interval of the lookup that found it."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead_port = unused.getsockname()[1]  # closed again: nothing listens there
    with DnsServer() as dns:
        b1, b2 = (("127.0.0.1", brokers[name].port) for name in ("b1", "b2"))
        dns.publish(SRV, {target("b1"): b1})
        args = ["--broker-srv", SRV, "--broker-dns-server", dns.address, "--broker-tls-ca", str(tmp_path / "ca.crt")]
        args += ["--broker-dns-interval-s", "0.2", "--health-interval-s", "2", "--listen", "127.0.0.1:0"]
        proxy = ServerProcess("proxy", args).start()
        client = V2Client(proxy.address)
        try:
            assert routed(client) == {"b1"}
            dns.publish(SRV, {target("b1"): b1, target("dead"): ("127.0.0.1", dead_port)})
            seen: set[str] = set()
            end = time.monotonic() + 2.5  # past a health round: the dead one was found and checked
            while time.monotonic() < end:
                seen |= routed(client)
                time.sleep(0.02)
            assert seen == {"b1"}
            dns.publish(SRV, {target("b1"): b1, target("dead"): ("127.0.0.1", dead_port), target("b2"): b2})
            found = time.monotonic()
            assert wait_until(lambda: routed(client) == {"b1", "b2"}, timeout=5)
            assert time.monotonic() - found < 1.5  # the DNS interval and one check, not the 2 s health interval
        finally:
            client.close()
            proxy.stop()


def test_an_ack_through_a_proxy_that_has_not_found_the_broker_yet_is_retriable_and_goes_through(
    tmp_path: Path,
) -> None:
    """Proxies look DNS up on their own: a client receives through proxy A, which found a new broker, and acks
    through proxy B, whose next lookup is not due. B answers those entries HA_NOT_AVAILABLE (retriable), looks up
    at once and acks them on the retry; a proxy whose DNS does not answer at all answers them retriable too."""
    ok, ha_not_available = 20000, 50002
    brokers = {name: ServerProcess("broker", broker_args(name, tmp_path / name)).start() for name in ("b1", "b2")}
    silent_dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent_dns.bind(("127.0.0.1", 0))  # never answers
    proxies: list[ServerProcess] = []
    clients: list[V2Client] = []
    try:
        with DnsServer() as dns:
            publish = {name: (target(name), ("127.0.0.1", b.port)) for name, b in brokers.items()}
            dns.publish(SRV, dict([publish["b1"]]))
            common = ["--broker-srv", SRV, "--listen", "127.0.0.1:0", "--broker-dns-server"]
            for args in (
                [dns.address, "--broker-dns-interval-s", "0.2"],
                [dns.address, "--broker-dns-interval-s", "60"],
            ):
                proxies.append(ServerProcess("proxy", common + args).start())
            clients += [V2Client(proxy.address) for proxy in proxies]
            a, b = clients
            assert routed(b) == {"b1"}
            dns.publish(SRV, dict([publish["b1"], publish["b2"]]))  # scaled up: A finds b2, B's lookup is not due
            assert wait_until(lambda: routed(a) == {"b1", "b2"}, timeout=10)
            assert all(a.send(TOPIC, [f"m{i}".encode()]).status.code == ok for i in range(20))
            messages: list[v2.Message] = []
            while len(messages) < 20:
                status, got = a.receive(TOPIC, GROUP, poll_s=1)
                assert got, status
                messages += got
            assert {m.system_properties.receipt_handle.split("~")[1] for m in messages} == {"b1", "b2"}

            silent = ServerProcess("proxy", common + ["{}:{}".format(*silent_dns.getsockname())]).start()
            proxies.append(silent)
            clients.append(V2Client(silent.address))
            codes = {entry.status.code for entry in clients[2].ack(TOPIC, GROUP, messages[:3]).entries}
            assert codes == {ha_not_available}

            first = [entry.status.code for entry in b.ack(TOPIC, GROUP, messages).entries]
            assert set(first) <= {ok, ha_not_available} and ha_not_available in first
            left = [m for m, code in zip(messages, first, strict=True) if code != ok]
            end = time.monotonic() + 5  # what the SDK's retries take at most
            while left and time.monotonic() < end:
                time.sleep(0.1)
                answer = b.ack(TOPIC, GROUP, left).entries
                assert {entry.status.code for entry in answer} <= {ok, ha_not_available}
                left = [m for m, entry in zip(left, answer, strict=True) if entry.status.code != ok]
            assert not left
    finally:
        for client in clients:
            client.close()
        for proxy in proxies:
            proxy.stop()
        for broker in brokers.values():
            broker.stop()
        silent_dns.close()


def test_a_proxy_is_ready_only_once_its_first_lookup_has_answered(tmp_path: Path) -> None:
    """A proxy started while its nameserver does not answer knows no broker: its health says NOT_SERVING (so a
    readiness probe keeps clients away) until a lookup answers, then SERVING."""
    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1")).start()
    proxy = None
    try:
        with DnsServer() as dns:
            dns.publish(SRV, {target("b1"): ("127.0.0.1", broker.port)})
            dns.silent = True
            args = ["--broker-srv", SRV, "--broker-dns-server", dns.address, "--broker-dns-interval-s", "0.2"]
            proxy = ServerProcess("proxy", [*args, "--listen", "127.0.0.1:0"]).start()
            with grpc.insecure_channel(proxy.address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)

                def status() -> int:
                    return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status)

                assert status() == health_pb2.HealthCheckResponse.NOT_SERVING
                dns.silent = False
                assert wait_until(lambda: status() == health_pb2.HealthCheckResponse.SERVING, timeout=15)
                client = V2Client(proxy.address)
                try:
                    assert routed(client) == {"b1"}
                finally:
                    client.close()
    finally:
        if proxy is not None:
            proxy.stop()
        broker.stop()


@pytest.mark.parametrize("first", [("b1", "b2"), ("b1",)], ids=["two", "one"])
@pytest.mark.parametrize("mode", ["notify", "adaptive"])
def test_a_receive_held_when_discovery_adds_a_broker_gets_its_first_message(
    tmp_path: Path, mode: str, first: tuple[str, ...]
) -> None:
    """A broker scaled out while a consumer long-polls is watched by that receive once it is up: the first message
    stored there answers it, not an empty answer at the end of its poll (docs/RECEIVE.md, "Brokers added"); also
    when the receive held a Pop at the only broker there was."""
    started = {name: ServerProcess("broker", broker_args(name, tmp_path / name)).start() for name in first}
    proxy = None
    try:
        with DnsServer() as dns, ThreadPoolExecutor(1) as pool:
            publish = {name: (target(name), ("127.0.0.1", b.port)) for name, b in started.items()}
            dns.publish(SRV, dict(publish.values()))
            args = ["--broker-srv", SRV, "--broker-dns-server", dns.address, "--broker-dns-interval-s", "0.2"]
            proxy = ServerProcess("proxy", [*args, "--receive-mode", mode, "--listen", "127.0.0.1:0"]).start()
            client = V2Client(proxy.address)
            try:
                assert wait_until(lambda: routed(client) == set(first), timeout=10)
                held = pool.submit(client.receive, TOPIC, GROUP, poll_s=20)
                started["b3"] = ServerProcess("broker", broker_args("b3", tmp_path / "b3")).start()
                dns.publish(SRV, {**dict(publish.values()), target("b3"): ("127.0.0.1", started["b3"].port)})
                assert wait_until(lambda: routed(client) == {*first, "b3"}, timeout=10)
                with grpc.insecure_channel(started["b3"].address) as channel:
                    stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
                    stub.Send(bpb.SendRequest(messages=[bpb.Message(topic=TOPIC, body=b"on b3")]), timeout=5)
                status, messages = held.result(timeout=30)
                assert status.code == v2.OK and [m.body for m in messages] == [b"on b3"]
            finally:
                client.close()
    finally:
        if proxy is not None:
            proxy.stop()
        for broker in started.values():
            broker.stop()
