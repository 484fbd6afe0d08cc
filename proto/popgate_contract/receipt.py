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

import re
from typing import NamedTuple

from popgate_contract.errors import InvalidReceiptHandle

VERSION = "1"
_SEP = "~"
MAX_HANDLE_LEN = 1024
_new_tuple = tuple.__new__


def encode_handle(broker: str, topic: str, queue_id: int, offset: int, attempt: int, token: int, until_ms: int) -> str:
    """The handle text for these fields (what ``ReceiptHandle(...).encode()`` gives, without the object)."""
    return f"{VERSION}~{broker}~{topic}~{queue_id}~{offset}~{attempt}~{token:x}~{until_ms}"


class ReceiptHandle(NamedTuple):
    broker: str
    topic: str
    queue_id: int
    offset: int
    attempt: int
    token: int
    invisible_until_ms: int

    def encode(self) -> str:
        return encode_handle(*self)

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        if not text:
            raise InvalidReceiptHandle("receipt handle is empty")
        if len(text) > MAX_HANDLE_LEN:
            raise InvalidReceiptHandle(f"receipt handle is longer than {MAX_HANDLE_LEN} characters")
        parts = text.split(_SEP)
        if len(parts) != 8 or parts[0] != VERSION:
            raise InvalidReceiptHandle("receipt handle is malformed (not a popgate handle)")
        _, broker, topic, queue, offset, attempt, token, until = parts
        if not broker or not topic:
            raise InvalidReceiptHandle("receipt handle is malformed (empty broker or topic name)")
        try:
            queue_id, at, n, tok, until_ms = int(queue), int(offset), int(attempt), int(token, 16), int(until)
        except ValueError:
            raise InvalidReceiptHandle("receipt handle is malformed (bad number)") from None
        if queue_id < 0 or at < 0 or tok < 0 or until_ms < 0 or n < 1:
            raise InvalidReceiptHandle("receipt handle is malformed (negative field)")
        # The tuple made as the generated `__new__` makes it, without its extra call (the broker decodes every
        # handle of every Ack).
        return _new_tuple(cls, (broker, topic, queue_id, at, n, tok, until_ms))


# A handle every field of which `ReceiptHandle.decode` accepts, in the spelling `encode_handle` writes (ASCII
# digits, attempt >= 1), read for its broker only.
_PLAIN_HANDLE = re.compile(r"1~([^~]+)~[^~]+~[0-9]+~[0-9]+~0*[1-9][0-9]*~[0-9a-fA-F]+~[0-9]+")


def broker_of(text: str) -> str:
    """The broker a handle belongs to; raises InvalidReceiptHandle when garbled. A handle spelt as brokers write
    them is not decoded whole (the proxy reads the broker of every handle it routes): the same broker, or the same
    refusal, as `ReceiptHandle.decode` — tests/unit/contract/test_broker_of.py."""
    plain = _PLAIN_HANDLE.fullmatch(text) if len(text) <= MAX_HANDLE_LEN else None
    return plain[1] if plain is not None else ReceiptHandle.decode(text).broker
