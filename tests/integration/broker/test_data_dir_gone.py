"""A data directory deleted under a running broker (`rm -rf`): the broker notices within a sweep, refuses Sends
(UNAVAILABLE, not OK into files the next start never sees) and its health answers NOT_SERVING, while /livez (its
pod's liveness) still answers 200: a restart would only start an empty store under its name."""

from __future__ import annotations

import shutil
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from popgate_pb import broker_pb2 as pb

from tests.conftest import BrokerHandle
from tests.procs import wait_until


def health(broker: BrokerHandle) -> int:
    request = health_pb2.HealthCheckRequest(service="")
    return int(health_pb2_grpc.HealthStub(broker.channel).Check(request, timeout=5).status)


def test_a_deleted_data_directory_is_noticed_while_running(make_broker: object) -> None:
    broker: BrokerHandle = make_broker("b1", "--queues-per-topic", "1")  # type: ignore[operator]
    send = pb.SendRequest(messages=[pb.Message(topic="t", message_id="m", body=b"x")])
    broker.stub.Send(send, timeout=10)
    assert health(broker) == health_pb2.HealthCheckResponse.SERVING
    shutil.rmtree(broker.data_dir)
    assert wait_until(lambda: health(broker) == health_pb2.HealthCheckResponse.NOT_SERVING, timeout=5)
    with pytest.raises(grpc.RpcError) as refused:
        broker.stub.Send(send, timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "was deleted" in (refused.value.details() or "")


def test_liveness_holds_while_health_says_the_files_are_gone(make_broker: object) -> None:
    """The pod's livenessProbe (GET /livez) keeps passing, so kubelet does not restart the broker: the restart
    would drop its last handles on the deleted files and serve an empty store under the same name."""
    broker: BrokerHandle = make_broker("b1", "--metrics-listen", "127.0.0.1:0")  # type: ignore[operator]
    line = next(line for line in broker.proc.lines if "metrics on" in line)
    livez = line.split("metrics on ")[1].strip().replace("/metrics", "/livez")
    shutil.rmtree(broker.data_dir)
    assert wait_until(lambda: health(broker) == health_pb2.HealthCheckResponse.NOT_SERVING, timeout=5)
    with urllib.request.urlopen(livez, timeout=5) as answer:
        assert answer.status == 200
