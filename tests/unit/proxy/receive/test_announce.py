"""GroupsSeen: which (topic, group) pairs a proxy has announced to the brokers, bounded; Announcer: every pair
told to a broker that comes up, a bounded number at a time."""

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


def test_pairs_are_listed_most_recently_received_first_with_their_latest_filter() -> None:
    seen = GroupsSeen()
    seen.first_sight("t", "a", "x")
    seen.first_sight("t", "b")
    seen.first_sight("t", "a", "y")
    assert seen.pairs() == [("t", "a", "y"), ("t", "b", "*")]


class Recording:
    """A broker whose announcements are answered when the test says (`answer`)."""

    def __init__(self) -> None:
        self.name = "b2"
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


async def test_a_broker_that_comes_up_is_told_every_pair_a_bounded_number_at_a_time_the_first_at_once() -> None:
    announcer = Announcer(timeout_s=1.0, in_flight=2)
    for group in ("g1", "g2", "g3", "g4", "g5"):
        announcer.received("t", group, "*", [])
    broker = Recording()
    announcer.broker_up(cast(BrokerClient, broker))
    assert broker.announced == ["g5", "g4"]  # before anything else can reach it, the most recent first
    await broker.answer()
    assert broker.announced == ["g5", "g4", "g3", "g2"] and len(broker.pending) == 2
    await broker.answer()
    await broker.answer()
    assert broker.announced == ["g5", "g4", "g3", "g2", "g1"] and not broker.pending


async def test_a_broker_down_again_is_told_no_more_until_it_is_next_up() -> None:
    announcer = Announcer(timeout_s=1.0, in_flight=1)
    for group in ("g1", "g2", "g3"):
        announcer.received("t", group, "*", [])
    broker = Recording()
    announcer.broker_up(cast(BrokerClient, broker))
    broker.healthy = False
    await broker.answer()
    assert broker.announced == ["g3"]
    broker.healthy = True
    announcer.broker_up(cast(BrokerClient, broker))
    for _ in range(3):
        await broker.answer()
    assert broker.announced == ["g3", "g3", "g2", "g1"]
    announcer.close()
