"""Redelivery and dead letters: invisibility timers, expired deliveries made ready again, the DLQ path.

An un-acked delivery becomes ready again at its deadline with attempt + 1; one that already had
its group's ``max_attempts`` deliveries goes to the topic ``%DLQ%<group>`` instead, its origin kept as
properties (not one of a ``%DLQ%`` topic: a dead letter is delivered again however many attempts it had).
One timer per group+topic fires at the earliest deadline and wakes held Pops. A FIFO message comes back
only after the in-flight FIFO messages before it in its queue (broker.core).
Owned and called by the core; it knows nothing of the core.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from popgate_pb import broker_pb2 as pb

from broker.clock import Clock
from broker.filters import MATCH_ALL, TagFilter
from broker.inflight import Delivery, GroupTopic
from broker.letters import MovedLog, letter_of
from broker.log import QueueLog, TopicLog
from broker.longpoll import HoldService
from broker.send import SendPath
from broker.store import NewMessage, Op
from popgate_contract import validation
from popgate_contract.errors import InvalidReceiptHandle
from popgate_process.throttled import Throttled

log = logging.getLogger(__name__)

# Dead-letter moves under way at once (each a payload read and a commit); the others wait in `Redelivery._to_dlq`,
# so however many deliveries run out of attempts at once, memory and tasks stay bounded and the log gets one line
# per topic, group and attempt count (`broker.letters.LOG_EVERY_S`) — tests/unit/broker/test_redelivery.py::
# test_many_dead_letters_due_at_once_are_moved_a_bounded_number_at_a_time.
MAX_DLQ_MOVES = 64
# Expired deliveries one `expire` moves: when many share a deadline, the timer moves the rest a slice per loop turn,
# waking held requests after each, so other calls are served meanwhile — tests/unit/broker/test_redelivery_storm.py::
# test_a_deadline_shared_by_many_is_expired_a_slice_a_loop_turn_each_once_in_order.
EXPIRE_SLICE = 10_000

PayloadReader = Callable[[TopicLog, list[tuple[int, int]]], Awaitable[dict[tuple[int, int], bytes]]]


class Redelivery:
    def __init__(
        self,
        *,
        topics: dict[str, TopicLog],
        groups: dict[tuple[str, str], GroupTopic],
        sends: SendPath,
        hold: HoldService,
        payloads: PayloadReader,
        max_attempts: Callable[[str], int],
        released: Callable[[GroupTopic, int], None],
        clock: Clock,
    ) -> None:
        self.topics = topics
        self.groups = groups  # (group, topic) -> its state, as the core keeps it
        self.sends = sends
        self.hold = hold
        self.payloads = payloads
        self.max_attempts = max_attempts  # a consumer group's deliveries of a message before its DLQ
        self.released = released  # a FIFO message left the group's flight (dead-lettered): (state, queue id)
        self.clock = clock
        self._timers: dict[tuple[str, str], tuple[int, asyncio.TimerHandle]] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self._to_dlq: deque[tuple[GroupTopic, int, int, Delivery]] = deque()  # out of attempts, not yet moved
        self._movers = 0  # tasks moving `_to_dlq` (at most MAX_DLQ_MOVES)
        self._moved = MovedLog()
        self._retry_failed = Throttled(log.warning)  # a store that cannot be read fails every retry alike

    def take(
        self,
        state: GroupTopic,
        now: int,
        want: int,
        ops: list[Op],
        *,
        tag_filter: TagFilter = MATCH_ALL,
        first_only: bool = False,
    ) -> list[tuple[int, int, int]]:
        """Up to ``want`` ready redeliveries as (queue id, offset, next attempt), in the order they became ready
        (with ``first_only``, FIFO messages and those a Pop undid unreceived alone: `GroupTopic.undone`); FIFO
        messages whose turn has not come stay ready. One whose
        turn came but whose tag ``tag_filter`` does not take (`goes_to`) is acked for the group instead, the
        store op appended to ``ops``, and a FIFO one lets its queue go on as its ack would —
        tests/unit/broker/test_redelivery_filter.py."""
        self.expire(state, now)
        picks: list[tuple[int, int, int]] = []
        if first_only and not state.undone and not any(gq.fifo for gq in state.queues.values()):
            return picks
        taking: set[tuple[int, int]] = set()  # FIFO messages taken by this call
        topic = self.topics.get(state.topic)
        released: set[int] = set()  # queues whose FIFO message was acked here

        def pick(entry: tuple[int, int, int]) -> bool:
            """Take one ready entry (a stale one is dropped, one the filter does not take acked); False when it
            is a FIFO message whose turn has not come, or neither FIFO nor undone and only those are taken."""
            queue_id, offset, token = entry
            delivery = state.current(queue_id, offset, token)
            if delivery is None:
                state.stale -= 1
                state.undone.discard((queue_id, offset))
                return True
            if first_only and offset not in state.queues[queue_id].fifo and (queue_id, offset) not in state.undone:
                return False
            state.undone.discard((queue_id, offset))
            if not _turn_came(state, queue_id, offset, taking):
                return False
            delivery.queued = False
            if topic is not None and not goes_to(tag_filter, topic.queues[queue_id], offset):
                if state.remove(queue_id, offset):
                    released.add(queue_id)
                ops.append(state.done_op(queue_id, offset))
                state.filtered += 1
                return True
            if offset in state.queues[queue_id].fifo:
                taking.add((queue_id, offset))
            picks.append((queue_id, offset, delivery.attempt + 1))
            return True

        waiting: list[tuple[int, int, int]] = []
        ready = state.ready
        while ready and len(picks) < want:
            entry = ready.popleft()
            if not pick(entry):
                waiting.append(entry)
        while waiting and len(picks) < want:  # their turn may have come with what was taken after them
            still = []
            for entry in waiting:
                if len(picks) >= want or not pick(entry):
                    still.append(entry)
            if len(still) == len(waiting):
                break
            waiting = still
        ready.extendleft(reversed(waiting))
        for queue_id in released:
            self.released(state, queue_id)
        return picks

    def fifo_ready(self, state: GroupTopic, queue_id: int) -> list[int]:
        """The offsets of the queue's ready FIFO redeliveries that can be taken now: at most its first FIFO
        message, for each waits for the ones before it (`_turn_came`)."""
        gq = state.queues[queue_id]
        first = min(gq.fifo, default=-1)
        delivery = gq.inflight.get(first)
        return [first] if delivery is not None and delivery.queued and _turn_came(state, queue_id, first) else []

    def has_ready(self, state: GroupTopic) -> bool:
        """Whether `take` would take something now (after `expire`)."""
        return self.ready_count(state) > 0

    def ready_count(self, state: GroupTopic) -> int:
        """How many redeliveries `take` could take now (after `expire`): the live entries of `state.ready` but
        the FIFO ones whose turn has not come, counted from the queues' FIFO messages, not by walking `ready`."""
        count = state.queued
        for queue_id, gq in state.queues.items():
            if gq.fifo:  # of its queued FIFO messages, only one whose turn came
                count += len(self.fifo_ready(state, queue_id)) - sum(
                    d.queued for d in map(gq.inflight.get, gq.fifo) if d
                )
        return count

    def expire(self, state: GroupTopic, now: int) -> int:
        """Move deliveries whose invisibility passed to the redelivery queue (or to the DLQ), the earliest EXPIRE_SLICE
        at most; how many of them can be taken now (a FIFO message behind one still in flight cannot: its release
        wakes for it)."""
        ready = 0
        fifo_queues: set[int] = set()  # an expiry there may also let an earlier FIFO redelivery go (`_turn_came`)
        # A DLQ's letter is never dead-lettered again: it stays where `popgate dlq list` shows it, delivered until
        # acked — test_redelivery.py::test_a_dead_letter_out_of_attempts_is_ready_again_not_dead_lettered_a_second_time
        dead_already = state.topic.startswith(validation.DLQ_PREFIX)
        max_attempts = self.max_attempts(state.group)
        for queue_id, offset, delivery in state.take_expired(now, EXPIRE_SLICE):
            if delivery.attempt >= max_attempts and not dead_already:
                self.to_dlq(state, queue_id, offset, delivery)
            else:
                state.make_ready(queue_id, offset, delivery)
                if offset in state.queues[queue_id].fifo:
                    fifo_queues.add(queue_id)
                else:
                    ready += 1
        return ready + sum(len(self.fifo_ready(state, q)) for q in fifo_queues)

    def schedule(self, state: GroupTopic) -> None:
        """(Re)arm the group's timer for its earliest deadline; an earlier armed timer stays."""
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
        delay = max(0.0, (deadline - self.clock.now_ms()) / 1000)
        handle = asyncio.get_running_loop().call_later(delay, self._on_deadline, state)
        self._timers[key] = (deadline, handle)

    def forget(self, state: GroupTopic) -> None:
        """The group's state on the topic was deleted (broker.admin): its timer goes."""
        timer = self._timers.pop((state.group, state.topic), None)
        if timer is not None:
            timer[1].cancel()

    def _on_deadline(self, state: GroupTopic) -> None:
        """The group's earliest deadline passed: wake a held request for each redelivery ready now, also those a
        Pop or a Notification's check moved to ready before this ran (and took fewer of) —
        tests/unit/broker/test_arrival.py::test_redeliveries_made_ready_by_a_pop_before_the_timer_still_wake. What is
        due past one slice (EXPIRE_SLICE) follows on the next loop turn: `schedule` rearms the timer at once."""
        self._timers.pop((state.group, state.topic), None)
        self.expire(state, self.clock.now_ms())
        key = (state.topic, state.group)
        if self.hold.holding(key) and (count := self.ready_count(state)):  # counted only when someone waits
            self.hold.wake(key, count)
        self.schedule(state)

    def to_dlq(self, state: GroupTopic, queue_id: int, offset: int, delivery: Delivery) -> None:
        """Dead-letter this delivery soon, by one of at most MAX_DLQ_MOVES movers (its attempts are spent, or
        its stored payload cannot be read: see `dead_letter`)."""
        self._to_dlq.append((state, queue_id, offset, delivery))
        if self._movers < MAX_DLQ_MOVES:
            self._movers += 1
            self._spawn(self._move_to_dlq())

    async def _move_to_dlq(self) -> None:
        """One of at most MAX_DLQ_MOVES movers: dead-letter the waiting messages one by one."""
        try:
            while self._to_dlq:
                try:
                    await self._out_of_attempts(*self._to_dlq.popleft())
                except Exception as exc:  # the commit failed: `_dead_lettered` made it due again; go on
                    log.warning("dead-lettering failed: %s", exc)
        finally:
            self._movers -= 1

    async def _out_of_attempts(self, state: GroupTopic, queue_id: int, offset: int, delivery: Delivery) -> None:
        """An expired delivery with no attempt left goes to the DLQ. Off the deadline heap already, it must not
        be stranded by a failure before the DLQ commit (its payload read): then it comes due again in a second,
        as when the commit fails (`_dead_lettered`)."""
        try:
            await self.dead_letter(state, queue_id, offset, delivery)
        except InvalidReceiptHandle:
            pass  # acked (or redelivered) while its payload was read: nothing left to move
        except Exception as exc:
            if state.current(queue_id, offset, delivery.token) is None:
                raise  # the commit's failure: `_dead_lettered` has put it back already
            self._retry_failed("dead-lettering %s/%s/%s failed, retried in 1 s: %s", state.topic, queue_id, offset, exc)
            self._due_again(state, queue_id, offset, delivery)

    def _live(self, state: GroupTopic) -> bool:
        """Whether `state` is still the group's on its topic: not deleted since (with its topic, or alone)."""
        return self.groups.get((state.group, state.topic)) is state

    def _due_again(self, state: GroupTopic, queue_id: int, offset: int, delivery: Delivery) -> None:
        """The delivery stays in flight with its attempt count and comes due again in a second (unless retention
        deleted its message meanwhile: there is nothing left to deliver; or its group, its topic, or that offset's
        place in the group's flight went to something else meanwhile — a delete, a reset, a new delivery)."""
        gq = state.queues.get(queue_id)
        if not self._live(state) or gq is None:
            return
        current = gq.inflight.get(offset)
        if current is not None and current.token != delivery.token:
            return
        queue = self.topics[state.topic].queues[queue_id]
        if offset < queue.min_offset:
            state.remove(queue_id, offset)
            return
        fifo = queue.is_fifo(offset)
        state.start_delivery(queue_id, offset, delivery.attempt, self.clock.now_ms() + 1000, None, fifo=fifo)
        self.schedule(state)

    async def dead_letter(
        self, state: GroupTopic, queue_id: int, offset: int, delivery: Delivery, *, message_id: str = ""
    ) -> pb.StoredMessage | None:
        """Move the delivery's message to the group's DLQ; InvalidReceiptHandle when it is no longer the group's to
        move (acked, redelivered, or its group or topic deleted — also while it waited for a mover, or while its
        payload was read): test_dead_letter_races.py::
        test_dead_letters_of_a_deleted_topic_do_not_take_its_new_messages. With `message_id`, None (nothing
        written) when the stored message is another one."""
        if not self._live(state):
            raise InvalidReceiptHandle(f"consumer group {state.group} on topic {state.topic} was deleted meanwhile")
        topic = self.topics[state.topic]
        payloads = await self.payloads(topic, [(queue_id, offset)])
        if not self._live(state) or state.current(queue_id, offset, delivery.token) is None:
            raise InvalidReceiptHandle("the message was acked or redelivered meanwhile")
        dlq = letter_of(payloads[(queue_id, offset)], state, queue_id, offset, delivery.attempt)
        if message_id and dlq.message_id != message_id:
            return None
        if not dlq.message_id:
            dlq.message_id = self.sends.ids.next()
        gq = state.queues[queue_id]
        fifo = offset in gq.fifo
        state.remove(queue_id, offset, keep_fifo=True)  # its queue stays held back until the commit (`_dead_lettered`)
        if gq.moving is None:
            gq.moving = set()
        gq.moving.add(offset)
        ops: list[Op] = [state.done_op(queue_id, offset)]
        self.sends.topic_for_send(dlq.topic, ops, force=True, queues=1)
        tag = dlq.tag if dlq.HasField("tag") else None
        committed = self.sends.submit(
            [NewMessage(dlq.topic, 0, self.clock.now_ms(), tag, dlq.SerializeToString())], ops
        )
        # What the commit did is settled by the commit, also when this caller is cancelled meanwhile.
        committed.add_done_callback(functools.partial(self._dead_lettered, state, queue_id, offset, delivery, fifo))
        [record] = await asyncio.shield(committed)
        return pb.StoredMessage(message=dlq, queue_id=0, offset=record.offset, store_ms=record.store_ms)

    def _dead_lettered(
        self,
        state: GroupTopic,
        queue_id: int,
        offset: int,
        delivery: Delivery,
        fifo: bool,
        committed: asyncio.Future[Any],
    ) -> None:
        gq = state.queues[queue_id]
        ours = gq.moving is not None and offset in gq.moving  # not reset meanwhile
        if ours and gq.moving is not None:
            gq.moving.discard(offset)
            if not gq.moving:
                gq.moving = None
        if committed.cancelled() or committed.exception() is not None:
            if ours:  # the message must not vanish (test_dead_letter_races.py::
                # test_a_failed_dead_letter_after_a_reset_does_not_take_the_new_delivery_back)
                self._due_again(state, queue_id, offset, delivery)
            return
        state.dead_lettered += 1
        if fifo:
            state.queues[queue_id].fifo.discard(offset)
            self.released(state, queue_id)
        self._moved.moved(state.topic, state.group, delivery.attempt)

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task failed: %s", task.exception())

    async def close(self) -> None:
        """Stop the timers, then give dead-lettering still under way a few seconds to finish."""
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        self._moved.flush()


def goes_to(tag_filter: TagFilter, queue: QueueLog, offset: int) -> bool:
    """Whether a ready redelivery of the queue's message at `offset` goes to a Pop with `tag_filter`: when the filter
    takes its tag. One it does not take is acked for the group, never delivered (`Redelivery.take`), as RocketMQ's
    proxy acks a popped message its request's subscription does not take (`PopMessageResultFilterImpl`). A message
    the queue no longer keeps is not the filter's to drop — tests/unit/broker/test_redelivery_filter.py."""
    if not queue.min_offset <= offset < queue.max_offset:
        return True
    return tag_filter.matches(queue.tag_at(offset))


def _turn_came(state: GroupTopic, queue_id: int, offset: int, taking: set[tuple[int, int]] | None = None) -> bool:
    """Whether a ready delivery may go: any but a FIFO message, which waits for every FIFO message before it in its
    queue (in flight, ready again or being dead-lettered) unless that one goes now too (`taking`), and for every
    FIFO message after it that a consumer still holds (in flight, its invisibility not passed). RocketMQ's orderly
    pop blocks a queue while any message of a popped batch is invisible: a consumer that hands back the head of its
    batch still holds the rest, and the head going to another consumer meanwhile would have two consumers on one
    message group at once."""
    queue = state.queues[queue_id]
    if offset not in queue.fifo:
        return True
    for o in queue.fifo:
        if o < offset:
            if taking is None or (queue_id, o) not in taking:
                return False
        elif o > offset:
            held = queue.inflight.get(o)
            if held is None or not held.expired:  # held by a consumer, or its dead letter being committed
                return False
    return True
