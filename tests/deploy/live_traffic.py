"""A consumer's and a producer's traffic through a proxy, over the v2 protocol, for the live deployment tests."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2, service_pb2_grpc

TIMEOUT_S = 10.0


def v2_message(topic: str, body: bytes, message_id: str) -> v2.Message:
    born = Timestamp()
    born.GetCurrentTime()
    return v2.Message(
        topic=v2.Resource(name=topic),
        body=body,
        system_properties=v2.SystemProperties(
            message_id=message_id,
            body_encoding=v2.IDENTITY,
            message_type=v2.NORMAL,
            body_digest=v2.Digest(type=v2.CRC32, checksum=f"{zlib.crc32(body):08X}"),
            born_timestamp=born,
            born_host="127.0.0.1",
        ),
    )


@dataclass(frozen=True)
class Received:
    message_id: str
    handle: str
    attempt: int


class ProxyClient:
    """One channel to a proxy; every call bounded by TIMEOUT_S."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.metadata = (
            ("x-mq-client-id", f"deploy-live-{os.getpid()}"),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"),
        )
        self._channel = grpc.insecure_channel(endpoint)
        self.stub = service_pb2_grpc.MessagingServiceStub(self._channel)
        self._sent = 0

    def __enter__(self) -> ProxyClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._channel.close()

    def _call(self, method: Any, request: Any) -> Any:
        return method(request, metadata=self.metadata, timeout=TIMEOUT_S)

    def query_route(self, topic: str) -> None:
        host, _, port = self.endpoint.rpartition(":")
        endpoints = v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host=host, port=int(port))])
        self._call(
            self.stub.QueryRoute, service_pb2.QueryRouteRequest(topic=v2.Resource(name=topic), endpoints=endpoints)
        )

    def send(self, topic: str, count: int) -> None:
        messages = []
        for _ in range(count):
            self._sent += 1
            messages.append(v2_message(topic, b"through the proxy", f"deploy-live-{os.getpid()}-{self._sent}"))
        answer = self._call(self.stub.SendMessage, service_pb2.SendMessageRequest(messages=messages))
        assert answer.status.code == v2.OK, answer.status

    def receive(self, topic: str, group: str, *, poll_s: float = 1.0) -> list[Received]:
        """One ReceiveMessage (up to 32 messages), read to its final status."""
        request = service_pb2.ReceiveMessageRequest(
            group=v2.Resource(name=group),
            message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
            filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
            batch_size=32,
        )
        request.invisible_duration.FromSeconds(60)
        request.long_polling_timeout.FromMilliseconds(int(poll_s * 1000))
        got = []
        for frame in self.stub.ReceiveMessage(request, metadata=self.metadata, timeout=poll_s + TIMEOUT_S):
            if frame.HasField("message"):
                props = frame.message.system_properties
                got.append(Received(props.message_id, props.receipt_handle, props.delivery_attempt))
        return got

    def ack(self, topic: str, group: str, messages: list[Received]) -> None:
        request = service_pb2.AckMessageRequest(group=v2.Resource(name=group), topic=v2.Resource(name=topic))
        for m in messages:
            request.entries.add(message_id=m.message_id, receipt_handle=m.handle)
        answer = self._call(self.stub.AckMessage, request)
        assert answer.status.code == v2.OK, answer.status

    def dead_letter(self, topic: str, group: str, message: Received) -> None:
        request = service_pb2.ForwardMessageToDeadLetterQueueRequest(
            group=v2.Resource(name=group),
            topic=v2.Resource(name=topic),
            receipt_handle=message.handle,
            message_id=message.message_id,
            delivery_attempt=message.attempt,
            max_delivery_attempts=17,
        )
        answer = self._call(self.stub.ForwardMessageToDeadLetterQueue, request)
        assert answer.status.code == v2.OK, answer.status
