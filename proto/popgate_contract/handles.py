"""Recall handles and transaction ids: what a producer gets back from a Send to withdraw a scheduled message or
to resolve a half message, in one opaque string each.

Both name the broker holding the message, so any proxy routes the call, and the message itself (a scheduled
message's row and id; a half message's row and a random token drawn when it was stored), so a made-up one, or
one of a message already delivered or resolved, is refused by the broker. Text: URL-safe base64 of the fields
joined by ``~`` (a character names never contain), versioned.
"""

from __future__ import annotations

import base64
import binascii
from typing import NamedTuple

from popgate_contract.errors import InvalidRecallHandle, InvalidTransactionId

MAX_LEN = 1024
_SEP = "~"


def _encode(*fields: object) -> str:
    return base64.urlsafe_b64encode(_SEP.join(map(str, fields)).encode()).decode()


def _decode(text: str, parts: int, kind: str) -> list[str] | None:
    if not text or len(text) > MAX_LEN:
        return None
    try:
        fields = base64.urlsafe_b64decode(text.encode("ascii")).decode().split(_SEP, parts - 1)
    except (binascii.Error, UnicodeError, ValueError):
        return None
    if len(fields) != parts or fields[0] != kind or not all(fields[1:]):
        return None
    return fields


class RecallHandle(NamedTuple):
    broker: str
    topic: str
    schedule_id: int
    message_id: str

    def encode(self) -> str:
        return _encode("R1", *self)

    @classmethod
    def decode(cls, text: str) -> RecallHandle:
        fields = _decode(text, 5, "R1")
        if fields is None or not (fields[3].isascii() and fields[3].isdigit()):  # "²".isdigit(), int("²") fails
            raise InvalidRecallHandle("recall handle is malformed (not one a popgate Send returned)")
        return cls(fields[1], fields[2], int(fields[3]), fields[4])


class TransactionId(NamedTuple):
    broker: str
    half_id: int
    token: int

    def encode(self) -> str:
        return _encode("T1", self.broker, self.half_id, f"{self.token:x}")

    @classmethod
    def decode(cls, text: str) -> TransactionId:
        fields = _decode(text, 4, "T1")
        try:
            if fields is not None and fields[2].isdigit():
                return cls(fields[1], int(fields[2]), int(fields[3], 16))
        except ValueError:
            pass
        raise InvalidTransactionId("transaction id is malformed (not one a popgate Send returned)")
