"""A broker is routed to only under the name it runs under (its --name): the name it writes into every receipt
handle, by which acks find it."""

from __future__ import annotations

from pathlib import Path

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from tests.integration.proxy.client import V2Client
from tests.procs import ServerProcess, broker_args, wait_until

TOPIC, GROUP = "named", "g"
OK = 20000


def routed(client: V2Client) -> set[str]:
    request = pb.QueryRouteRequest(topic=v2.Resource(name=TOPIC))
    return {queue.broker.name for queue in client.stub.QueryRoute(request, timeout=5).message_queues}


def test_a_broker_listed_under_another_name_than_its_own_is_kept_out_of_routing_until_it_runs_under_it(
    tmp_path: Path,
) -> None:
    """Listed as b2 but running as b1 (its --name left at the default): kept out of routing with an ERROR naming
    both names and its address, so every message sent is acked; once it runs as b2 at that address, routed."""
    b1 = ServerProcess("broker", broker_args("b1", tmp_path / "b1")).start()
    misnamed = ServerProcess("broker", broker_args("b1", tmp_path / "other")).start()
    args = ["--broker", f"b1={b1.address}", "--broker", f"b2={misnamed.address}", "--listen", "127.0.0.1:0"]
    proxy = ServerProcess("proxy", args + ["--health-interval-s", "0.2"]).start()
    client = V2Client(proxy.address)
    try:
        assert routed(client) == {"b1"}
        errors = [line for line in proxy.lines if " ERROR " in line]
        assert any("b2" in line and "'b1'" in line and misnamed.address in line for line in errors), proxy.lines[-8:]
        assert all(client.send(TOPIC, [f"m{i}".encode()]).status.code == OK for i in range(20))
        received = 0
        while received < 20:
            status, messages = client.receive(TOPIC, GROUP, poll_s=1)
            assert messages, status
            answer = client.ack(TOPIC, GROUP, messages)
            assert [entry.status.code for entry in answer.entries] == [OK] * len(messages)
            received += len(messages)

        port = misnamed.port
        misnamed.stop()
        misnamed = ServerProcess("broker", broker_args("b2", tmp_path / "b2", listen=f"127.0.0.1:{port}")).start()
        assert wait_until(lambda: routed(client) == {"b1", "b2"}, timeout=10)
    finally:
        client.close()
        proxy.stop()
        misnamed.stop()
        b1.stop()
