"""The broker core: topics, consumer groups, pop/ack/invisibility, long polling and dead letters.

Protocol-neutral (no gRPC). All hot state lives here, on the event loop; the
store makes it durable. Pops reserve messages synchronously (so concurrent pops
never share a message) and then await the store.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from popgate_pb import broker_pb2 as pb

from broker import validation
from broker.errors import (
    BadRequest,
    BrokerError,
    IllegalBatchSize,
    IllegalInvisibleTime,
    IllegalMessage,
    IllegalPollingTime,
    InvalidReceiptHandle,
    MessageBodyEmpty,
    MessageBodyTooLarge,
    TopicNotFound,
)
from broker.filters import TagFilter
from broker.inflight import Delivery, GroupTopic
from broker.lag import QueueLag, queue_lag
from broker.log import PayloadCache, QueueLog, TopicLog
from broker.longpoll import HoldService, Kind, Outcome
from broker.receipt import ReceiptHandle
from broker.schedule import ScheduledDelivery, ScheduleIndex, due_time_ms
from broker.settings import BrokerSettings
from broker.store import (
    CreateQueue,
    DeleteInflight,
    DeleteScheduled,
    NewMessage,
    Op,
    PutInflight,
    PutScheduled,
    Record,
    SetGroupFilter,
    SetPullOffset,
    Snapshot,
    Store,
)

log = logging.getLogger(__name__)

DLQ_PROPS = ("ORIGIN_TOPIC", "ORIGIN_MESSAGE_ID", "DELIVERY_ATTEMPTS", "ORIGIN_QUEUE_ID", "ORIGIN_OFFSET")
MAX_PROPERTIES_BYTES = 16 * 1024
MAX_KEYS = 64


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# Delivery tokens only have to be unguessable by a client that never saw the handle,
# not cryptographically strong: a seeded PRNG avoids a syscall per message.
_tokens = random.Random(os.urandom(16))


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
    offset: int  # -1 while scheduled
    due_ms: int | None = None


@dataclass(slots=True)
class PopResult:
    messages: list[Popped]
    polling_full: bool = False


@dataclass(frozen=True, slots=True)
class GroupQueueLag:
    topic: str
    group: str
    queue_id: int
    lag: QueueLag


class BrokerCore:
    def __init__(self, settings: BrokerSettings, store: Store) -> None:
        self.settings = settings
        self.name = settings.name
        self.store = store
        self.topics: dict[str, TopicLog] = {}
        self.groups: dict[tuple[str, str], GroupTopic] = {}  # (group, topic)
        self.hold = HoldService(settings.max_held)
        self.cache = PayloadCache(settings.cache_bytes)
        self.messages_in: dict[str, int] = {}
        self.messages_out: dict[tuple[str, str], int] = {}
        self._timers: dict[tuple[str, str], tuple[int, asyncio.TimerHandle]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = MessageIds()
        self._valid_topics: set[str] = set()
        self.schedule = ScheduleIndex()
        self._scheduled_rows: dict[int, PutScheduled] = {}
        self._scheduled_bytes = 0
        self._next_schedule_id = 0
        self.scheduler = ScheduledDelivery(
            self.schedule, self._deliver_scheduled, max_in_flight=settings.schedule_max_in_flight
        )
        self.on_lateness: Callable[[float], None] | None = None

    # -- start ---------------------------------------------------------------

    def restore(self, snap: Snapshot) -> None:
        by_topic: dict[str, list[QueueLog]] = {}
        for (topic, queue_id), index in sorted(snap.queues.items()):
            by_topic.setdefault(topic, []).append(QueueLog(topic, queue_id, index))
        for topic, queues in by_topic.items():
            self.topics[topic] = TopicLog(topic, queues)
        for f in snap.filters:
            self._group(f.group, f.topic).filter = TagFilter.parse(f.expression)
        for p in snap.pull_offsets:
            self._group(p.group, p.topic).queue(p.queue_id, p.pull_offset).pull_offset = p.pull_offset
        for i in snap.inflight:
            state = self._group(i.group, i.topic)
            state.queue(i.queue_id, i.offset + 1)
            state.deliver(i.queue_id, i.offset, Delivery(i.attempt, i.token, i.deadline_ms))
        for state in self.groups.values():
            self._schedule(state)
        for due, schedule_id in snap.scheduled:
            self.schedule.add(due, schedule_id)
            self._next_schedule_id = max(self._next_schedule_id, schedule_id)

    def start(self) -> None:
        self.scheduler.start()

    async def _deliver_scheduled(self, entries: list[tuple[int, int]]) -> None:
        """Move due scheduled messages into their topics: append and delete in one transaction."""
        rows = [r for _, sid in entries if (r := self._scheduled_rows.get(sid)) is not None]
        if len(rows) < len(entries):
            rows += await self.store.read_scheduled([sid for _, sid in entries if sid not in self._scheduled_rows])
        ops: list[Op] = [DeleteScheduled(r.schedule_id) for r in rows]
        appends = []
        for r in rows:
            self._topic_for_send(r.topic, ops, force=True)
            appends.append(NewMessage(r.topic, r.queue_id, now_ms(), r.tag, r.payload))
        await self.store.submit(appends, ops)
        for r in rows:
            if self._scheduled_rows.pop(r.schedule_id, None) is not None:
                self._scheduled_bytes -= len(r.payload)
        if self.on_lateness is not None:
            now = now_ms()
            for r in rows:
                self.on_lateness((now - r.due_ms) / 1000)

    # -- send ----------------------------------------------------------------

    async def send(self, messages: Sequence[pb.Message]) -> list[Sent]:
        if not messages:
            raise BadRequest("send carries no message")
        if len(messages) > self.settings.max_send_batch:
            raise IllegalBatchSize(f"send carries {len(messages)} messages, at most {self.settings.max_send_batch}")
        now = now_ms()
        checked = [self._check(m, now) for m in messages]  # all or nothing: check every message first
        ops: list[Op] = []
        appends: list[NewMessage] = []
        out: list[Sent] = []
        scheduled: list[PutScheduled] = []
        for m, (tag, due) in zip(messages, checked, strict=True):
            new = self._place(m, tag, now, ops)
            if due is None:
                appends.append(new)
                out.append(Sent(m.message_id, m.topic, new.queue_id, -1))
            else:
                self._next_schedule_id += 1
                put = PutScheduled(self._next_schedule_id, due, m.topic, new.queue_id, tag, new.payload)
                scheduled.append(put)
                out.append(Sent(m.message_id, m.topic, new.queue_id, -1, due))
        records = await self.store.submit(appends, [*ops, *scheduled])
        offsets = iter(records)
        for sent in out:
            if sent.due_ms is None:
                sent.offset = next(offsets).offset
        for put in scheduled:
            self.schedule.add(put.due_ms, put.schedule_id)
            if self._scheduled_bytes < self.settings.cache_bytes // 2:
                self._scheduled_rows[put.schedule_id] = put  # saves a disk read at delivery
                self._scheduled_bytes += len(put.payload)
            self.scheduler.added(put.due_ms)
        return out

    def _check(self, m: pb.Message, now: int) -> tuple[str | None, int | None]:
        """Validate one message; returns its tag and due time (None when none)."""
        if m.topic not in self._valid_topics:
            validation.check_topic(m.topic)
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(m.topic)
        size = len(m.body)
        if not size:
            raise MessageBodyEmpty("message body is empty")
        if size > self.settings.max_body_bytes:
            raise MessageBodyTooLarge(
                f"message body is {size} bytes, larger than the limit of {self.settings.max_body_bytes}"
            )
        tag = m.tag if m.HasField("tag") else None
        if tag is not None:
            validation.check_tag(tag)
        if m.keys:
            if len(m.keys) > MAX_KEYS:
                raise IllegalMessage(f"message has {len(m.keys)} keys, at most {MAX_KEYS}")
            for key in m.keys:
                validation.check_text_field("message key", key, limit=256)
        if m.properties:
            props = sum(len(k) + len(v) for k, v in m.properties.items())
            if props > MAX_PROPERTIES_BYTES or any(not k for k in m.properties):
                raise IllegalMessage(f"message properties need non-empty keys and <= {MAX_PROPERTIES_BYTES} B in all")
        if m.message_id:
            validation.check_message_id(m.message_id)
        if m.message_group:
            validation.check_text_field("message group", m.message_group, limit=128)
        due = due_time_ms(
            now, deliver_at_ms=m.deliver_at_ms, delay_level=m.delay_level, max_delay_ms=self.settings.max_delay_ms
        )
        if m.HasField("queue_id") and m.queue_id >= 0:
            topic = self.topics.get(m.topic)
            count = len(topic.queues) if topic else self.settings.queues_per_topic
            if m.queue_id >= count:
                raise BadRequest(f"queue {m.queue_id} does not exist; topic {m.topic} has {count} queues")
        if not self.settings.auto_create and m.topic not in self.topics:
            raise TopicNotFound(f"topic {m.topic} does not exist on broker {self.name} and auto-create is off")
        return tag, due

    def _place(self, m: pb.Message, tag: str | None, now: int, ops: list[Op]) -> NewMessage:
        """Choose the queue and fill in what the producer left out (after every message passed its checks)."""
        topic = self._topic_for_send(m.topic, ops)
        if m.message_group:
            queue_id = _stable_hash(m.message_group) % len(topic.queues)
        elif m.HasField("queue_id") and m.queue_id >= 0:
            queue_id = m.queue_id
        else:
            queue_id = topic.pick_queue()
        if not m.message_id:
            m.message_id = self._ids.next()
        if not m.born_ms:
            m.born_ms = now
        return NewMessage(m.topic, queue_id, now, tag, m.SerializeToString())

    def _topic_for_send(self, name: str, ops: list[Op], *, force: bool = False, queues: int = 0) -> TopicLog:
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        if not (self.settings.auto_create or force):
            raise TopicNotFound(f"topic {name} does not exist on broker {self.name} and auto-create is off")
        count = queues or self.settings.queues_per_topic
        topic = self.topics[name] = TopicLog(name, [QueueLog(name, q) for q in range(count)])
        ops.extend(CreateQueue(name, q) for q in range(count))
        return topic

    def arrived(self, records: Sequence[Record]) -> None:
        """ArrivalListener: committed messages become visible, and wake whoever can consume them."""
        by_topic: dict[str, list[str | None]] = {}
        for record in records:
            queue = self.topics[record.topic].queues[record.queue_id]
            queue.append(record)
            self.cache.add(queue, record.offset, record.payload)
            by_topic.setdefault(record.topic, []).append(record.tag)
        for topic, tags in by_topic.items():
            self.messages_in[topic] = self.messages_in.get(topic, 0) + len(tags)
            for group in self.hold.groups_waiting(topic):
                self.hold.arrived((topic, group), tags)

    # -- pop -----------------------------------------------------------------

    def _check_read(self, topic: str, group: str, expression: str, poll_ms: int) -> TagFilter:
        validation.check_topic(topic)
        validation.check_group(group)
        if not 0 <= poll_ms <= self.settings.max_poll_ms:
            raise IllegalPollingTime(f"poll time {poll_ms} ms is outside 0..{self.settings.max_poll_ms} ms")
        if topic not in self.topics and not self.settings.auto_create:
            raise TopicNotFound(f"topic {topic} does not exist on broker {self.name}")
        return TagFilter.parse(expression)

    async def pop(
        self, topic: str, group: str, expression: str, max_messages: int, invisible_ms: int, poll_ms: int
    ) -> PopResult:
        tag_filter = self._check_read(topic, group, expression, poll_ms)
        if not 1 <= max_messages <= self.settings.max_pop_batch:
            raise IllegalBatchSize(f"max messages {max_messages} is outside 1..{self.settings.max_pop_batch}")
        s = self.settings
        if not s.min_invisible_ms <= invisible_ms <= s.max_invisible_ms:
            raise IllegalInvisibleTime(
                f"invisible time {invisible_ms} ms is outside {s.min_invisible_ms}..{s.max_invisible_ms} ms"
            )
        state = self._group(group, topic)
        ops: list[Op] = []
        if state.filter != tag_filter:
            state.filter = tag_filter
            ops.append(SetGroupFilter(group, topic, str(tag_filter)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_ms / 1000
        while True:
            popped = await self._pop_once(state, max_messages, invisible_ms, ops)
            if popped:
                return PopResult(popped)
            ops = []
            outcome = await self.hold.hold((topic, group), Kind.POP, tag_filter, deadline - loop.time())
            if outcome is not Outcome.SERVED:
                return PopResult([], polling_full=outcome is Outcome.FULL)

    async def _pop_once(self, state: GroupTopic, want: int, invisible_ms: int, ops: list[Op]) -> list[Popped]:
        now = now_ms()
        picks = self._take_redeliveries(state, now, want)
        topic = self.topics.get(state.topic)
        if topic is not None and len(picks) < want:
            picks.extend((q, o, 1) for q, o in self._take_new(state, topic, want - len(picks), ops))
        if not picks:
            if ops:
                await self.store.submit([], ops)
            return []
        assert topic is not None
        deliveries = []
        for queue_id, offset, attempt in picks:
            delivery = Delivery(attempt, _tokens.getrandbits(48), now + invisible_ms)
            state.deliver(queue_id, offset, delivery)
            ops.append(
                PutInflight(state.group, state.topic, queue_id, offset, attempt, delivery.token, now + invisible_ms)
            )
            deliveries.append((queue_id, offset, delivery))
        self._schedule(state)
        committed = self.store.submit([], ops)
        payloads = await self._payloads(topic, [(q, o) for q, o, _ in picks])
        await committed
        deliveries = self._fit(state, deliveries, payloads)
        key = (state.topic, state.group)
        self.messages_out[key] = self.messages_out.get(key, 0) + len(deliveries)
        return [self._popped(topic, q, o, d, payloads) for q, o, d in deliveries]

    def _fit(
        self,
        state: GroupTopic,
        deliveries: list[tuple[int, int, Delivery]],
        payloads: dict[tuple[int, int], bytes],
    ) -> list[tuple[int, int, Delivery]]:
        """Keep the answer under the response size limit; what does not fit is ready again at once, its
        delivery undone (same attempt count next time)."""
        total = 0
        for i, (queue_id, offset, _) in enumerate(deliveries):
            total += len(payloads[(queue_id, offset)]) + 256
            if total > self.settings.max_pop_bytes and i > 0:
                break
        else:
            return deliveries
        now = now_ms()
        ops: list[Op] = []
        for queue_id, offset, d in deliveries[i:]:
            undone = Delivery(d.attempt - 1, _tokens.getrandbits(48), now)
            state.deliver(queue_id, offset, undone)
            ops.append(PutInflight(state.group, state.topic, queue_id, offset, undone.attempt, undone.token, now))
        self.store.submit([], ops)
        self._schedule(state)
        return deliveries[:i]

    def _popped(
        self, topic: TopicLog, queue_id: int, offset: int, d: Delivery, payloads: dict[tuple[int, int], bytes]
    ) -> Popped:
        handle = ReceiptHandle(self.name, topic.name, queue_id, offset, d.attempt, d.token, d.deadline_ms)
        store_ms = topic.queues[queue_id].store_ms_at(offset)
        return Popped(
            topic.name,
            queue_id,
            offset,
            store_ms,
            payloads[(queue_id, offset)],
            d.attempt,
            handle.encode(),
            d.deadline_ms,
        )

    def _take_redeliveries(self, state: GroupTopic, now: int, want: int) -> list[tuple[int, int, int]]:
        self._expire(state, now)
        picks: list[tuple[int, int, int]] = []
        ready = state.ready
        while ready and len(picks) < want:
            queue_id, offset, token = ready.popleft()
            delivery = state.current(queue_id, offset, token)
            if delivery is not None:
                picks.append((queue_id, offset, delivery.attempt + 1))
        return picks

    def _take_new(self, state: GroupTopic, topic: TopicLog, want: int, ops: list[Op]) -> list[tuple[int, int]]:
        """New messages from the pull offsets, spread fairly over the queues (rotating start)."""
        n = len(topic.queues)
        start = state.next_queue
        state.next_queue = (start + 1) % n
        active = [topic.queues[(start + i) % n] for i in range(n)]
        picks: list[tuple[int, int]] = []
        while want > 0 and active:
            share = max(1, want // len(active))
            still: list[QueueLog] = []
            for queue in active:
                if want <= 0:
                    break
                gq = state.queue(queue.queue_id, self._start_offset(queue))
                before = gq.pull_offset
                offsets = list(queue.matching(gq.pull_offset, state.filter, min(share, want)))
                gq.pull_offset = offsets[-1] + 1 if len(offsets) == min(share, want) else queue.max_offset
                gq.pull_offset = max(gq.pull_offset, before)
                if gq.pull_offset != before:
                    ops.append(SetPullOffset(state.group, state.topic, queue.queue_id, gq.pull_offset))
                picks.extend((queue.queue_id, o) for o in offsets)
                want -= len(offsets)
                if gq.pull_offset < queue.max_offset:
                    still.append(queue)
            active = still
        return picks

    def _start_offset(self, queue: QueueLog) -> int:
        return queue.min_offset if self.settings.consume_from == "earliest" else queue.max_offset

    async def _payloads(self, topic: TopicLog, picks: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        out: dict[tuple[int, int], bytes] = {}
        missing: dict[int, list[int]] = {}
        for queue_id, offset in picks:
            payload = topic.queues[queue_id].payloads.get(offset)
            if payload is None:
                missing.setdefault(queue_id, []).append(offset)
            else:
                out[(queue_id, offset)] = payload
        for queue_id, offsets in missing.items():
            found = await self.store.read_payloads(topic.name, queue_id, offsets)
            for offset in offsets:
                if offset not in found:
                    raise BrokerError(f"message {topic.name}/{queue_id}/{offset} is missing from the store")
                out[(queue_id, offset)] = found[offset]
        return out

    # -- redelivery and dead letters -----------------------------------------

    def _expire(self, state: GroupTopic, now: int) -> int:
        """Move deliveries whose invisibility passed to the redelivery queue (or to the DLQ)."""
        ready = 0
        for queue_id, offset, delivery in state.take_expired(now, 1 << 30):
            if delivery.attempt >= self.settings.max_delivery_attempts:
                self._spawn(self._dead_letter(state, queue_id, offset, delivery))
            else:
                state.ready.append((queue_id, offset, delivery.token))
                ready += 1
        return ready

    def _schedule(self, state: GroupTopic) -> None:
        key = (state.group, state.topic)
        deadline = state.next_deadline()
        current = self._timers.get(key)
        if current is not None:
            if deadline is not None and current[0] <= deadline:
                return
            current[1].cancel()
            del self._timers[key]
        if deadline is None:
            return
        delay = max(0.0, (deadline - now_ms()) / 1000)
        handle = asyncio.get_running_loop().call_later(delay, self._on_deadline, state)
        self._timers[key] = (deadline, handle)

    def _on_deadline(self, state: GroupTopic) -> None:
        self._timers.pop((state.group, state.topic), None)
        count = self._expire(state, now_ms())
        if count:
            self.hold.wake((state.topic, state.group), count)
        self._schedule(state)

    async def _dead_letter(self, state: GroupTopic, queue_id: int, offset: int, delivery: Delivery) -> pb.StoredMessage:
        topic = self.topics[state.topic]
        payloads = await self._payloads(topic, [(queue_id, offset)])
        if state.current(queue_id, offset, delivery.token) is None:
            raise InvalidReceiptHandle("the message was acked or redelivered meanwhile")
        state.remove(queue_id, offset)
        original = pb.Message.FromString(payloads[(queue_id, offset)])
        dlq = pb.Message()
        dlq.CopyFrom(original)
        dlq.topic = validation.DLQ_PREFIX + state.group
        values = (state.topic, original.message_id, str(delivery.attempt), str(queue_id), str(offset))
        dlq.properties.update(dict(zip(DLQ_PROPS, values, strict=True)))
        ops: list[Op] = [DeleteInflight(state.group, state.topic, queue_id, offset)]
        self._topic_for_send(dlq.topic, ops, force=True, queues=1)
        tag = dlq.tag if dlq.HasField("tag") else None
        [record] = await self.store.submit([NewMessage(dlq.topic, 0, now_ms(), tag, dlq.SerializeToString())], ops)
        state.dead_lettered += 1
        log.info(
            "dead-lettered %s/%s/%s after %s attempts to %s", state.topic, queue_id, offset, delivery.attempt, dlq.topic
        )
        return pb.StoredMessage(message=dlq, queue_id=0, offset=record.offset, store_ms=record.store_ms)

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task failed: %s", task.exception())

    # -- ack and invisibility ------------------------------------------------

    def _resolve(self, topic: str, group: str, text: str) -> tuple[GroupTopic, ReceiptHandle, Delivery]:
        handle = ReceiptHandle.decode(text)
        if handle.broker != self.name:
            raise InvalidReceiptHandle(f"receipt handle belongs to broker {handle.broker}, not {self.name}")
        if topic and handle.topic != topic:
            raise InvalidReceiptHandle(f"receipt handle is for topic {handle.topic}, not {topic}")
        state = self.groups.get((group, handle.topic))
        delivery = state.current(handle.queue_id, handle.offset, handle.token) if state else None
        if state is None or delivery is None or delivery.attempt != handle.attempt:
            raise InvalidReceiptHandle("receipt handle is stale: the message was acked or redelivered since")
        return state, handle, delivery

    async def ack(self, topic: str, group: str, handles: Sequence[str]) -> list[BrokerError | None]:
        validation.check_group(group)
        if not handles:
            raise BadRequest("ack carries no receipt handle")
        if len(handles) > self.settings.max_send_batch:
            raise IllegalBatchSize(f"ack carries {len(handles)} handles, at most {self.settings.max_send_batch}")
        results: list[BrokerError | None] = []
        ops: list[Op] = []
        for text in handles:
            try:
                state, handle, _ = self._resolve(topic, group, text)
            except BrokerError as exc:
                results.append(exc)
                continue
            state.remove(handle.queue_id, handle.offset)
            ops.append(DeleteInflight(group, handle.topic, handle.queue_id, handle.offset))
            results.append(None)
        if ops:
            await self.store.submit([], ops)
        return results

    async def change_invisible(self, topic: str, group: str, text: str, invisible_ms: int) -> tuple[str, int]:
        validation.check_group(group)
        if not 0 <= invisible_ms <= self.settings.max_invisible_ms:
            raise IllegalInvisibleTime(
                f"invisible time {invisible_ms} ms is outside 0..{self.settings.max_invisible_ms} ms"
            )
        state, handle, old = self._resolve(topic, group, text)
        deadline = now_ms() + invisible_ms
        delivery = Delivery(old.attempt, _tokens.getrandbits(48), deadline)
        state.deliver(handle.queue_id, handle.offset, delivery)
        self._schedule(state)
        op = PutInflight(
            group, handle.topic, handle.queue_id, handle.offset, delivery.attempt, delivery.token, deadline
        )
        await self.store.submit([], [op])
        new = ReceiptHandle(
            self.name, handle.topic, handle.queue_id, handle.offset, delivery.attempt, delivery.token, deadline
        )
        return new.encode(), deadline

    async def dead_letter(self, topic: str, group: str, text: str) -> pb.StoredMessage:
        validation.check_group(group)
        state, handle, delivery = self._resolve(topic, group, text)
        return await self._dead_letter(state, handle.queue_id, handle.offset, delivery)

    # -- notification ----------------------------------------------------------

    async def notification(self, topic: str, group: str, expression: str, poll_ms: int) -> tuple[bool, bool]:
        """(has_message, polling_full); consumes nothing."""
        tag_filter = self._check_read(topic, group, expression, poll_ms)
        state = self._group(group, topic)
        if self._has_ready(state, tag_filter):
            return True, False
        outcome = await self.hold.hold((topic, group), Kind.NOTIFICATION, tag_filter, poll_ms / 1000)
        return outcome is Outcome.SERVED, outcome is Outcome.FULL

    def _has_ready(self, state: GroupTopic, tag_filter: TagFilter) -> bool:
        self._expire(state, now_ms())
        if any(state.current(q, o, t) for q, o, t in state.ready):
            return True
        topic = self.topics.get(state.topic)
        if topic is None:
            return False
        for queue in topic.queues:
            gq = state.queues.get(queue.queue_id)
            pull = gq.pull_offset if gq else self._start_offset(queue)
            if queue.first_match(pull, tag_filter) < queue.max_offset:
                return True
        return False

    def sweep(self) -> None:
        """Safety net: wake held requests whose group has something ready (normally woken on arrival)."""
        for topic, group in self.hold.keys():
            state = self.groups.get((group, topic))
            if state is not None and self._has_ready(state, state.filter):
                self.hold.wake_all((topic, group))

    # -- stats -----------------------------------------------------------------

    def lags(self, topic: str = "", group: str = "") -> list[GroupQueueLag]:
        out = []
        for (g, t), state in sorted(self.groups.items()):
            log_ = self.topics.get(t)
            if log_ is None or (topic and t != topic) or (group and g != group):
                continue
            for queue in log_.queues:
                lag = queue_lag(queue, state.queues.get(queue.queue_id), state.filter, self._start_offset(queue))
                out.append(GroupQueueLag(t, g, queue.queue_id, lag))
        return out

    async def list_messages(self, topic: str, queue_id: int, from_offset: int, limit: int) -> list[Record]:
        validation.check_topic(topic)
        if topic not in self.topics:
            raise TopicNotFound(f"topic {topic} does not exist on broker {self.name}")
        if not 1 <= limit <= 1000:
            raise IllegalBatchSize("limit must be in 1..1000")
        return await self.store.read_range(topic, queue_id, from_offset, limit)

    def _group(self, group: str, topic: str) -> GroupTopic:
        state = self.groups.get((group, topic))
        if state is None:
            state = self.groups[(group, topic)] = GroupTopic(group, topic)
        return state

    async def close(self) -> None:
        await self.scheduler.close()
        self.hold.close()
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)


def _stable_hash(text: str) -> int:
    return zlib.crc32(text.encode())
