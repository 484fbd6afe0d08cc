"""Transactions in the broker (broker.transactions, broker.txcheck), no sockets: a half message is invisible
until committed, delivered once after its commit, never after its rollback, also across a restart; forged and
stale transaction ids change nothing; checks come after the immunity time, once per interval, are recorded before
they are handed out, and after the last one the half message is rolled back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import admin
from broker.core import BrokerCore
from broker.txcheck import CheckSchedule, Half
from popgate_contract.errors import BadRequest, InvalidTransactionId
from popgate_contract.handles import TransactionId
from tests.unit.broker.cores import ManualClock, broker, submitted_event

NOW = 1_800_000_000_000
INVISIBLE_MS = 30_000
HOUR_MS = 3_600_000
SETTINGS = {"transaction_immunity_s": 1.0, "transaction_check_interval_s": 2.0, "transaction_max_checks": 3}


def test_checks_start_after_the_immunity_come_once_per_interval_and_expire_after_the_last() -> None:
    schedule = CheckSchedule(immunity_ms=1000, interval_ms=2000, max_checks=2)
    schedule.add(Half(1, 7, "t", 0, None, NOW, 0, NOW + 1000))
    assert schedule.due(["t"], NOW + 999, 10) == []
    assert schedule.next_due_ms(["t"]) == NOW + 1000
    (half,) = schedule.due(["t"], NOW + 1000, 10)
    assert schedule.due(["other"], NOW + 1000, 10) == []
    schedule.checked(half, *schedule.check_state(half, NOW + 1000))
    assert schedule.due(["t"], NOW + 2999, 10) == [] and schedule.expired(NOW + 2999) == []
    (half,) = schedule.due(["t"], NOW + 3000, 10)
    schedule.checked(half, *schedule.check_state(half, NOW + 3000))  # its last check
    assert schedule.due(["t"], NOW + 10_000, 10) == []
    assert schedule.expired(NOW + 4999) == []
    assert schedule.expired(NOW + 5000) == [half]


def test_resolved_half_messages_leave_the_check_schedules_memory_early() -> None:
    """Half messages committed within their immunity (the usual case) go from the schedule's heaps as they are
    resolved, not when their checks would have ended (minutes later); the one left keeps its checks."""
    schedule = CheckSchedule(immunity_ms=6000, interval_ms=30_000, max_checks=15)
    for half_id in range(1, 10_001):
        schedule.add(Half(half_id, 7, "t", 0, None, NOW, 0, NOW + 6000))
    for half_id in range(2, 10_001):
        schedule.remove(half_id)
    assert len(schedule._expiry) < 10 and sum(map(len, schedule._due.values())) < 10  # noqa: SLF001
    (half,) = schedule.due(["t"], NOW + 6000, 10)
    assert half.half_id == 1 and schedule.expired(NOW + 456_000) == [half]


def test_a_half_message_nobody_checks_expires_when_its_checks_would_have_ended() -> None:
    schedule = CheckSchedule(immunity_ms=1000, interval_ms=2000, max_checks=3)
    schedule.add(Half(1, 7, "t", 0, None, NOW, 0, NOW + 1000))
    assert schedule.expired(NOW + 6999) == []
    assert [h.half_id for h in schedule.expired(NOW + 7000)] == [1]


def test_a_half_message_of_a_topic_still_asked_for_waits_for_its_checks_past_their_time() -> None:
    """A producer online but answering slower than checks fall due: its topic is asked for every second, each time
    for one check, so each half message is checked far less often than every interval. None is rolled back when the
    time of its last check passes, each only an interval after its last check; a half message of a topic nobody
    asks for is rolled back at that time."""
    schedule = CheckSchedule(immunity_ms=1000, interval_ms=2000, max_checks=3, started_ms=NOW)
    for half_id in range(1, 11):
        schedule.add(Half(half_id, 7, "t", 0, None, NOW, 0, NOW + 1000))
    schedule.add(Half(99, 7, "nobody asks", 0, None, NOW, 0, NOW + 1000))
    last_check: dict[int, int] = {}
    rolled_back: dict[int, tuple[int, int]] = {}  # half id -> (checks, when)
    for now in range(NOW + 1000, NOW + 60_000, 1000):
        for h in schedule.due(["t"], now, 1):
            schedule.checked(h, *schedule.check_state(h, now))
            last_check[h.half_id] = now
        rolled_back |= {h.half_id: (h.checks, now) for h in schedule.expired(now)}
        for half_id in rolled_back:
            schedule.remove(half_id)
    assert rolled_back.pop(99) == (0, NOW + 7000)  # immunity + max_checks * interval
    assert sorted(rolled_back) == list(range(1, 11))
    for half_id, (checks, when) in rolled_back.items():
        assert checks == 3 and when >= last_check[half_id] + 2000


def test_a_half_message_of_a_topic_asked_for_without_room_waits_for_its_checks() -> None:
    """A proxy whose producers have no room for checks still names the topic (`asked`): its half messages get no
    check then and are not rolled back at the time of their last check; once checks are taken, they get theirs."""
    schedule = CheckSchedule(immunity_ms=1000, interval_ms=2000, max_checks=3, started_ms=NOW)
    schedule.add(Half(1, 7, "t", 0, None, NOW, 0, NOW + 1000))
    schedule.add(Half(2, 7, "nobody asks", 0, None, NOW, 0, NOW + 1000))
    for now in range(NOW + 1000, NOW + 20_000, 1000):
        schedule.asked(["t"], now)
        assert [h.half_id for h in schedule.expired(now)] == ([2] if now == NOW + 7000 else [])
    assert [h.half_id for h in schedule.due(["t"], NOW + 20_000, 5)] == [1]


async def half(core: BrokerCore, body: bytes, topic: str = "t") -> str:
    (sent,) = await core.send([pb.Message(topic=topic, body=body, transactional=True)])
    assert sent.transaction_id and sent.offset == -1
    return sent.transaction_id


async def bodies(core: BrokerCore, group: str = "g") -> list[bytes]:
    result = await core.pop("t", group, "*", 32, INVISIBLE_MS, 0)
    return [pb.Message.FromString(m.payload).body for m in result.messages]


async def test_commit_delivers_once_rollback_never_also_across_a_restart(tmp_path: Path) -> None:
    async with broker(tmp_path, **SETTINGS) as (core, _):
        committed, rolled_back, pending = await half(core, b"c"), await half(core, b"r"), await half(core, b"p")
        assert await bodies(core) == []  # half messages are invisible
        await core.transactions.end("t", committed, commit=True)
        await core.transactions.end("t", rolled_back, commit=False)
        assert await bodies(core) == [b"c"]
        # Resolved already: the other outcome is refused, nothing changes.
        for stale, commit in ((committed, False), (rolled_back, True)):
            with pytest.raises(InvalidTransactionId, match="already"):
                await core.transactions.end("t", stale, commit=commit)
    async with broker(tmp_path, **SETTINGS) as (core, _):
        assert len(core.transactions.schedule) == 1
        assert await bodies(core, "g2") == [b"c"]
        await core.transactions.end("t", pending, commit=True)
        assert await bodies(core, "g2") == [b"p"]
        stats = core.transactions.stats
        assert (stats.committed, stats.rolled_back) == (1, 0)


@pytest.mark.parametrize(
    "forge",
    [
        lambda t: "garbage",
        lambda t: TransactionId("b2", t.half_id, t.token).encode(),  # another broker's
        lambda t: TransactionId("b1", t.half_id, t.token + 1).encode(),  # the wrong token
        lambda t: TransactionId("b1", t.half_id + 1, t.token).encode(),  # no such half message
    ],
)
async def test_a_forged_transaction_id_is_refused_and_nothing_changes(tmp_path: Path, forge: object) -> None:
    async with broker(tmp_path, **SETTINGS) as (core, _):
        real = await half(core, b"x")
        with pytest.raises(InvalidTransactionId):
            await core.transactions.end("t", forge(TransactionId.decode(real)), commit=True)  # type: ignore[operator]
        with pytest.raises(InvalidTransactionId):  # another topic's id
            await core.transactions.end("other", real, commit=True)
        assert await bodies(core) == [] and len(core.transactions.schedule) == 1
        await core.transactions.end("t", real, commit=True)
        assert await bodies(core) == [b"x"]


async def test_a_transactional_message_with_a_group_delay_or_priority_is_refused_whole(tmp_path: Path) -> None:
    async with broker(tmp_path, **SETTINGS) as (core, _):
        for extra in ({"message_group": "g"}, {"delay_level": 1}, {"priority": 2}):
            with pytest.raises(BadRequest):
                await core.send(
                    [pb.Message(topic="t", body=b"ok"), pb.Message(topic="t", body=b"x", transactional=True, **extra)]
                )  # type: ignore[arg-type]
        assert len(core.transactions.schedule) == 0


async def test_checks_are_recorded_before_they_are_handed_out_and_the_last_one_rolls_back(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        tid = await half(core, b"h")
        assert await core.transactions.checks(["t"], 10) == ([], NOW + 1000)
        clock.now = NOW + 1000
        (check,), next_due = await core.transactions.checks(["t"], 10)
        assert (check.transaction_id, check.check, next_due) == (tid, 1, NOW + 3000)
        assert pb.Message.FromString(check.row.payload).body == b"h"
        assert (await core.transactions.checks(["t"], 10))[0] == []  # not again within the interval
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):  # the check count survived the restart
        clock.now = NOW + 3000
        (check,), _ = await core.transactions.checks(["t"], 10)
        assert check.check == 2
        clock.now = NOW + 5000
        (check,), _ = await core.transactions.checks(["t"], 10)
        assert check.check == 3  # the last
        clock.now = NOW + 7000
        rolling_back = core.transactions.expire()
        assert rolling_back is not None
        await rolling_back
        assert len(core.transactions.schedule) == 0 and core.transactions.stats.expired == 1
        with pytest.raises(InvalidTransactionId):
            await core.transactions.end("t", tid, commit=True)
        assert await bodies(core) == []


async def test_a_wall_clock_step_while_running_neither_rolls_a_half_message_back_nor_moves_its_checks(
    tmp_path: Path,
) -> None:
    """Its checks and its roll-back keep their distance from its send on the monotonic clock: a step of the
    wall clock forward rolls back nothing and asks no producer early, a step back delays no check."""
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        tid = await half(core, b"h")
        clock.step(HOUR_MS)
        assert core.transactions.expire() is None
        assert await core.transactions.checks(["t"], 10) == ([], NOW + HOUR_MS + 1000)
        clock.step(-2 * HOUR_MS)
        clock.now += 1000
        (check,), next_due = await core.transactions.checks(["t"], 10)
        assert (check.transaction_id, check.check, next_due) == (tid, 1, NOW - HOUR_MS + 3000)
        clock.now += 6000  # at the time of the last check (7 s after the send), none handed out since
        rolling_back = core.transactions.expire()
        assert rolling_back is not None
        await rolling_back
        with pytest.raises(InvalidTransactionId, match="rolled back already"):
            await core.transactions.end("t", tid, commit=True)


class ReadApartClock(ManualClock):
    """Its monotonic clock reads 1 ms behind every other time, as two clocks read at ms precision may."""

    def __init__(self, now: int) -> None:
        super().__init__(now)
        self.reads = 0

    def monotonic_ms(self) -> int:
        self.reads += 1
        return super().monotonic_ms() - self.reads % 2


async def test_the_next_check_answered_is_the_one_stored_also_after_a_restart(tmp_path: Path) -> None:
    clock = ReadApartClock(NOW)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        await half(core, b"h")
        clock.now = NOW + 1000
        (_, next_due) = await core.transactions.checks(["t"], 10)
        assert next_due == NOW + 3000
    for _ in range(4):
        async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
            assert await core.transactions.checks(["t"], 10) == ([], NOW + 3000)


@pytest.mark.parametrize("commit", [True, False])
async def test_an_end_cancelled_during_its_commit_takes_effect_and_a_resend_is_answered_ok(
    tmp_path: Path, commit: bool
) -> None:
    async with broker(tmp_path, **SETTINGS) as (core, _):
        tid = await half(core, b"c")
        submitted = submitted_event(core)
        ending = asyncio.create_task(core.transactions.end("t", tid, commit=commit))
        await submitted.wait()
        ending.cancel()  # the caller went away (a proxy timeout) while the commit was under way
        with pytest.raises(asyncio.CancelledError):
            await ending
        await core.transactions.end("t", tid, commit=commit)  # the resend after a lost answer: OK
        assert len(core.transactions.schedule) == 0
        with pytest.raises(InvalidTransactionId, match="already"):  # the other outcome: refused
            await core.transactions.end("t", tid, commit=not commit)
        assert await bodies(core) == ([b"c"] if commit else [])
        stats = core.transactions.stats
        assert (stats.committed, stats.rolled_back) == ((1, 0) if commit else (0, 1))


async def test_a_resend_while_the_first_end_commits_waits_for_it(tmp_path: Path) -> None:
    async with broker(tmp_path, **SETTINGS) as (core, _):
        tid = await half(core, b"c")
        submitted = submitted_event(core)
        first = asyncio.create_task(core.transactions.end("t", tid, commit=True))
        await submitted.wait()
        with pytest.raises(InvalidTransactionId, match="being committed"):
            await core.transactions.end("t", tid, commit=False)
        await core.transactions.end("t", tid, commit=True)
        await first
        assert await bodies(core) == [b"c"]


async def test_a_half_committed_into_a_topic_made_again_with_fewer_queues_is_delivered(tmp_path: Path) -> None:
    """Sent to queue 7 of 8; the topic deleted before the commit, which makes it again with 4 queues."""
    async with broker(tmp_path, queues_per_topic=4) as (core, _):
        await admin.create_topic(core, pb.CreateTopicRequest(topic="t", queues=8), pb.CreateTopicResponse())
        (sent,) = await core.send([pb.Message(topic="t", body=b"h", transactional=True, queue_id=7)])
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        await core.transactions.end("t", sent.transaction_id, commit=True)
        assert len(core.topics["t"].queues) == 4 and await bodies(core) == [b"h"]
        await core.send([pb.Message(topic="t", body=b"p%d" % i) for i in range(4)])
        assert sorted(await bodies(core)) == [b"p0", b"p1", b"p2", b"p3"]


async def test_a_send_of_half_or_delayed_messages_alone_is_not_deferred_as_consumer_state(tmp_path: Path) -> None:
    """A Send that appends nothing to a queue (only half messages, or only delayed ones) and names no time (a
    direct client's) is still waited for by its caller: it goes to the store's writer at once, never after the
    delay consumer state waits under --flush async (here 30 s)."""
    async with broker(tmp_path, clock=ManualClock(NOW), state_delay_s=30.0, **SETTINGS) as (core, _):
        await asyncio.wait_for(half(core, b"h"), 10)
        delayed = pb.Message(topic="t", body=b"d", deliver_at_ms=NOW + 60_000)
        (sent,) = await asyncio.wait_for(core.send([delayed]), 10)
        assert sent.recall_handle and sent.offset == -1


async def test_a_rollback_a_check_and_an_expiry_are_not_deferred_as_consumer_state(tmp_path: Path) -> None:
    """Their callers wait for these commits (a producer's rollback, a proxy's checks, the sweep): they go to the
    store's writer at once, never after the delay consumer state waits under --flush async (here 30 s)."""
    clock = ManualClock(NOW)
    async with broker(tmp_path, clock=clock, state_delay_s=30.0, **SETTINGS) as (core, _):
        rolled_back = await asyncio.wait_for(half(core, b"r"), 10)
        checked = await asyncio.wait_for(half(core, b"c"), 10)
        await asyncio.wait_for(core.transactions.end("t", rolled_back, commit=False), 10)
        clock.now = NOW + 1000
        (check,), _ = await asyncio.wait_for(core.transactions.checks(["t"], 10), 10)
        assert check.transaction_id == checked
        clock.now = NOW + HOUR_MS
        expiring = core.transactions.expire()
        assert expiring is not None
        await asyncio.wait_for(expiring, 10)
        assert len(core.transactions.schedule) == 0
