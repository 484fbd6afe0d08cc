"""The broker core: topics, consumer groups, pop/ack/invisibility, long polling and notification.

Protocol-neutral (no gRPC). All hot state lives here, on the event loop; the
store makes it durable. Pops reserve messages synchronously (so concurrent pops
never share a message) and then await the store. The core orchestrates the parts
it owns, none of which knows the core:

- ``SendPath`` (broker.send): checking and storing sends, scheduled delivery;
- ``ConsumerGroups`` (broker.groups): each group's state on a topic, made on its first look;
- ``Readiness`` (broker.readiness): what a group can read now, behind FIFO messages too;
- ``Redelivery`` (broker.redelivery): invisibility timers and dead letters;
- ``StateCommits`` (broker.commits): consumer-state changes on their way to the store;
- ``Pops`` (broker.pop): taking, reserving and answering messages, held while none is ready;
- ``Acks`` (broker.acks): acks, invisibility changes and dead letters, by receipt handle;
- ``HoldService`` (broker.longpoll): held Pops and Notifications, woken by the core.

FIFO order (RocketMQ's orderly pop, SQS FIFO): a message sent with a message group
is a FIFO message, and a group's later messages of its queue wait while it is in
flight to that group — new ones are not read past the next FIFO message, and a
redelivered FIFO message waits for the in-flight FIFO messages before it — until
it is acked or dead-lettered (which wakes the group's held requests). A blocked
queue counts as empty for a Notification, as in RocketMQ.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Iterator, Sequence

from popgate_pb import broker_pb2 as pb

from broker import admin, arrival
from broker.acks import Acks
from broker.clock import Clock
from broker.commits import StateCommits
from broker.consumers import ConsumerRegistry
from broker.filters import MATCH_ALL, TagFilter
from broker.groups import ConsumerGroups
from broker.inflight import GroupTopic
from broker.lag import queue_lag
from broker.log import PayloadCache, QueueLog, TopicLog
from broker.longpoll import HoldService, Kind, Outcome
from broker.model import GroupQueueLag, PopResult, Sent
from broker.pop import Pops, read_payloads
from broker.readiness import Readiness
from broker.recall import recall
from broker.redelivery import Redelivery
from broker.retention import Retention
from broker.send import SendPath
from broker.settings import BrokerSettings
from broker.store import Op, Record, Snapshot, Store
from broker.transactions import Transactions
from popgate_contract import validation
from popgate_contract.errors import (
    BadRequest,
    DomainError,
    IllegalBatchSize,
    IllegalPollingTime,
    TooManyRequests,
    TopicNotFound,
)

log = logging.getLogger(__name__)


class BrokerCore:
    def __init__(self, settings: BrokerSettings, store: Store, *, clock: Clock) -> None:
        self.settings = settings
        self.name = settings.name
        self.store = store
        self.clock = clock  # every time the broker reads: its parts get this one
        self.topics: dict[str, TopicLog] = {}
        self.consumers = ConsumerGroups(settings, self.topics)
        self.groups = self.consumers.groups  # (group, topic) -> its state
        self.hold = HoldService(settings.max_held, unused_wake=self._pass_on_unused)
        self.cache = PayloadCache(settings.cache_bytes)
        self.messages_in: dict[str, int] = {}
        # For the on-call metrics (broker/metrics.py): bytes stored per topic, first deliveries and acks per (topic,
        # group), and each ack's time since its message was stored, handed to `on_acked` when set (one call per Ack and
        # topic, with the seconds of each of its acks); `on_forgotten` (topic, group) is told when a group's state on a
        # topic is dropped (broker.admin), to drop its series.
        self.bytes_in: dict[str, int] = {}
        self.messages_acked: dict[tuple[str, str], int] = {}
        self.on_acked: Callable[[str, str, Sequence[float]], None] | None = None
        self.on_forgotten: Callable[[str, str], None] | None = None
        self.sends = SendPath(settings, store, self.topics, clock=clock)
        self.consumers_seen = ConsumerRegistry()  # the live consumers proxies report (broker.admin)
        # Commits of the state of groups that looked at a topic before it existed, made when its first messages
        # arrived, by topic, until the Send that brought them waits for them (at most one per early-looked topic).
        self.adoptions: dict[str, asyncio.Future[list[Record]]] = {}
        self.commits = StateCommits(settings, store, self.groups)
        self.commits.on_purged = self._purged
        self.create_when_purged: set[str] = set()  # `create_topics` names still being deleted (admin: deleted again)
        self._closing = False
        self._creating: set[asyncio.Task[list[str]]] = set()
        self.sends.purging = self.commits.purging  # one set: a topic whose purge is not committed is not made again
        self.redelivery = Redelivery(
            topics=self.topics,
            groups=self.groups,
            sends=self.sends,
            hold=self.hold,
            payloads=functools.partial(read_payloads, store),
            max_attempts=settings.max_attempts_of,
            released=self._fifo_released,
            clock=clock,
        )
        self.readiness = Readiness(
            topics=self.topics, redelivery=self.redelivery, max_pop_batch=settings.max_pop_batch, clock=clock
        )
        self.acks = Acks(
            name=self.name,
            settings=settings,
            groups=self.groups,
            commits=self.commits,
            redelivery=self.redelivery,
            fifo_released=self._fifo_released,
            counted=self._count_acks,
            clock=clock,
        )
        self.pops = Pops(
            settings=settings,
            topics=self.topics,
            consumers=self.consumers,
            readiness=self.readiness,
            hold=self.hold,
            redelivery=self.redelivery,
            commits=self.commits,
            payloads=functools.partial(read_payloads, store),
            resolve=self.acks.resolve,
            clock=clock,
        )
        self.messages_out, self.first_out = self.pops.messages_out, self.pops.first_out  # counted by the Pops
        self.transactions = self.sends.transactions = Transactions(settings, self.sends, clock=clock)
        self.schedule = self.sends.schedule
        self.scheduler = self.sends.scheduler
        self.retention = Retention(
            settings=settings,
            store=store,
            topics=self.topics,
            groups=self.groups,
            commits=self.commits,
            cache=self.cache,
            clock=clock,
            drop_topic=self._drop_topic,
        )

    async def _drop_topic(self, topic: str, still: Callable[[], bool]) -> bool:
        """Retention's deletion of a topic whole, unless `still` fails just before it goes: whether it went."""
        out = pb.DeleteTopicResponse()
        await admin.delete_topic(self, pb.DeleteTopicRequest(topic=topic), out, still)
        return out.existed

    # -- start ---------------------------------------------------------------

    def restore(self, snap: Snapshot) -> None:
        by_topic: dict[str, dict[int, QueueLog]] = {}
        for (topic, queue_id), index in snap.queues.items():
            by_topic.setdefault(topic, {})[queue_id] = QueueLog(topic, queue_id, index)
        for topic, known in by_topic.items():
            # A topic's list is indexed by queue id. A queue with neither a stored row nor a message
            # (its topic's first commit failed) comes back empty, and the next Send stores its row.
            count = max(known) + 1
            self.topics[topic] = TopicLog(topic, [known.get(q) or QueueLog(topic, q) for q in range(count)])
            if len(known) < count:
                self.sends.unsaved(topic)
        ops: list[Op] = []
        self.consumers.restore(snap, ops, self.clock.now_ms())
        if ops:  # consumer state below a queue's first message (retention): corrected, stored
            self.commits.commit(ops)
        for state in self.groups.values():
            self.redelivery.schedule(state)
        self.sends.restore(snap.scheduled)
        self.transactions.restore(snap.halves)
        for topic in snap.purging:  # a deletion's rows left by a stop: not made again before they are deleted
            self.commits.purging.add(topic)
            self.commits.topic_rows.start(topic)

    def start(self) -> None:
        self.scheduler.start()

    def _purged(self, topic: str) -> None:
        """A deleted topic's rows are gone: made now if `create_topics` named it meanwhile (not as the core closes:
        the next start creates it)."""
        if topic in self.create_when_purged and not self._closing:
            self.create_when_purged.discard(topic)
            task = asyncio.get_running_loop().create_task(self.create_topics([topic]))
            self._creating.add(task)
            task.add_done_callback(self._created)

    def _created(self, task: asyncio.Task[list[str]]) -> None:
        self._creating.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("storing a --topic topic once its deletion ended failed (its next write stores it): %s", exc)

    async def create_topics(self, names: Sequence[str]) -> list[str]:
        """Create the topics that do not exist yet (`--topic`, also with auto-create off); the new ones. One still
        being deleted (a stop left its deletion midway: `restore` resumed it) is created once it is gone, in the
        background: a start does not wait for it, nor hang on a store that refuses the deletion's steps —
        tests/unit/broker/test_topic_purges.py::test_a_topic_named_at_start_is_created_once_its_deletion_ends."""
        ops: list[Op] = []
        created = []
        for name in dict.fromkeys(names):
            if name in self.commits.purging:
                log.info("topic %s is being deleted: created once that is done", name)
                self.create_when_purged.add(name)
                continue
            if name not in self.topics:
                validation.check_topic(name)
                self.sends.topic_for_send(name, ops, force=True)
                created.append(name)
        if ops:
            await self.sends.submit([], ops, awaited=True)
        return created

    async def send(
        self, messages: Sequence[pb.Message], runs: Sequence[pb.SharedRun] = (), within_s: float | None = None
    ) -> list[Sent]:
        sent = await self.sends.send(messages, runs, within_s)
        if self.adoptions:  # this Send created topics that groups had looked at: answered once their state is
            for topic in {s.topic for s in sent}:  # recorded too (with --flush sync: committed), see `arrived`
                if (adopted := self.adoptions.pop(topic, None)) is not None:
                    await self.commits.record(adopted)
        return sent

    async def recall(self, topic: str, handle: str) -> str:
        """Withdraw a scheduled message before it is due (broker.recall); its message id."""
        return await recall(self.sends, topic, handle)

    def arrived(self, records: Sequence[Record]) -> None:
        """ArrivalListener: committed messages become visible, and wake whoever can consume them (broker.arrival)."""
        arrival.announce(self, records)

    def _fifo_released(self, state: GroupTopic, queue_id: int) -> None:
        """A FIFO message of the queue was acked or dead-lettered: wake as many of the group's held requests as
        the queue now serves (`Readiness.released`), oldest first, as an arrival does; not every held request of
        the group."""
        tags, cut = self.readiness.released(state, queue_id)
        key = (state.topic, state.group)
        if tags:
            self.hold.arrived(key, tags)
        if cut:  # more is readable than a Pop's batch: a held filter matching only past it is woken too —
            # tests/unit/broker/test_arrival.py::test_a_fifo_release_wakes_a_filter_that_matches_only_past_a_pops_batch
            self.hold.wake_oldest_ready(key, functools.partial(self.readiness.check, state))

    # -- pop (broker.pop) ------------------------------------------------------

    def _check_read(self, topic: str, group: str, expression: str, poll_ms: int) -> tuple[TagFilter, int]:
        """The request's filter and its poll time, cut to this broker's longest: a long poll may always end
        sooner than asked, and a proxy's range wider than this broker's (their settings are separate) must
        not make every long receive fail. A negative poll time is refused."""
        validation.check_topic(topic)
        validation.check_group(group)
        if poll_ms < 0:
            raise IllegalPollingTime(f"poll time {poll_ms} ms is negative")
        if topic not in self.topics and not self.settings.auto_create:
            raise TopicNotFound(f"topic {topic} does not exist on broker {self.name}")
        return TagFilter.parse(expression), min(poll_ms, self.settings.max_poll_ms)

    def pop(
        self,
        topic: str,
        group: str,
        expression: str,
        max_messages: int,
        invisible_ms: int,
        poll_ms: int,
        max_fifo: int = 0,
    ) -> Coroutine[object, object, PopResult]:
        """The Pop path's coroutine itself (no frame of this one while a Pop is held); a bad read raises here."""
        tag_filter, poll_ms = self._check_read(topic, group, expression, poll_ms)
        return self.pops.pop(topic, group, tag_filter, max_messages, invisible_ms, poll_ms, max_fifo)

    def release(self, topic: str, group: str, handles: Sequence[str]) -> int:
        return self.pops.release(topic, group, handles)

    # -- ack and invisibility (broker.acks) ----------------------------------

    async def ack(self, topic: str, group: str, handles: Sequence[str]) -> list[DomainError | None]:
        return await self.acks.ack(topic, group, handles)

    def _count_acks(self, group: str, acked: dict[str, list[tuple[int, int]]]) -> None:
        """Count the acks per (topic, group) and hand their latencies to `on_acked`, one call per topic with
        at least one."""
        now = self.clock.now_ms()
        on_acked = self.on_acked
        for topic, messages in acked.items():
            topic_log = self.topics.get(topic)
            if topic_log is None or (group, topic) not in self.groups:
                # Its topic or group was deleted while the acks were committed (broker.admin): the acks stand and
                # are answered OK, nothing is counted for what is gone — tests/unit/broker/test_core_commits.py::
                # test_acks_applied_while_their_topic_is_deleted_are_answered_ok.
                continue
            queues = topic_log.queues
            counted = 0
            seconds: list[float] = []
            for queue_id, offset in messages:
                if queue_id >= len(queues):
                    continue
                counted += 1
                if on_acked is not None:
                    queue = queues[queue_id]
                    stored = queue.store_ms
                    i = offset - queue.min_offset
                    if 0 <= i < len(stored):  # min_offset <= offset < max_offset: not deleted by retention
                        seconds.append(max(0, now - stored[i]) / 1000)
            if counted:
                key = (topic, group)
                self.messages_acked[key] = self.messages_acked.get(key, 0) + counted
            if seconds and on_acked is not None:
                on_acked(topic, group, seconds)

    async def change_invisible(self, topic: str, group: str, text: str, invisible_ms: int) -> tuple[str, int]:
        return await self.acks.change_invisible(topic, group, text, invisible_ms)

    async def change_invisible_many(
        self, topic: str, group: str, handles: Sequence[str], invisible_ms: int, *, undelivered: bool = False
    ) -> tuple[list[tuple[str, int] | DomainError], int]:
        return await self.acks.change_invisible_many(topic, group, handles, invisible_ms, undelivered=undelivered)

    async def renew(
        self, group: str, handles: Sequence[str], invisible_ms: int, *, bring_forward: bool = False
    ) -> tuple[list[DomainError | None], int]:
        return await self.acks.renew(group, handles, invisible_ms, bring_forward=bring_forward)

    async def dead_letter(self, topic: str, group: str, text: str, *, message_id: str = "") -> pb.StoredMessage | None:
        return await self.acks.dead_letter(topic, group, text, message_id=message_id)

    def unreadable(self, topic: str, group: str, text: str) -> None:
        self.acks.unreadable(topic, group, text)

    # -- notification ----------------------------------------------------------

    async def notification(self, topic: str, group: str, expression: str, poll_ms: int) -> tuple[bool, bool]:
        """(has_message, polling_full); consumes nothing."""
        tag_filter, poll_ms = self._check_read(topic, group, expression, poll_ms)
        ops: list[Op] = []
        state = self.consumers.reader(group, topic, tag_filter, ops, pop_filter=False)
        if ops:
            await self.commits.write(ops)
        if state is not None and self.readiness.has_ready(state, tag_filter):
            return True, False
        waiter = self.hold.enter((topic, group), Kind.NOTIFICATION, tag_filter, poll_ms / 1000)
        if isinstance(waiter, Outcome):
            return False, waiter is Outcome.FULL
        try:  # awaited here, as a held Pop's: a held Notification is this frame and a waiter
            outcome = await waiter.future
        except asyncio.CancelledError:
            self.hold.leave((topic, group), waiter, cancelled=True)
            raise
        self.hold.leave((topic, group), waiter)
        return outcome is Outcome.SERVED, False

    def pass_on(self, topic: str, group: str) -> bool:
        """A Notification answered ``has_message`` whose receive then took nothing here (it was answered from
        another broker first, or ended): the wake it had is passed on to the group's oldest request held here
        that something is ready for. An arrival wakes one held request per message, so without this a message
        whose wake went to such a receive would wait for the safety sweep, or a whole long poll with the sweep
        off, while another consumer's request was held here — tests/unit/broker/test_session_stream.py::
        test_a_notification_answered_and_not_used_passes_its_wake_on_to_the_next_held_request. Whether one was
        woken."""
        state = self.groups.get((group, topic))
        if state is None:
            return False
        return self.hold.wake_oldest_ready((topic, group), functools.partial(self.readiness.check, state))

    def _pass_on_unused(self, key: tuple[str, str]) -> None:
        """A held request of (topic, group) woken and cancelled before it was answered: as `pass_on`."""
        self.pass_on(*key)

    def sweep(self) -> None:
        """Safety net: wake held requests whose group has something ready (normally woken on arrival);
        retry writing consumer state the store refused (`StateCommits.retry`)."""
        self.commits.retry()
        self.transactions.expire()
        for topic, group in self.hold.keys():
            state = self.groups.get((group, topic))
            if state is None and topic in self.topics:  # held since before the topic existed
                ops: list[Op] = []
                try:
                    state = self.consumers.reader(group, topic, MATCH_ALL, ops, pop_filter=False)
                except TooManyRequests:
                    continue  # its requests are answered when their poll time ends
                if ops:
                    self.commits.commit(ops)
            if state is not None:  # each request's own filter: the group's last Pop filter may differ
                self.hold.wake_ready((topic, group), functools.partial(self.readiness.check, state))

    # -- stats -----------------------------------------------------------------

    def lags(self, topic: str = "", group: str = "") -> list[GroupQueueLag]:
        return list(self.iter_lags(topic, group))

    def iter_lags(self, topic: str = "", group: str = "") -> Iterator[GroupQueueLag]:
        """Each (group, topic)'s queues one after another, worked out as they are taken."""
        for (g, t), state in sorted(self.groups.items()):
            log_ = self.topics.get(t)
            if log_ is None or (topic and t != topic) or (group and g != group):
                continue
            for queue in log_.queues:
                lag = queue_lag(queue, state.queues.get(queue.queue_id), state.filter, queue.min_offset)
                yield GroupQueueLag(t, g, queue.queue_id, lag)

    async def list_messages(self, topic: str, queue_id: int, from_offset: int, limit: int) -> list[Record]:
        """Up to `limit` stored messages from `from_offset` on, cut at `--max-pop-bytes` (at least one): the caller
        goes on from the offset after the last, and an answer stays under the gRPC message limit whatever the
        messages' sizes — tests/unit/broker/test_limits.py::
        test_listing_stored_messages_is_cut_at_the_byte_budget_and_goes_on_from_the_next_offset."""
        validation.check_topic(topic)
        if topic not in self.topics:
            raise TopicNotFound(f"topic {topic} does not exist on broker {self.name}")
        if not 1 <= limit <= 1000:
            raise IllegalBatchSize("limit must be in 1..1000")
        if not 0 <= queue_id < 2**31 or not 0 <= from_offset < 2**62:
            raise BadRequest(f"queue id {queue_id} / offset {from_offset} out of range (0..2^31, 0..2^62)")
        queues = self.topics[topic].queues
        if queue_id < len(queues):  # not below the first retained message (its row may not be deleted yet)
            from_offset = max(from_offset, queues[queue_id].min_offset)
        return await self.store.read_range(topic, queue_id, from_offset, limit, max_bytes=self.settings.max_pop_bytes)

    async def close(self) -> None:
        self._closing = True
        await self.commits.topic_rows.close()
        for task in list(self._creating):
            task.cancel()
        await asyncio.gather(*self._creating, return_exceptions=True)
        await self.scheduler.close()
        await self.transactions.close()
        self.hold.close()
        await self.redelivery.close()
