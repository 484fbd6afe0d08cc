"""The plain-Python model test_model.py compares the broker with: settings, messages, deliveries, groups."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

TOPIC = "t"
QUEUES = 2  # --queues-per-topic: few, so that FIFO and other messages share queues
MAX_ATTEMPTS = 2  # --max-delivery-attempts, small so that dead letters come within a few steps
# Consumer groups of the one topic, each with the filter all its Pops and Notifications carry.
GROUPS = {"ga": "*", "gb": "*", "gc": "a || b"}
TAGS = [None, "a", "b", "c"]
MESSAGE_GROUPS = ["o1", "o3", "o4"]  # o1 and o3 share a queue of 2, o4 has the other
INVISIBLE_MS = [100, 1_000, 5_000, 30_000]
START_MS = 1_800_000_000_000
RETENTION_MS = 30_000  # --retention-s: short, so that passes (rule `retain`) delete within a few steps
T = TypeVar("T")


def filter_matches(group: str, tag: str | None) -> bool:
    expression = GROUPS[group]
    return expression == "*" or (tag is not None and tag in {t.strip() for t in expression.split("||")})


@dataclass
class Msg:
    body: bytes
    tag: str | None
    message_group: str | None
    queue: int
    due_ms: int | None = None  # delayed: when it becomes visible
    offset: int | None = None  # None until appended to its queue
    store_ms: int | None = None

    @property
    def fifo(self) -> bool:
        return self.message_group is not None


@dataclass
class Flight:
    attempt: int
    handle: str
    deadline_ms: int


@dataclass
class GroupModel:
    name: str
    looked: bool = False  # has state on the broker (lags lists it)
    looked_early: bool = False  # looked before the topic existed (remembered in memory only)
    start: list[int] = field(default_factory=lambda: [0] * QUEUES)  # where it starts reading each queue
    inflight: dict[bytes, Flight] = field(default_factory=dict)  # popped, not acked (deadline passed or not)
    acked: set[bytes] = field(default_factory=set)
    dlq: dict[bytes, int] = field(default_factory=dict)  # body -> attempts when dead-lettered
    dlq_deleted: set[bytes] = field(default_factory=set)  # dead letters retention deleted since
    handles: list[str] = field(default_factory=list)  # every handle handed out, stale ones included
    delivered_once: set[bytes] = field(default_factory=set)  # ever popped

    def status(self, body: bytes) -> str:
        if body in self.inflight:
            return "inflight"
        if body in self.acked:
            return "acked"
        if body in self.dlq:
            return "dlq"
        return "new"


def run_with(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return loop.run_until_complete(asyncio.wait_for(coro, 20))
