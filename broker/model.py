"""Values the broker core hands out: pop results, send results and ids."""

from __future__ import annotations

import itertools
import os
import time
import zlib
from dataclasses import dataclass

from broker.lag import QueueLag


class MessageIds:
    """Unique message ids without a syscall each: a random per-process prefix plus a counter."""

    def __init__(self) -> None:
        self._prefix = os.urandom(6).hex().upper()
        self._counter = itertools.count(int(time.time() * 1000) << 8)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016X}"


@dataclass(slots=True)
class Popped:
    topic: str
    queue_id: int
    offset: int
    store_ms: int
    payload: bytes
    attempt: int
    handle: str
    invisible_until_ms: int


@dataclass(slots=True)
class Sent:
    message_id: str
    topic: str
    queue_id: int
    offset: int  # -1 while scheduled, or a half message
    due_ms: int | None = None
    recall_handle: str = ""  # a scheduled message's (broker.recall)
    transaction_id: str = ""  # a half message's (broker.transactions)


@dataclass(slots=True)
class PopResult:
    messages: list[Popped]
    polling_full: bool = False
    held: bool = False  # parked in the hold before this answer (is_long_polling)
    closing: bool = False  # answered before its poll time because the broker is stopping


@dataclass(frozen=True, slots=True)
class GroupQueueLag:
    topic: str
    group: str
    queue_id: int
    lag: QueueLag


def stable_hash(text: str) -> int:
    return zlib.crc32(text.encode())
