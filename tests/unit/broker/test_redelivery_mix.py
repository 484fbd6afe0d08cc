"""How a Pop mixes redeliveries and new messages, without sockets (docs/BROKER.md, "Pop"): as RocketMQ's Pop reads
the retry topic first in one request in five (`popFromRetryProbability` 20), a group's Pops on a topic take new
messages first and fill the rest of the batch with redeliveries, but for every fifth, which takes redeliveries
first. Neither starves the other. A FIFO message's redelivery still comes before everything, and never after its
group's later messages. Real SQLite store, no safety sweep."""

from __future__ import annotations

from pathlib import Path

from popgate_pb import broker_pb2 as pb

from broker.core import BrokerCore
from broker.model import PopResult
from broker.pop import REDELIVERIES_FIRST_EVERY, redeliveries_first, take_new
from tests.unit.broker.cores import broker
from tests.unit.broker.test_fifo import INVISIBLE_MS, bodies, send


async def pop(core: BrokerCore, want: int) -> PopResult:
    return await core.pop("t", "g", "*", want, INVISIBLE_MS, 0)


async def nack(core: BrokerCore, result: PopResult) -> None:
    """Hand every message of the answer back, ready again at once (the SDK's `nack()`: delay 0)."""
    for m in result.messages:
        await core.change_invisible("t", "g", m.handle, 0)


def test_one_pop_in_five_takes_redeliveries_first() -> None:
    assert REDELIVERIES_FIRST_EVERY == 5
    assert [n for n in range(1, 21) if redeliveries_first(n)] == [5, 10, 15, 20]


async def test_a_stream_of_redeliveries_does_not_starve_new_messages(tmp_path: Path) -> None:
    """Consumers that fail 32 messages again and again (nack after each Pop of 32) get a message sent after them
    in their next Pop, not after the 32 have used all their attempts and gone to the DLQ."""
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"poison-%d" % i) for i in range(32)])
        await core.send([pb.Message(topic="t", body=b"fresh")])
        first = await pop(core, 32)
        assert b"fresh" not in bodies(first)
        await nack(core, first)
        second = await pop(core, 32)
        assert b"fresh" in bodies(second), "the new message waited behind the redeliveries"
        assert [m.attempt for m in second.messages] == [1] + [2] * 31  # the rest of the batch: redeliveries


async def test_a_new_priority_message_goes_before_a_redelivered_plain_one(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"plain-%d" % i) for i in range(8)])
        await nack(core, await pop(core, 8))
        await core.send([pb.Message(topic="t", body=b"urgent", priority=9)])
        first = await pop(core, 1)
        assert (bodies(first), first.messages[0].attempt) == ([b"urgent"], 1)


async def test_a_flood_of_new_messages_does_not_starve_redeliveries(tmp_path: Path) -> None:
    """With more new messages than any Pop takes, the redeliveries get the fifth Pop; with fewer, the rest of
    each batch."""
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"old-%d" % i) for i in range(8)])
        await nack(core, await pop(core, 8))  # the group's first Pop
        await core.send([pb.Message(topic="t", body=b"new-%d" % i) for i in range(40)])
        pops = [await pop(core, 4) for _ in range(4)]  # its Pops 2-5
        assert [[m.attempt for m in p.messages] for p in pops] == [[1] * 4] * 3 + [[2] * 4], (
            "the fifth Pop did not take the redeliveries first"
        )
        await core.send([pb.Message(topic="t", body=b"late")])
        rest = await pop(core, 64)  # Pop 6: every new message first, then the redeliveries left
        assert [m.attempt for m in rest.messages] == [1] * 29 + [2] * 4
        old = {b"old-%d" % i for i in range(8)}
        assert set(bodies(rest)[29:]) == old - set(bodies(pops[3]))


async def test_a_fifo_redelivery_comes_first_in_every_pop_and_before_its_groups_later_messages(
    tmp_path: Path,
) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2", b"m3"])
        first = await pop(core, 1)  # Pop 1
        assert bodies(first) == [b"m1"]
        await nack(core, first)
        await core.send([pb.Message(topic="t", body=b"plain-%d" % i) for i in range(40)])
        again = await pop(core, 1)  # Pop 2, new messages first: but a FIFO redelivery goes before them
        assert (bodies(again), again.messages[0].attempt) == ([b"m1"], 2)
        await nack(core, again)
        batch = await pop(core, 32)  # Pop 3: m1's redelivery, never m2 or m3 while m1 is in flight
        assert bodies(batch)[0] == b"m1" and not {b"m2", b"m3"} & set(bodies(batch)), bodies(batch)
        await core.ack("t", "g", [batch.messages[0].handle])
        assert bodies(await pop(core, 32))[:2] == [b"m2", b"m3"]


async def test_new_messages_taken_before_a_fifo_redelivery_never_pass_it(tmp_path: Path) -> None:
    """Whatever the order of a Pop's two takes: while m1 awaits its redelivery, taking new messages reads its queue
    up to m2 and no further (`readable_end`)."""
    async with broker(tmp_path / "data") as (core, _):
        await send(core, [b"m1", b"m2", b"m3"])
        await nack(core, await pop(core, 1))
        state = core.groups[("g", "t")]
        core.redelivery.expire(state, core.clock.now_ms())
        assert state.ready, "m1 is not awaiting its redelivery"
        picks: list[tuple[int, int, int]] = []
        take_new(core.consumers, state, core.topics["t"], 32, [], picks)
        assert picks == []


async def test_released_messages_go_out_first_again(tmp_path: Path) -> None:
    """A Pop's messages no caller received (an answer refused or crossed by its cancel: `release`) go out again in
    the group's next Pop, attempt unchanged, before the messages behind them: a Pop refused again and again takes
    the same message back each time rather than the topic's next one."""
    async with broker(tmp_path / "data") as (core, _):
        await core.send([pb.Message(topic="t", body=b"m%d" % i) for i in range(8)])
        for _ in range(3):
            first = await pop(core, 1)
            assert (bodies(first), first.messages[0].attempt) == ([b"m0"], 1)
            assert core.release("t", "g", [m.handle for m in first.messages]) == 1
        rest = await pop(core, 8)
        assert bodies(rest) == [b"m%d" % i for i in range(8)] and {m.attempt for m in rest.messages} == {1}


async def test_answers_cut_to_their_size_limit_do_not_starve_new_messages_again(tmp_path: Path) -> None:
    """With every answer cut to --max-pop-bytes (large messages), what each Pop undid goes first again, and only
    that: failing messages handed back at once still do not hold back a message sent after them."""
    async with broker(tmp_path / "data", max_pop_bytes=2000) as (core, _):
        await core.send([pb.Message(topic="t", body=b"poison-%03d" % i + b"x" * 300) for i in range(32)])
        await core.send([pb.Message(topic="t", body=b"fresh")])
        highest = 0  # attempt of the failing messages
        for _ in range(300):
            answer = await pop(core, 8)  # two messages an answer
            if b"fresh" in bodies(answer):
                break
            highest = max([highest] + [m.attempt for m in answer.messages])
            await nack(core, answer)
        assert b"fresh" in bodies(answer) and highest < 8, highest  # long before they run out of attempts (17)
