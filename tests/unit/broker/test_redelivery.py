"""Redelivery without sockets: expiry makes deliveries ready again or dead-letters them past the attempt
limit, a failed DLQ commit keeps the message in flight, and the invisibility timer wakes a held Pop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from popgate_pb import broker_pb2 as pb

from broker.clock import WallClock
from broker.filters import MATCH_ALL
from broker.inflight import Delivery, GroupTopic
from broker.log import QueueLog, TopicLog
from broker.longpoll import HoldService, Kind, Outcome
from broker.redelivery import MAX_DLQ_MOVES, Redelivery
from broker.send import SendPath
from broker.settings import BrokerSettings
from broker.store import DeleteInflight, NewMessage, Op, Record
from popgate_contract.errors import StoreUnavailable
from tests.unit.broker.test_longpoll import holding

MAX_ATTEMPTS = 3
SETTINGS = BrokerSettings(max_delivery_attempts=MAX_ATTEMPTS, group_max_attempts=(("fast", 1),))


class CommitLog:
    """Just enough of a Store: records every commit, answers at once, refuses writes on demand."""

    def __init__(self) -> None:
        self.commits: list[tuple[list[NewMessage], list[Op]]] = []
        self.refuse = False

    def submit(self, appends: Sequence[NewMessage], ops: Sequence[Op]) -> asyncio.Future[list[Record]]:
        future: asyncio.Future[list[Record]] = asyncio.get_running_loop().create_future()
        if self.refuse:
            future.set_exception(StoreUnavailable("disk full"))
            return future
        self.commits.append((list(appends), list(ops)))
        future.set_result([Record(a.topic, a.queue_id, i, a.store_ms, a.tag, a.payload) for i, a in enumerate(appends)])
        return future


def make(store: CommitLog, *, failed_reads: int = 0) -> tuple[Redelivery, GroupTopic, HoldService]:
    """failed_reads: that many payload reads fail first, as a disk read error would."""
    topics = {"t": TopicLog("t", [QueueLog("t", 0)])}
    hold = HoldService(10)
    reads = [0]

    async def payloads(topic: TopicLog, picks: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        reads[0] += 1
        if reads[0] <= failed_reads:
            raise OSError("disk I/O error")
        return {
            (q, o): pb.Message(topic=topic.name, message_id=f"m{o}", body=b"x").SerializeToString() for q, o in picks
        }

    clock = WallClock()
    sends = SendPath(BrokerSettings(auto_create=True), store, topics, clock=clock)  # type: ignore[arg-type]
    state = GroupTopic("g", "t")
    state.queue(0, 0).pull_offset = 2
    redelivery = Redelivery(
        topics=topics,
        groups={("g", "t"): state},
        sends=sends,
        hold=hold,
        payloads=payloads,
        max_attempts=SETTINGS.max_attempts_of,
        released=lambda state, queue_id: None,
        clock=clock,
    )
    return redelivery, state, hold


async def test_expired_delivery_is_ready_again_below_the_limit_and_dead_lettered_at_it() -> None:
    store = CommitLog()

    redelivery, state, _ = make(store)
    state.deliver(0, 0, Delivery(MAX_ATTEMPTS - 1, 11, 100))
    state.deliver(0, 1, Delivery(MAX_ATTEMPTS, 12, 100))
    picks = redelivery.take(state, 200, 10, [])
    await redelivery.close()  # waits for the dead-lettering under way
    assert state.current(0, 1, 12) is None and state.dead_lettered == 1
    assert picks == [(0, 0, MAX_ATTEMPTS)]
    [(appends, ops)] = store.commits
    assert DeleteInflight("g", "t", 0, 1) in ops
    [dlq] = appends
    message = pb.Message.FromString(dlq.payload)
    assert dlq.topic == message.topic == "%DLQ%g"
    assert message.message_id == "m1"
    assert dict(message.properties) == {
        "ORIGIN_TOPIC": "t",
        "ORIGIN_MESSAGE_ID": "m1",
        "DELIVERY_ATTEMPTS": str(MAX_ATTEMPTS),
        "ORIGIN_QUEUE_ID": "0",
        "ORIGIN_OFFSET": "1",
    }


async def test_a_group_with_its_own_max_attempts_is_dead_lettered_at_it_the_others_at_the_default() -> None:
    store = CommitLog()

    redelivery, state, _ = make(store)
    fast = GroupTopic("fast", "t")
    fast.queue(0, 0).pull_offset = 2
    redelivery.groups[("fast", "t")] = fast
    for group in (state, fast):
        group.deliver(0, 0, Delivery(1, 11, 100))
    picks = redelivery.take(state, 200, 10, []), redelivery.take(fast, 200, 10, [])
    await redelivery.close()
    assert picks == ([(0, 0, 2)], [])  # "g" gets its second delivery; "fast" had its one
    [(appends, _)] = store.commits
    assert [a.topic for a in appends] == ["%DLQ%fast"]


async def test_a_dead_letter_out_of_attempts_is_ready_again_not_dead_lettered_a_second_time() -> None:
    """A group reading a DLQ (`popgate dlq resend` leaving a letter it cannot re-send, run after run) never moves
    the letter on to its own DLQ: it stays where `dlq list` shows it, delivered again until acked."""
    store = CommitLog()

    redelivery, _, _ = make(store)
    dlq = "%DLQ%g"
    redelivery.topics[dlq] = TopicLog(dlq, [QueueLog(dlq, 0)])
    reader = GroupTopic("popgate-dlq-resend", dlq)
    reader.queue(0, 0).pull_offset = 1
    redelivery.groups[("popgate-dlq-resend", dlq)] = reader
    reader.deliver(0, 0, Delivery(MAX_ATTEMPTS, 11, 100))
    picks = redelivery.take(reader, 200, 10, [])
    await redelivery.close()
    assert picks == [(0, 0, MAX_ATTEMPTS + 1)] and reader.dead_lettered == 0 and store.commits == []


async def test_refused_dead_letter_keeps_the_message_in_flight() -> None:
    store = CommitLog()
    store.refuse = True
    redelivery, state, _ = make(store)
    state.deliver(0, 1, Delivery(MAX_ATTEMPTS, 12, 100))
    assert redelivery.expire(state, now=200) == 0
    await redelivery.close()
    deadline = state.next_deadline()
    assert deadline is not None and deadline > redelivery.clock.now_ms()  # comes due again, same attempt count
    assert state.dead_lettered == 0
    assert store.commits == []


async def test_a_failed_payload_read_while_dead_lettering_keeps_the_message_in_flight() -> None:
    store = CommitLog()

    redelivery, state, _ = make(store, failed_reads=1)
    state.deliver(0, 1, Delivery(MAX_ATTEMPTS, 12, 100))
    redelivery.expire(state, now=200)  # out of attempts: to the DLQ, but its payload cannot be read
    await redelivery.close()
    deadline = state.next_deadline()
    assert deadline is not None and deadline > redelivery.clock.now_ms()  # in flight, due again (not stranded)
    redelivery.expire(state, now=deadline)  # the read works this time
    await redelivery.close()
    assert (state.dead_lettered, len(store.commits), state.inflight_count) == (1, 1, 0)


async def test_deadline_timer_wakes_a_held_pop() -> None:
    redelivery, state, hold = make(CommitLog())
    state.deliver(0, 0, Delivery(1, 11, redelivery.clock.now_ms() + 50))
    redelivery.schedule(state)
    outcome = await holding(hold, ("t", "g"), Kind.POP, MATCH_ALL, 5.0)
    assert redelivery.take(state, redelivery.clock.now_ms(), 1, []) == [(0, 0, 2)]
    await redelivery.close()
    assert outcome is Outcome.SERVED


class SlowCommit(CommitLog):
    """Answers each commit only when the test says so (as a writer thread under load)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[asyncio.Future[list[Record]]] = []
        self.submitted = asyncio.Event()

    def submit(self, appends: Sequence[NewMessage], ops: Sequence[Op]) -> asyncio.Future[list[Record]]:
        future: asyncio.Future[list[Record]] = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self.submitted.set()
        return future


async def test_a_dead_letter_cancelled_while_its_commit_fails_keeps_the_message_in_flight() -> None:
    store = SlowCommit()

    redelivery, state, _ = make(store)
    delivery = Delivery(2, 12, redelivery.clock.now_ms() + 60_000)
    state.deliver(0, 1, delivery)
    call = asyncio.create_task(redelivery.dead_letter(state, 0, 1, delivery))  # the DeadLetter RPC
    await store.submitted.wait()
    call.cancel()  # the client's deadline passes while the commit is under way
    await asyncio.gather(call, return_exceptions=True)
    store.waiting[0].set_exception(StoreUnavailable("disk full"))  # and then the commit fails
    await asyncio.sleep(0)
    again = state.queues[0].inflight.get(1)
    assert again is not None and again.attempt == 2  # in flight again, due in a second
    assert state.dead_lettered == 0
    await redelivery.close()


async def test_many_dead_letters_due_at_once_are_moved_a_bounded_number_at_a_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """500 deliveries past their last attempt, expiring together: at most MAX_DLQ_MOVES moves (payload read and
    commit) are under way at once, each message still reaches the DLQ exactly once and leaves the flight, and the
    log says so in one line, not one a message."""
    store = CommitLog()
    count = 500
    reading = [0, 0]  # now, most at once

    with caplog.at_level(logging.INFO, logger="broker.letters"):
        redelivery, state, _ = make(store)
        payloads = redelivery.payloads

        async def slow(topic: TopicLog, picks: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
            reading[0] += 1
            reading[1] = max(reading)
            for _ in range(3):  # a read that takes a few loop turns, as the reader thread's
                await asyncio.sleep(0)
            reading[0] -= 1
            return await payloads(topic, picks)

        redelivery.payloads = slow
        state.queue(0, 0).pull_offset = count
        for offset in range(count):
            state.deliver(0, offset, Delivery(MAX_ATTEMPTS, offset + 1, 100))
        assert redelivery.expire(state, now=200) == 0
        tasks = len(redelivery._tasks)
        await redelivery.close()
        assert (tasks, state.dead_lettered, state.inflight_count) == (MAX_DLQ_MOVES, count, 0)
    assert reading[1] == MAX_DLQ_MOVES
    moved = sorted(op.offset for _, ops in store.commits for op in ops if isinstance(op, DeleteInflight))
    assert moved == list(range(count))  # each exactly once
    assert sum(len(appends) for appends, _ in store.commits) == count
    [line] = [r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert line == f"dead-lettered {count} message(s) of t after {MAX_ATTEMPTS} attempts to %DLQ%g"
