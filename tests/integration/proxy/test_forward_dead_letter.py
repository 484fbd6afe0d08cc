"""ForwardMessageToDeadLetterQueue sent again with the same handle (its first answer lost: the official clients
retry a forward until it is answered OK, with no limit) through a real proxy and broker: OK both times, and the
group's DLQ holds the message once."""

from __future__ import annotations

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from tests.integration.proxy.client import V2Client
from tests.integration.proxy.conftest import MakeCluster


def test_the_same_forward_sent_twice_is_ok_twice_and_dead_letters_the_message_once(
    make_cluster: MakeCluster,
) -> None:
    client = V2Client(make_cluster(brokers=1).endpoint)
    try:
        topic, group = "fwd-twice", "g-fwd"
        assert client.send(topic, [b"poison"]).status.code == v2.OK
        messages: list[v2.Message] = []
        for _ in range(10):  # bounded: the topic's first messages reach the route within a poll or two
            _, messages = client.receive(topic, group, batch=1, invisible_s=30, poll_s=2)
            if messages:
                break
        [m] = messages
        forward = pb.ForwardMessageToDeadLetterQueueRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=topic),
            receipt_handle=m.system_properties.receipt_handle,
            message_id=m.system_properties.message_id,
            delivery_attempt=1,
            max_delivery_attempts=4,
        )
        answers = [client.stub.ForwardMessageToDeadLetterQueue(forward, timeout=5).status for _ in range(2)]
        assert [a.code for a in answers] == [v2.OK, v2.OK], answers
        _, dead = client.receive(f"%DLQ%{group}", "inspect", batch=32, poll_s=3)
        assert [d.body for d in dead] == [b"poison"]
    finally:
        client.close()
