"""Wake on arrival inside the broker core, no sockets: a Send answers a held Pop and a held Notification at
once, and an arrival that a held request's tag filter rejects answers neither.

The core runs over a real SQLite store and without the process's safety sweep (only broker/__main__.py
starts one), so the arrival hook (store commit → ``BrokerCore.arrived`` → ``HoldService.arrived``) is the
only thing that can answer a held request before its poll time ends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker.__main__ import sweep_forever
from broker.core import BrokerCore
from broker.longpoll import Kind
from broker.model import PopResult
from broker.store import Record
from tests.unit.broker.cores import ManualClock, broker

POLL_MS = 20_000  # how long a request is held: without a wake it is still held long after ANSWER_S
ANSWER_S = 1.0  # generous bound on "at once" (the wake itself takes a few loop turns)
REJECT_WINDOW_S = 0.3  # how long a request woken by mistake is given to show up as answered
INVISIBLE_MS = 30_000


def sweeping() -> bool:
    """Whether a safety sweep runs on this loop (it would answer held requests whether or not they were woken)."""
    return any(getattr(task.get_coro(), "cr_code", None) is sweep_forever.__code__ for task in asyncio.all_tasks())


async def held(core: BrokerCore, *, pops: int, notifications: int) -> None:
    want = {Kind.POP: pops, Kind.NOTIFICATION: notifications}
    while core.hold.held != want:  # noqa: ASYNC110 - in-process state with no event to wait on; bounded by wait_for
        await asyncio.sleep(0.005)


async def hold_pop_and_notification(
    core: BrokerCore, tag_filter: str
) -> tuple[asyncio.Future[PopResult], asyncio.Future[tuple[bool, bool]]]:
    """A Pop (group g) and a Notification (group n) with `tag_filter`, both held, and no sweep running."""
    pop = asyncio.ensure_future(core.pop("t", "g", tag_filter, 32, INVISIBLE_MS, POLL_MS))
    note = asyncio.ensure_future(core.notification("t", "n", tag_filter, POLL_MS))
    await asyncio.wait_for(held(core, pops=1, notifications=1), 5)
    assert not sweeping()
    return pop, note


def bodies(result: PopResult) -> list[bytes]:
    return [pb.Message.FromString(m.payload).body for m in result.messages]


async def test_a_send_answers_a_held_pop_and_a_held_notification_at_once(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        pop, note = await hold_pop_and_notification(core, "*")

        await core.send([pb.Message(topic="t", body=b"hello")])
        done, _ = await asyncio.wait({pop, note}, timeout=ANSWER_S)
        assert pop in done, "the arrival did not wake the held Pop"
        assert note in done, "the arrival did not wake the held Notification"
        assert bodies(pop.result()) == [b"hello"] and pop.result().held  # it waited for the message
        assert note.result() == (True, False)  # has_message, not polling_full
        assert core.hold.total_held == 0
        assert not sweeping()


async def test_an_arrival_the_tag_filter_rejects_answers_no_held_request(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        pop, note = await hold_pop_and_notification(core, "a")

        await core.send([pb.Message(topic="t", body=b"not for us", tag="b")])
        done, _ = await asyncio.wait({pop, note}, timeout=REJECT_WINDOW_S)
        assert not done, "a message with tag b answered a request that only takes tag a"
        assert core.hold.held == {Kind.POP: 1, Kind.NOTIFICATION: 1}

        await core.send([pb.Message(topic="t", body=b"for us", tag="a")])
        done, _ = await asyncio.wait({pop, note}, timeout=ANSWER_S)
        assert done == {pop, note}, "the matching arrival did not wake both held requests"
        assert bodies(pop.result()) == [b"for us"]
        assert note.result() == (True, False)
        assert not sweeping()


async def test_a_pop_says_whether_the_broker_held_it(tmp_path: Path) -> None:
    """`held` (RocketMQ's "suspended", the proxy's is_long_polling): not for a Pop answered at once, with messages
    or with poll 0; yes for one held until its poll time ended."""
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"waiting")])
        at_once = await core.pop("t", "g", "*", 32, INVISIBLE_MS, POLL_MS)
        assert bodies(at_once) == [b"waiting"] and not at_once.held
        nothing_now = await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)
        assert nothing_now.messages == [] and not nothing_now.held
        timed_out = await core.pop("t", "g", "*", 32, INVISIBLE_MS, 50)
        assert timed_out.messages == [] and timed_out.held


async def test_a_wake_passed_on_goes_past_a_request_cancelled_in_the_same_turn(tmp_path: Path) -> None:
    """Three consumers' Notifications held in turn; one arrival wakes the first. That one's receive takes a message
    elsewhere and passes its wake on, in the same turn as the second's receive ends and cancels its Notification
    (the proxy joins both frames in one stream message): the third gets the wake, not the cancelled second, whose
    task has not run yet to leave the list. Lost, it would leave the message waiting a whole long poll while the
    third consumer waits here (a false empty)."""
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"warm")])
        await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)  # the group exists; nothing ready now
        waiting = []
        for n in (1, 2, 3):
            waiting.append(asyncio.ensure_future(core.notification("t", "g", "*", POLL_MS)))
            await asyncio.wait_for(held(core, pops=0, notifications=n), 5)
        first, second, third = waiting
        await core.send([pb.Message(topic="t", body=b"one")])  # wakes the first only
        assert await asyncio.wait_for(first, 5) == (True, False)
        second.cancel()
        core.pass_on("t", "g")
        assert await asyncio.wait_for(third, 5) == (True, False)


@pytest.mark.parametrize("kind", [Kind.NOTIFICATION, Kind.POP])
async def test_a_request_woken_and_cancelled_before_it_is_answered_passes_its_wake_on(
    tmp_path: Path, kind: Kind
) -> None:
    """One arrival wakes the oldest held request only. When its caller cancels it in the turn the wake came, before
    it is answered (a notify receive answered from another broker cancels its other Notifications, and that cancel
    frame can cross the wake), the next request held here gets the wake: the message is not left waiting for the
    sweep or a whole long poll while another consumer waits here."""
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"warm")])
        await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)  # the group exists; nothing ready now
        if kind is Kind.POP:
            first: asyncio.Future[object] = asyncio.ensure_future(core.pop("t", "g", "*", 1, INVISIBLE_MS, POLL_MS))
        else:
            first = asyncio.ensure_future(core.notification("t", "g", "*", POLL_MS))
        await asyncio.wait_for(held(core, pops=int(kind is Kind.POP), notifications=int(kind is Kind.NOTIFICATION)), 5)
        second = asyncio.ensure_future(core.notification("t", "g", "*", POLL_MS))  # another consumer's, held later
        await asyncio.wait_for(
            held(core, pops=int(kind is Kind.POP), notifications=1 + int(kind is Kind.NOTIFICATION)), 5
        )
        wake = core.hold.arrived

        def woken_then_cancelled(*args: object) -> int:
            woken = wake(*args)  # type: ignore[arg-type]
            first.cancel()  # its cancel read in the same turn as the wake: the woken task has not run yet
            return woken

        core.hold.arrived = woken_then_cancelled  # type: ignore[method-assign]
        await core.send([pb.Message(topic="t", body=b"one")])  # wakes the oldest only
        assert await asyncio.wait_for(second, ANSWER_S) == (True, False)  # passed on: not the sweep, nor 20 s
        assert first.cancelled() and not sweeping()


async def test_redeliveries_made_ready_by_a_pop_before_the_timer_still_wake(tmp_path: Path) -> None:
    """Two deliveries' invisibility ends; before the group's timer runs, another consumer's Pop moves both to ready
    and takes one. The timer then wakes the held Pop for the one left (it counted only what it moved itself: none,
    and the held Pop waited out its poll)."""
    clock = ManualClock(1_000_000)
    async with broker(tmp_path / "data", clock=clock, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"m1"), pb.Message(topic="t", body=b"m2")])
        assert len((await core.pop("t", "g", "*", 2, 300, 0)).messages) == 2  # invisible for 300 ms
        waiting = asyncio.ensure_future(core.pop("t", "g", "*", 1, INVISIBLE_MS, POLL_MS))
        await asyncio.wait_for(held(core, pops=1, notifications=0), 5)
        clock.now += 300  # their time is up; the group's timer (0.3 s of the loop's clock) has not run yet
        other = await core.pop("t", "g", "*", 1, INVISIBLE_MS, 0)
        assert len(other.messages) == 1
        result = await asyncio.wait_for(waiting, 0.3 + ANSWER_S)
        assert len(bodies(result)) == 1 and bodies(result) != bodies(other)


async def test_a_fifo_release_wakes_a_filter_that_matches_only_past_a_pops_batch(tmp_path: Path) -> None:
    """A FIFO message acked: its queue serves the group again. A held Pop whose filter matches only a message past
    the next Pop's batch of other tags is woken too (before, only the batch's tags were looked at)."""
    async with broker(tmp_path / "data", queues_per_topic=1, max_pop_batch=2) as (core, _):
        await core.send([pb.Message(topic="t", body=b"m0", tag="b", message_group="o")])
        first = await core.pop("t", "g", "b", 1, INVISIBLE_MS, 0)
        assert bodies(first) == [b"m0"]
        await core.send([
            pb.Message(topic="t", body=b"m1", tag="a", message_group="o"),
            pb.Message(topic="t", body=b"m2", tag="a"),
            pb.Message(topic="t", body=b"m3", tag="b"),
        ])  # fmt: skip
        waiting = asyncio.ensure_future(core.pop("t", "g", "b", 1, INVISIBLE_MS, POLL_MS))
        await asyncio.wait_for(held(core, pops=1, notifications=0), 5)
        await core.ack("t", "g", [first.messages[0].handle])
        assert bodies(await asyncio.wait_for(waiting, ANSWER_S)) == [b"m3"]


async def test_a_record_of_a_queue_the_topic_lacks_hides_no_other_record_of_its_batch(tmp_path: Path) -> None:
    async with broker(tmp_path / "data", queues_per_topic=2) as (core, _):
        await core.create_topics(["t"])
        payload = pb.Message(topic="t", body=b"ok").SerializeToString()
        core.arrived([Record("t", 7, 0, 0, None, b"lost"), Record("t", 1, 0, 0, None, payload)])
        assert bodies(await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0)) == [b"ok"]
