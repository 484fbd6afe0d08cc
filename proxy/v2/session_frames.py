"""The Session stream's answers, encoded by hand (proto/ext/messaging.proto's SessionResponse) around their serialized
body: a receive's message frames are serialized already (grpc writes bytes as they are: proxy/server.py's
PassBytes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from popgate_contract.codes import status_of
from popgate_contract.wire import field, varint

_ID = b"\x08"
_BODY = {"status": b"\x12", "send": b"\x22", "receive": b"\x2a", "ack": b"\x32", "change_invisible": b"\x3a"}
_BODY["end_transaction"] = b"\x42"
_BODY["change_invisible_many"] = b"\x4a"
_BODY["send_shared"] = _BODY["send"]  # answered as the SendMessage it stands for
_MORE = b"\x7a"
_RESPONSES: dict[str, Callable[..., Any]] = {
    "send": pb.SendMessageResponse,
    "send_shared": pb.SendMessageResponse,
    "receive": ext.ReceiveMessagesResponse,
    "ack": pb.AckMessageResponse,
    "change_invisible": pb.ChangeInvisibleDurationResponse,
    "end_transaction": pb.EndTransactionResponse,
    "change_invisible_many": ext.ChangeInvisibleManyResponse,
}


def request_of(message: ext.SessionRequest, kind: str) -> Any:
    return getattr(message, kind)


def serialized(frame: Any) -> bytes:
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


def encoded(request_id: int, kind: str, body: bytes) -> bytes:
    """The SessionResponse answering `request_id` with `body` (a serialized answer of `kind`) —
    tests/unit/proxy/test_session.py::test_hand_encoded_answers_read_as_the_generated_message."""
    return _ID + varint(request_id) + field(_BODY[kind], body)


def joined(first: bytes, more: list[bytes]) -> bytes:
    """One stream message: the answer `first`, then `more` (each an encoded answer) in its ``more`` field."""
    return first + b"".join(field(_MORE, answer) for answer in more)


def refusal(request_id: int, kind: str | None, error: errors.DomainError) -> bytes:
    """The answer to a request refused before its handler: its kind's response with the v2 status of `error`,
    or a bare ``status`` when its kind is unknown."""
    status = status_of(error)
    if kind is None:
        return encoded(request_id, "status", status.SerializeToString())
    return encoded(request_id, kind, _RESPONSES[kind](status=status).SerializeToString())
