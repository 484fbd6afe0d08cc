"""With accounts, a client id belongs to the account that used it: another account's Heartbeat or
NotifyClientTermination with that id neither gives back nor keeps alive what the client holds, and one naming a group
needs the rights a receive of that group needs (as RocketMQ's proxy asks SUB on the group)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from popgate import _wire as wire
from proxy.auth import DATE_FORMAT, DATE_HEADER, authorization
from proxy.v2.access import CLIENT_ID
from tests.integration.process.test_h2grpc_raw import answer, connected, headers
from tests.procs import secured_cluster

CONFIG = """
broker_token = "broker-secret"
min_invisible_s = 1

[[acl]]
access_key = "alice"
secret_key = "alice-secret-0123456"
publish = ["orders-*"]
subscribe = ["orders-*"]
groups = ["billing"]

[[acl]]
access_key = "stranger"
secret_key = "stranger-secret-0123456"
"""
ALICE_ID = "alicehost@4242@0@abc"
SECRETS = {"alice": "alice-secret-0123456", "stranger": "stranger-secret-0123456"}
Metadata = tuple[tuple[str, str], ...]


def signed(account: str, client_id: str) -> Metadata:
    date = time.strftime(DATE_FORMAT, time.gmtime())
    return (
        (DATE_HEADER, date),
        ("authorization", authorization(account, SECRETS[account], date)),
        (CLIENT_ID, client_id),
    )


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with secured_cluster(tmp_path_factory.mktemp("accounts"), CONFIG) as cluster:
        yield cluster.endpoint


@pytest.fixture(scope="module")
def stub(endpoint: str) -> Iterator[pb_grpc.MessagingServiceStub]:
    with grpc.insecure_channel(endpoint) as channel:
        yield pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]


def receive(
    stub: pb_grpc.MessagingServiceStub, topic: str, meta: Metadata, *, wait: int, renew: bool
) -> list[v2.Message]:
    request = wire.receive_request("billing", wire.Subscription(topic), max=8, invisible=30, wait=wait)
    if renew:
        request.auto_renew = True
        request.ClearField("invisible_duration")
    frames = list(stub.ReceiveMessage(request, metadata=meta, timeout=wait + 5))
    return [f.message for f in frames if f.HasField("message")]


def test_another_accounts_termination_with_a_clients_id_gives_back_nothing(stub: pb_grpc.MessagingServiceStub) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    message = v2.Message(topic=v2.Resource(name=topic), body=b"held by alice")
    message.system_properties.message_id = uuid.uuid4().hex.upper()
    message.system_properties.message_type = v2.NORMAL
    sent = stub.SendMessage(pb.SendMessageRequest(messages=[message]), metadata=signed("alice", ALICE_ID), timeout=5)
    assert sent.status.code == v2.OK
    [held] = receive(stub, topic, signed("alice", ALICE_ID), wait=5, renew=True)

    ended = stub.NotifyClientTermination(
        pb.NotifyClientTerminationRequest(), metadata=signed("stranger", ALICE_ID), timeout=5
    )
    assert ended.status.code == v2.OK  # a producer's termination names no group: any valid key may send one
    assert receive(stub, topic, signed("alice", "otherhost@1@0@zzz"), wait=3, renew=False) == []
    entry = pb.AckMessageEntry(
        message_id=held.system_properties.message_id, receipt_handle=held.system_properties.receipt_handle
    )
    acked = stub.AckMessage(
        pb.AckMessageRequest(group=v2.Resource(name="billing"), topic=v2.Resource(name=topic), entries=[entry]),
        metadata=signed("alice", ALICE_ID),
        timeout=5,
    )
    assert acked.status.code == v2.OK, acked.status


def test_heartbeat_and_termination_naming_a_group_need_its_rights(stub: pb_grpc.MessagingServiceStub) -> None:
    billing = v2.Resource(name="billing")
    beat = pb.HeartbeatRequest(group=billing, client_type=v2.PUSH_CONSUMER)
    end = pb.NotifyClientTerminationRequest(group=billing)
    assert stub.Heartbeat(beat, metadata=signed("stranger", ALICE_ID), timeout=5).status.code == v2.FORBIDDEN
    assert stub.NotifyClientTermination(end, metadata=signed("stranger", ALICE_ID), timeout=5).status.code == (
        v2.FORBIDDEN
    )
    assert stub.Heartbeat(beat, metadata=signed("alice", ALICE_ID), timeout=5).status.code == v2.OK
    assert stub.NotifyClientTermination(end, metadata=signed("alice", ALICE_ID), timeout=5).status.code == v2.OK
    producer = pb.HeartbeatRequest(client_type=v2.PRODUCER)  # the official producers' heartbeat: no group
    assert stub.Heartbeat(producer, metadata=signed("stranger", "p@1@0@p"), timeout=5).status.code == v2.OK


async def test_a_call_without_credentials_is_refused_before_its_request_is_whole(endpoint: str) -> None:
    """A SendMessage without credentials whose 1 MiB request has begun and never ends is answered 40100 at once, as
    its whole request would be, holding no call place nor its bytes meanwhile."""
    peer = await connected(endpoint)
    try:
        peer.client.send_headers(1, [*headers(b"/apache.rocketmq.v2.MessagingService/SendMessage"), (CLIENT_ID, "x")])
        peer.client.send_data(1, b"\x00\x00\x10\x00\x00" + b"x" * 1000)
        peer.send()
        frames = await asyncio.wait_for(peer.read(answered=1), 10)
    finally:
        await peer.close()
    body, trailers = answer(frames, 1)
    assert trailers[b"grpc-status"] == b"0"
    refused = pb.SendMessageResponse.FromString(body[5:])
    assert refused.status.code == v2.UNAUTHORIZED, refused
