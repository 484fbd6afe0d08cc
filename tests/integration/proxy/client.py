"""A small blocking v2 client for the integration tests (raw stubs, no SDK)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from popgate import _wire as wire


class V2Client:
    def __init__(self, endpoint: str, *, options: Sequence[tuple[str, Any]] = ()) -> None:
        self.channel = grpc.insecure_channel(endpoint, options=options)
        self.stub = pb_grpc.MessagingServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.channel.close()

    def send(self, topic: str, bodies: list[bytes], *, timeout_s: float = 5) -> pb.SendMessageResponse:
        messages = []
        for body in bodies:
            message = v2.Message(topic=v2.Resource(name=topic), body=body)
            message.system_properties.message_id = uuid.uuid4().hex.upper()
            message.system_properties.body_encoding = v2.IDENTITY
            message.system_properties.message_type = v2.NORMAL
            messages.append(message)
        return self.stub.SendMessage(pb.SendMessageRequest(messages=messages), timeout=timeout_s)

    def receive(
        self, topic: str, group: str, *, batch: int = 32, invisible_s: int = 30, poll_s: int = 1
    ) -> tuple[v2.Status, list[v2.Message]]:
        request = wire.receive_request(group, wire.Subscription(topic), max=batch, invisible=invisible_s, wait=poll_s)
        status, messages = v2.Status(), []
        for frame in self.stub.ReceiveMessage(request, timeout=poll_s + 3):
            if frame.HasField("status"):
                status = frame.status
            elif frame.HasField("message"):
                messages.append(frame.message)
        return status, messages

    def ack(self, topic: str, group: str, messages: list[v2.Message], *, timeout_s: float = 5) -> pb.AckMessageResponse:
        entries = [
            pb.AckMessageEntry(
                message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle
            )
            for m in messages
        ]
        request = pb.AckMessageRequest(group=v2.Resource(name=group), topic=v2.Resource(name=topic), entries=entries)
        return self.stub.AckMessage(request, timeout=timeout_s)
