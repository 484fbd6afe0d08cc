"""Receipt handles: everything needed to ack one delivery, in one string.

A handle names the broker, the message (topic, queue, offset) and the delivery
(attempt and a random token drawn at pop time). A broker accepts an ack only
when the token matches the message's current delivery, so a handle from an
earlier delivery (stale) or a made-up one (forged) is refused. The proxy only
reads the broker name, so any proxy can route an ack.

Format (fields joined by ``~``, a character names never contain)::

    1~<broker>~<topic>~<queue>~<offset>~<attempt>~<token hex>~<invisible_until_ms>
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.errors import InvalidReceiptHandle

VERSION = "1"
_SEP = "~"
_MAX_LEN = 1024


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    broker: str
    topic: str
    queue_id: int
    offset: int
    attempt: int
    token: int
    invisible_until_ms: int

    def encode(self) -> str:
        return _SEP.join(
            (
                VERSION,
                self.broker,
                self.topic,
                str(self.queue_id),
                str(self.offset),
                str(self.attempt),
                format(self.token, "x"),
                str(self.invisible_until_ms),
            )
        )

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        if not text:
            raise InvalidReceiptHandle("receipt handle is empty")
        if len(text) > _MAX_LEN:
            raise InvalidReceiptHandle(f"receipt handle is longer than {_MAX_LEN} characters")
        parts = text.split(_SEP)
        if len(parts) != 8 or parts[0] != VERSION:
            raise InvalidReceiptHandle("receipt handle is malformed (not a popgate handle)")
        _, broker, topic, queue, offset, attempt, token, until = parts
        if not broker or not topic:
            raise InvalidReceiptHandle("receipt handle is malformed (empty broker or topic name)")
        try:
            handle = cls(broker, topic, int(queue), int(offset), int(attempt), int(token, 16), int(until))
        except ValueError:
            raise InvalidReceiptHandle("receipt handle is malformed (bad number)") from None
        if min(handle.queue_id, handle.offset, handle.token, handle.invisible_until_ms) < 0 or handle.attempt < 1:
            raise InvalidReceiptHandle("receipt handle is malformed (negative field)")
        return handle


def broker_of(text: str) -> str:
    """The broker a handle belongs to; raises InvalidReceiptHandle when garbled."""
    return ReceiptHandle.decode(text).broker
