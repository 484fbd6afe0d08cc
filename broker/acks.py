"""What a consumer does with a delivery it holds, by the receipt handle it was given: ack it, change or renew its
invisibility, dead-letter it. A handle acts only on the delivery it names while that is still its group's
current one (`Acks.resolve`): another group's handle, or one acked or redelivered since, is InvalidReceiptHandle
and changes nothing. DeadLetter alone goes by the message the handle names (`Acks.owed`), as RocketMQ's proxy
forwards by offset: a retried forward then ends, whichever delivery of the message is current — under a stale
handle only when the message there is the one the forward names by id (a topic made again reuses offsets).

Owned by the core, which hands Acks, ChangeInvisibleDuration, Renew and dead-letter requests here; it knows
nothing of the core: a FIFO message leaving the group's flight and the acks to count go back through the
callbacks it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from popgate_pb import broker_pb2 as pb

from broker.clock import Clock
from broker.commits import StateCommits
from broker.inflight import Delivery, GroupTopic
from broker.redelivery import Redelivery
from broker.settings import BrokerSettings
from broker.store import Op
from popgate_contract import validation
from popgate_contract.errors import (
    BadRequest,
    DomainError,
    IllegalBatchSize,
    IllegalInvisibleTime,
    InvalidReceiptHandle,
)
from popgate_contract.receipt import ReceiptHandle, encode_handle

# A forward by offset whose delivery changed while its payload was read (acked, delivered again) is decided again
# on the group's state then, at most this many times in all.
MAX_FORWARD_TRIES = 3


class Acks:
    def __init__(
        self,
        *,
        name: str,
        settings: BrokerSettings,
        groups: dict[tuple[str, str], GroupTopic],
        commits: StateCommits,
        redelivery: Redelivery,
        fifo_released: Callable[[GroupTopic, int], None],
        counted: Callable[[str, dict[str, list[tuple[int, int]]]], None],
        clock: Clock,
    ) -> None:
        self.name = name
        self.settings = settings
        self.groups = groups
        self.commits = commits
        self.redelivery = redelivery
        self.fifo_released = fifo_released  # a FIFO message left the group's flight (acked): (state, queue id)
        self.counted = counted  # the acks of one Ack: (group, topic -> (queue, offset) acked)
        self.clock = clock

    def decode(self, topic: str, text: str) -> ReceiptHandle:
        """A handle of this broker, for `topic` (any topic when empty); else InvalidReceiptHandle."""
        handle = ReceiptHandle.decode(text)
        if handle.broker != self.name:
            raise InvalidReceiptHandle(f"receipt handle belongs to broker {handle.broker}, not {self.name}")
        if topic and handle.topic != topic:
            raise InvalidReceiptHandle(f"receipt handle is for topic {handle.topic}, not {topic}")
        return handle

    def resolve(self, topic: str, group: str, text: str) -> tuple[GroupTopic, ReceiptHandle, Delivery]:
        handle = self.decode(topic, text)
        state = self.groups.get((group, handle.topic))
        delivery = state.current(handle.queue_id, handle.offset, handle.token) if state else None
        if state is None or delivery is None or delivery.attempt != handle.attempt:
            # Not "stale" alone: a handle acked with another group's name lands here too, and the message names
            # both causes — tests/unit/broker/test_wrong_group.py::
            # test_an_ack_under_another_groups_name_says_that_group_has_no_such_delivery.
            raise InvalidReceiptHandle(
                f"consumer group {group} has no in-flight delivery of message {handle.topic}/{handle.queue_id}/"
                f"{handle.offset} with this receipt handle: the handle is another group's, or the message was acked "
                "or redelivered since"
            )
        return state, handle, delivery

    def each_resolved(
        self, topic: str, group: str, handles: Sequence[str], results: list[Any]
    ) -> Iterator[tuple[GroupTopic, ReceiptHandle, Delivery]]:
        """`resolve` of each handle in order: a handle that names no delivery of the group gets its error appended to
        `results` and is skipped; the caller appends its own result for each one yielded, so `results` keeps the
        handles' order."""
        for text in handles:
            try:
                yield self.resolve(topic, group, text)
            except DomainError as exc:
                results.append(exc)

    async def ack(self, topic: str, group: str, handles: Sequence[str]) -> list[DomainError | None]:
        check_handles("ack", group, handles)
        results: list[DomainError | None] = []
        ops: list[Op] = []
        released: dict[tuple[str, int], GroupTopic] = {}  # (topic, queue) whose FIFO block may be gone
        acked: dict[str, list[tuple[int, int]]] = {}  # topic -> (queue, offset) acked, in request order
        for state, handle, _ in self.each_resolved(topic, group, handles, results):
            if state.remove(handle.queue_id, handle.offset):
                released[(state.topic, handle.queue_id)] = state
            ops.append(state.done_op(handle.queue_id, handle.offset))
            acked.setdefault(handle.topic, []).append((handle.queue_id, handle.offset))
            results.append(None)
        for (_, queue_id), state in released.items():
            self.fifo_released(state, queue_id)
        if ops:
            await self.commits.write(ops)
        self.counted(group, acked)
        return results

    async def change_invisible(self, topic: str, group: str, text: str, invisible_ms: int) -> tuple[str, int]:
        validation.check_group(group)
        if not 0 <= invisible_ms <= self.settings.max_invisible_ms:
            raise IllegalInvisibleTime(
                f"invisible time {invisible_ms} ms is outside 0..{self.settings.max_invisible_ms} ms"
            )
        state, handle, old = self.resolve(topic, group, text)
        deadline = self.clock.now_ms() + invisible_ms
        ops: list[Op] = []
        delivery = state.start_delivery(handle.queue_id, handle.offset, old.attempt, deadline, ops)
        self.redelivery.schedule(state)
        await self.commits.write(ops)
        new = encode_handle(
            self.name, handle.topic, handle.queue_id, handle.offset, delivery.attempt, delivery.token, deadline
        )
        return new, deadline

    async def change_invisible_many(
        self, topic: str, group: str, handles: Sequence[str], invisible_ms: int, *, undelivered: bool = False
    ) -> tuple[list[tuple[str, int] | DomainError], int]:
        """`change_invisible` of each handle, all to `invisible_ms` from now, in one commit: per handle its new
        handle and deadline, or the error it alone would have raised (the others are changed all the same) —
        tests/unit/broker/test_change_many.py. `undelivered` (messages the application never saw): ready at once
        with the attempt they had and taken first, as a Pop its cancel frame released (`Pops.release`) —
        tests/unit/broker/test_change_many.py::test_messages_given_back_undelivered_keep_their_attempt, and
        ::test_only_a_pops_delivery_is_uncounted_by_an_undelivered_give_back."""
        check_handles("ChangeInvisibleTimes", group, handles)
        if not 0 <= invisible_ms <= self.settings.max_invisible_ms or (undelivered and invisible_ms):
            raise IllegalInvisibleTime(
                f"invisible time {invisible_ms} ms is outside 0..{0 if undelivered else self.settings.max_invisible_ms}"
                " ms"
            )
        deadline = self.clock.now_ms() + invisible_ms
        results: list[tuple[str, int] | DomainError] = []
        ops: list[Op] = []
        touched: dict[tuple[str, str], GroupTopic] = {}
        for state, handle, old in self.each_resolved(topic, group, handles, results):
            # Its next Pop counts it again: uncounted only when a Pop counted it (not a nack's handle given back)
            attempt = old.attempt - 1 if undelivered and old.popped else old.attempt
            delivery = state.start_delivery(handle.queue_id, handle.offset, attempt, deadline, ops)
            if undelivered:
                state.undone.add((handle.queue_id, handle.offset))
            touched[(state.group, state.topic)] = state
            new = encode_handle(
                self.name, handle.topic, handle.queue_id, handle.offset, delivery.attempt, delivery.token, deadline
            )
            results.append((new, deadline))
        for state in touched.values():
            self.redelivery.schedule(state)
        if ops:
            await self.commits.write(ops)
        return results, deadline

    async def renew(
        self, group: str, handles: Sequence[str], invisible_ms: int, *, bring_forward: bool = False
    ) -> tuple[list[DomainError | None], int]:
        """Extend the invisibility of in-flight deliveries to `invisible_ms` from now, keeping each delivery (its
        receipt handle stays valid: the proxy renews handles its client holds); per handle None or the error, and the
        new deadline. Stale handles, and deliveries whose invisibility already passed (queued to be delivered again:
        a handle acks until then, but renewing it now would race that redelivery), are InvalidReceiptHandle. A
        deadline already later stays, unless `bring_forward` (a client gone: visible again soon). Durable as the
        other in-flight changes (a PutInflight)."""
        check_handles("renew", group, handles)
        check_invisible(self.settings, invisible_ms)
        deadline = self.clock.now_ms() + invisible_ms
        results: list[DomainError | None] = []
        ops: list[Op] = []
        touched: dict[tuple[str, str], GroupTopic] = {}
        for text in handles:
            try:
                state, handle, delivery = self.resolve("", group, text)
                if delivery.expired:
                    raise InvalidReceiptHandle("receipt handle is stale: its invisibility passed, redelivery is due")
            except DomainError as exc:
                results.append(exc)
                continue
            if delivery.deadline_ms < deadline or (bring_forward and delivery.deadline_ms != deadline):
                state.extend(handle.queue_id, handle.offset, delivery, deadline, ops)
                touched[(state.group, state.topic)] = state
            results.append(None)
        for state in touched.values():
            self.redelivery.schedule(state)
        if ops:
            await self.commits.write(ops)
        return results, deadline

    async def dead_letter(self, topic: str, group: str, text: str, *, message_id: str = "") -> pb.StoredMessage | None:
        """Move the message the handle names to the group's DLQ by its topic, queue and offset, as RocketMQ's proxy
        forwards by offset: under a stale handle too, for the official clients retry a refused forward forever. In
        flight to the group under any delivery (a newer one, or one whose invisibility passed) it is dead-lettered
        and that delivery ends (`Redelivery.dead_letter`: one commit, a FIFO message group released); no longer the
        group's (acked, dead-lettered already or under way) None, and nothing is written. Under a stale handle a
        `message_id` given must be the stored message's, else None and nothing written: a topic deleted and made
        again reuses offsets (test_a_stale_forward_of_a_deleted_topics_message_leaves_the_new_message_at_its_offset).
        A message the group was never given (or a group with no state on the topic) stays InvalidReceiptHandle —
        tests/unit/broker/test_dead_letter_stale.py."""
        validation.check_group(group)
        tries = MAX_FORWARD_TRIES
        while True:
            state, handle, delivery = self.owed(topic, group, text)
            if delivery is None:
                return None
            current = delivery.token == handle.token and delivery.attempt == handle.attempt
            tries -= 1
            try:
                return await self.redelivery.dead_letter(
                    state, handle.queue_id, handle.offset, delivery, message_id="" if current else message_id
                )
            except InvalidReceiptHandle:
                if not tries:
                    raise

    def owed(self, topic: str, group: str, text: str) -> tuple[GroupTopic, ReceiptHandle, Delivery | None]:
        """The group's delivery of the message the handle names, whichever delivery is current; None when the
        group is done with it (acked, dead-lettered, or passed: below its pull offset, or taken ahead and done).
        InvalidReceiptHandle when the group never had it (no state on that queue, or not reached yet)."""
        handle = self.decode(topic, text)
        state = self.groups.get((group, handle.topic))
        gq = state.queues.get(handle.queue_id) if state is not None else None
        if state is None or gq is None:
            raise InvalidReceiptHandle(f"consumer group {group} never read {handle.topic}/{handle.queue_id}")
        delivery = gq.inflight.get(handle.offset)
        if delivery is not None or handle.offset < gq.pull_offset or handle.offset in (gq.ahead or ()):
            return state, handle, delivery
        raise InvalidReceiptHandle(
            f"consumer group {group} was never given message {handle.topic}/{handle.queue_id}/{handle.offset}"
        )

    def unreadable(self, topic: str, group: str, text: str) -> None:
        """A popped message whose stored payload does not parse: dead-lettered as it is, not answered (it would
        fail every Pop it is in, and its healthy batch-mates would reach the DLQ with it)."""
        try:
            state, handle, delivery = self.resolve(topic, group, text)
        except DomainError:
            return
        self.redelivery.to_dlq(state, handle.queue_id, handle.offset, delivery)


def check_invisible(settings: BrokerSettings, invisible_ms: int) -> None:
    s = settings
    if not s.min_invisible_ms <= invisible_ms <= s.max_invisible_ms:
        raise IllegalInvisibleTime(
            f"invisible time {invisible_ms} ms is outside {s.min_invisible_ms}..{s.max_invisible_ms} ms"
        )


def check_handles(kind: str, group: str, handles: Sequence[str]) -> None:
    """An Ack's or a Renew's group and its 1..MAX_HANDLES receipt handles."""
    validation.check_group(group)
    if not handles:
        raise BadRequest(f"{kind} carries no receipt handle")
    if len(handles) > validation.MAX_HANDLES:
        raise IllegalBatchSize(f"{kind} carries {len(handles)} handles, at most {validation.MAX_HANDLES}")
