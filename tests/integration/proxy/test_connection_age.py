"""A proxy whose client connections age (`--max-connection-age-s`, the deploy's 1800 s) and a producer that holds
one Telemetry stream for as long as it runs, as the official clients do: the stream outlives its connection's age
and grace, so the transaction checks the proxy sends on it still arrive."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Producer
from popgate.cli.cluster import Cluster, ClusterConfig
from proxy.v2.access import CLIENT_ID
from tests.integration.proxy.client import V2Client

AGE_ARGS = ("--min-invisible-s", "1", "--max-connection-age-s", "0.5", "--max-connection-age-grace-s", "0.5")
CHECK_ARGS = ("--transaction-immunity-s", "0.5", "--transaction-check-interval-s", "1")


def commands(outbox: queue.Queue[pb.TelemetryCommand | None]) -> Iterator[pb.TelemetryCommand]:
    while (command := outbox.get()) is not None:
        yield command


def test_a_producers_telemetry_stream_outlives_its_connections_age_and_still_gets_checks(tmp_path: Path) -> None:
    """Past the connection's age and grace (~1.1 s) the producer's Telemetry stream is still open and a half message
    left unresolved meanwhile is checked on it; the client's other calls go on, on a new connection."""
    config = ClusterConfig(
        brokers=1, listen="127.0.0.1:0", data_dir=tmp_path, proxy_args=AGE_ARGS, broker_args=CHECK_ARGS
    )
    with Cluster(config) as cluster:
        client = V2Client(cluster.endpoint)
        outbox: queue.Queue[pb.TelemetryCommand | None] = queue.Queue()
        metadata = ((CLIENT_ID, "host@1@0@aged"),)
        try:
            replies = client.stub.Telemetry(commands(outbox), metadata=metadata, timeout=30)
            publishing = v2.Publishing(topics=[v2.Resource(name="aged_tx")])
            outbox.put(pb.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER, publishing=publishing)))
            assert next(replies).HasField("settings")
            time.sleep(2.5)  # the connection's age and grace pass
            assert client.stub.Heartbeat(pb.HeartbeatRequest(), metadata=metadata, timeout=5).status.code == v2.OK
            with Producer(cluster.endpoint) as gone:  # leaves its transaction open: as if it died
                orphan = gone.transaction().send("aged_tx", b"orphan").message_id
            check = next(replies)  # within the broker's check interval; a cut stream raises here
            asked = check.recover_orphaned_transaction_command.message.system_properties.message_id
            assert asked == orphan, check
        except grpc.RpcError as exc:
            raise AssertionError(f"the Telemetry stream ended: {exc.code()} {exc.details()}") from exc
        finally:
            outbox.put(None)
            client.close()
