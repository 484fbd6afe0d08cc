"""FIFO order inside the broker core, no sockets (broker.core, "FIFO order"): a message sent with a message
group holds back its queue's later messages for the consumer group it is in flight to, until it is acked or
dead-lettered; its redelivery comes first; a Notification counts the blocked queue as empty; the ack (or the
dead letter) wakes whoever waits. Real SQLite store, no safety sweep: only arrivals, acks and timers wake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker.core import BrokerCore
from broker.longpoll import Kind
from broker.model import PopResult, stable_hash
from broker.store import NewMessage, Op, Record
from popgate_contract.errors import BadRequest, StoreUnavailable
from tests.unit.broker.cores import broker
from tests.unit.broker.test_arrival import ANSWER_S, POLL_MS, REJECT_WINDOW_S, held

INVISIBLE_MS = 30_000
QUEUES = 4  # the default queues_per_topic


def groups_on_distinct_queues() -> tuple[str, str]:
    """Two message groups that hash to different queues of a topic."""
    first = "orders-1"
    other = next(
        f"orders-{i}" for i in range(2, 100) if stable_hash(f"orders-{i}") % QUEUES != stable_hash(first) % QUEUES
    )
    return first, other


async def send(core: BrokerCore, bodies: list[bytes], group: str = "orders-1", topic: str = "t") -> None:
    await core.send([pb.Message(topic=topic, body=b, message_group=group) for b in bodies])


async def pop(core: BrokerCore, want: int = 32, poll_ms: int = 0, group: str = "g") -> PopResult:
    return await core.pop("t", group, "*", want, INVISIBLE_MS, poll_ms)


def bodies(result: PopResult) -> list[bytes]:
    return [pb.Message.FromString(m.payload).body for m in result.messages]


async def ack(core: BrokerCore, result: PopResult, group: str = "g") -> None:
    assert await core.ack("t", group, [m.handle for m in result.messages]) == [None] * len(result.messages)


async def test_the_next_fifo_message_waits_for_the_ack_of_the_one_before(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2", b"m3"])
        first = await pop(core, want=1)
        assert bodies(first) == [b"m1"]
        assert bodies(await pop(core)) == [], "m2 went out while m1 was in flight"
        await ack(core, first)
        second = await pop(core)
        assert bodies(second) == [b"m2", b"m3"], "a batch takes the next FIFO messages together, in order"
        await send(core, [b"m4"])
        await ack(core, PopResult(second.messages[:1]))
        assert bodies(await pop(core)) == [], "m4 went out while m3 was in flight"


async def test_a_pop_takes_at_most_max_fifo_fifo_messages(tmp_path: Path) -> None:
    """A proxy's receive standing for several of a client's asks at most one receive's worth of FIFO messages: the
    rest of the run waits for the ack of those in flight and then comes in order, its attempt count unchanged."""
    async with broker(tmp_path / "data") as (core, _):
        mine, other = groups_on_distinct_queues()
        await send(core, [b"a1", b"a2", b"a3", b"a4"], group=mine)
        await send(core, [b"b1"], group=other)
        first = await core.pop("t", "g", "*", 32, INVISIBLE_MS, 0, max_fifo=3)
        got = bodies(first)
        assert len(got) == 3 and [b for b in got if b[:1] == b"a"] == [b"a1", b"a2", b"a3"][: len(got) - (b"b1" in got)]
        during = bodies(await pop(core))
        assert not [b for b in during if b[:1] == b"a"], "the run went on while its head was in flight"
        await ack(core, first)
        rest = await pop(core)
        assert [b for b in bodies(rest) if b[:1] == b"a"] == [b"a1", b"a2", b"a3", b"a4"][len(got) - (b"b1" in got) :]
        assert [m.attempt for m in rest.messages] == [1] * len(rest.messages)
        assert sorted(got + during + bodies(rest)) == sorted([b"a1", b"a2", b"a3", b"a4", b"b1"])


async def test_other_groups_other_queues_and_normal_messages_before_it_are_not_held_back(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        mine, other = groups_on_distinct_queues()
        await send(core, [b"a1", b"a2"], group=mine)
        assert bodies(await pop(core, want=1)) == [b"a1"]
        await send(core, [b"b1"], group=other)
        await core.send([pb.Message(topic="t", body=b"n1", queue_id=q) for q in range(QUEUES)])
        got = bodies(await pop(core))
        # The blocked queue holds n1 behind a2; every other queue gives its messages.
        assert sorted(got) == [b"b1"] + [b"n1"] * (QUEUES - 1)
        # Another consumer group has its own flight: it takes the whole queue in one batch, in order.
        theirs = bodies(await pop(core, group="g2"))
        assert sorted(theirs) == [b"a1", b"a2", b"b1"] + [b"n1"] * QUEUES
        assert theirs.index(b"a1") < theirs.index(b"a2")


async def test_an_unacked_fifo_message_comes_back_before_the_next_one(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2"])
        batch = await pop(core)
        m1, m2 = batch.messages
        # m2 is handed back at once, m1 stays in flight: m2 must wait for m1.
        await core.change_invisible("t", "g", m2.handle, 0)
        assert bodies(await pop(core)) == [], "m2's redelivery overtook m1, still in flight"
        # Both come back: m1 first, then m2, in one batch.
        await core.change_invisible("t", "g", m1.handle, 0)
        again = await pop(core)
        assert bodies(again) == [b"m1", b"m2"]
        assert [m.attempt for m in again.messages] == [2, 2]


async def test_a_handed_back_fifo_message_waits_for_the_rest_of_its_batch_and_their_ack_wakes_it(
    tmp_path: Path,
) -> None:
    """RocketMQ's orderly pop blocks a queue while any message of a popped batch is invisible: the consumer that
    handed back the head of its batch still holds the rest, and the head must not go to another consumer meanwhile
    (a review's probe got m4 again at once while m5 and m6 of its batch were in flight)."""
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2", b"m3"])
        m1, m2, m3 = (await pop(core)).messages
        await core.change_invisible("t", "g", m1.handle, 0)
        waiting_pop = asyncio.ensure_future(pop(core, poll_ms=POLL_MS))
        await asyncio.wait_for(held(core, pops=1, notifications=0), 5)
        await ack(core, PopResult([m2]))
        done, _ = await asyncio.wait({waiting_pop}, timeout=REJECT_WINDOW_S)
        assert not done, "m1 went out again while m3 of its batch was still in flight"
        await ack(core, PopResult([m3]))
        again = await asyncio.wait_for(waiting_pop, ANSWER_S)
        assert bodies(again) == [b"m1"] and [m.attempt for m in again.messages] == [2]


async def test_a_handed_back_fifo_head_comes_back_with_its_batch_once_the_rest_is_handed_back_too(
    tmp_path: Path,
) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2", b"m3"])
        m1, m2, m3 = (await pop(core)).messages
        await core.change_invisible("t", "g", m1.handle, 0)
        await core.change_invisible("t", "g", m2.handle, 0)
        waiting_pop = asyncio.ensure_future(pop(core, poll_ms=POLL_MS))
        await asyncio.wait_for(held(core, pops=1, notifications=0), 5)
        done, _ = await asyncio.wait({waiting_pop}, timeout=REJECT_WINDOW_S)
        assert not done, "m1 went out again while m3 of its batch was still in flight"
        await core.change_invisible("t", "g", m3.handle, 0)  # its expiry lets m1 (and the rest after it) go
        again = await asyncio.wait_for(waiting_pop, ANSWER_S)
        assert bodies(again) == [b"m1", b"m2", b"m3"] and [m.attempt for m in again.messages] == [2, 2, 2]


async def test_a_notification_counts_a_blocked_queue_as_empty_and_the_ack_wakes_it(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2"])
        first = await pop(core, want=1)
        note = asyncio.ensure_future(core.notification("t", "g", "*", POLL_MS))
        waiting_pop = asyncio.ensure_future(pop(core, poll_ms=POLL_MS))
        await asyncio.wait_for(held(core, pops=1, notifications=1), 5)
        await send(core, [b"m3", b"m4"])  # behind m1 as well: wakes no one (unfiltered, 2 would wake both)
        done, _ = await asyncio.wait({note, waiting_pop}, timeout=REJECT_WINDOW_S)
        assert not done, "a message held back behind an in-flight FIFO message answered a held request"
        await ack(core, first)
        done, _ = await asyncio.wait({note, waiting_pop}, timeout=ANSWER_S)
        assert done == {note, waiting_pop}, "the ack did not wake the held requests"
        assert note.result() == (True, False)
        assert bodies(waiting_pop.result()) == [b"m2", b"m3", b"m4"]


async def test_a_dead_lettered_fifo_message_lets_the_next_one_go(tmp_path: Path) -> None:
    async with broker(tmp_path / "data", max_delivery_attempts=1) as (core, _):
        await send(core, [b"m1", b"m2"])
        first = await pop(core, want=1)
        waiting_pop = asyncio.ensure_future(pop(core, poll_ms=POLL_MS))
        await asyncio.wait_for(held(core, pops=1, notifications=0), 5)
        await core.change_invisible("t", "g", first.messages[0].handle, 0)  # its last attempt: dead-lettered
        assert bodies(await asyncio.wait_for(waiting_pop, ANSWER_S)) == [b"m2"]
        letters = await core.pop("%DLQ%g", "dlq-reader", "*", 32, INVISIBLE_MS, 0)
        assert bodies(letters) == [b"m1"]


async def test_the_order_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with broker(data, flush="sync") as (core, _):
        await send(core, [b"m1", b"m2"])
        assert bodies(await pop(core, want=1)) == [b"m1"]
    async with broker(data, flush="sync") as (core, _):
        assert bodies(await pop(core)) == [], "after a restart m2 went out while m1 was in flight"
        assert bodies(await core.pop("t", "g2", "*", 32, INVISIBLE_MS, 0)) == [b"m1", b"m2"]


async def test_a_fifo_message_cannot_be_delayed(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        late = pb.Message(topic="t", body=b"x", message_group="orders-1", deliver_at_ms=core.clock.now_ms() + 60_000)
        with pytest.raises(BadRequest, match="message group"):
            await core.send([pb.Message(topic="t", body=b"fine"), late])
        assert bodies(await pop(core)) == [], "part of a refused send was stored"


async def test_an_ack_wakes_as_many_held_requests_as_it_makes_messages_ready_oldest_first(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2"])
        first = await pop(core, want=1)
        pops = [asyncio.ensure_future(pop(core, poll_ms=POLL_MS)) for _ in range(5)]
        notes = [asyncio.ensure_future(core.notification("t", "g", "*", POLL_MS)) for _ in range(5)]
        await asyncio.wait_for(held(core, pops=5, notifications=5), 5)
        await ack(core, first)  # one message (m2) becomes ready: one Pop, not all ten requests
        done, _ = await asyncio.wait(pops, timeout=ANSWER_S, return_when=asyncio.FIRST_COMPLETED)
        assert [bodies(p.result()) for p in done] == [[b"m2"]]
        await asyncio.sleep(REJECT_WINDOW_S)
        assert core.hold.held == {Kind.POP: 4, Kind.NOTIFICATION: 5}, "the ack woke requests it had nothing for"
        for request in [*pops, *notes]:
            request.cancel()


async def test_a_redelivery_held_back_behind_an_earlier_fifo_message_wakes_no_notification(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2"])
        m1, m2 = (await pop(core)).messages
        note = asyncio.ensure_future(core.notification("t", "g", "*", POLL_MS))
        await asyncio.wait_for(held(core, pops=0, notifications=1), 5)
        await core.change_invisible("t", "g", m2.handle, 0)  # ready, but m1 is still in flight
        done, _ = await asyncio.wait({note}, timeout=REJECT_WINDOW_S)
        assert not done, "a Notification was answered for a redelivery no Pop can take"
        await ack(core, PopResult([m1]))
        assert await asyncio.wait_for(note, ANSWER_S) == (True, False)


async def test_the_next_fifo_message_waits_for_the_dead_letters_commit(tmp_path: Path) -> None:
    """A FIFO message out of attempts leaves the flight when its dead letter is committed, not before: should the
    commit fail (a full disk), it comes back ahead of the next one, which must not have gone meanwhile."""
    async with broker(tmp_path / "data", max_delivery_attempts=1) as (core, _):
        await send(core, [b"m1", b"m2"])
        first = await pop(core, want=1)
        real_submit = core.sends.submit
        pending: list[asyncio.Future[list[Record]]] = []

        def held_dead_letter(appends: Sequence[NewMessage], ops: Sequence[Op]) -> asyncio.Future[list[Record]]:
            if not any(a.topic.startswith("%DLQ%") for a in appends):
                return real_submit(appends, ops)
            pending.append(asyncio.get_running_loop().create_future())
            return pending[-1]

        core.sends.submit = held_dead_letter  # type: ignore[method-assign]
        await core.change_invisible("t", "g", first.messages[0].handle, 0)  # its last attempt: dead-lettered
        async with asyncio.timeout(5):
            while not pending:  # noqa: ASYNC110 - the redelivery timer runs the dead letter; bounded
                await asyncio.sleep(0.01)
        assert bodies(await pop(core)) == [], "m2 went out while m1's dead letter was not committed"
        pending[0].set_exception(StoreUnavailable("disk full"))
        core.sends.submit = real_submit  # type: ignore[method-assign]
        await asyncio.sleep(0)
        assert bodies(await pop(core)) == [], "m2 went out after m1's dead letter failed"
        # m1 comes due again (in a second), is dead-lettered for good, and m2 goes.
        assert bodies(await asyncio.wait_for(pop(core, poll_ms=POLL_MS), 5)) == [b"m2"]
