"""The Pop: a group takes the messages ready for it — redeliveries that are due and new messages from its pull
offsets, spread fairly over the queues, behind FIFO and priority rules (`take_new`): new messages first in four
Pops of five, redeliveries first in the fifth (`redeliveries_first`), a FIFO redelivery first in all. Each is
reserved as a delivery before anything is awaited, so concurrent Pops never share a message; the answer stays
under the response size limit, and deliveries its caller never received are ready again at once, attempt count
unchanged (`Pops.release`). With nothing ready a Pop is held (broker.longpoll) until a message it can take arrives
or its poll time ends.

Owned by the core, which checks the request's topic, group, filter and poll time first; it knows nothing of the
core.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from collections.abc import Callable, Sequence

from broker.acks import check_invisible
from broker.clock import Clock
from broker.commits import StateCommits
from broker.filters import TagFilter
from broker.groups import ConsumerGroups
from broker.inflight import Delivery, GroupTopic
from broker.log import QueueLog, TopicLog
from broker.longpoll import HoldService, Kind, Outcome
from broker.model import Popped, PopResult
from broker.priority import best, take_prioritized
from broker.readiness import Readiness, readable_end
from broker.redelivery import PayloadReader, Redelivery
from broker.settings import BrokerSettings
from broker.store import DeleteInflight, Op, SetPullOffset, Store
from popgate_contract.errors import DomainError, IllegalBatchSize, StoreUnavailable, TopicNotFound
from popgate_contract.receipt import ReceiptHandle, encode_handle

# One Pop pass in this many of a group's on a topic takes redeliveries first; the others take new messages first and
# fill the rest of the batch with redeliveries, so neither starves the other (RocketMQ: `popFromRetryProbability` 20).
REDELIVERIES_FIRST_EVERY = 5


def redeliveries_first(passes: int) -> bool:
    """Whether a group's `passes`-th Pop pass on a topic takes redeliveries before new messages — tests/unit/broker/
    test_redelivery_mix.py::test_one_pop_in_five_takes_redeliveries_first."""
    return passes % REDELIVERIES_FIRST_EVERY == 0


class Pops:
    def __init__(
        self,
        *,
        settings: BrokerSettings,
        topics: dict[str, TopicLog],
        consumers: ConsumerGroups,
        readiness: Readiness,
        hold: HoldService,
        redelivery: Redelivery,
        commits: StateCommits,
        payloads: PayloadReader,
        resolve: Callable[[str, str, str], tuple[GroupTopic, ReceiptHandle, Delivery]],
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.name = settings.name
        self.topics = topics
        self.consumers = consumers
        self.readiness = readiness
        self.hold = hold
        self.redelivery = redelivery
        self.commits = commits
        self.payloads = payloads
        self.resolve = resolve  # a receipt handle to the delivery it names (broker.acks)
        self.clock = clock
        self.messages_out: dict[tuple[str, str], int] = {}  # per (topic, group): messages delivered
        self.first_out: dict[tuple[str, str], int] = {}  # per (topic, group): first deliveries (broker/metrics.py)

    async def pop(
        self,
        topic: str,
        group: str,
        tag_filter: TagFilter,
        max_messages: int,
        invisible_ms: int,
        poll_ms: int,
        max_fifo: int = 0,
    ) -> PopResult:
        """A Pop whose topic, group, filter and poll time the core checked (`BrokerCore._check_read`), with at most
        `max_fifo` FIFO messages when > 0 (`_cap_fifo`)."""
        if max_messages < 1:
            raise IllegalBatchSize(f"max messages {max_messages} is less than 1")
        max_messages = min(max_messages, self.settings.max_pop_batch)  # fewer than asked is always an answer
        check_invisible(self.settings, invisible_ms)
        ops: list[Op] = []
        state = self.consumers.reader(group, topic, tag_filter, ops)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + poll_ms / 1000
        held = False
        while True:
            if state is not None:
                popped = await self._pop_once(state, max_messages, invisible_ms, ops, max_fifo)
                if popped is None:  # its topic or group went while it read
                    return PopResult([], held=held)
                if popped:
                    return PopResult(popped, held=held)
                if ops and self.settings.flush == "sync" and self.readiness.has_ready(state, tag_filter):
                    # Arrived while the pass waited for its commit (nobody was held to wake): read again with this
                    # Pop's filter, which a Pop of the group with another one may have replaced meanwhile —
                    # tests/unit/broker/test_core_commits.py::
                    # test_a_pop_that_reads_again_after_its_sync_commit_reads_with_its_own_filter.
                    ops = []
                    state = self.consumers.reader(group, topic, tag_filter, ops)
                    continue
            ops = []
            wait_s = deadline - loop.time()
            waiter = self.hold.enter((topic, group), Kind.POP, tag_filter, wait_s)
            if isinstance(waiter, Outcome):
                outcome = waiter
            else:  # awaited here, not in a coroutine of the hold's: a held Pop is one frame and a waiter
                try:
                    outcome = await waiter.future
                except asyncio.CancelledError:
                    self.hold.leave((topic, group), waiter, cancelled=True)
                    raise
                self.hold.leave((topic, group), waiter)
                del waiter
            held = held or (wait_s > 0 and outcome in (Outcome.SERVED, Outcome.TIMED_OUT, Outcome.ENDED))
            if outcome is Outcome.ENDED and topic not in self.topics and not self.settings.auto_create:
                # as the next Pop would be: tests/integration/sdk/test_topic_deleted_held.py
                raise TopicNotFound(f"topic {topic} was deleted on broker {self.name} while this Pop waited")
            if outcome is not Outcome.SERVED:
                closing = outcome is Outcome.CLOSED and wait_s > 0  # its poll cut short by the broker stopping
                return PopResult([], polling_full=outcome is Outcome.FULL, held=held, closing=closing)
            # Woken for a message this Pop's filter matches: read with that filter, which another Pop of the
            # group may have replaced meanwhile (reading with that one would skip the message for the group).
            state = self.consumers.reader(group, topic, tag_filter, ops)

    async def _pop_once(
        self, state: GroupTopic, want: int, invisible_ms: int, ops: list[Op], max_fifo: int = 0
    ) -> list[Popped] | None:
        """What one pass takes and reads; None when the topic or the group's state it took from went while it read
        the payloads (deleted, or deleted and made again): nothing is answered, and the messages stay the new
        topic's or group's alone — tests/unit/broker/test_pop_order.py::
        test_a_pop_whose_read_spans_a_delete_and_recreate_answers_none_of_the_new_topics."""
        now = self.clock.now_ms()
        topic = self.topics.get(state.topic)
        picks = self._pick(state, topic, now, want, ops)
        if not picks:
            if ops:
                await self.commits.write(ops)
            return []
        assert topic is not None
        deliveries = []
        deadline = now + invisible_ms
        for queue_id, offset, attempt in picks:
            queue = topic.queues[queue_id]
            fifo = queue.fifo is not None and queue.is_fifo(offset)
            deliveries.append(
                (
                    queue_id,
                    offset,
                    state.start_delivery(queue_id, offset, attempt, deadline, ops, fifo=fifo, popped=True),
                )
            )
        self.redelivery.schedule(state)
        committed = self.commits.commit(ops)
        try:
            payloads = await self.payloads(topic, [(q, o) for q, o, _ in picks])
            await self.commits.record(committed)
        except asyncio.CancelledError:  # the caller went away: nobody receives them
            self._undo(state, deliveries)
            raise
        except StoreUnavailable:  # the store cannot be read: nobody receives them, no attempt is charged, and they
            # do not go first (test_pop_order.py::test_a_pop_the_store_cannot_read_charges_no_attempt)
            self._undo(state, deliveries, first=False)
            raise
        except DomainError:  # payloads missing: the topic's rows purged under it, or a real fault
            if self._still(state, topic):
                raise
        if not self._still(state, topic):
            self._undo(state, deliveries)
            return None
        deliveries = self._fit(state, deliveries, payloads)
        if max_fifo > 0:
            deliveries = self._cap_fifo(state, topic, deliveries, max_fifo)
        key = (state.topic, state.group)
        self.messages_out[key] = self.messages_out.get(key, 0) + len(deliveries)
        self.first_out[key] = self.first_out.get(key, 0) + sum(1 for _, _, d in deliveries if d.attempt == 1)
        return popped_messages(self.name, topic, deliveries, payloads)

    def _pick(
        self, state: GroupTopic, topic: TopicLog | None, now: int, want: int, ops: list[Op]
    ) -> list[tuple[int, int, int]]:
        """Up to `want` messages as (queue id, offset, attempt): FIFO redeliveries first in every pass (a FIFO
        message's redelivery comes before its group's later messages, which `readable_end` holds back whatever the
        order of the takes), then, by `redeliveries_first`, the other redeliveries and the new messages or the
        new messages and the other redeliveries — tests/unit/broker/test_redelivery_mix.py."""
        state.pops += 1
        first = redeliveries_first(state.pops)
        tag_filter = state.filter  # this Pop's: `pop` takes the reader with it before each pass
        picks = self.redelivery.take(state, now, want, ops, tag_filter=tag_filter, first_only=not first)
        if topic is not None and len(picks) < want:
            take_new(self.consumers, state, topic, want - len(picks), ops, picks)
        if not first and len(picks) < want:
            picks += self.redelivery.take(state, now, want - len(picks), ops, tag_filter=tag_filter)
        return picks

    def _still(self, state: GroupTopic, topic: TopicLog) -> bool:
        """Whether the topic and the group's state on it are those a Pop took its picks from."""
        return self.topics.get(state.topic) is topic and self.consumers.groups.get((state.group, state.topic)) is state

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
        self._undo(state, deliveries[i:])
        return deliveries[:i]

    def _cap_fifo(
        self, state: GroupTopic, topic: TopicLog, deliveries: list[tuple[int, int, Delivery]], most: int
    ) -> list[tuple[int, int, Delivery]]:
        """At most `most` FIFO messages: past them, the rest of each such message's queue is undone as `_fit` undoes
        (ready again at once, same attempt count; a FIFO message then waits its turn, and nothing after it in its
        queue goes before it) — tests/unit/broker/test_fifo.py::test_a_pop_takes_at_most_max_fifo_fifo_messages."""
        kept: list[tuple[int, int, Delivery]] = []
        undone: list[tuple[int, int, Delivery]] = []
        cut: set[int] = set()  # queues whose rest waits
        fifo = 0
        for delivery in deliveries:
            queue_id, offset, _ = delivery
            if queue_id not in cut and topic.queues[queue_id].is_fifo(offset):
                fifo += 1
                if fifo > most:
                    cut.add(queue_id)
            (undone if queue_id in cut else kept).append(delivery)
        if undone:
            self._undo(state, undone)
        return kept

    def _undo(self, state: GroupTopic, deliveries: Sequence[tuple[int, int, Delivery]], *, first: bool = True) -> None:
        """Deliveries nobody received: ready again at once, with the attempt count they had before, and (`first`)
        taken first in the group's next passes, before the messages behind them, as before they were taken
        (test_redelivery_mix.py::test_released_messages_go_out_first_again). Only those still the group's current
        ones: a reset, a group deleted or another Pop's redelivery while this Pop read its payloads owns the message
        now — tests/unit/broker/test_pop_order.py::
        test_a_pop_cut_short_after_a_reset_during_its_read_does_not_bring_its_messages_back."""
        if self.consumers.groups.get((state.group, state.topic)) is not state:
            return
        now = self.clock.now_ms()
        ops: list[Op] = []
        for queue_id, offset, d in deliveries:
            if state.current(queue_id, offset, d.token) is d:
                state.start_delivery(queue_id, offset, d.attempt - 1, now, ops)
                if first:
                    state.undone.add((queue_id, offset))
        self.commits.commit(ops)
        self.redelivery.schedule(state)

    def release(self, topic: str, group: str, handles: Sequence[str]) -> int:
        """A Pop answered after its caller had cancelled it (the cancel crossed the answer): its
        messages were never received, so they are ready again at once, attempt count unchanged — not
        hidden for their whole invisible time. Handles no longer current are skipped; how many were
        released."""
        undone: list[tuple[int, int, Delivery]] = []
        state = None
        for text in handles:
            try:
                state, handle, delivery = self.resolve(topic, group, text)
            except DomainError:
                continue
            undone.append((handle.queue_id, handle.offset, delivery))
        if state is not None and undone:
            self._undo(state, undone)
        return len(undone)


def take_new(
    consumers: ConsumerGroups,
    state: GroupTopic,
    topic: TopicLog,
    want: int,
    ops: list[Op],
    picks: list[tuple[int, int, int]],
) -> None:
    """New messages from the pull offsets, spread fairly over the queues (rotating start), appended to `picks`
    as (queue id, offset, attempt 1). A topic holding priority messages gives the highest priorities of all its
    queues here first, as RocketMQ orders a topic's priorities within a broker (test_priority.py::
    test_a_pop_takes_the_highest_priorities_of_every_queue_first)."""
    n = len(topic.queues)
    start = state.next_queue
    state.next_queue = (start + 1) % n
    active = [topic.queues[(start + i) % n] for i in range(n)]
    if any(queue.priority is not None for queue in active):
        first = len(picks)
        for queue, chosen in _priority_shares(consumers, state, active, want, ops):
            _take_from(consumers, state, queue, len(chosen), ops, picks, chosen)
        picks[first:] = sorted(picks[first:], key=lambda pick: -_level(topic.queues[pick[0]], pick[1]))
        return
    while want > 0 and active:
        share = max(1, want // len(active))
        still: list[QueueLog] = []
        for queue in active:
            if want <= 0:
                break
            taken, more = _take_from(consumers, state, queue, min(share, want), ops, picks)
            want -= taken
            if more and taken:
                still.append(queue)
        active = still


def _take_from(
    consumers: ConsumerGroups,
    state: GroupTopic,
    queue: QueueLog,
    count: int,
    ops: list[Op],
    picks: list[tuple[int, int, int]],
    chosen: list[int] | None = None,
) -> tuple[int, bool]:
    """Up to `count` new messages of one queue appended to `picks` (`chosen`: those of a priority queue, found by
    `_priority_shares`): how many, and whether it has more to read."""
    gq = consumers.group_queue(state, queue, ops)
    before = gq.pull_offset
    end = readable_end(gq, queue)
    if queue.priority is not None:
        passed: list[int] = []
        offsets = take_prioritized(queue, gq, state.filter, count, end, passed, chosen)
        ops.extend(DeleteInflight(state.group, state.topic, queue.queue_id, o) for o in passed)
    else:
        offsets = list(queue.matching(gq.pull_offset, state.filter, count, end))
        gq.pull_offset = offsets[-1] + 1 if len(offsets) == count else end
        gq.pull_offset = max(gq.pull_offset, before)
    if gq.pull_offset != before:
        ops.append(SetPullOffset(state.group, state.topic, queue.queue_id, gq.pull_offset))
    picks.extend((queue.queue_id, o, 1) for o in offsets)
    return len(offsets), gq.pull_offset < end


def _level(queue: QueueLog, offset: int) -> int:
    return queue.priority.get(offset, 0) if queue.priority is not None else 0


def _priority_shares(
    consumers: ConsumerGroups, state: GroupTopic, queues: list[QueueLog], want: int, ops: list[Op]
) -> list[tuple[QueueLog, list[int]]]:
    """Which of the `want` best new messages over `queues` each queue gives (in its own order): by priority, then
    each queue's own order, equals taken from the queues in turn (their rotation, as plain Pops share)."""
    found: list[list[int]] = []
    ranked: list[tuple[int, int, int]] = []  # (-priority, place in its queue, queue's turn)
    for turn, queue in enumerate(queues):
        gq = consumers.group_queue(state, queue, ops)
        end = readable_end(gq, queue)
        if queue.priority is None:
            offsets = list(queue.matching(gq.pull_offset, state.filter, want, end))
        else:
            offsets = best(queue, gq, state.filter, want, end)
        found.append(offsets)
        ranked += [(-_level(queue, o), place, turn) for place, o in enumerate(offsets)]
    counts = Counter(turn for _, _, turn in heapq.nsmallest(want, ranked))
    return [(queues[turn], found[turn][:count]) for turn, count in sorted(counts.items())]


async def read_payloads(store: Store, topic: TopicLog, picks: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    out: dict[tuple[int, int], bytes] = {}
    missing: dict[int, list[int]] = {}
    for queue_id, offset in picks:
        payload = topic.queues[queue_id].payloads.get(offset)
        if payload is None:
            missing.setdefault(queue_id, []).append(offset)
        else:
            out[(queue_id, offset)] = payload
    if missing:  # one read of the store's for all the queues: one hop to its reading thread a Pop
        found = await store.read_payloads(topic.name, missing)
        for queue_id, offsets in missing.items():
            for offset in offsets:
                payload = found.get((queue_id, offset))
                if payload is None:
                    raise DomainError(f"message {topic.name}/{queue_id}/{offset} is missing from the store")
                out[(queue_id, offset)] = payload
    return out


def popped_messages(
    broker: str, topic: TopicLog, deliveries: list[tuple[int, int, Delivery]], payloads: dict[tuple[int, int], bytes]
) -> list[Popped]:
    """The answer's messages, in the order of `deliveries`, each with its receipt handle."""
    name, queues = topic.name, topic.queues
    return [
        Popped(
            name,
            q,
            o,
            queues[q].store_ms_at(o),
            payloads[(q, o)],
            d.attempt,
            encode_handle(broker, name, q, o, d.attempt, d.token, d.deadline_ms),
            d.deadline_ms,
        )
        for q, o, d in deliveries
    ]
