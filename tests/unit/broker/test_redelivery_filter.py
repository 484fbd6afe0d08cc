"""A redelivery goes only to a Pop whose filter takes its tag (docs/BROKER.md, "Consumption model"): one it does
not take is acked for the group and dropped, as RocketMQ's proxy acks a popped message whose tag its request's
subscription does not take (`PopMessageResultFilterImpl`). Real SQLite store, no safety sweep, a clock the test
moves."""

from __future__ import annotations

from pathlib import Path

from popgate_pb import broker_pb2 as pb

from broker.core import BrokerCore
from broker.filters import TagFilter
from broker.log import QueueLog
from broker.metrics import BrokerMetrics
from broker.model import PopResult
from broker.redelivery import goes_to
from broker.store import Record
from tests.unit.broker.cores import ManualClock, broker

INVISIBLE_MS = 30_000


async def send(core: BrokerCore, *tagged: tuple[str, str], message_group: str = "") -> None:
    await core.send([pb.Message(topic="t", body=b.encode(), tag=t, message_group=message_group) for b, t in tagged])


async def pop(core: BrokerCore, expression: str, want: int = 32) -> PopResult:
    return await core.pop("t", "g", expression, want, INVISIBLE_MS, 0)


def seen(result: PopResult) -> list[tuple[str, int]]:
    return [(pb.Message.FromString(m.payload).body.decode(), m.attempt) for m in result.messages]


def test_a_redelivery_goes_to_a_pop_whose_filter_takes_its_tag() -> None:
    queue = QueueLog("t", 0)
    for offset, tag in enumerate(["a", None, "b"]):
        queue.append(Record("t", 0, offset, 0, tag, b""))
    a, a_or_b = TagFilter.parse("a"), TagFilter.parse("a||b")
    assert [goes_to(a, queue, o) for o in range(3)] == [True, False, False]
    assert [goes_to(a_or_b, queue, o) for o in range(3)] == [True, False, True]
    assert all(goes_to(TagFilter.parse("*"), queue, o) for o in range(3))
    assert goes_to(a, queue, 7), "a message this queue no longer keeps is not the filter's to drop"


async def test_after_a_filter_change_the_old_tags_redeliveries_are_acked_not_delivered(tmp_path: Path) -> None:
    """A deploy from `a` to `b`: the new consumer never sees the `a` messages the old one left un-acked; they are
    acked for the group (also after a restart) and counted."""
    clock = ManualClock(1_000_000)
    async with broker(tmp_path / "data", clock=clock) as (core, _):
        metrics = BrokerMetrics()
        metrics.watch(core)
        await send(core, ("a-1", "a"), ("a-2", "a"))
        assert seen(await pop(core, "a")) == [("a-1", 1), ("a-2", 1)]  # never acked: the old consumer stopped
        await send(core, ("b-1", "b"))
        clock.now += INVISIBLE_MS + 1
        assert seen(await pop(core, "b")) == [("b-1", 1)]
        assert seen(await pop(core, "b")) == []
        assert core.groups[("g", "t")].inflight_count == 1  # b-1 alone
        found = {
            (s.labels["topic"], s.labels["group"]): s.value
            for m in metrics.registry.collect()
            for s in m.samples
            if s.name == "popgate_broker_filtered_redeliveries_total"
        }
        assert found == {("t", "g"): 2}
    async with broker(tmp_path / "data", clock=clock) as (core, _):
        clock.now += INVISIBLE_MS + 1
        assert seen(await pop(core, "a||b")) == [("b-1", 2)], "the dropped redeliveries came back after a restart"


async def test_a_nacked_message_does_not_go_to_a_consumer_of_the_group_with_another_filter(tmp_path: Path) -> None:
    async with broker(tmp_path / "data") as (core, _):
        await send(core, ("a-1", "a"))
        [message] = (await pop(core, "a")).messages
        await core.change_invisible("t", "g", message.handle, 0)  # the SDK's nack()
        assert seen(await pop(core, "b")) == []
        await send(core, ("a-2", "a"))
        assert seen(await pop(core, "a")) == [("a-2", 1)], "a-1 was not acked for the group"


async def test_a_dropped_fifo_redelivery_lets_its_message_groups_next_message_go(tmp_path: Path) -> None:
    """Dropping a FIFO message unblocks its message group as its ack would: the next message goes in the same Pop."""
    clock = ManualClock(1_000_000)
    async with broker(tmp_path / "data", clock=clock) as (core, _):
        await send(core, ("m1", "a"), message_group="orders-1")
        assert seen(await pop(core, "a")) == [("m1", 1)]
        await send(core, ("m2", "b"), message_group="orders-1")  # held back behind m1
        assert seen(await pop(core, "a||b")) == []
        clock.now += INVISIBLE_MS + 1
        assert seen(await pop(core, "b")) == [("m2", 1)]
