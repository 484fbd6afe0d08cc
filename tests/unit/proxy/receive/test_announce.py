"""GroupsSeen: which (topic, group) pairs a proxy has announced to the brokers, bounded; Announcer: the most recent
pairs told to a broker that comes up, a bounded number at a time, sends trying it last meanwhile."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from popgate_pb import broker_pb2 as bpb

from proxy.ports import BrokerClient
from proxy.receive.announce import Announcer, GroupsSeen


def test_a_pair_is_new_once() -> None:
    seen = GroupsSeen()
    assert seen.first_sight("t", "g")
    assert not seen.first_sight("t", "g")
    assert seen.first_sight("t", "other") and seen.first_sight("u", "g")


def test_the_least_recently_seen_pair_is_forgotten_past_the_capacity() -> None:
    seen = GroupsSeen(capacity=2)
    seen.first_sight("t", "a")
    seen.first_sight("t", "b")
    assert not seen.first_sight("t", "a")  # seen again: now the most recent
    assert seen.first_sight("t", "c")  # forgets b, the least recent
    assert len(seen) == 2
    assert not seen.first_sight("t", "a") and seen.first_sight("t", "b")


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        GroupsSeen(capacity=0)


def test_pairs_are_listed_least_recently_received_first_with_their_latest_filter() -> None:
    seen = GroupsSeen()
    seen.first_sight("t", "a", "x")
    seen.first_sight("t", "b")
    seen.first_sight("t", "a", "y")
    seen.first_sight("t", "c")
    assert seen.pairs() == [("t", "b", "*"), ("t", "a", "y"), ("t", "c", "*")]
    assert seen.pairs(2) == [("t", "a", "y"), ("t", "c", "*")]


class Recording:
    """A broker whose announcements are answered when the test says (`answer`)."""

    def __init__(self, name: str = "b2") -> None:
        self.name = name
        self.healthy = True
        self.pending: list[tuple[bpb.NotificationRequest, asyncio.Future[bpb.NotificationResponse]]] = []
        self.announced: list[str] = []

    def begin_notification(
        self, request: bpb.NotificationRequest, *, timeout_s: float
    ) -> asyncio.Future[bpb.NotificationResponse]:
        assert request.poll_ms == 0
        call: asyncio.Future[bpb.NotificationResponse] = asyncio.get_running_loop().create_future()
        self.pending.append((request, call))
        self.announced.append(request.group)
        return call

    async def answer(self) -> None:
        pending, self.pending = self.pending, []
        for _, call in pending:
            call.set_result(bpb.NotificationResponse())
        for _ in range(5):
            await asyncio.sleep(0)


async def test_a_broker_that_comes_up_is_told_the_most_recent_pairs_it_keeps_oldest_first() -> None:
    """A broker without the topics keeps only the most recent early looks (MAX_EARLY_LOOKS): it is told no more
    than that, the least recent first, so that the groups in use are the ones it keeps, not those told first."""
    announcer = Announcer(timeout_s=1.0, in_flight=2, most=3)
    for group in ("g1", "g2", "g3", "g4", "g5"):
        announcer.received("t", group, "*", [])
    announcer.received("t", "g2", "*", [])  # received again: the most recent
    broker = Recording()
    announcer.broker_up(cast(BrokerClient, broker))
    assert broker.announced == ["g4", "g5"]  # at once, `in_flight` of them
    await broker.answer()
    assert broker.announced == ["g4", "g5", "g2"] and len(broker.pending) == 1
    await broker.answer()
    assert broker.announced == ["g4", "g5", "g2"] and not broker.pending


def names(clients: list[BrokerClient]) -> list[str]:
    return [c.name for c in clients]


async def test_sends_try_a_broker_that_came_up_last_until_its_announcements_are_answered() -> None:
    announcer = Announcer(timeout_s=1.0, in_flight=1)
    for group in ("g1", "g2"):
        announcer.received("t", group, "*", [])
    b1, b2, b3 = Recording("b1"), Recording("b2"), Recording("b3")
    b3.healthy = False
    clients = [cast(BrokerClient, b) for b in (b2, b1, b3)]
    assert names(announcer.send_order(clients)) == names(clients)
    announcer.broker_up(clients[0])
    assert names(announcer.send_order(clients)) == ["b1", "b2", "b3"]  # live before down still
    await b2.answer()
    assert names(announcer.send_order(clients)) == ["b1", "b2", "b3"]  # g2 not answered yet
    await b2.answer()
    assert names(announcer.send_order(clients)) == names(clients)


async def test_sends_go_to_a_broker_that_came_up_again_once_its_announcements_take_longer_than_the_hold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    announcer = Announcer(timeout_s=1.0, hold_s=0.05)
    announcer.received("t", "g1", "*", [])
    b1, b2 = Recording("b1"), Recording("b2")
    clients = [cast(BrokerClient, b) for b in (b2, b1)]
    announcer.broker_up(clients[0])
    assert names(announcer.send_order(clients)) == ["b1", "b2"]
    await asyncio.sleep(0.1)
    assert names(announcer.send_order(clients)) == names(clients)  # unanswered still: routed anyway, and said so
    assert "not all been answered within 0.05 s" in caplog.text
    announcer.close()


async def test_a_broker_down_again_is_told_no_more_until_it_is_next_up() -> None:
    announcer = Announcer(timeout_s=1.0, in_flight=1)
    for group in ("g1", "g2", "g3"):
        announcer.received("t", group, "*", [])
    broker = Recording()
    announcer.broker_up(cast(BrokerClient, broker))
    broker.healthy = False
    await broker.answer()
    assert broker.announced == ["g1"]
    broker.healthy = True
    announcer.broker_up(cast(BrokerClient, broker))
    for _ in range(3):
        await broker.answer()
    assert broker.announced == ["g1", "g1", "g2", "g3"]
    announcer.close()


async def test_a_deleted_group_or_topic_is_not_announced_to_a_broker_that_comes_up() -> None:
    """An admin deleted the group (through this proxy): a broker that comes up afterwards is not told of it, which
    would give the deleted group its state back there; other groups, and a whole topic deleted, likewise."""
    announcer = Announcer(timeout_s=1.0)
    for topic, group in (("t", "gone"), ("u", "gone"), ("t", "kept"), ("old", "kept")):
        announcer.received(topic, group, "*", [])
    announcer.seen.forget(group="gone")
    announcer.seen.forget(topic="old")
    broker = Recording()
    announcer.broker_up(cast(BrokerClient, broker))
    assert [(r.topic, r.group) for r, _ in broker.pending] == [("t", "kept")]
    await broker.answer()
    announcer.seen.forget(topic="t", group="kept")
    assert announcer.seen.pairs() == []


async def test_a_group_deleted_while_a_broker_is_told_is_left_out_of_the_rest_of_its_round() -> None:
    announcer = Announcer(timeout_s=1.0, in_flight=2)
    for group in ("g1", "g2", "g3", "g4", "gone"):
        announcer.received("t", group, "*", [])
    broker = Recording()
    announcer.broker_up(cast(BrokerClient, broker))
    assert broker.announced == ["g1", "g2"]
    announcer.seen.forget(topic="t", group="gone")  # an admin's DeleteGroup (Proxy.deleted), then its fan-out
    for _ in range(4):
        await broker.answer()
    assert broker.announced == ["g1", "g2", "g3", "g4"]
