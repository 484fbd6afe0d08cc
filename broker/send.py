"""The send path: checking messages, choosing queues, creating topics, and scheduled delivery.

Every message of a Send is checked before anything is stored (all or nothing).
Messages due now go to their topic; delayed ones go to the durable schedule and
are moved into their topic by the ``ScheduledDelivery`` when due.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from popgate_pb import broker_pb2 as pb

from broker.budget import ByteBudget
from broker.clock import Clock
from broker.log import QueueLog, TopicLog
from broker.model import MessageIds, Sent, stable_hash
from broker.schedule import ScheduledDelivery, ScheduleIndex, due_time_ms
from broker.settings import BrokerSettings
from broker.store import (
    RECORD_OVERHEAD_BYTES,
    CreateQueue,
    DeleteScheduled,
    NewMessage,
    Op,
    PutScheduled,
    Record,
    Store,
)
from broker.topic_purges import TopicDeletion
from popgate_contract import validation
from popgate_contract.errors import (
    BEING_DELETED,
    BadRequest,
    IllegalBatchSize,
    MessageBodyEmpty,
    MessageBodyTooLarge,
    StoreUnavailable,
    TooManyRequests,
    TopicNotFound,
)
from popgate_contract.handles import RecallHandle
from popgate_contract.v2wire import body_digest, message_id_field, static_parts, static_system
from popgate_contract.wire import field

if TYPE_CHECKING:
    from broker.transactions import Transactions

Built = tuple[list[NewMessage], list[Op], list[Sent]]  # a Send's appends, ops and answers, in the making
_MESSAGE_ID, _BODY, _V2 = b"\x1a", b"\x22", b"\x7a"  # Message.message_id (3), body (4), v2_system (15)
# A scheduled message due into a topic whose deletion is still going waits this much longer (`deliver_scheduled`).
PURGING_RETRY_MS = 1000


def _expand(shared: pb.Message, body: bytes, message_id: str) -> pb.Message:
    """A run's message as a Message of its own."""
    m = pb.Message()
    m.CopyFrom(shared)
    m.body, m.message_id = body, message_id
    return m


def remembered_queue(topic: TopicLog, queue_id: int) -> int:
    """The queue a message chosen for `queue_id` when it was sent (scheduled, or a transaction's half message) is
    appended to now: that queue while the topic has it, else the topic's choice for a new message (the topic was
    deleted and made again with fewer queues meanwhile) — tests/unit/broker/test_schedule.py::
    test_a_message_due_in_a_topic_made_again_with_fewer_queues_goes_to_a_queue_it_has and
    tests/unit/broker/test_transactions.py::test_a_half_committed_into_a_topic_made_again_with_fewer_queues_is_delivered."""
    return queue_id if queue_id < len(topic.queues) else topic.pick_queue()


class SendPath:
    def __init__(self, settings: BrokerSettings, store: Store, topics: dict[str, TopicLog], *, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self.name = settings.name
        self.store = store
        self.topics = topics
        self.ids = MessageIds()  # for messages sent without one (and dead letters whose original is unreadable)
        self._valid_topics: set[str] = set()
        self.schedule = ScheduleIndex()
        self._scheduled_rows: dict[int, PutScheduled] = {}
        self._scheduled_bytes = 0
        self._next_schedule_id = 0
        self._unsaved_topics: set[str] = set()  # created in memory, their queue rows not yet committed
        self.deleting: dict[str, TopicDeletion] = {}  # topics being deleted (broker.admin): Sends to them are refused
        # Of those, the ones an admin deletes (not retention's drop of a DLQ topic, which keeps a letter written
        # meanwhile): any append into them is refused (`_into`).
        self.deleting_all: set[str] = set()
        # Deleted topics whose purge has not committed (StateCommits.purging, set by the core): not made again.
        self.purging: set[str] = set()
        self.scheduler = ScheduledDelivery(
            self.schedule, self.deliver_scheduled, clock=clock, max_in_flight=settings.schedule_max_in_flight
        )
        self.on_lateness: Callable[[float], None] | None = None
        self.transactions: Transactions | None = None  # set by the core (it needs this send path)
        # Sends taken and not yet committed (docs/BROKER.md, "Limits"): their bodies are held by grpc's request,
        # the serialized payloads and the writer's queue until the commit settles.
        self.in_flight = ByteBudget(
            settings.max_send_bytes, what="bytes of sends in flight", setting="--max-send-bytes"
        )

    def restore(self, scheduled: list[tuple[int, int]]) -> None:
        for due, schedule_id in scheduled:
            self.schedule.add(due, schedule_id)
            self._next_schedule_id = max(self._next_schedule_id, schedule_id)

    async def send(
        self, messages: Sequence[pb.Message], runs: Sequence[pb.SharedRun] = (), within_s: float | None = None
    ) -> list[Sent]:
        """Store `messages`, then each run's messages, in order; their results in that order. `within_s`: the
        caller's time; a Send whose commit has not started within it stores nothing (half messages and scheduled
        ones neither) and is refused TooManyRequests (`Store.submit`)."""
        if len(runs) > validation.MAX_SEND_MESSAGES:  # refused at the cost of its count: each run has a message
            raise IllegalBatchSize(f"send carries {len(runs)} runs, at most {validation.MAX_SEND_MESSAGES}")
        count = len(messages) + sum(len(r.bodies) for r in runs)
        if not count:
            raise BadRequest("send carries no message")
        if count > validation.MAX_SEND_MESSAGES:
            raise IllegalBatchSize(f"send carries {count} messages, at most {validation.MAX_SEND_MESSAGES}")
        now = self.clock.now_ms()
        checked = [self.check(m, now) for m in messages]  # all or nothing: check every message first
        shared = [self.check_run(r, now) for r in runs]
        self.check_new_topics([*messages, *(r.shared for r in runs)])
        # Before anything is created, copied or stored (a refused Send stores none of its messages); after the
        # checks (a bad Send is refused as such). Nothing below awaits before the commit is submitted.
        body_bytes = sum(len(m.body) for m in messages) + sum(len(b) for r in runs for b in r.bodies)
        # A run's shared part is stored with each of its messages: counted once a message, as it will be held —
        # tests/unit/broker/test_send_runs.py::test_a_runs_shared_part_counts_once_a_message_against_the_budget.
        shared_bytes = sum(r.shared.ByteSize() * len(r.bodies) for r in runs)
        cost = self.in_flight.take(body_bytes + shared_bytes + RECORD_OVERHEAD_BYTES * count)
        appends: list[NewMessage] = []
        ops: list[Op] = []
        out: list[Sent] = []
        try:
            self._build(messages, checked, now, (appends, ops, out))
            for run, (tag, due) in zip(runs, shared, strict=True):
                if due is None and not run.shared.transactional:
                    self._build_run(run, tag, now, (appends, ops, out))
                else:  # scheduled or a transaction's: a message at a time, as if sent so
                    expanded = [_expand(run.shared, b, i) for b, i in zip(run.bodies, run.message_ids, strict=True)]
                    self._build(expanded, [(tag, due)] * len(expanded), now, (appends, ops, out))
            # Its caller waits, also for a Send of half or delayed messages alone (no append) naming no time —
            # tests/unit/broker/test_transactions.py::
            # test_a_send_of_half_or_delayed_messages_alone_is_not_deferred_as_consumer_state.
            committed = self.submit(appends, ops, within_s, awaited=True)
        except BaseException:  # nothing was submitted: the bytes were never held
            self.in_flight.give(cost)
            raise
        committed.add_done_callback(lambda _: self.in_flight.give(cost))  # stored, failed, or its caller gone
        # Shielded: a Send cancelled while its commit is under way (client gone, proxy timeout,
        # session lost) must not cancel what the commit does after it (see `submit`).
        records = await asyncio.shield(committed)
        offsets = iter(records)
        for sent in out:
            if sent.due_ms is None and not sent.transaction_id:  # appended to its topic now
                sent.offset = next(offsets).offset
        return out

    def _build_run(self, run: pb.SharedRun, tag: str | None, now: int, into: Built) -> None:
        """A checked run's appends and answers, as `place` would make them for each of its messages: what they
        share is encoded once, each adds its id, body and the v2 system properties that differ (id, digest) —
        tests/unit/broker/test_send_runs.py::test_a_runs_messages_are_stored_as_the_same_messages_sent_one_by_one."""
        appends, ops, out = into
        shared = pb.Message()
        shared.CopyFrom(run.shared)
        shared.ClearField("v2_system")
        if not shared.born_ms:
            shared.born_ms = now
        topic = self.topic_for_send(shared.topic, ops)
        name, group, priority = shared.topic, shared.message_group, shared.priority
        if group:
            fixed: int | None = stable_hash(group) % len(topic.queues)
        else:
            fixed = shared.queue_id if shared.HasField("queue_id") and shared.queue_id >= 0 else None
        head, (before, after) = shared.SerializeToString(), static_parts(shared)
        for body, message_id in zip(run.bodies, run.message_ids, strict=True):
            message_id = message_id or self.ids.next()
            system = before + message_id_field(message_id) + body_digest(body) + after
            payload = b"".join((head, field(_MESSAGE_ID, message_id.encode()), field(_BODY, body), field(_V2, system)))
            queue_id = topic.pick_queue() if fixed is None else fixed
            appends.append(NewMessage(name, queue_id, now, tag, payload, fifo=bool(group), priority=priority))
            out.append(Sent(message_id, name, queue_id, -1))

    def _build(
        self, messages: Sequence[pb.Message], checked: list[tuple[str | None, int | None]], now: int, into: Built
    ) -> None:
        """The appends, ops and answers of checked messages (scheduled messages go to the schedule), added to `into`."""
        appends, ops, out = into
        for m, (tag, due) in zip(messages, checked, strict=True):
            new = self.place(m, tag, now, ops)
            if m.transactional and self.transactions is not None:
                half, transaction_id = self.transactions.half(m, new, now)
                ops.append(half)  # a Put of its own table, like a scheduled message's
                out.append(Sent(m.message_id, m.topic, new.queue_id, -1, transaction_id=transaction_id))
            elif due is None:
                appends.append(new)
                out.append(Sent(m.message_id, m.topic, new.queue_id, -1))
            else:
                self._next_schedule_id += 1
                put = PutScheduled(self._next_schedule_id, due, m.topic, new.queue_id, tag, new.payload)
                ops.append(put)
                recall = RecallHandle(self.name, m.topic, put.schedule_id, m.message_id).encode()
                out.append(Sent(m.message_id, m.topic, new.queue_id, -1, due, recall))

    def submit(
        self, appends: Sequence[NewMessage], ops: Sequence[Op], within_s: float | None = None, *, awaited: bool = False
    ) -> asyncio.Future[list[Record]]:
        """`Store.submit` for every write of the send path (`within_s`: a Send's, see `send`; `awaited`: see
        `Store.submit`). What a commit stores
        takes effect from the commit, not from its caller's return (appends are announced by the store the same way):
        a new topic's queue rows count as stored (until then each write to the topic carries them again, see
        `topic_for_send`) and a scheduled message joins the schedule."""
        refused = (self.purging and self._remade(ops)) or (self.deleting_all and self._into(appends))
        if refused:
            committed: asyncio.Future[list[Record]] = asyncio.get_running_loop().create_future()
            committed.set_exception(
                StoreUnavailable(f"topic {refused} is being deleted on broker {self.name}: made again once it is")
            )
        elif within_s is not None:
            committed = self.store.submit(appends, ops, within_s=within_s)
        elif awaited:
            committed = self.store.submit(appends, ops, awaited=True)
        else:
            committed = self.store.submit(appends, ops)
        committed.add_done_callback(functools.partial(self._committed, ops))
        return committed

    def _into(self, appends: Sequence[NewMessage]) -> str | None:
        """A topic being deleted that these appends would go into (a scheduled message come due, a transaction's
        commit, a dead letter: a Send's own messages are refused before): its purge would delete them, so they are
        refused as a refused commit, each retried by its own path —
        tests/unit/broker/test_topic_purges.py::test_a_scheduled_message_due_as_its_topic_is_deleted_is_kept."""
        return next((m.topic for m in appends if m.topic in self.deleting_all), None)

    def _remade(self, ops: Sequence[Op]) -> str | None:
        """A deleted topic that these ops would make again before its purge committed (`topic_for_send`)."""
        return next((op.topic for op in ops if isinstance(op, CreateQueue) and op.topic in self.purging), None)

    def _committed(self, ops: Sequence[Op], future: asyncio.Future[list[Record]]) -> None:
        if future.cancelled() or future.exception() is not None:  # also retrieves a failure nobody awaits
            return
        if self.transactions is not None:
            self.transactions.committed(ops)
        for op in ops:
            if isinstance(op, CreateQueue):
                self._unsaved_topics.discard(op.topic)
            elif isinstance(op, PutScheduled):
                self.schedule.add(op.due_ms, op.schedule_id)
                if self._scheduled_bytes < self.settings.cache_bytes // 2:
                    self._scheduled_rows[op.schedule_id] = op  # saves a disk read at delivery
                    self._scheduled_bytes += len(op.payload)
                self.scheduler.added(op.due_ms)

    def check(self, m: pb.Message, now: int) -> tuple[str | None, int | None]:
        """Validate one message; returns its tag and due time (None when none)."""
        self._check_body(m.body)
        return self._check_fields(m, now)

    def check_run(self, run: pb.SharedRun, now: int) -> tuple[str | None, int | None]:
        """Validate a run as its messages one by one: the first whole, then each other's body and id (all else they
        share), so that a bad run is refused with the error its first bad message would get; their tag and due
        time — tests/unit/broker/test_send_runs.py::test_a_bad_run_is_refused_as_its_messages_sent_one_by_one."""
        bodies, ids, shared = run.bodies, run.message_ids, run.shared
        if not bodies or len(ids) != len(bodies):
            raise BadRequest(f"a run carries {len(bodies)} bodies and {len(ids)} message ids: one each")
        if shared.body or shared.message_id:
            raise BadRequest("a run's shared message has a body or a message id of its own")
        checked = self.check(_expand(shared, bodies[0], ids[0]), now)
        for body, message_id in zip(itertools.islice(bodies, 1, None), itertools.islice(ids, 1, None), strict=True):
            self._check_body(body)  # each body read (copied) once, not the run's bodies all at once
            if message_id:
                validation.check_message_id(message_id)
        return checked

    def _check_body(self, body: bytes) -> None:
        size = len(body)
        if not size:
            raise MessageBodyEmpty("message body is empty")
        if size > self.settings.max_body_bytes:
            raise MessageBodyTooLarge(
                f"message body is {size} bytes, larger than the limit of {self.settings.max_body_bytes}"
            )

    def _check_fields(self, m: pb.Message, now: int) -> tuple[str | None, int | None]:
        """`check` of all but the body."""
        if m.topic not in self._valid_topics:
            validation.check_topic(m.topic)
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(m.topic)
        tag = m.tag if m.HasField("tag") else None
        if tag is not None:
            validation.check_tag(tag)
        if m.keys:
            validation.check_keys(m.keys)
        if m.properties or m.keys or tag:
            validation.check_properties(m.properties, tag=tag or "", keys=m.keys)
        if m.message_id:
            validation.check_message_id(m.message_id)
        if m.message_group:
            validation.check_message_group(m.message_group)
        if m.trace_context:
            validation.check_trace_context(m.trace_context)
        due = due_time_ms(
            now, deliver_at_ms=m.deliver_at_ms, delay_level=m.delay_level, max_delay_ms=self.settings.max_delay_ms
        )
        if due is not None and m.message_group:  # as RocketMQ's clients: a FIFO message is never delayed
            raise BadRequest("a message with a message group cannot also have a delivery time or delay")
        if m.priority < 0:
            raise BadRequest(f"priority {m.priority} is negative")
        if m.priority and (m.message_group or due is not None):  # as RocketMQ's clients
            raise BadRequest("a priority message cannot also have a message group, a delivery time or a delay")
        if m.transactional and (m.message_group or due is not None or m.priority):  # as RocketMQ's clients
            raise BadRequest("a transactional message cannot also have a message group, a delivery time or a priority")
        if m.HasField("queue_id") and m.queue_id >= 0:
            topic = self.topics.get(m.topic)
            count = len(topic.queues) if topic else self.settings.queues_per_topic
            if m.queue_id >= count:
                raise BadRequest(f"queue {m.queue_id} does not exist; topic {m.topic} has {count} queues")
        if m.topic in self.deleting or m.topic in self.purging:
            raise TopicNotFound(f"topic {m.topic} {BEING_DELETED} on broker {self.name}")
        if not self.settings.auto_create and m.topic not in self.topics:
            raise TopicNotFound(f"topic {m.topic} does not exist on broker {self.name} and auto-create is off")
        return tag, due

    def check_new_topics(self, messages: Sequence[pb.Message]) -> None:
        """Refuse, before anything is created, a Send whose new topics would take the broker past `--max-topics`.
        Each topic costs memory and metric series for good, and any producer could name new ones (one Send may
        name as many as it has messages). Topics the broker creates itself (`--topic` at start, a group's
        dead-letter topic, a scheduled message's topic when due) are never refused but count —
        tests/unit/broker/test_limits.py::test_a_send_that_would_create_topics_beyond_the_limit_is_refused_whole.
        A Send creating no topic is never refused, even with the broker past the limit by its own topics —
        ::test_past_the_topic_limit_by_the_brokers_own_topics_sends_to_existing_topics_go_on."""
        room = max(self.settings.max_topics - len(self.topics), 0)
        if room >= len(messages):
            return  # the common case: no set to build
        new = {m.topic for m in messages if m.topic not in self.topics}
        if len(new) > room:
            raise TooManyRequests(
                f"broker {self.name} has {len(self.topics)} topics, its limit (--max-topics {self.settings.max_topics})"
                f": a Send creating {len(new)} more is refused"
            )

    def place(self, m: pb.Message, tag: str | None, now: int, ops: list[Op]) -> NewMessage:
        """Choose the queue and fill in what the producer left out (after every message passed its checks)."""
        topic = self.topic_for_send(m.topic, ops)
        if m.message_group:
            queue_id = stable_hash(m.message_group) % len(topic.queues)
        elif m.HasField("queue_id") and m.queue_id >= 0:
            queue_id = m.queue_id
        else:
            queue_id = topic.pick_queue()
        if not m.message_id:
            m.message_id = self.ids.next()
        if not m.born_ms:
            m.born_ms = now
        m.v2_system = static_system(m)  # after the last change to the message: what it is stored as
        payload = m.SerializeToString()
        return NewMessage(m.topic, queue_id, now, tag, payload, fifo=bool(m.message_group), priority=m.priority)

    def forget(self, topic: str) -> None:
        """The topic was deleted (broker.admin): nothing of its name is kept
        (tests/unit/broker/test_admin.py::test_deleted_topics_leave_nothing_behind_however_many)."""
        self._unsaved_topics.discard(topic)
        self._valid_topics.discard(topic)

    def unsaved(self, topic: str) -> None:
        """The topic's queue rows may be missing from the store: its next write stores them."""
        self._unsaved_topics.add(topic)

    def topic_for_send(self, name: str, ops: list[Op], *, force: bool = False, queues: int = 0) -> TopicLog:
        """The topic a write goes to, made when it does not exist (the CreateQueue ops appended to `ops`).

        A deleted topic whose purge has not committed is not made (the store's offsets of it go on until the purge
        commits): a topic outside `topics` is returned and `submit` fails the write with StoreUnavailable, as a
        refused commit, so that a scheduled delivery, a transaction's commit or a dead letter is retried by its own
        path — tests/unit/broker/test_admin.py::
        test_a_topic_whose_deletion_failed_is_not_made_again_before_its_purge_commits."""
        topic = self.topics.get(name)
        if topic is not None:
            if name in self._unsaved_topics:  # its first commit failed or is still on its way
                ops.extend(CreateQueue(name, q.queue_id) for q in topic.queues)
            return topic
        if not (self.settings.auto_create or force):
            raise TopicNotFound(f"topic {name} does not exist on broker {self.name} and auto-create is off")
        count = queues or self.settings.queues_per_topic
        topic = TopicLog(name, [QueueLog(name, q) for q in range(count)])
        ops.extend(CreateQueue(name, q) for q in range(count))
        if name not in self.purging:
            self.topics[name] = topic
            self._unsaved_topics.add(name)
        return topic

    async def scheduled_rows(self, schedule_ids: Sequence[int]) -> list[PutScheduled]:
        """The stored rows of these scheduled messages (those the cache has, the rest from the store)."""
        rows = [r for sid in schedule_ids if (r := self._scheduled_rows.get(sid)) is not None]
        if len(rows) < len(schedule_ids):
            rows += await self.store.read_scheduled([sid for sid in schedule_ids if sid not in self._scheduled_rows])
        return rows

    def forget_scheduled(self, schedule_id: int) -> None:
        """A scheduled message left the schedule (delivered or recalled): its cached row goes."""
        if (row := self._scheduled_rows.pop(schedule_id, None)) is not None:
            self._scheduled_bytes -= len(row.payload)

    async def deliver_scheduled(self, entries: list[tuple[int, int]]) -> None:
        """Move due scheduled messages into their topics: append and delete in one transaction. One whose topic is
        being deleted, or deleted and its rows not yet (`purging`: not made again until then), waits
        PURGING_RETRY_MS more, not failing its batch, whose retries past the last would hold every topic's
        deliveries back —
        tests/unit/broker/test_topic_purges.py::test_a_deleted_topics_scheduled_message_waits_and_holds_no_other."""
        rows = await self.scheduled_rows([sid for _, sid in entries])
        if (held := self.purging | self.deleting_all) and any(r.topic in held for r in rows):
            due = self.clock.now_ms() + PURGING_RETRY_MS
            later = {r.schedule_id for r in rows if r.topic in held}
            for sid in later:
                self.schedule.add(due, sid)
            # Out of the batch, which a failed commit retries: they are waiting in the schedule again —
            # tests/unit/broker/test_topic_purges.py::test_a_put_back_scheduled_message_is_not_in_its_batchs_retry.
            taken = len(entries)
            entries[:] = [e for e in entries if e[1] not in later]
            self.scheduler.put_back(taken - len(entries), due)
            rows = [r for r in rows if r.schedule_id not in later]
            if not rows:
                return
        ops: list[Op] = [DeleteScheduled(r.schedule_id) for r in rows]
        appends = []
        for r in rows:
            queue_id = remembered_queue(self.topic_for_send(r.topic, ops, force=True), r.queue_id)
            appends.append(NewMessage(r.topic, queue_id, self.clock.now_ms(), r.tag, r.payload))
        await self.submit(appends, ops)
        for r in rows:
            self.forget_scheduled(r.schedule_id)
        if self.on_lateness is not None:
            now = self.clock.now_ms()
            for r in rows:
                self.on_lateness((now - r.due_ms) / 1000)
