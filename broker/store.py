"""The store interface the broker core talks to, and the records it deals in.

The core keeps hot state in memory; the store makes it durable. Every write is
one ``commit(appends, ops)``: new messages plus consumer-state operations,
applied atomically. Offsets are assigned by the store at commit time, so a
failed write never leaves a hole. Committed messages are announced to an
``ArrivalListener`` on the event loop before the commit's caller resumes; the
store knows nothing else about who listens.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

# What a listed record costs in an answer beside its payload (queue, offset, store time, field tags), rounded up.
RECORD_OVERHEAD_BYTES = 64


@dataclass(slots=True)
class NewMessage:
    topic: str
    queue_id: int
    store_ms: int
    tag: str | None
    payload: bytes  # serialized popgate.broker.v1.Message
    fifo: bool = False  # sent with a message group: consumed in order (broker.core, "FIFO")
    priority: int = 0  # > 0: taken before lower ones among a queue's ready messages (broker.priority)


@dataclass(slots=True)
class Record:
    topic: str
    queue_id: int
    offset: int
    store_ms: int
    tag: str | None
    payload: bytes
    fifo: bool = False  # as NewMessage.fifo; only what a commit appends carries it (reads leave it False)
    priority: int = 0  # as NewMessage.priority, as `fifo`


class CreateQueue(NamedTuple):
    topic: str
    queue_id: int


class SetPullOffset(NamedTuple):
    group: str
    topic: str
    queue_id: int
    pull_offset: int


class PutInflight(NamedTuple):
    group: str
    topic: str
    queue_id: int
    offset: int
    attempt: int
    token: int
    deadline_ms: int


class DeleteInflight(NamedTuple):
    group: str
    topic: str
    queue_id: int
    offset: int


class SetGroupFilter(NamedTuple):
    group: str
    topic: str
    expression: str


class PutScheduled(NamedTuple):
    schedule_id: int
    due_ms: int
    topic: str
    queue_id: int
    tag: str | None
    payload: bytes


class DeleteScheduled(NamedTuple):
    schedule_id: int


class PutHalf(NamedTuple):
    """A transaction's half message (broker.transactions), kept apart from its topic until resolved."""

    half_id: int
    token: int
    topic: str
    queue_id: int
    tag: str | None
    payload: bytes
    store_ms: int
    checks: int
    next_check_ms: int


class SetHalfCheck(NamedTuple):
    half_id: int
    checks: int
    next_check_ms: int


class DeleteHalf(NamedTuple):
    half_id: int


class PurgeGroup(NamedTuple):
    """Every stored row of a group's state on a topic (pull offsets, deliveries, filter): a deleted group
    (broker.admin). Applied in its request's turn: the ops of requests before it first, of those after it after."""

    group: str
    topic: str


class PurgeQueueInflight(NamedTuple):
    """Every stored delivery and ACKED_AHEAD mark of a group on one queue: an offset reset (broker.reset) drops them
    all in one statement, not a DeleteInflight each. Applied in its request's turn, as PurgeGroup."""

    group: str
    topic: str
    queue_id: int


class PurgeTopic(NamedTuple):
    """A topic's messages, queues and every group's state on it: a deleted topic (broker.admin). Applied in its
    request's turn, as PurgeGroup; the topic's offsets start again at 0 should it be created again."""

    topic: str


PURGES = (PurgeGroup, PurgeQueueInflight, PurgeTopic)

Op = (
    CreateQueue
    | SetPullOffset
    | PutInflight
    | DeleteInflight
    | SetGroupFilter
    | PutScheduled
    | DeleteScheduled
    | PutHalf
    | SetHalfCheck
    | DeleteHalf
    | PurgeGroup
    | PurgeQueueInflight
    | PurgeTopic
)


@dataclass(slots=True)
class QueueIndex:
    """Offsets, store times and tags of every message of one queue, oldest first, and which are FIFO. Loaded
    compact (8 bytes a store time; each tag text once), as the core keeps them: the whole store's index is in
    memory at start, and never as a Python int and a string per message, even at the load's peak —
    tests/unit/broker/test_sqlite_store.py::test_loading_the_index_at_start_costs_about_what_is_kept."""

    min_offset: int = 0
    store_ms: array[int] | list[int] = field(default_factory=lambda: array("q"))
    tags: list[str | None] = field(default_factory=list)  # interned (sys.intern)
    fifo: list[int] = field(default_factory=list)  # offsets of the messages sent with a message group
    priority: list[tuple[int, int]] = field(default_factory=list)  # (offset, priority) of priority messages


@dataclass(slots=True)
class Snapshot:
    """Everything the core rebuilds its hot state from at start."""

    queues: dict[tuple[str, int], QueueIndex] = field(default_factory=dict)
    pull_offsets: list[SetPullOffset] = field(default_factory=list)
    inflight: list[PutInflight] = field(default_factory=list)
    filters: list[SetGroupFilter] = field(default_factory=list)
    scheduled: list[tuple[int, int]] = field(default_factory=list)  # (due_ms, schedule id)
    halves: list[PutHalf] = field(default_factory=list)  # half messages, their payloads left out (b"")
    purging: set[str] = field(default_factory=set)  # topics purged whose rows are not all deleted yet


class ArrivalListener(Protocol):
    def arrived(self, records: Sequence[Record]) -> None: ...


class Store(Protocol):
    def load(self) -> Snapshot:
        """Read the whole hot state (blocking: call before serving)."""
        ...

    def set_listener(self, listener: ArrivalListener) -> None: ...

    def submit(
        self,
        appends: Sequence[NewMessage],
        ops: Sequence[Op],
        *,
        within_s: float | None = None,
        awaited: bool = False,
    ) -> asyncio.Future[list[Record]]:
        """Queue appends and ops for one durable transaction, in call order; the future gives the
        appended records with their offsets. Must be called on the event loop. `within_s`: a Send's time left; a
        commit not started within it stores nothing and fails with TooManyRequests (`store_writes.in_time`).
        `awaited`: a caller's answer waits for this commit (a rollback, a recall), so it is never deferred as
        consumer state is (`store_pacing.STATE_DELAY_S`)."""
        ...

    async def read_payloads(self, topic: str, wanted: Mapping[int, Sequence[int]]) -> dict[tuple[int, int], bytes]:
        """The stored payloads of the topic's messages `wanted` (queue -> offsets), by (queue, offset), read in one
        call to the reading thread whatever the queues; messages not stored (deleted) are left out."""
        ...

    async def read_range(
        self, topic: str, queue_id: int, from_offset: int, limit: int, *, max_bytes: int | None = None
    ) -> list[Record]:
        """Up to `limit` records from `from_offset` on, stopping before their payloads (plus
        `RECORD_OVERHEAD_BYTES` each) would pass `max_bytes`; at least one when there is one."""
        ...

    async def read_scheduled(self, schedule_ids: Sequence[int]) -> list[PutScheduled]: ...

    async def read_halves(self, half_ids: Sequence[int]) -> list[PutHalf]: ...

    async def retained_from(self, targets: Sequence[tuple[str, int, int]]) -> dict[tuple[str, int], int]:
        """For each (topic, queue, offset): the queue's first offset once what lies wholly below the offset is
        deleted (a store deletes whole units: the unit holding the offset stays, and the queue's last one)."""
        ...

    async def delete_before(self, cuts: Sequence[tuple[str, int, int]]) -> int:
        """Delete what lies wholly below each (topic, queue, offset) (`retained_from` gave the offset), in
        bounded transactions between other commits."""
        ...

    async def purge_step(self, topic: str) -> tuple[bool, int]:
        """Delete the next rows of a topic whose purge committed, in a bounded transaction between other commits:
        whether they were its last, and how many went."""
        ...

    async def close(self) -> None: ...
