"""GZIP bodies are inflated off the proxy's event loop: a client sending them does not hold everyone else's calls."""

from __future__ import annotations

import gzip
import statistics
import threading
import time

import grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from tests.integration.proxy.conftest import MakeCluster

MiB = 1024 * 1024
OPTIONS = [("grpc.max_send_message_length", 100 * MiB)]


def bombs(count: int) -> pb.SendMessageRequest:
    """`count` 4 KB gzips of 4 MiB of zeros (62 KB in all), then a message refused for its tag once they are
    inflated: the proxy does all the inflating and stores nothing."""
    body = gzip.compress(b"\0" * (4 * MiB - 1024), 9)
    request = pb.SendMessageRequest()
    for i in range(count + 1):
        m = request.messages.add(topic=v2.Resource(name="t"), body=body)
        m.system_properties.message_id = f"{i:032X}"
        m.system_properties.body_encoding = v2.GZIP
        m.system_properties.message_type = v2.NORMAL
    m.system_properties.tag = "bad|tag"
    return request


def test_other_calls_go_on_while_two_clients_send_gzip_bodies_that_inflate_to_56_mib_a_request(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(brokers=1)
    request, stop, answers = bombs(14), threading.Event(), []

    def flood() -> None:
        with grpc.insecure_channel(cluster.endpoint, options=OPTIONS) as channel:
            stub = pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
            while not stop.is_set():
                answers.append(stub.SendMessage(request, timeout=30).status.code)

    with grpc.insecure_channel(cluster.endpoint) as channel:
        stub = pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.Heartbeat(pb.HeartbeatRequest(), timeout=10)
        floods = [threading.Thread(target=flood) for _ in range(2)]
        for thread in floods:
            thread.start()
        try:
            took = []
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline or len(answers) < 4:
                started = time.perf_counter()
                stub.Heartbeat(pb.HeartbeatRequest(), timeout=10)
                took.append(time.perf_counter() - started)
                time.sleep(0.005)
                assert time.monotonic() < deadline + 60, f"{len(answers)} GZIP requests answered in 64 s"
        finally:
            stop.set()
            for thread in floods:
                thread.join(60)
    # Inflated on the loop, each request held it ~0.2 s: heartbeats took 555 ms at the median (a review's probe).
    assert statistics.median(took) < 0.1, f"median heartbeat {statistics.median(took) * 1000:.0f} ms"
    assert set(answers) == {v2.ILLEGAL_MESSAGE_TAG}, answers  # every one inflated, checked and refused whole
