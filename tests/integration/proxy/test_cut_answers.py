"""A receive answer cut off before its final status: its messages go back to their broker at once."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import time

import grpc
import h2.config
import h2.connection
import h2.settings
import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from popgate import _wire as wire
from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster

INVISIBLE_S = 60
BODY = 1024 * 1024
COUNT = 4  # one Pop answer (4 MiB, under the broker's 8 MiB --max-pop-bytes)


@pytest.mark.parametrize("mode", ["longpoll", "notify"])
def test_messages_of_an_answer_its_client_left_mid_stream_are_received_again_at_once(
    make_cluster: MakeCluster, mode: str
) -> None:
    cluster = make_cluster(brokers=1, proxy_args=("--receive-mode", mode))
    # No BDP probing: the client's flow-control window stays small, so the proxy cannot hand the whole answer
    # (4 MiB) to grpc while the client reads only its first frames: the answer is cut before its status.
    leaving = V2Client(cluster.endpoint, options=[("grpc.http2.bdp_probe", 0)])
    other = V2Client(cluster.endpoint)
    try:
        sent = leaving.send("cut", [bytes([65 + i]) * BODY for i in range(COUNT)], timeout_s=30)
        assert [e.status.code for e in sent.entries] == [v2.OK] * COUNT
        request = wire.receive_request("g", wire.Subscription("cut"), max=32, invisible=INVISIBLE_S, wait=5)
        call = leaving.stub.ReceiveMessage(request, timeout=10)
        assert next(call).HasField("delivery_timestamp")
        assert next(call).message.body[:1] == b"A"
        call.cancel()  # the client goes away with one message of four, and no status: it uses none of them

        received: list[v2.Message] = []
        deadline = time.monotonic() + 15  # well below the invisible time
        while len(received) < COUNT and time.monotonic() < deadline:
            status, messages = other.receive("cut", "g", invisible_s=INVISIBLE_S, poll_s=2)
            assert status.code in (v2.OK, v2.MESSAGE_NOT_FOUND), status
            received += messages
        assert sorted(m.body[:1] for m in received) == [bytes([65 + i]) for i in range(COUNT)]
        # Handed back, not redelivered: the attempt count is unchanged.
        assert [m.system_properties.delivery_attempt for m in received] == [1] * COUNT
    finally:
        leaving.close()
        other.close()


@pytest.mark.parametrize("mode", ["longpoll", "notify"])
def test_receives_cancelled_at_any_moment_leave_no_message_invisible(make_cluster: MakeCluster, mode: str) -> None:
    """200 receives of a backlog, each cancelled 0-10 ms after it starts, so that a cancel crosses the broker's
    answer anywhere on its way: every message is ready again at once. Before, an answer that reached the proxy
    just after the cancel was dropped there, its messages invisible for the whole invisible time (32-144 of
    160 here; 328 of 400 in a review's probe). The client reads nothing and its flow-control window stays small
    (no BDP probing): no answer of 32 x 128 KiB can be written whole, so none of them may keep a message."""
    cluster = make_cluster(brokers=2, proxy_args=("--receive-mode", mode, "--min-invisible-s", "1"))
    topic, group, total = f"storm-{mode}", "g", 160
    client = V2Client(cluster.endpoint)
    try:
        for _ in range(total // 16):
            assert client.send(topic, [b"z" * 128 * 1024] * 16, timeout_s=30).status.code == v2.OK
    finally:
        client.close()

    async def storm() -> None:
        async with grpc.aio.insecure_channel(cluster.endpoint, options=[("grpc.http2.bdp_probe", 0)]) as channel:
            stub = pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
            request = wire.receive_request(group, wire.Subscription(topic), max=32, invisible=INVISIBLE_S, wait=5)
            rng = random.Random(7)
            for _ in range(200):
                call = stub.ReceiveMessage(request, timeout=10)
                await asyncio.sleep(rng.uniform(0, 0.01))
                call.cancel()

    asyncio.run(storm())

    # Given back, every one is received again well before the invisible time (60 s) would bring it back.
    other, ids = V2Client(cluster.endpoint), set()
    try:
        deadline = time.monotonic() + 20
        while len(ids) < total and time.monotonic() < deadline:
            status, messages = other.receive(topic, group, invisible_s=INVISIBLE_S, poll_s=1)
            assert status.code in (v2.OK, v2.MESSAGE_NOT_FOUND), status
            ids.update(m.system_properties.message_id for m in messages)
    finally:
        other.close()
    assert len(ids) == total, f"{total - len(ids)} of {total} messages left invisible"


def test_an_answer_its_client_does_not_read_is_cut_off_and_its_messages_go_to_another_consumer(
    make_cluster: MakeCluster,
) -> None:
    """A client that opens a receive and never reads it (its connection alive) held the messages and their place in
    the proxy's bounds for as long as it liked: a review's lazy clients kept 32 MiB of answers, and every other
    consumer's large receive was TOO_MANY_REQUESTS, for minutes. The answer is cut off at its write deadline."""
    cluster = make_cluster(brokers=1, proxy_args=("--max-answer-write-s", "1"))
    lazy = V2Client(cluster.endpoint, options=[("grpc.http2.bdp_probe", 0)])  # a small window: the writes stall
    other = V2Client(cluster.endpoint)
    try:
        sent = lazy.send("lazy", [bytes([65 + i]) * BODY for i in range(COUNT)], timeout_s=30)
        assert [e.status.code for e in sent.entries] == [v2.OK] * COUNT
        request = wire.receive_request("g", wire.Subscription("lazy"), max=32, invisible=INVISIBLE_S, wait=5)
        call = lazy.stub.ReceiveMessage(request, timeout=60)  # opened, never read until the end
        started = time.monotonic()
        got: list[bytes] = []
        while len(got) < COUNT and time.monotonic() - started < 20:
            _, messages = other.receive("lazy", "g", invisible_s=INVISIBLE_S, poll_s=5)
            got += [m.body[:1] for m in messages]
        assert sorted(got) == [bytes([65 + i]) for i in range(COUNT)], got  # not after the 60 s invisible time
        # (the lazy client's call itself stays open until its deadline: grpc.aio cannot end a call whose write is
        # stalled, docs/PROXY.md "Limits")
        call.cancel()
    finally:
        lazy.close()
        other.close()


def _receive_never_read(endpoint: str, topic: str, group: str) -> socket.socket:
    """A ReceiveMessage on a connection whose streams' flow-control window is 0: nothing of the answer can be sent,
    and the client never reads. Kept open while the returned socket is."""
    host, port = endpoint.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
    )
    conn.initiate_connection()
    request = wire.receive_request(group, wire.Subscription(topic), max=32, invisible=INVISIBLE_S, wait=2)
    body = request.SerializeToString()
    path = "/apache.rocketmq.v2.MessagingService/ReceiveMessage"
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", endpoint),
                          ("content-type", "application/grpc"), ("te", "trailers")])  # fmt: skip
    conn.send_data(1, b"\x00" + struct.pack(">I", len(body)) + body, end_stream=True)
    sock.sendall(conn.data_to_send())
    return sock


def test_small_frames_a_client_never_takes_are_cut_off_and_stay_counted(make_cluster: MakeCluster) -> None:
    """An answer of frames each far below the server's send buffer (32 x 30 KB) to a client whose window is 0 stays
    counted in max_answer_bytes, and its messages go back at the write deadline. Before, it counted as written once
    queued: a review's 200 such streams held 131 MB against a 16 MiB budget and 4,480 of 6,400 messages invisible."""
    cluster = make_cluster(brokers=1, proxy_args=("--max-answer-bytes", "1MiB", "--max-answer-write-s", "3"))
    other = V2Client(cluster.endpoint)
    try:
        for _ in range(2):
            assert other.send("small", [b"s" * 30_000] * 32, timeout_s=30).status.code == v2.OK
        lazy = _receive_never_read(cluster.endpoint, "small", "g")
        try:
            time.sleep(1)  # the lazy receive is answered (32 messages, ~0.96 MB) and none of it is taken
            status, messages = other.receive("small", "g", invisible_s=INVISIBLE_S, poll_s=1)
            assert (status.code, len(messages)) == (v2.TOO_MANY_REQUESTS, 0), status  # the budget is the lazy's
            received: set[str] = set()
            deadline = time.monotonic() + 15  # well below the invisible time
            while len(received) < 64 and time.monotonic() < deadline:
                status, messages = other.receive("small", "g", invisible_s=INVISIBLE_S, poll_s=1)
                received.update(m.system_properties.message_id for m in messages)
            assert len(received) == 64, f"{64 - len(received)} of 64 messages left invisible"
        finally:
            lazy.close()
    finally:
        other.close()
