"""A broker connection that dies without a word (no FIN, no RST: a NAT or firewall entry lost, a blackholed link)
while the broker stays reachable on a new one: the proxy connects again and routes to it within seconds."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc

from tests.forwarder import Forwarder
from tests.integration.proxy.client import V2Client
from tests.procs import ServerProcess, broker_args, wait_until

TOPIC, GROUP = "silent", "g"
OK, HA_NOT_AVAILABLE = 20000, 50002
RECONNECTED = "connecting again"


def sent(client: V2Client, body: bytes) -> bool:
    try:
        return client.send(TOPIC, [body], timeout_s=2).status.code == OK
    except grpc.RpcError:
        return False


def test_a_broker_whose_connection_went_silent_is_connected_again_and_served(tmp_path: Path) -> None:
    """Every health check on the dead connection times out, and its channel never notices (it stayed down for good
    in a review's probe, though a new connection reached it at once): connected again, the broker is routed to and
    its messages served."""
    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1")).start()
    forwarder = Forwarder(broker.address)
    args = ["--broker", f"b1={forwarder.address}", "--listen", "127.0.0.1:0"]
    proxy = ServerProcess("proxy", args).start()
    client = V2Client(proxy.address)
    try:
        assert sent(client, b"before")
        forwarder.go_silent()
        assert wait_until(lambda: any("is now down" in line for line in proxy.lines), timeout=10), proxy.lines[-12:]
        started = time.monotonic()
        assert wait_until(lambda: sent(client, b"after"), timeout=15, interval=0.2), proxy.lines[-12:]
        back_s = time.monotonic() - started
        received: list[bytes] = []

        def both_received() -> bool:
            received.extend(message.body for message in client.receive(TOPIC, GROUP)[1])
            return {b"before", b"after"} <= set(received)

        assert wait_until(both_received)
        assert set(received) == {b"before", b"after"}, (received, back_s)
    finally:
        client.close()
        proxy.stop()
        forwarder.close()
        broker.stop()


def test_an_ack_to_a_hung_broker_is_refused_unsent_on_the_connection_made_again_too(tmp_path: Path) -> None:
    """A stopped broker (SIGSTOP) times its checks out on a connected channel: it is connected again, and that new
    connection never completes. An ack for it is still refused at once, unsent (HA_NOT_AVAILABLE, safe to retry),
    not held to its deadline, and goes through once the broker is back."""
    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1")).start()
    proxy = ServerProcess("proxy", ["--broker", f"b1={broker.address}", "--listen", "127.0.0.1:0"]).start()
    client = V2Client(proxy.address)
    assert broker.proc is not None
    try:
        assert sent(client, b"m")
        _, messages = client.receive(TOPIC, GROUP)
        broker.proc.send_signal(signal.SIGSTOP)
        try:
            assert wait_until(lambda: any(RECONNECTED in line for line in proxy.lines), timeout=15), proxy.lines[-12:]
            mark = len(proxy.lines)  # what the proxy logs from here on: its broker is down until SIGCONT
            started = time.monotonic()
            refused = client.ack(TOPIC, GROUP, messages, timeout_s=10)
            took = time.monotonic() - started
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        assert refused.status.code == HA_NOT_AVAILABLE, refused.status
        assert took < 1.0, f"held {took:.2f} s"
        assert wait_until(lambda: any("is now up" in line for line in proxy.lines[mark:]), timeout=15), proxy.lines[
            -12:
        ]
        assert client.ack(TOPIC, GROUP, messages).status.code == OK
    finally:
        client.close()
        proxy.stop()
        broker.stop()
