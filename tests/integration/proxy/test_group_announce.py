"""A broker that comes up after a group's first receive (discovery adds it, or it comes back on an empty data
directory under the same name) is told of the group by the proxy at once (proxy/receive/announce.py): under
`--consume-from latest` the group then gets every message sent there from then on, not only those sent after its
first receive reached that broker."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract.consumers import MAX_EARLY_LOOKS
from proxy.receive.announce import HOLD_S
from tests.dns_server import DnsServer
from tests.integration.proxy.client import V2Client
from tests.procs import ServerProcess, broker_args, wait_until

SRV = "_grpc._tcp.popgate-broker.test."
TOPIC, GROUP = "orders", "billing"
LATEST_MANY = ("--consume-from", "latest", "--max-groups", "50000")  # room for more groups than early looks


def latest_broker(name: str, data_dir: Path, listen: str = "127.0.0.1:0") -> ServerProcess:
    args = ["--name", name, "--listen", listen, "--data-dir", str(data_dir), "--topic", TOPIC]
    return ServerProcess("broker", [*args, "--consume-from", "latest"]).start()


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    processes: list[ServerProcess] = []
    yield processes
    for process in reversed(processes):
        process.stop()


def routed(client: V2Client, topic: str = TOPIC) -> set[str]:
    request = pb.QueryRouteRequest(topic=v2.Resource(name=topic))
    return {queue.broker.name for queue in client.stub.QueryRoute(request, timeout=5).message_queues}


def sent_then_received(client: V2Client, count: int) -> set[bytes]:
    """Send `count` messages one by one, then receive (and ack) until three receives in a row are empty."""
    for i in range(count):
        assert client.send(TOPIC, [f"m{i}".encode()]).status.code == v2.Code.OK
    return received_all(client, TOPIC, GROUP)


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


def received_all(client: V2Client, topic: str, group: str) -> set[bytes]:
    """Receive (and ack) from `topic` as `group` until three receives in a row are empty."""
    got: set[bytes] = set()
    empty = 0
    while empty < 3:
        _, messages = client.receive(topic, group, poll_s=1)
        empty = 0 if messages else empty + 1
        if messages:
            got |= {m.body for m in messages}
            client.ack(topic, group, messages)
    return got


def cold_fillers_hot(tmp_path: Path, started: list[ServerProcess], fillers: int, topic: str) -> list[ServerProcess]:
    """Two `latest` brokers (auto-create) and a proxy: "cold" receives topic T first, then `fillers` other groups
    receive `topic`, then "hot" receives T. The brokers, then the proxy."""
    brokers = [
        ServerProcess("broker", broker_args(name, tmp_path / name, *LATEST_MANY)).start() for name in ("b1", "b2")
    ]
    started += brokers
    listed = [arg for name, b in zip(("b1", "b2"), brokers, strict=True) for arg in ("--broker", f"{name}={b.address}")]
    proxy = ServerProcess("proxy", [*listed, "--listen", "127.0.0.1:0"]).start()
    started.append(proxy)
    client = V2Client(proxy.address)
    try:
        assert client.send("T", [b"before"]).status.code == v2.Code.OK
        assert client.send(topic, [b"before"]).status.code == v2.Code.OK
        client.receive("T", "cold", poll_s=0)

        def fill(first: int) -> None:
            filler = V2Client(proxy.address)
            for i in range(first, fillers, 8):
                filler.receive(topic, f"f{i}", poll_s=0)
            filler.close()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(fill, range(8)))
        client.receive("T", "hot", poll_s=0)
    finally:
        client.close()
    return [*brokers, proxy]


def back_empty(tmp_path: Path, started: list[ServerProcess], client: V2Client, b2: ServerProcess) -> ServerProcess:
    """`b2` stopped, its data directory removed; the broker it becomes when started again at its address."""
    b2.stop()
    assert wait_until(lambda: routed(client, "T") == {"b1"}, timeout=10)
    shutil.rmtree(tmp_path / "b2")
    b2 = ServerProcess("broker", broker_args("b2", tmp_path / "b2", *LATEST_MANY, listen=b2.address))
    started.append(b2)
    return b2


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~60 s of receives from 8 threads; twice that on a loaded host
def test_a_broker_back_empty_keeps_the_most_recently_received_groups_past_its_early_looks(
    tmp_path: Path, started: list[ServerProcess]
) -> None:
    """More groups than a broker keeps early looks of (MAX_EARLY_LOOKS): the group received last is among those it
    keeps, so under `latest` it gets every message sent there after the broker came back."""
    _, b2, proxy = cold_fillers_hot(tmp_path, started, MAX_EARLY_LOOKS + 100, "F")
    client = V2Client(proxy.address)
    try:
        back_empty(tmp_path, started, client, b2).start()
        assert wait_until(lambda: routed(client, "T") == {"b1", "b2"}, timeout=10)
        time.sleep(HOLD_S)  # every announcement answered
        bodies = [f"m{i}".encode() for i in range(40)]
        for body in bodies:
            assert client.send("T", [body]).status.code == v2.Code.OK
        assert received_all(client, "T", "hot") - {b"before"} == set(bodies)
    finally:
        client.close()


def test_sends_wait_for_the_announcements_to_a_broker_back_empty(tmp_path: Path, started: list[ServerProcess]) -> None:
    """A broker back on an empty data directory is told of thousands of groups (many rounds of announcements) while
    an application keeps sending: no send creates the topic there before a group is announced, so under `latest`
    every group gets every message, the group received first (told first) as the one received last."""
    _, b2, proxy = cold_fillers_hot(tmp_path, started, 3_000, "T")
    client = V2Client(proxy.address)
    try:
        b2 = back_empty(tmp_path, started, client, b2)
        sent: list[bytes] = []
        stop = threading.Event()

        def send() -> None:
            sender = V2Client(proxy.address)
            while not stop.is_set():
                body = f"m{len(sent)}".encode()
                if sender.send("T", [body]).status.code == v2.Code.OK:
                    sent.append(body)
            sender.close()

        with ThreadPoolExecutor(1) as pool:
            sending = pool.submit(send)
            b2.start()
            assert wait_until(lambda: routed(client, "T") == {"b1", "b2"}, timeout=10)
            time.sleep(2)
            stop.set()
            sending.result()
        for group in ("cold", "hot"):
            assert received_all(client, "T", group) - {b"before"} == set(sent), group
    finally:
        client.close()
